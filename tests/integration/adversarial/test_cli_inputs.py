"""Wrong types, wrong kinds of path and settings nothing reads, given to the command lines as a
careless user would (issue 18 item 10): each one is one ``error: ...`` line on stderr, exit code 2,
and nothing is written — the checks run before Hydra creates its output directory or any work
starts. The cases call the entry points in this process (the checks stop them before any job
runs); ``test_runs.py`` runs one through a real console process."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A working directory holding a plain file, a parquet file and a JSONL file (and nothing else)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a directory\n")
    pq.write_table(pa.Table.from_pylist([{"response": "x", "ground_truth": "{}"}]), tmp_path / "rows.parquet")
    (tmp_path / "ok.jsonl").write_text('{"a": 1}\n')
    return tmp_path


def _main(monkeypatch, capsys, module: str, args: list[str]) -> tuple[object, list[str]]:
    """Run ``module.main`` as its console script would; returns (exit code, non-empty stderr lines)."""
    mod = importlib.import_module(module)
    monkeypatch.setattr(sys, "argv", [module, *args])
    with pytest.raises(SystemExit) as exc:
        if module in ("recallm.cli.create_model", "recallm.cli.export", "recallm.cli.grpo"):
            sys.exit(mod.main(args))
        mod.main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return exc.value.code, err


# fmt: off
CASES = [
    # (id, module, args, pattern)
    ("data-workers", "recallm.cli.data", ["data=tiny", "workers=abc", "out_dir=out"], r"workers must be an integer, got 'abc'"),
    ("data-workers-float", "recallm.cli.data", ["data=tiny", "workers=2.5", "out_dir=out"], r"workers must be an integer, got 2\.5"),
    ("data-workers-zero", "recallm.cli.data", ["data=tiny", "workers=0", "out_dir=out"], r"workers must be >= 1, got 0"),
    ("data-out-file", "recallm.cli.data", ["data=tiny", "out_dir=afile"], r"out_dir afile is a file, not a directory"),
    ("data-out-under-file", "recallm.cli.data", ["data=tiny", "out_dir=afile/sub"], r"out_dir afile/sub: afile is a file"),
    ("data-unknown", "recallm.cli.data", ["data=tiny", "out_dir=out", "+worker=4"], r"unknown setting worker\b.*workers"),
    ("data-progress", "recallm.cli.data", ["data=tiny", "out_dir=out", "progress=maybe"], r"progress must be true or false"),
    ("data-typo", "recallm.cli.data", ["data=tiny", "out_dir=out", "worker=4"], r"Key 'worker' not in 'DataRun'"),
    ("sft-unknown", "recallm.cli.sft", ["foo=1", "out_dir=out"], r"Could not override 'foo'.*Key 'foo' not in 'SFTRun'"),
    ("sft-plus-unknown", "recallm.cli.sft", ["+foo=1", "out_dir=out"], r"unknown setting foo: there is no setting foo"),
    ("rlm-parallel", "recallm.cli.rlm", ["parallel=x", "out_dir=out"], r"parallel must be an integer, got 'x'"),
    ("rlm-tasks-typo", "recallm.cli.rlm", ["tasks.per_cel=2", "out_dir=out"], r"Key 'per_cel' not in 'TaskRun'"),
    ("pipeline-threads", "recallm.cli.pipeline", ["threads=many"], r"threads must be an integer, got 'many'"),
    ("eval-overwrite", "recallm.cli.eval", ["overwrite=yes", "out_dir=out"], r"overwrite must be true or false, got 'yes'"),
    ("sft-lr", "recallm.cli.sft", ["sft.embed.lr=abc", "out_dir=out"], r"sft\.embed\.lr must be a number, got 'abc'"),
    ("sft-plus-lr", "recallm.cli.sft", ["+sft.lr=123.0", "out_dir=out"], r"unknown setting sft\.lr.*sft\.embed\.lr.*sft\.full\.lr"),
    ("sft-parquet", "recallm.cli.sft", ["train_file=rows.parquet", "val_file=null", "out_dir=out"], r"train_file rows\.parquet is a parquet file, not JSONL"),
    ("sft-out-file", "recallm.cli.sft", ["train_file=ok.jsonl", "val_file=null", "out_dir=afile"], r"out_dir afile is a file"),
    ("sft-max-steps", "recallm.cli.sft", ["train_file=ok.jsonl", "val_file=null", "out_dir=out", "max_steps=-1"], r"max_steps must be >= 1"),
    ("sft-missing-data", "recallm.cli.sft", ["train_file=nope.jsonl", "val_file=null", "out_dir=out"], r"train_file nope\.jsonl does not exist"),
    ("eval-batch", "recallm.cli.eval", ["backend.batch_size=abc", "out_dir=out"], r"backend\.batch_size must be an integer, got 'abc'"),
    ("eval-limit", "recallm.cli.eval", ["limit=-3", "out_dir=out"], r"limit must be >= 1, got -3"),
    ("eval-limit-type", "recallm.cli.eval", ["limit=abc", "out_dir=out"], r"limit must be an integer, got 'abc'"),
    ("eval-out-file", "recallm.cli.eval", ["out_dir=afile"], r"out_dir afile is a file"),
    ("score-parquet", "recallm.cli.score", ["input=rows.parquet"], r"input rows\.parquet is a parquet file, not JSONL"),
    ("score-dir", "recallm.cli.score", ["input=."], r"input \. is a directory"),
    ("score-out-dir", "recallm.cli.score", ["input=ok.jsonl", "output=."], r"output \. is a directory"),
    ("pipeline-run-dir", "recallm.cli.pipeline", ["run_dir=afile"], r"run_dir afile is a file"),
    ("create-out-file", "recallm.cli.create_model", ["--tiny", "--out", "afile"], r"--out afile is a file, not a directory"),
    ("create-base-file", "recallm.cli.create_model", ["--base", "afile", "--out", "m"], r"--base afile is a file, not a directory"),
    ("export-out-file", "recallm.cli.export", ["--checkpoint", ".", "--out", "afile"], r"--out afile is a file"),
]
# fmt: on


@pytest.mark.parametrize("module,args,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_line_exit_2_nothing_written(place, monkeypatch, capsys, module, args, pattern):
    before = _tree(place)
    code, err = _main(monkeypatch, capsys, module, args)
    assert code == 2, err[-5:]
    assert len(err) == 1 and err[0].startswith("error: "), err[-5:]
    assert re.search(pattern, err[0]), err[0]
    assert _tree(place) == before  # no output directory, no Hydra log directory, no tiny model


def test_grpo_wrong_type_is_one_line(place, monkeypatch, capsys, tiny_dir):
    """A verl key of the wrong type (verl's own config gives the type)."""
    code, err = _main(
        monkeypatch,
        capsys,
        "recallm.cli.grpo",
        [f"actor_rollout_ref.model.path={tiny_dir}", "data.train_batch_size=abc", "--print-config"],
    )
    assert code == 2 and len(err) == 1, err[-5:]
    assert re.search(r"data\.train_batch_size must be an integer, got 'abc'", err[0]), err[0]


def test_settings_that_exist_somewhere_else_are_still_known(place, monkeypatch, capsys):
    """``+sft.embed.steps`` is not in the tiny recipe but other recipes of the group set it: a known
    setting (only the type is checked); ``+backend.rlm...`` is the eval command's open node."""
    code, err = _main(monkeypatch, capsys, "recallm.cli.sft", ["+sft.embed.steps=abc", "out_dir=out"])
    assert code == 2 and re.search(r"sft\.embed\.steps must be an integer, got 'abc'", err[0]), err
    code, err = _main(
        monkeypatch, capsys, "recallm.cli.sft", ["+sft.embed.steps=2", "train_file=nope.jsonl", "out_dir=out"]
    )
    assert code == 2 and re.search(r"train_file nope\.jsonl does not exist", err[0]), err
    code, err = _main(monkeypatch, capsys, "recallm.cli.eval", ["+backend.rlm.root.name=scripted", "limit=0"])
    assert code == 2 and re.search(r"limit must be >= 1, got 0", err[0]), err


def test_jsonl_readers_refuse_parquet(place, tiny_dir):
    """The one JSONL reader: a parquet file, a directory or a binary file is a one-line error."""
    from recallm.errors import RecallmError
    from recallm.io import read_jsonl
    from recallm.sft.data import load_sft_file
    from recallm.tokens import load_tokenizer

    with pytest.raises(RecallmError, match=r"rows\.parquet is a parquet file, not JSONL"):
        read_jsonl(place / "rows.parquet")
    with pytest.raises(RecallmError, match=r"is a directory"):
        read_jsonl(place)
    (place / "bin.jsonl").write_bytes(b'{"a": 1}\n\xff\xfe garbage\n')
    with pytest.raises(RecallmError, match=r"bin\.jsonl:2: not UTF-8 text"):
        read_jsonl(place / "bin.jsonl")
    with pytest.raises(RecallmError, match=r"rows\.parquet is a parquet file, not JSONL"):
        load_sft_file(place / "rows.parquet", load_tokenizer(tiny_dir), max_length=10, vocab_size=10)
    assert read_jsonl(place / "ok.jsonl") == [{"a": 1}]


@pytest.mark.slow
def test_print_config_refuses_a_hostile_row(tmp_path, tiny_dir, capsys):
    """`recallm-grpo --print-config` validates the data like a launch would: a gold ``start`` of "abc"
    is one line on stderr and exit 2, before anything starts (it used to pass, and GRPO crashed at
    its first reward). (Moved from the unit tier's test_reward_hostile: it imports verl.)"""
    pytest.importorskip("verl")
    from data_gen.io import write_parquet
    from recallm.cli.grpo import main

    gold = {"text": "Paris is in France.", "start": 15, "end": 34}
    good_gt = {"category": "single_hop_qa", "answers": ["Paris"], "gold": [gold]}
    bad_gt = {**good_gt, "gold": [{**gold, "start": "abc"}]}

    def row(gt: dict) -> dict:
        return {
            "data_source": "nq",
            "ability": "single_hop_qa",
            "prompt": [{"role": "user", "content": "q"}],
            "reward_model": {"style": "rule", "ground_truth": json.dumps(gt)},
            "extra_info": {"index": 0},
        }

    good_file = write_parquet([row(good_gt), row(good_gt)], tmp_path / "good.parquet")
    bad_file = write_parquet([row(good_gt), row(bad_gt)], tmp_path / "bad.parquet")
    args = [
        "grpo=tiny_cpu",
        f"actor_rollout_ref.model.path={tiny_dir}",
        f"data.val_files={good_file}",
        "--print-config",
    ]
    with pytest.raises(SystemExit) as exit_:
        main([*args, f"data.train_files={bad_file}"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(err) == 1, err
    assert "bad.parquet: row 1:" in err[0] and "gold[0].start must be a non-negative integer" in err[0]
    assert main([*args, f"data.train_files={good_file}"]) == 0
