"""Run an RLM on a generated task set (``recallm.rlm.tasks``), score it, resumably.

``run_tasks`` plans every (task, length, index), skips the ones already in
``<out_dir>/results.jsonl``, and for each pending one: generates the example, runs the RLM
(its trajectory goes to ``<out_dir>/trajectories/<task>-<length>-<index>.jsonl``), scores the
answer, appends the score to the trajectory (a ``score`` event) and one line to
``results.jsonl`` (flushed and fsynced). A rerun with the same configuration does only what is
left; another configuration in the same ``out_dir`` is refused (``overwrite=True`` starts
over) - the same rules as ``recallm-eval``, through its ``prepare_out_dir``.

``summarize_tasks`` gives, per task and length and per task overall: ``n``, ``score`` (mean),
``correct`` (share), ``outcomes`` (counts), and the means of ``turns``, ``tokens``,
``subcalls`` and ``wall_s``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError
from recallm.rlm.runner import RLM
from recallm.rlm.tasks import TokenCounter, make_task, score_answer
from recallm.rlm.trajectory import append_event

__all__ = ["run_tasks", "summarize_tasks", "TRAJECTORY_DIR"]

log = logging.getLogger(__name__)
TRAJECTORY_DIR = "trajectories"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _cell(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    outcomes: dict[str, int] = {}
    for r in records:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    return {
        "n": len(records),
        "score": _mean([float(r["score"]) for r in records]),
        "correct": _mean([float(bool(r["correct"])) for r in records]),
        "outcomes": dict(sorted(outcomes.items())),
        "turns": _mean([float(r["turns"]) for r in records]),
        "tokens": _mean([float(r["usage"]["tokens"]) for r in records]),
        "subcalls": _mean([float(r["usage"]["subcalls"]) for r in records]),
        "wall_s": _mean([float(r["usage"]["wall_s"]) for r in records]),
    }


def summarize_tasks(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary of a task set's results (see module doc)."""
    out: dict[str, Any] = {}
    for task in sorted({r["task"] for r in records}):
        recs = [r for r in records if r["task"] == task]
        by_length = {
            str(n): _cell([r for r in recs if int(r["length"]) == n]) for n in sorted({int(r["length"]) for r in recs})
        }
        out[task] = {"overall": _cell(recs), "by_length": by_length}
    return {"n_examples": len(records), "tasks": out, "overall": _cell(records) if records else None}


def run_tasks(
    rlm: RLM,
    specs: Sequence[tuple[str, int, int]],
    out_dir: str | Path,
    *,
    seed: int = 0,
    counter: TokenCounter | None = None,
    tolerance: float = 0.02,
    max_pair_users: int | None = None,
    needles: int = 2,
    fingerprint: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    parallel: int = 1,
    limit: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run (or finish) a task set into ``out_dir``; returns the summary (module doc).
    ``parallel`` tasks run at once (threads; each has its own REPL process)."""
    from tqdm import tqdm

    from recallm.eval.runner import RESULTS_FILE, SUMMARY_FILE, prepare_out_dir, read_results
    from recallm.io import write_json_atomic

    if parallel < 1:
        raise RecallmError(f"parallel must be >= 1, got {parallel}")
    out_dir = Path(out_dir)
    prepare_out_dir(out_dir, fingerprint or {}, overwrite)
    traj_dir = out_dir / TRAJECTORY_DIR
    traj_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / RESULTS_FILE
    done = {r["task_id"] for r in read_results(results)}
    pending = [s for s in specs if f"{s[0]}/{s[1]}/{s[2]}" not in done]
    if limit is not None:
        pending = pending[: max(0, int(limit))]
    log.info("%d tasks planned, %d done, %d to run now", len(specs), len(specs) - len(pending), len(pending))
    lock = threading.Lock()
    bar = tqdm(total=len(pending), desc="rlm", unit="task", disable=not progress or not pending)

    def one(spec: tuple[str, int, int], f) -> None:
        task, length, index = spec
        example = make_task(
            task,
            length,
            index,
            seed=seed,
            counter=counter,
            tolerance=tolerance,
            max_pair_users=max_pair_users,
            needles=needles,
        )
        path = traj_dir / f"{task}-{length}-{index}.jsonl"
        result = rlm.run(example.context, example.query, task_id=example.task_id, trajectory=path)
        score = score_answer(task, result.answer, example.reference)
        append_event(
            path,
            {
                "event": "score",
                "rlm": "0",
                "task": task,
                "score": score.score,
                "correct": score.correct,
                "metrics": score.metrics,
                "reference": example.reference,
            },
        )
        record = {
            "task_id": example.task_id,
            "task": task,
            "length": length,
            "index": index,
            "tokens": example.tokens,
            "answer": result.answer,
            "outcome": result.outcome,
            "reason": result.reason,
            "turns": result.turns,
            "usage": result.usage,
            "score": score.score,
            "correct": score.correct,
            "metrics": score.metrics,
            "trajectory": str(path.relative_to(out_dir)),
        }
        with lock:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
            bar.update(1)

    try:
        with results.open("a") as f:
            if parallel == 1:
                for spec in pending:
                    one(spec, f)
            else:
                with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="rlm-task") as pool:
                    for future in [pool.submit(one, spec, f) for spec in pending]:
                        future.result()
    finally:
        bar.close()
    planned = {f"{t}/{n}/{i}" for t, n, i in specs}
    records = [r for r in read_results(results) if r["task_id"] in planned]
    summary = summarize_tasks(records)
    summary["complete"] = len(records) == len(planned)
    summary["planned"] = len(planned)
    write_json_atomic(out_dir / SUMMARY_FILE, summary)
    return summary
