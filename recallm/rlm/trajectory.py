"""RLM trajectories: one JSONL file per task, one event per line, written as the run goes.

Events (every one has ``event``, ``rlm`` - the instance id: ``0`` for the root, ``0.1``,
``0.1.2``... for recursive children - ``depth`` and ``time``, seconds since the task started):

* ``start`` - ``task_id``, ``query``, ``context`` (metadata: type, chars, approx tokens,
  preview), ``isolation``, ``models``, ``settings``, ``messages`` (the system prompt and the
  first user message: the root's whole prompt at turn 1), ``parent`` (for a child);
* ``turn`` - ``turn`` (1-based), ``reply`` (raw model text), ``visible`` (what enters the root's
  history), ``prompt_tokens``, ``completion_tokens``, ``latency_s``, ``finish_reason``,
  ``cells`` (each: ``code``, ``stdout``, ``stdout_chars``, ``error``, ``timed_out``,
  ``elapsed``, ``final``, ``restarted``), ``final`` (how the turn ended the run, if it did),
  ``observation`` (the user message the root reads next, None after the last turn); the one last
  call at the iteration limit is a ``turn`` too, numbered ``max_iterations + 1``, with
  ``final_call`` true and no cells;
* ``subcall`` - ``turn``, ``kind``, ``index`` (in a batch), ``prompt_chars``, ``prompt``
  (a preview), ``response`` (a preview), ``prompt_tokens``, ``completion_tokens``,
  ``latency_s``, ``attempts``, ``error``; for ``rlm_query`` also ``child`` (its instance id)
  and ``outcome``, or ``fallback`` (why a plain sub-call answered it: no REPL could come free);
* ``end`` - ``outcome`` (``final`` | ``plain_text`` | ``max_iterations`` | ``budget_exhausted``
  | ``error``), ``reason``, ``answer``, ``turns``, ``usage`` (tokens, sub-calls, wall time);
* ``score`` - written by a task runner after the root's ``end``: ``score``, ``correct``,
  ``metrics``, ``reference``.

``load_trajectory`` reads one back (a partial last line, from a crash, is ignored);
``root_conversation`` rebuilds the root's messages turn by turn (``recallm.rlm.sft_data``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError

__all__ = ["TrajectoryWriter", "load_trajectory", "reading", "root_conversation", "trajectory_files", "preview", "append_event"]


def preview(text: str | None, limit: int) -> str | None:
    """``text`` cut to ``limit`` characters (with a note of the rest)."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}[... {len(text) - limit:,} more characters]"


class TrajectoryWriter:
    """Appends events to ``path`` (flushed per event; thread-safe) and keeps them in ``events``.
    ``path=None`` keeps them in memory only."""

    def __init__(self, path: str | Path | None, *, max_text_chars: int = 4000) -> None:
        self.path = Path(path) if path is not None else None
        self.max_text_chars = int(max_text_chars)
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", encoding="utf-8")

    def write(self, event: Mapping[str, Any]) -> None:
        record = {**event, "time": round(time.monotonic() - self._start, 4)}
        line = json.dumps(record, ensure_ascii=False, default=str)
        with self._lock:
            self.events.append(json.loads(line))
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_trajectory(path: str | Path) -> list[dict[str, Any]]:
    """The events of a trajectory file; a ``RecallmError`` naming a damaged line or a file that
    is no trajectory."""
    path = Path(path)
    if not path.is_file():
        raise RecallmError(f"trajectory file {path} does not exist")
    events = []
    try:
        lines = path.read_bytes().decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise RecallmError(f"{path} is not UTF-8 text at byte {exc.start}: not an RLM trajectory") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except RecursionError:
            raise RecallmError(f"{path}:{number}: JSON nested too deeply; the trajectory is damaged") from None
        except json.JSONDecodeError:
            if number == len(lines):  # a last line cut short by a crash
                break
            raise RecallmError(f"{path}:{number}: not valid JSON; the trajectory is damaged") from None
        if not isinstance(event, dict) or "event" not in event:
            raise RecallmError(f"{path}:{number}: not a trajectory event (no 'event' key)")
        events.append(event)
    if not events or events[0].get("event") != "start":
        raise RecallmError(f"{path} is not an RLM trajectory (it does not begin with a start event)")
    return events


@contextlib.contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Around the use of one trajectory's events: a field of the wrong JSON type (a number where
    text is, a string where a list is), which the code reading it trips over, is one ``RecallmError``
    naming the file instead of a traceback."""
    try:
        yield
    except RecallmError:
        raise
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as exc:
        raise RecallmError(f"{path}: an event field has an unexpected type or value ({type(exc).__name__}: {exc})") from None


def trajectory_files(paths: Iterable[str | Path]) -> list[Path]:
    """Trajectory files from files and directories (``*.jsonl`` inside, sorted)."""
    out: list[Path] = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            out.extend(sorted(path.glob("*.jsonl")))
        elif path.is_file():
            out.append(path)
        else:
            raise RecallmError(f"trajectory path {path} does not exist")
    return out


def root_conversation(events: list[dict[str, Any]], rlm: str = "0") -> list[tuple[list[dict[str, str]], str]]:
    """For each turn of instance ``rlm``: (the messages the model read, the raw reply it wrote)."""
    start = next((e for e in events if e.get("event") == "start" and e.get("rlm") == rlm), None)
    if start is None:
        raise RecallmError(f"the trajectory has no instance {rlm!r}")
    messages = [dict(m) for m in start.get("messages") or []]
    out = []
    for event in events:
        if event.get("event") != "turn" or event.get("rlm") != rlm:
            continue
        out.append(([dict(m) for m in messages], str(event.get("reply", ""))))
        messages.append({"role": "assistant", "content": str(event.get("visible", ""))})
        if event.get("observation") is not None:
            messages.append({"role": "user", "content": str(event["observation"])})
    return out


def append_event(path: str | Path, event: Mapping[str, Any]) -> None:
    """Add one event to a finished trajectory file (a task runner's ``score``)."""
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(json.dumps(dict(event), ensure_ascii=False, default=str) + "\n")
