"""The time of a run: steps per hour and the jobs it takes.

Steps per hour from a step time you give or one measured by a previous run (the mean of verl's
``timing_s/step`` in its metrics log).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from recallm.config import MAX_SECONDS
from recallm.errors import RecallmError
from recallm.plan.report import Plan

__all__ = ["mean_step_seconds", "time_lines"]


def mean_step_seconds(metrics: str | Path) -> float:
    """The mean ``timing_s/step`` of a verl metrics log (JSONL, one record per step; the last record of
    a step logged twice wins, as ``recallm.eval.curves`` reads it)."""
    path = Path(metrics)
    if path.is_dir():
        from recallm.paths import METRICS_FILE

        path = path / METRICS_FILE
    if not path.exists():
        raise RecallmError(f"--metrics {metrics}: no such metrics log")
    from recallm.io import check_in_file

    check_in_file(path, "--metrics", kind="jsonl")  # (a FIFO, a device, a binary file: one line, nothing read)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RecallmError(f"--metrics {path} is not UTF-8 text (byte {exc.start}): not a metrics log") from None
    except OSError as exc:
        raise RecallmError(f"--metrics {path} cannot be read ({exc.strerror})") from None
    steps: dict[int, float] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):  # (not JSON; an integer of more than 4300 digits; deep nesting)
            raise RecallmError(f"--metrics {path}: line {number} is not JSON") from None
        data = record.get("data", record) if isinstance(record, dict) else {}
        step = record.get("step") if isinstance(record, dict) else None
        value = data.get("timing_s/step") if isinstance(data, dict) else None
        if isinstance(step, int) and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not 0 < value <= MAX_SECONDS:  # (nan and inf too)
                raise RecallmError(
                    f"--metrics {path}: line {number}: timing_s/step must be in (0, {MAX_SECONDS}] seconds, got {value}"
                )
            steps[step] = float(value)
    if not steps:
        raise RecallmError(f"--metrics {path}: no step has timing_s/step")
    return sum(steps.values()) / len(steps)


def time_lines(plan: Plan, steps: int | None, step_seconds: float | None, time_limit_h: float | None) -> None:
    if step_seconds is None:
        plan.notes.append("no step time given: --step-seconds S or --metrics <a previous run's metrics.jsonl>")
        return
    per_hour = 3600 / step_seconds
    plan.add("time", "steps per hour", per_hour, None, "/h", f"{step_seconds:,.0f} s per step")
    if not steps:
        return
    hours = steps * step_seconds / 3600
    why = f"{steps} steps x {step_seconds:,.0f} s = {hours:,.1f} h"
    if time_limit_h:
        jobs = math.ceil(hours / time_limit_h)
        why += f": {jobs} job(s) of {time_limit_h:g} h (each requeue resumes from the newest checkpoint)"
    plan.add("time", "whole run", hours * 3600, None, "h", why)
