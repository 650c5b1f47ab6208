"""The RLM's task sets: one example of a task (:func:`make_task`), its score (:func:`score_answer`), and
the schema of a set of them (:class:`TaskSet`, :class:`TaskRun`: the configs' ``data.train``/``val`` and
``tasks``). Each task's generator and scorer live in its module (``niah``, ``oolong``, ``oolong_pairs``,
``mrcr``)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recallm.errors import RecallmError
from recallm.eval.types import parse_length
from recallm.rlm.tasks import mrcr, niah, oolong, oolong_pairs
from recallm.rlm.tasks.common import MAX_LENGTH, MIN_LENGTH, TASKS, TaskExample, TaskScore, TokenCounter, context_text

__all__ = ["make_task", "score_answer", "TaskSet", "TaskRun", "task_specs"]

_SCORERS = {"s_niah": niah.score, "oolong": oolong.score, "oolong_pairs": oolong_pairs.score, "mrcr": mrcr.score}


def make_task(
    task: str,
    length: int,
    index: int,
    *,
    seed: int = 0,
    counter: TokenCounter | None = None,
    tolerance: float = 0.02,
    max_pair_users: int | None = None,
    needles: int = 2,
) -> TaskExample:
    """One example of ``task`` at ``length`` tokens, deterministic in (seed, task, length, index)
    (and ``needles`` for ``mrcr``)."""
    if task not in TASKS:
        raise RecallmError(f"unknown RLM task {task!r}; known: {', '.join(TASKS)}")
    if not MIN_LENGTH <= length <= MAX_LENGTH:
        raise RecallmError(f"bad length {length} for task {task}: expected {MIN_LENGTH} to {MAX_LENGTH} tokens")
    if not 0 < tolerance < 0.5:
        raise RecallmError(f"tolerance must be in (0, 0.5), got {tolerance}")
    if isinstance(needles, bool) or not isinstance(needles, int) or needles < 1:
        raise RecallmError(f"needles must be a positive integer, got {needles!r}")
    if max_pair_users is not None and (isinstance(max_pair_users, bool) or max_pair_users < 2):
        raise RecallmError(f"max_pair_users must be >= 2 or null, got {max_pair_users!r}")
    counter = counter or TokenCounter()
    tag = f"{seed}|{task}|{length}|{index}" + (f"|{needles}" if task == "mrcr" else "")
    rng = random.Random(tag)
    if task == "s_niah":
        context, query, reference = niah.generate(rng, length, counter, tolerance)
    elif task == "oolong":
        context, query, reference = oolong.generate(rng, length, index, counter, tolerance)
    elif task == "oolong_pairs":
        context, query, reference = oolong_pairs.generate(rng, length, index, counter, tolerance, max_pair_users)
    else:
        context, query, reference = mrcr.generate(rng, length, counter, tolerance, needles)
    return TaskExample(task, length, index, context, query, reference, tokens=counter.count(context_text(context)))


@dataclass(frozen=True)
class TaskSet:
    """The schema of a task set: ``data.train``/``data.val`` of ``configs/rlm_train.yaml`` (and, with
    ``TaskRun``'s two more keys, ``tasks`` of ``configs/rlm.yaml``). Read with
    ``recallm.config.typed``; the defaults are ``make_task``'s."""

    names: Any = ()  # a task name or a list of them (``TASKS``)
    lengths: Any = ()  # token counts or their short forms (8K, 1M), one or a list
    per_cell: int = 1  # examples per task and length
    seed: int = 0
    tolerance: float = 0.02  # contexts land within this share of the target length
    max_pair_users: int | None = None  # oolong_pairs: cap the users meeting the condition
    needles: int = 2  # mrcr: identical requests in the conversation

    def specs(self) -> list[tuple[str, int, int]]:
        """(task, length, index) of every example (``task_specs``)."""
        return task_specs(self.names or [], self.lengths or [], self.per_cell)

    def task_kwargs(self) -> dict[str, Any]:
        """``make_task``'s keyword arguments of this set (the counter aside)."""
        return {
            "seed": self.seed,
            "tolerance": self.tolerance,
            "max_pair_users": self.max_pair_users,
            "needles": self.needles,
        }


@dataclass(frozen=True)
class TaskRun(TaskSet):
    """``tasks`` of ``configs/rlm.yaml``: a named task set, token-counted with a tokenizer."""

    name: str = "tasks"
    tokenizer_path: str | None = None  # count tokens with this tokenizer (None: 4 characters per token)


def task_specs(tasks: Sequence[str], lengths: Sequence[Any], per_cell: int) -> list[tuple[str, int, int]]:
    """(task, length, index) of every example of a task set; a ``RecallmError`` for bad settings."""
    names = [tasks] if isinstance(tasks, str) else list(tasks)
    if not names:
        raise RecallmError("tasks.names is empty; choose from " + ", ".join(TASKS))
    for name in names:
        if name not in TASKS:
            raise RecallmError(f"unknown RLM task {name!r}; known: {', '.join(TASKS)}")
    values = [lengths] if isinstance(lengths, (str, int)) else list(lengths)
    parsed = [parse_length(v, "tasks.lengths") for v in values]
    for n in parsed:
        if not MIN_LENGTH <= n <= MAX_LENGTH:
            raise RecallmError(f"tasks.lengths: bad length {n}; expected {MIN_LENGTH} to {MAX_LENGTH} tokens")
    if isinstance(per_cell, bool) or not isinstance(per_cell, int) or per_cell < 1:
        raise RecallmError(f"tasks.per_cell must be a positive integer, got {per_cell!r}")
    return [(t, n, i) for t in names for n in sorted(set(parsed)) for i in range(per_cell)]


def score_answer(task: str, answer: str | None, reference: Mapping[str, Any]) -> TaskScore:
    """The score of ``answer`` (None: no answer) for an example of ``task`` (its module's ``score``)."""
    if task not in TASKS:
        raise RecallmError(f"unknown RLM task {task!r}; known: {', '.join(TASKS)}")
    return _SCORERS[task](answer, reference)
