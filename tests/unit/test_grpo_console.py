"""GRPO's console (``recallm.grpo.console``): one line per step, verl's and Ray's output in the run's log."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from recallm.grpo.console import step_record, summary_line

ROOT = Path(__file__).resolve().parents[2]
LINE = (
    "(TaskRunner pid=4242) step:2 - critic/score/mean:np.float64(0.4125) - recallm/spans_per_response:1.25 - "
    "recallm/reward/recall_overlap:0.625 - recallm/reward/answer:0.5 - timing_s/step:41.23 - actor/lr:1e-06"
)


def test_a_step_line_becomes_one_summary():
    step, metrics = step_record(LINE)
    assert step == 2 and metrics["critic/score/mean"] == 0.4125 and metrics["actor/lr"] == 1e-06
    assert summary_line(step, metrics, 10) == (
        "step 2/10: score 0.412, spans 1.25/response, gold overlap 0.62, answer 0.50, 41.2 s"
    )
    assert step_record("(WorkerDict pid=1) WARNING: something") is None
    # verl's validation record before the first step is not a training step
    assert summary_line(*step_record("step:0 - val-core/x/acc/mean@1:0.5"), 10) is None


def test_the_summary_ends_with_the_steps_health_and_warnings_get_a_line_each(tmp_path):
    """The training-health checks (``recallm.grpo.health``): ``health ok`` or the checks that fired at the end
    of the step's line, and each warning the trainer prints on a console line of its own."""
    healthy = LINE + " - recallm/health/warnings:0 - recallm/health/clipped:0.0"
    assert summary_line(*step_record(healthy), 10).endswith(", 41.2 s, health ok")
    sick = LINE + " - recallm/health/warnings:2 - recallm/health/clipped:1.0 - recallm/health/no_spans:1.0"
    assert summary_line(*step_record(sick), 10).endswith(", 41.2 s, health: clipped, no_spans")
    script = textwrap.dedent(
        f"""
        from omegaconf import OmegaConf
        from recallm.grpo.console import console_to_log
        cfg = OmegaConf.create({{"trainer": {{"default_local_dir": {str(tmp_path / "run")!r}, "total_training_steps": 3}}}})
        with console_to_log(cfg):
            print({sick!r}, flush=True)
            print("(TaskRunner pid=4242) [recallm health] warning: step 2: 80% of the responses hit the cap", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120, env={"PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:3] == [
        "step 2/3: score 0.412, spans 1.25/response, gold overlap 0.62, answer 0.50, 41.2 s, health: clipped, no_spans",
        "warning: step 2: 80% of the responses hit the cap",
    ]


def test_the_run_output_goes_to_the_log_and_a_line_per_step_to_the_console(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from omegaconf import OmegaConf
        from recallm.grpo.console import console_to_log
        cfg = OmegaConf.create({{"trainer": {{"default_local_dir": {str(tmp_path / "run")!r}, "total_training_steps": 3}}}})
        with console_to_log(cfg, heartbeat=1.0) as log:
            time.sleep(1.8)
            print("Ray noise " * 5, flush=True)
            print({LINE!r}, flush=True)
            os.system("echo a worker writes to the inherited descriptor >&2")
            print("step:3 - critic/score/mean:0.5 - timing_s/step:2.0", file=sys.stderr)
            sys.stdout.flush(); time.sleep(1.5)
        print("after:", log)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120, env={"PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 0, done.stderr
    log = tmp_path / "run" / "grpo.log"
    assert done.stdout.splitlines() == [
        f"verl's and Ray's output: {log}; one line per step below",
        "step 1/3: running, 0 min so far",
        "step 2/3: score 0.412, spans 1.25/response, gold overlap 0.62, answer 0.50, 41.2 s",
        "step 3/3: score 0.500, 2.0 s",
        f"verl's and Ray's output: {log}",
        f"after: {log}",
    ]
    text = log.read_text()
    assert "Ray noise" in text and "a worker writes to the inherited descriptor" in text and "Ray noise" not in done.stdout


def test_a_failed_run_shows_the_end_of_its_log(tmp_path):
    script = textwrap.dedent(
        f"""
        from omegaconf import OmegaConf
        from recallm.grpo.console import console_to_log
        cfg = OmegaConf.create({{"trainer": {{"default_local_dir": {str(tmp_path / "run")!r}}}}})
        with console_to_log(cfg):
            print("ray.exceptions.ActorDiedError: the actor died", flush=True)
            raise SystemExit(3)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120, env={"PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 3
    assert f"GRPO failed; the last lines of {tmp_path / 'run' / 'grpo.log'}:" in done.stderr
    assert "  ray.exceptions.ActorDiedError: the actor died" in done.stderr
