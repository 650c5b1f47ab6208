"""Training curves from verl's metric logs (recallm.eval.curves), the appending file logger, the
per-category answer metric, `recallm-grpo plot` and the report hook."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from recallm.errors import RecallmError
from recallm.eval.curves import (
    PANELS,
    read_metrics,
    read_runs,
    report_section,
    series,
    training_steps,
    window_mean,
)


def record(step: int, score: float, **extra) -> str:
    data = {
        "critic/score/mean": score,
        "recallm/spans_per_response": 2.0 - step / 10,
        "recallm/reward/recall_overlap": 0.1 * step,
        "recallm/answer/reasoning_retrieval": score,
        "recallm/logprob_gap_in_spans": 1e-7,
        **extra,
    }
    return json.dumps({"step": step, "data": data})


def test_jsonl_resume_and_restart_semantics(tmp_path):
    log = tmp_path / "metrics.jsonl"
    # steps 1-4, then a resume from the step-2 checkpoint redoes 3-4 and goes on to 5
    lines = [record(s, 0.1 * s) for s in (1, 2, 3, 4)] + [record(3, 0.9), record(4, 0.8), record(5, 0.7)]
    log.write_text("\n".join(lines) + "\n" + '{"step": 6, "da')  # killed while writing the last line
    metrics = read_metrics(tmp_path)  # a directory holding metrics.jsonl
    assert sorted(metrics) == [1, 2, 3, 4, 5]
    assert series(metrics, "critic/score/mean") == ([1, 2, 3, 4, 5], [0.1, 0.2, 0.9, 0.8, 0.7])
    assert window_mean(metrics, "critic/score/mean", first=2) == pytest.approx(0.15)
    assert window_mean(metrics, "critic/score/mean", last=2) == pytest.approx(0.75)
    # a restart from scratch drops every earlier record after its first step
    log.write_text("\n".join([record(s, 0.5) for s in (1, 2, 3)] + [record(1, 0.0), record(2, 0.1)]) + "\n")
    assert sorted(read_metrics(log)) == [1, 2] and read_metrics(log)[2]["critic/score/mean"] == 0.1
    # a resume from the step-2 checkpoint logs its validation at step 2 first: step 2's training
    # metrics survive (merged), step 3 is redone
    val = json.dumps({"step": 2, "data": {"val-core/x": 0.5}})
    log.write_text("\n".join([record(s, 0.1 * s) for s in (0, 1, 2, 3)] + [val, record(3, 0.9)]) + "\n")
    metrics = read_metrics(log)
    assert sorted(metrics) == [0, 1, 2, 3] and metrics[2]["val-core/x"] == 0.5
    assert metrics[2]["critic/score/mean"] == pytest.approx(0.2) and metrics[3]["critic/score/mean"] == 0.9
    with pytest.raises(RecallmError, match="was never logged"):
        window_mean(read_metrics(log), "nope", first=3)


def test_console_log_and_bad_input(tmp_path):
    console = tmp_path / "grpo.log"
    console.write_text(
        "(TaskRunner pid=1) step:1 - actor/pg_loss:np.float64(-0.5) - critic/score/mean:0.25 - perf/x:nan\n"
        "Training Progress: 50%\n"
        "(TaskRunner pid=1) step:2 - critic/score/mean:np.float32(0.75) - num_turns/min:np.int32(2)\n"
    )
    metrics = read_metrics(console)
    assert metrics == {
        1: {"actor/pg_loss": -0.5, "critic/score/mean": 0.25},
        2: {"critic/score/mean": 0.75, "num_turns/min": 2.0},
    }
    with pytest.raises(RecallmError, match="does not exist"):
        read_metrics(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\n{"step": 2, "data": {}}\n')
    with pytest.raises(RecallmError, match=r"bad.jsonl:1: not a verl metrics record"):
        read_metrics(bad)
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    with pytest.raises(RecallmError, match="holds no training step"):
        read_metrics(empty)
    with pytest.raises(RecallmError, match="no GRPO metrics logs"):
        read_runs({})


def test_steps_and_span_metrics_are_counted_honestly(tmp_path):
    """verl's validation before training logs step 0: two training steps are two, not three; a step without
    spans has no verbatim share or gap (an old log's 1.0 / 0.0 there is not drawn or averaged)."""
    log = tmp_path / "metrics.jsonl"
    val = json.dumps({"step": 0, "data": {"val-core/acc": 0.1}})
    steps = [
        record(s, 0.5, **{"recallm/spans_per_response": 0.0, "recallm/spans_verbatim": 1.0,
                          "recallm/logprob_gap_in_spans": 0.0})
        for s in (1, 2)
    ]  # fmt: skip
    log.write_text("\n".join([val, *steps]) + "\n")
    metrics = read_metrics(log)
    assert sorted(metrics) == [0, 1, 2] and training_steps(metrics) == [1, 2]
    assert series(metrics, "recallm/spans_verbatim") == ([], []) and series(metrics, "critic/score/mean")[0] == [1, 2]
    table = "\n".join(report_section({"run": log}, tmp_path / "report"))
    assert "run: 2 training steps (+1 validation-only record)" in table
    assert "| recallm/logprob_gap_in_spans | n/a (0 spans) | n/a (0 spans) |" in table


def test_report_section_and_plot_cli(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(record(s, s / 30) for s in range(1, 31)) + "\n")
    b.write_text("\n".join(record(s, 0.2, **{"recallm/answer/retrieval": 0.5}) for s in range(1, 13)) + "\n")
    lines = report_section({"recall": a, "control": b}, tmp_path / "report")
    assert (tmp_path / "report" / "plots" / "grpo_curves.png").stat().st_size > 10_000
    table = "\n".join(lines)
    assert "| critic/score/mean | 0.183 | 0.850 | 0.200 | 0.200 |" in table  # first/last ten steps
    assert "| recallm/answer/retrieval | – | – | 0.500 | 0.500 |" in table  # a category one run lacks
    assert len([k for k, _, _ in PANELS if k]) == 4
    out = tmp_path / "plot"
    done = subprocess.run(
        [sys.executable, "-m", "recallm.cli.grpo", "plot", f"recall={a}", str(b), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "curves.png").is_file()
    md = (out / "curves.md").read_text()
    assert md.startswith("# GRPO training curves") and "![GRPO training curves](curves.png)" in md
    assert "| metric | recall first 10 | recall last 10 | b first 10 | b last 10 |" in md  # unnamed: the file's stem
    failed = subprocess.run(
        [sys.executable, "-m", "recallm.cli.grpo", "plot", str(tmp_path / "none.jsonl"), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 2 and "none.jsonl does not exist" in failed.stderr


def test_build_report_adds_the_curves(tmp_path):
    from recallm.eval.report import build_report

    run = tmp_path / "eval" / "r"
    run.mkdir(parents=True)
    summary = {"run": {"name": "r"}, "n_examples": 1, "benchmarks": {}}
    (run / "summary.json").write_text(json.dumps(summary))
    log = tmp_path / "m.jsonl"
    log.write_text("\n".join(record(s, 0.5) for s in (1, 2, 3)) + "\n")
    report = build_report({"r": run}, tmp_path / "report", curves={"recall": log})
    text = report.read_text()
    assert "## Training curves (GRPO)" in text and "plots/grpo_curves.png" in text
    assert (tmp_path / "report" / "plots" / "grpo_curves.png").is_file()


def test_file_logger_appends(tmp_path, monkeypatch):
    import verl.utils.tracking as tracking

    from recallm.grpo import worker_hooks

    worker_hooks.install_appending_file_logger()  # idempotent; the module's import installed it already
    assert getattr(tracking.FileLogger.__init__, "_recallm", False)
    path = tmp_path / "sub" / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    for step in (1, 2):  # two runs (a resume): the first run's record survives
        logger = tracking.FileLogger("p", "e")
        logger.log({"critic/score/mean": np.float64(step / 4)}, step)
        logger.finish()
    assert sorted(read_metrics(path)) == [1, 2]
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH")
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path / "root"))
    tracking.FileLogger("proj", "exp").finish()
    assert (tmp_path / "root" / "proj" / "exp.jsonl").is_file()


def test_answer_score_per_category():
    import torch
    from verl import DataProto

    from recallm.grpo.metrics import recall_batch_metrics

    gt = json.dumps({"category": "retrieval", "answers": ["x"]})
    batch = DataProto.from_dict(
        tensors={"responses": torch.zeros(3, 2, dtype=torch.long), "response_mask": torch.ones(3, 2)},
        non_tensors={
            "answer": np.array([1.0, 0.0, 0.5]),
            "extra_info": np.array([{"category": "reasoning_retrieval"}, {"category": "reasoning_retrieval"}, {}]),
            "reward_model": np.array([{}, {}, {"ground_truth": gt}]),
        },
    )
    m = recall_batch_metrics(batch, None, None)
    assert m["recallm/answer/reasoning_retrieval"] == 0.5 and m["recallm/answer/retrieval"] == 0.5


def test_recallm_model_types_get_their_base_token_builder():
    from verl.utils.tokenizer import continuous_token_wiring as wiring

    from recallm.grpo import worker_hooks

    worker_hooks.install_token_builder_families()
    family = wiring.infer_continuous_token_model_family(hf_model_type="recallm_qwen2")
    assert family == wiring.infer_continuous_token_model_family(hf_model_type="qwen2") != "default"


def test_the_pipelines_curves_override_composes():
    # recallm-pipeline's report job passes `curves={name:path,...}`: the eval config must take a
    # mapping there (an empty mapping in struct mode refuses new keys)
    from hydra import compose, initialize_config_dir

    from recallm.paths import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("eval", overrides=["mode=report", "curves={recall:/runs/a/metrics.jsonl,norecall:/runs/b.jsonl}"])
    assert dict(cfg.curves) == {"recall": "/runs/a/metrics.jsonl", "norecall": "/runs/b.jsonl"}
