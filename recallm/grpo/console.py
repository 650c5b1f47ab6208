"""GRPO's console: one line per training step; verl's and Ray's output in a log file the run names.

verl's console logger prints every metric of a step on one line (``step:N - key:value - ...``, a few
hundred keys), and Ray forwards every worker's output to the launching process — on a CPU run of two
steps, over a thousand lines of warnings. With ``recallm.console=summary`` (the default) the launch
sends this process's stdout and stderr — and with them everything Ray forwards from its workers — to
``<trainer.default_local_dir>/grpo.log`` (appended to; a resumed run adds to it), and prints instead,
per training step::

    step 2/10: score 0.412, spans 1.25/response, gold overlap 0.63, answer 0.50, 41.2 s

(``critic/score/mean``, ``recallm/spans_per_response``, ``recallm/reward/recall_overlap``,
``recallm/reward/answer`` and verl's ``timing_s/step``; a metric a step did not log is left out), and
every two minutes while a step runs, ``step 3/10: running, 4 min so far``. If the
run fails, the last lines of the log are shown with its path. ``recallm.console=full`` leaves
everything on the console as verl prints it.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recallm.paths import GRPO_LOG

__all__ = ["STEP_LINE", "number", "step_record", "summary_line", "console_to_log"]

#: verl's console logger: ``step:N - key:value - key:value ...`` (Ray prefixes ``(TaskRunner pid=...)``)
STEP_LINE = re.compile(r"\bstep:(\d+) - (.*)$")
_SUMMARY = (
    ("critic/score/mean", "score {:.3f}"),
    ("recallm/spans_per_response", "spans {:.2f}/response"),
    ("recallm/reward/recall_overlap", "gold overlap {:.2f}"),
    ("recallm/reward/answer", "answer {:.2f}"),
    ("timing_s/step", "{:.1f} s"),
)


_WRAPPED = re.compile(r"^np\.\w+\((.*)\)$")


def number(value: Any) -> float | None:
    """A metric's value as a finite float (the console logger prints numpy scalars as ``np.float64(0.5)``),
    or None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, str):
        text = value.strip()
        match = _WRAPPED.match(text)
        if match:
            text = match.group(1)
        try:
            parsed = float(text)
        except ValueError:
            return None
        return parsed if math.isfinite(parsed) else None
    return None


def step_record(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {metric: value})`` of one of verl's console lines, or None for any other line."""
    match = STEP_LINE.search(line)
    if not match or len(match.group(1)) > 18:  # (a step of thousands of digits is no step: int() refuses it)
        return None
    data: dict[str, float] = {}
    for item in match.group(2).split(" - "):
        key, sep, value = item.partition(":")
        if sep and (parsed := number(value)) is not None:
            data[key.strip()] = parsed
    return int(match.group(1)), data


def summary_line(step: int, metrics: dict[str, float], total: int | None = None) -> str | None:
    """The one console line of a training step (module doc); None for a record that is not one (the
    validation record verl logs before the first step)."""
    if "critic/score/mean" not in metrics and "timing_s/step" not in metrics:
        return None
    parts = [fmt.format(metrics[key]) for key, fmt in _SUMMARY if key in metrics]
    return f"step {step}{f'/{total}' if total else ''}: {', '.join(parts)}"


#: seconds without a finished step after which the console says the step is still running (and again as often)
HEARTBEAT_S = 120.0


def _tail(
    path: Path, start: int, out_fd: int, total: int | None, stop: threading.Event, heartbeat: float = HEARTBEAT_S
) -> None:
    """Follow ``path`` from byte ``start``, writing a summary line to ``out_fd`` for each step line, and a
    line every ``heartbeat`` seconds while a step runs (a CPU step of a real model takes minutes)."""
    since = last_said = time.monotonic()
    done = 0
    with path.open("rb") as f:
        f.seek(start)
        pending = b""
        while True:
            chunk = f.read(1 << 16)
            if chunk:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    record = step_record(raw.decode("utf-8", "replace"))
                    line = summary_line(*record, total) if record else None
                    if line:
                        os.write(out_fd, (line + "\n").encode())
                        done, since = record[0], time.monotonic()
                        last_said = since
                continue
            if stop.is_set():
                return
            now = time.monotonic()
            if now - last_said >= heartbeat and not (total and done >= total):
                step = f"step {done + 1}{f'/{total}' if total else ''}"
                os.write(out_fd, f"{step}: running, {(now - since) / 60:.0f} min so far\n".encode())
                last_said = now
            time.sleep(0.5)


def _last_lines(path: Path, n: int = 25) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 64_000))
            return f.read().decode("utf-8", "replace").splitlines()[-n:]
    except OSError:
        return []


@contextmanager
def console_to_log(cfg: Any, *, mode: str = "summary", heartbeat: float = HEARTBEAT_S) -> Iterator[Path | None]:
    """Inside: this process's stdout/stderr go to the run's log file and a summary line per step to the
    console (module doc); yields the log's path (None with ``mode="full"``: nothing is redirected)."""
    if mode != "summary":
        yield None
        return
    folder = Path(str(cfg.trainer.default_local_dir))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / GRPO_LOG
    total = cfg.trainer.get("total_training_steps")
    sys.stdout.flush()
    sys.stderr.flush()
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    start = os.fstat(log_fd).st_size
    saved_out, saved_err = os.dup(1), os.dup(2)
    os.write(saved_out, f"verl's and Ray's output: {path}; one line per step below\n".encode())
    stop = threading.Event()
    follower = threading.Thread(
        target=_tail, args=(path, start, saved_out, int(total) if total else None, stop, heartbeat), daemon=True
    )
    failed = True
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        follower.start()
        yield path
        failed = False
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        stop.set()
        if follower.is_alive():
            follower.join(timeout=10)
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (saved_out, saved_err, log_fd):
            os.close(fd)
        if failed:
            print(f"GRPO failed; the last lines of {path}:", file=sys.stderr)
            for line in _last_lines(path):
                print(f"  {line}", file=sys.stderr)
        else:
            print(f"verl's and Ray's output: {path}", flush=True)
