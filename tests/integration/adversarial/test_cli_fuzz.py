"""The CLI fuzz test (issue 31): every command x a matrix of hostile arguments and damaged inputs —
missing, empty, truncated, binary files, directories for files, wrong JSON types, NaN / huge /
negative numbers, unicode paths. Each case is one ``error:`` line on stderr (no traceback; a launch whose
checks find several problems: one line each, then ``error: N problems; nothing was started``), exit
code 2, and nothing written: the working directory holds the same files, of the same sizes and
times, afterwards (no output directory, no Hydra log directory, no lock file, no tiny model).

The commands run in this process (their entry points, as the console scripts call them), so the
whole matrix (about 140 cases) takes a few minutes on 2 cores; ``test_runs.py`` runs one command through a real process."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

NUMBERS = ["nan", "-1", "1e400", "99999999999999999999999"]  # (1e400 is inf to YAML and float())


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root``: a file's size and time, a directory's presence."""
    return {
        str(p.relative_to(root)): (0, 0) if p.is_dir() else (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def place(tmp_path_factory, tiny_dir) -> Path:
    """Damaged inputs of every kind, side by side (module doc)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("fuzz")
    (root / "adir").mkdir()
    (root / "empty.jsonl").write_bytes(b"")
    (root / "binary.jsonl").write_bytes(bytes(range(256)) * 8)
    (root / "notutf8.jsonl").write_bytes(b'{"a": "\xff\xfe"}\n')
    (root / "truncated.jsonl").write_bytes(b'{"response": "Answer: x", "ground_truth": {"categ')
    (root / "list.jsonl").write_text("[1, 2, 3]\n")
    (root / "types.jsonl").write_text(json.dumps({"response": 5, "ground_truth": [1], "prompt_text": 3}) + "\n")
    (root / "deep.jsonl").write_text("[" * 100000 + "]" * 100000 + "\n")
    (root / "afile").write_text("a file\n")
    pq.write_table(pa.Table.from_pylist([{"x": 1, "y": "z"}]), root / "wrongcols.parquet")
    (root / "trunc.parquet").write_bytes(b"PAR1" + b"\x00" * 100)
    unicode = root / "données ü 中"
    unicode.mkdir()
    (unicode / "rows.jsonl").write_text('{"a": 1}\n')
    # models: truncated, empty and NaN weights, no manifest to catch them first
    for name in ("m_trunc", "m_empty", "m_nan", "m_noconfig"):
        shutil.copytree(tiny_dir, root / name)
        (root / name / "recallm_files.json").unlink()
    weights = root / "m_trunc" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (root / "m_empty" / "model.safetensors").write_bytes(b"")
    tensors = load_file(str(root / "m_nan" / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].float().fill_(float("nan")).to(tensors[name].dtype)
    save_file(tensors, str(root / "m_nan" / "model.safetensors"), metadata={"format": "pt"})
    (root / "m_noconfig" / "config.json").unlink()
    # RLM trajectories: not UTF-8, wrong JSON types after a valid start
    (root / "traj_bin.jsonl").write_bytes(b'{"event": "start"}\n\xff\xfe\n')
    start = {"event": "start", "rlm": "0", "task": "t", "prompt": "p", "messages": 5}
    turn = {"event": "turn", "rlm": "0", "messages": 5, "reply": ["x"], "cells": "abc", "notes": 3}
    bad = [start, turn, turn,
           {"event": "score", "correct": True, "score": "x", "task": 5, "reference": 7},
           {"event": "end", "rlm": "0", "answer": {"a": 1}}]  # fmt: skip
    (root / "traj_types.jsonl").write_text("".join(json.dumps(e) + "\n" for e in bad))
    (root / "trajs").mkdir()
    shutil.copy(root / "traj_types.jsonl", root / "trajs" / "t.jsonl")
    # eval run directories with damaged summaries and results; a pipeline run dir with a damaged state
    for name, summary in {"ev_list": b"[]", "ev_bin": b"\xff\xfe", "ev_types": b'{"benchmarks": {"ruler": 3}}',
                          "ev_deep": b"[" * 100000}.items():  # fmt: skip
        (root / name).mkdir()
        (root / name / "summary.json").write_bytes(summary)
    (root / "ev_resdir").mkdir()
    (root / "ev_resdir" / "results.jsonl").mkdir()
    for name, state in {"pl_bin": b"\xff", "pl_list": b"[]", "pl_types": b'{"jobs": {"data": 3}}'}.items():
        (root / name).mkdir()
        (root / name / "pipeline.json").write_bytes(state)
    (root / "lockdir").mkdir()
    (root / "lockdir" / ".recallm.lock").mkdir()
    return root


def _run(monkeypatch, capsys, module: str, args: list[str]) -> tuple[object, list[str]]:
    mod = importlib.import_module(module)
    monkeypatch.setattr(sys, "argv", [module, *args])
    code: object = 0
    try:
        code = mod.main()
    except SystemExit as exc:
        code = exc.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


SCORE = "recallm.cli.score"
DATA = "recallm.cli.data"
SFT = "recallm.cli.sft"
EVAL = "recallm.cli.eval"
RLM = "recallm.cli.rlm"
PIPE = "recallm.cli.pipeline"
CREATE = "recallm.cli.create_model"
EXPORT = "recallm.cli.export"
ANNOTATE = "recallm.cli.annotate"
GRPO = "recallm.cli.grpo"
SERVE = "recallm.cli.serve"
DEMO = "recallm.cli.decoding_demo"

FILES = ["missing.jsonl", "empty.jsonl", "binary.jsonl", "notutf8.jsonl", "truncated.jsonl", "list.jsonl",
         "types.jsonl", "deep.jsonl", "adir", "wrongcols.parquet", "données ü 中/missing.jsonl"]  # fmt: skip
SFT_FILES = {"missing.jsonl", "empty.jsonl", "binary.jsonl", "truncated.jsonl", "types.jsonl", "adir"}
MODELS = ["m_trunc", "m_empty", "m_nan", "m_noconfig", "missing_model", "afile", "données ü 中"]

CASES: list[tuple[str, str, list[str]]] = []
for f in FILES:
    CASES.append((f"score-input-{f}", SCORE, [f"input={f}", "output=out/s.jsonl"]))
    if f in SFT_FILES:  # (each loads the model before reading the data: the kinds that differ for SFT)
        CASES.append((f"sft-train-{f}", SFT, [f"train_file={f}", "val_file=null", "out_dir=out", "model.path=m_ok"]))
    CASES.append((f"rlm-show-{f}", RLM, ["show", f]))
for m in MODELS:
    CASES.append((f"create-check-{m}", CREATE, ["--check", m]))
    CASES.append((f"create-base-{m}", CREATE, ["--base", m, "--out", "out/m"]))
    CASES.append((f"sft-model-{m}", SFT, ["train_file=ok.jsonl", "val_file=null", "out_dir=out", f"model.path={m}"]))
    CASES.append((f"eval-model-{m}", EVAL, [f"model_path={m}", "out_dir=out", "eval=toy", "limit=1"]))
    CASES.append((f"serve-{m}", SERVE, [m, "--print-command"]))
for n in NUMBERS:
    CASES.append((f"create-yarn-{n}", CREATE, ["--tiny", "--out", "out/m", f"--yarn-factor={n}"]))
    CASES.append((f"create-maxrecall-{n}", CREATE, ["--tiny", "--out", "out/m", f"--max-recall-tokens={n}"]))
    CASES.append((f"data-workers-{n}", DATA, ["data=tiny", "out_dir=out", f"workers={n}"]))
    CASES.append((f"sft-steps-{n}", SFT, ["train_file=ok.jsonl", "out_dir=out", f"max_steps={n}"]))
    CASES.append((f"sft-lr-{n}", SFT, ["train_file=ok.jsonl", "out_dir=out", f"sft.full.lr={n}"]))
    CASES.append((f"eval-limit-{n}", EVAL, ["out_dir=out", f"limit={n}"]))
    CASES.append((f"pipeline-threads-{n}", PIPE, [f"threads={n}", "run_dir=out"]))
    CASES.append((f"rlm-parallel-{n}", RLM, [f"parallel={n}", "out_dir=out"]))
    CASES.append((f"score-tau-{n}", SCORE, ["input=ok_rollouts.jsonl", "output=out/s.jsonl", f"reward.categories.icl.tau={n}"]))
CASES += [
    ("score-output-is-input", SCORE, ["input=ok_rollouts.jsonl", "output=ok_rollouts.jsonl"]),
    ("score-output-dir", SCORE, ["input=ok_rollouts.jsonl", "output=adir"]),
    ("score-output-under-file", SCORE, ["input=ok_rollouts.jsonl", "output=afile/x.jsonl"]),
    ("data-out-lockdir", DATA, ["data=tiny", "out_dir=lockdir"]),
    ("data-entries-type", DATA, ["data=tiny", "out_dir=out", "data.train.entries=5"]),
    ("data-task-unknown", DATA, ["data=tiny", "out_dir=out", "data.train.entries=[{task: nope, count: 1}]"]),
    ("data-out-unicode-file", DATA, ["data=tiny", "out_dir=données ü 中/rows.jsonl"]),
    ("rlm-show-traj-bin", RLM, ["show", "traj_bin.jsonl", "out_file=out/x.html"]),
    ("rlm-show-traj-types", RLM, ["show", "traj_types.jsonl"]),
    ("rlm-to-sft-traj-types", RLM, ["to-sft", "sft_data.trajectories=trajs", "sft_data.tokenizer_path=m_ok", "sft_data.out_file=out/x.jsonl"]),
    ("rlm-to-sft-traj-bin", RLM, ["to-sft", "sft_data.trajectories=traj_bin.jsonl", "sft_data.tokenizer_path=m_ok", "sft_data.out_file=out/x.jsonl"]),
    ("eval-report-list", EVAL, ["mode=report", "runs=[ev_list]", "report_dir=out"]),
    ("eval-report-bin", EVAL, ["mode=report", "runs=[ev_bin]", "report_dir=out"]),
    ("eval-report-types", EVAL, ["mode=report", "runs=[ev_types]", "report_dir=out"]),
    ("eval-report-deep", EVAL, ["mode=report", "runs=[ev_deep]", "report_dir=out"]),
    ("eval-report-missing", EVAL, ["mode=report", "runs=[nope]", "report_dir=out"]),
    ("eval-out-lockdir", EVAL, ["out_dir=lockdir", "model_path=m_ok", "eval=toy"]),
    ("eval-results-dir", EVAL, ["out_dir=ev_resdir", "model_path=m_ok", "eval=toy", "limit=1"]),
    ("pipeline-state-bin", PIPE, ["experiment=tiny_cpu", "run_dir=pl_bin"]),
    ("pipeline-state-list", PIPE, ["experiment=tiny_cpu", "run_dir=pl_list"]),
    ("pipeline-state-types", PIPE, ["experiment=tiny_cpu", "run_dir=pl_types"]),
    ("pipeline-status-bin", PIPE, ["experiment=tiny_cpu", "run_dir=pl_bin", "--status"]),
    ("annotate-wrong-columns", ANNOTATE, ["input=wrongcols.parquet", "tokenizer=m_ok", "output_dir=out", "teacher.traces=ok.jsonl", "annotator.model=x"]),
    ("annotate-trunc-parquet", ANNOTATE, ["input=trunc.parquet", "tokenizer=m_ok", "output_dir=out", "teacher.traces=ok.jsonl", "annotator.model=x"]),
    ("export-checkpoint-missing", EXPORT, ["--checkpoint", "nope", "--out", "out/m"]),
    ("export-checkpoint-file", EXPORT, ["--checkpoint", "afile", "--out", "out/m"]),
    ("export-checkpoint-unicode", EXPORT, ["--checkpoint", "données ü 中", "--out", "out/m"]),
    ("grpo-plot-missing", GRPO, ["plot", "nope.jsonl", "--out", "out"]),
    ("grpo-plot-binary", GRPO, ["plot", "binary.jsonl", "--out", "out"]),
    ("grpo-model-trunc", GRPO, ["actor_rollout_ref.model.path=m_trunc", "--print-config"]),
    ("grpo-model-nan", GRPO, ["actor_rollout_ref.model.path=m_nan", "--print-config"]),
    ("demo-out-file", DEMO, ["out_dir=afile"]),
]


@pytest.fixture
def cwd(place, tiny_dir, monkeypatch) -> Path:
    monkeypatch.chdir(place)
    if not (place / "m_ok").exists():
        shutil.copytree(tiny_dir, place / "m_ok")
        (place / "ok.jsonl").write_text('{"a": 1}\n')
        gt = {"category": "icl", "answers": ["x"], "gold": []}
        (place / "ok_rollouts.jsonl").write_text(json.dumps({"response": "Answer: x", "ground_truth": gt}) + "\n")
    return place


class _TooLong(BaseException):
    pass


def _alarm(signum, frame):
    raise _TooLong("a hostile case ran for more than 60 s: it was not refused")


@pytest.mark.parametrize("module,args", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_exit_2_nothing_written(cwd, monkeypatch, capsys, module, args):
    import signal
    import subprocess

    def no_process(*a, **k):
        raise _TooLong(f"a hostile case started a process: {a[0] if a else k}")

    # verl (and Ray under it) imported before Popen is refused: Ray starts processes while it imports, and an
    # import stopped half-way leaves a partial `ray` in sys.modules that breaks every later test importing it
    importlib.import_module("verl")
    monkeypatch.setattr(subprocess, "Popen", no_process)  # (the pipeline's jobs, a served model)
    before = _tree(cwd)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)
    try:
        code, err = _run(monkeypatch, capsys, module, args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        after = _tree(cwd)
        for new in sorted(set(after) - set(before), key=len):  # keep the next case's place clean
            path = cwd / new
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    text = "\n".join(err)
    assert "Traceback" not in text, text[-3000:]
    assert code == 2, (code, err[-5:])
    errors = [line for line in err if "error:" in line]
    if len(errors) > 1:  # a launch's checks found several problems: one line each, then how many (recallm.errors)
        assert errors[-1] == f"error: {len(errors) - 1} problems; nothing was started" and err[-1] == errors[-1], err
    assert errors and err[-1] == errors[-1], err[-5:]
    if module == GRPO and any(a.startswith("actor_rollout_ref.model.path=") for a in args):  # the damaged model itself
        model = next(a.split("=", 1)[1] for a in args if a.startswith("actor_rollout_ref.model.path="))
        assert any(f"{model}: " in line for line in errors), errors
    assert after == before, sorted(set(after) ^ set(before))[:10]
