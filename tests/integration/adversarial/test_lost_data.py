"""Data lost (issue 31): two ``recallm-score`` runs with one ``output=`` (the first said it wrote a
file holding the second's scores), ``input=X output=X`` (the rollouts overwritten), two
``recallm-eval`` runs into one directory (both ran everything), a deleted ``run.json`` (old results
reused unchecked), ``recallm-pipeline`` without a run-directory lock. Each is refused in one line,
and what is on disk stays."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from pathlib import Path

import pytest

from recallm.errors import RecallmError
from recallm.io import lock_dir, lock_output

PROMPT = "Documents:\n[1] Paris is in France.\n[2] Lyon is in France.\nQuestion: ?\n"
GT = {"category": "single_hop_qa", "answers": ["Paris"], "gold": [{"text": "Paris is in France.", "start": 15, "end": 34}]}


def _rollouts(path: Path, n: int = 3) -> Path:
    rows = [{"response": f"<think>x</think>\nAnswer: {a}", "ground_truth": GT, "prompt_text": PROMPT} for a in ["Paris", "Lyon", "Rome"][:n]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _main(monkeypatch, capsys, module: str, args: list[str]):
    import importlib

    mod = importlib.import_module(module)
    monkeypatch.setattr(sys, "argv", [module, *args])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return exc.value.code, err


@contextlib.contextmanager
def _held_elsewhere(lock, path, what):
    """``lock(path, what)`` held by another thread (as another run would) for the block."""
    held, done = threading.Event(), threading.Event()

    def hold():
        with lock(path, what):
            held.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(30)
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_score_output_that_is_the_input_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    src = _rollouts(tmp_path / "r.jsonl")
    before = src.read_bytes()
    code, err = _main(monkeypatch, capsys, "recallm.cli.score", ["input=r.jsonl", "output=./r.jsonl"])
    assert code == 2 and len(err) == 1 and "is the input file" in err[0], err
    assert src.read_bytes() == before


def test_second_score_run_with_the_same_output_is_refused(tmp_path, monkeypatch, capsys):
    """While one run holds ``out.jsonl``, a second is refused before it writes (and in the middle,
    were it past the check): the file the first reports is its own."""
    from recallm.cli.score import score_file

    monkeypatch.chdir(tmp_path)
    _rollouts(tmp_path / "a.jsonl")
    _rollouts(tmp_path / "b.jsonl", n=2)
    out = tmp_path / "out.jsonl"
    with _held_elsewhere(lock_output, out, "recallm-score (the first run)"):
        code, err = _main(monkeypatch, capsys, "recallm.cli.score", ["input=b.jsonl", "output=out.jsonl"])
        assert code == 2 and len(err) == 1 and "in use by another writer (recallm-score (the first run)" in err[0], err
        with pytest.raises(RecallmError, match="in use by another writer"):
            score_file(tmp_path / "b.jsonl", out, None)
    assert not out.exists()
    score_file(tmp_path / "a.jsonl", out, None)
    assert len(out.read_text().splitlines()) == 3
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]
    assert not leftovers, leftovers


def test_score_output_carries_its_checksum(tmp_path):
    from recallm.cli.score import score_file
    from recallm.io import read_jsonl

    out = tmp_path / "out.jsonl"
    score_file(_rollouts(tmp_path / "a.jsonl"), out, None)
    assert len(read_jsonl(out)) == 3
    out.write_text(out.read_text().replace('"line": 1', '"line": 7'))
    with pytest.raises(RecallmError, match=r"out\.jsonl changed since it was written"):
        read_jsonl(out)


def test_lock_file_that_is_a_directory_is_one_line(tmp_path):
    (tmp_path / "run" / ".recallm.lock").mkdir(parents=True)
    with pytest.raises(RecallmError, match=r"\.recallm\.lock is a directory, not a lock file"):
        with lock_dir(tmp_path / "run", "test"):
            pass


# ------------------------------------------------------------------------------------------ eval
def test_second_eval_into_one_out_dir_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "ev"
    with _held_elsewhere(lock_dir, out, "recallm-eval (the first run)"):
        code, err = _main(monkeypatch, capsys, "recallm.cli.eval", [f"out_dir={out}", "limit=1"])
    assert code == 2 and len(err) == 1 and "in use by another writer (recallm-eval (the first run)" in err[0], err
    assert not out.exists()  # the lock file and the directory made for it are gone with the first run


def test_eval_run_takes_the_out_dir_lock(tmp_path, monkeypatch, tiny_dir):
    """Past the command's check (two runs starting together), the run itself holds the lock while it
    prepares ``out_dir`` and evaluates: a second writer meanwhile is refused."""
    from hydra import compose, initialize_config_dir

    import recallm.eval.app as app
    from recallm.paths import config_dir

    outcome = {}

    def evaluate(settings, out_dir, *args):
        def second():
            try:
                with lock_dir(out_dir, "second"):
                    outcome["second"] = "ran"
            except RecallmError as exc:
                outcome["second"] = str(exc)

        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
        return {}

    monkeypatch.setattr(app, "_run_locked", evaluate)
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(
            "eval",
            overrides=[f"out_dir={tmp_path / 'ev'}", f"model_path={tiny_dir}", "limit=1", "eval=toy", "benchmarks=[synthetic]"],
        )
    app.run(cfg)
    assert "in use by another writer (recallm-eval" in outcome["second"], outcome


def test_results_without_run_json_are_not_reused(tmp_path):
    from recallm.eval.runner import RESULTS_FILE, prepare_out_dir

    out = tmp_path / "ev"
    prepare_out_dir(out, {"model": "a"})
    (out / RESULTS_FILE).write_text('{"example_id": "x", "correct": 1}\n')
    (out / "run.json").unlink()
    with pytest.raises(RecallmError, match=r"holds results\.jsonl without its run\.json.*overwrite=true"):
        prepare_out_dir(out, {"model": "a"})
    assert (out / RESULTS_FILE).read_text().startswith('{"example_id": "x"')
    prepare_out_dir(out, {"model": "a"}, overwrite=True)
    assert not (out / RESULTS_FILE).exists()


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe\x00garbage\n", b'[1, 2]\n{"example_id": "x"}\n', b'"just a string"\n', b'5\n'],
    ids=["not-utf8", "list", "string", "number"],
)
def test_damaged_results_file_is_one_line(tmp_path, content):
    from recallm.eval.runner import read_results

    path = tmp_path / "results.jsonl"
    path.write_bytes(content)
    with pytest.raises(RecallmError, match=r"results\.jsonl:1: ") as exc:
        read_results(path)
    assert "\n" not in str(exc.value)


def test_results_file_that_is_a_directory_is_one_line(tmp_path):
    from recallm.eval.runner import read_results

    (tmp_path / "results.jsonl").mkdir()
    with pytest.raises(RecallmError, match=r"results\.jsonl is a directory, not a results file"):
        read_results(tmp_path / "results.jsonl")


# -------------------------------------------------------------------------------------- pipeline
def test_second_pipeline_in_one_run_dir_is_refused(tmp_path):
    from recallm.pipeline import Pipeline

    run_dir = tmp_path / "run"
    with _held_elsewhere(lock_dir, run_dir, "recallm-pipeline (the first)"):
        with pytest.raises(RecallmError, match=r"in use by another writer \(recallm-pipeline \(the first\)"):
            Pipeline(run_dir, []).run()
    assert not (run_dir / "pipeline.json").exists()


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe not utf-8", b"[]", b'{"jobs": []}', b'{"jobs": {"data": "done"}}', b'{"jobs": {}, "stage_seconds": {"a": "x"}}'],
    ids=["not-utf8", "list", "jobs-list", "job-string", "seconds-string"],
)
def test_damaged_pipeline_state_is_one_line(tmp_path, content):
    from recallm.pipeline import Pipeline, Stage, StageJob

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "pipeline.json").write_bytes(content)
    pipeline = Pipeline(run_dir, [Stage("data", [StageJob("data", ["true"], [run_dir / "data"])])])
    with pytest.raises(RecallmError, match=r"pipeline\.json is (corrupt|not a pipeline state file)") as exc:
        pipeline.status()
    assert "\n" not in str(exc.value)


def test_eval_results_are_checksummed_when_a_run_finishes(tmp_path, tiny_dir):
    """A finished run's results and summary carry checksums the report verifies; a resumed run
    drops them while it appends."""
    from data_gen.fit import PromptRenderer
    from recallm.eval.backends import HFBackend
    from recallm.eval.benchmarks import make_benchmarks
    from recallm.eval.report import build_report
    from recallm.eval.runner import run_eval
    from recallm.io import file_problem
    from recallm.tokens import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    suite = {
        "generation": {"max_new_tokens": 4},
        "benchmarks": {"lost_in_thought": {"lengths": [512], "per_cell": 1, "key_type": "toy", "value_type": "toy"}},
    }
    out = tmp_path / "ev"
    run_eval(make_benchmarks(suite), HFBackend(tiny_dir, tokenizer, batch_size=1), PromptRenderer(tokenizer), out,
             fingerprint={"m": 1}, progress=False)  # fmt: skip
    assert file_problem(out / "results.jsonl", required=True) is None
    assert file_problem(out / "summary.json", required=True) is None
    build_report({"run": out}, tmp_path / "report")
    summary = out / "summary.json"
    summary.write_text(summary.read_text().replace('"complete": true', '"complete": false'))
    with pytest.raises(RecallmError, match=r"summary\.json (changed since it was written|has \d+ bytes)"):
        build_report({"run": out}, tmp_path / "report2")
    assert not (tmp_path / "report2").exists()
