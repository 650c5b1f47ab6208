"""bench/toy_rl_algorithms.py reads a run directory of ``recallm-pipeline experiment=toy_rl_algorithms``: each arm's
verl metrics log and eval summary become one table row, a figure and the ``RESULT`` line, with each arm's wall
time per step as a ratio against GRPO's (the median of its ``timing_s/step``). Checked on a run directory written
here with known values; a directory without the GRPO arm is one ``error:`` line, exit 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("toy_rl_algorithms_bench", ROOT / "bench" / "toy_rl_algorithms.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _arm(run_dir: Path, arm: str, times: list[float], scores: list[float], extra: dict | None = None) -> None:
    folder = run_dir / "grpo" / arm
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w") as f:
        for step, (t, s) in enumerate(zip(times, scores, strict=True), 1):
            data = {"timing_s/step": t, "critic/score/mean": s, "recallm/health/warnings": 1 if step == 2 else 0}
            f.write(json.dumps({"step": step, "data": {**data, **(extra or {})}}) + "\n")


def _accuracy(run_dir: Path, run: str, correct: float) -> None:
    folder = run_dir / "eval" / run
    folder.mkdir(parents=True)
    by_length = {"360": {"all": {"correct": correct}}}
    (folder / "summary.json").write_text(json.dumps({"benchmarks": {"synthetic": {"by_length": by_length}}}))


def test_rows_ratios_and_the_result_line(bench, tmp_path, capsys):
    run = tmp_path / "run"
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    _arm(run, "grpo", [10.0, 12.0, 11.0, 50.0, 11.0, 10.0, 12.0], scores)  # median 11
    _arm(run, "dapo", [20.0, 24.0, 22.0, 22.0, 21.0, 23.0, 22.0], scores,
         {"dynamic_sampling/dropped_groups": 3.0, "dynamic_sampling/gen_batches": 2.0})  # fmt: skip
    _arm(run, "one_step_off", [5.5] * 7, scores)
    _accuracy(run, "before", 0.25)
    _accuracy(run, "after_grpo", 0.5)
    _accuracy(run, "after_dapo", 0.625)
    figure = tmp_path / "fig.png"
    assert bench.main(["--run-dir", str(run), "--figure", str(figure)]) == 0
    out = capsys.readouterr().out
    assert figure.is_file() and figure.stat().st_size > 0
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows["GRPO"].startswith("| GRPO | 0.500 | 0.300 | 0.500 | 11.0 | 1.00x | – | – |")
    assert rows["DAPO (dynamic sampling)"].startswith("| DAPO (dynamic sampling) | 0.625 | 0.300 | 0.500 | 22.0 | 2.00x | 3.0 | 2.00 |")
    assert "| GRPO, one-step-off | – |" in rows["GRPO, one-step-off"] and "| 0.50x |" in rows["GRPO, one-step-off"]
    assert all(line.split(" | ")[9] == "1" for line in rows.values() if line.startswith("| GRPO") or "DAPO" in line)
    assert "GSPO" not in rows  # an arm that did not run is left out
    result = out.strip().splitlines()[-1]
    assert result == "RESULT acc_before=0.250 acc_grpo=0.500 acc_dapo=0.625 acc_one_step_off=– step_ratio_dapo=2.00 step_ratio_one_step_off=0.50"


def test_a_run_without_the_grpo_arm_is_refused(bench, tmp_path, capsys):
    _arm(tmp_path, "dapo", [1.0], [0.0])
    assert bench.main(["--run-dir", str(tmp_path), "--figure", str(tmp_path / "f.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "grpo/grpo/metrics.jsonl" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "f.png").exists()
