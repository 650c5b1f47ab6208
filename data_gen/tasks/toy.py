"""The toy lost-in-thought task the tiny pipeline trains and evaluates (``make demo``).

It keeps the paper's structure (§2, App. A) at a scale a ~1M-parameter model learns on a CPU:
the lookup key is not in the question, it must be *derived* by a reasoning step, and its value
then found in a dictionary far back in the prompt. Every word is one token of the tiny
tokenizer (``recallm.tiny``): keys are numbers, values invented words, instructions plain words.

Prompt (user message): an instruction, ``pairs`` lines ``k: v`` (distinct keys in
``[1, max_key]``, distinct values), then ``q = n ; key = q + 1`` with ``n = key - 1`` — the key
never appears in the question. Trace (``trace: worked``, the default): ``q = n ; key = k`` (the
reasoning step: the question's number copied, then the key computed from it), a recall span over
the gold line, and the answer ``v``; ``trace: short`` writes the step as ``key = k`` alone. With
``pairs`` (a count or ``[min, max]``) the dictionary's size is drawn and the mixture's ``lengths``
are upper bounds (natural length); with ``pairs: null`` lines are added until the prompt reaches
the target length (evaluation at 1x and 4x the longest training prompt; at most ``max_key`` lines).
"""

from __future__ import annotations

import random
from typing import Any

from data_gen.base import Draft, Piece, Row, Task, register
from recallm.errors import RecallmError

__all__ = ["ToyLookup"]


@register
class ToyLookup(Task):
    """Derive a key (``q + 1``), find it in the dictionary, answer its value (reasoning retrieval)."""

    name = "toy_lookup"
    category = "reasoning_retrieval"
    min_tokens = 40
    instructions = (
        "look up the key then give the value",
        "find the value of the key",
        "use the key to find the value",
        "state the value for the key",
        "give the value of the key",
    )

    TRACES = ("worked", "short")

    def __init__(
        self, pairs=(2, 64), max_key: int = 299, trace: str = "worked", data_source: str | None = None
    ) -> None:
        super().__init__(data_source)
        if trace not in self.TRACES:
            raise RecallmError(f"trace must be one of {list(self.TRACES)}, got {trace!r}")
        self.trace_style = trace
        from recallm.tiny import TOY_KEYS, TOY_VALUES

        if not 1 <= int(max_key) < len(TOY_KEYS):
            raise RecallmError(f"max_key must be in [1, {len(TOY_KEYS) - 1}], got {max_key}")
        self.max_key = int(max_key)
        self._values = TOY_VALUES
        self.limit = min(self.max_key, len(TOY_VALUES))  # keys 1..max_key, distinct values
        self.pairs: tuple[int, int] | None = None
        if pairs is not None:
            lo, hi = (int(pairs), int(pairs)) if isinstance(pairs, int) else (int(pairs[0]), int(pairs[1]))
            if not 1 <= lo <= hi <= self.limit:
                raise RecallmError(f"pairs must satisfy 1 <= min <= max <= {self.limit}, got {[lo, hi]}")
            self.pairs = (lo, hi)
        # with pairs, the dictionary's size is drawn and the prompt length follows (lengths are upper
        # bounds); without (pairs=null), lines are added until the prompt reaches the target length
        self.natural_length = self.pairs is not None
        self.max_tokens = None if self.pairs is not None else 5 * self.limit + self.min_tokens

    def draft(self, rng: random.Random) -> Draft:
        n = rng.randint(*self.pairs) if self.pairs is not None else self.limit
        keys = rng.sample(range(1, self.max_key + 1), n)
        values = rng.sample(self._values, n)
        key, value = keys[0], values[0]
        lines = [Piece(f"{k}: {v}", gold=k == key, meta={"key": str(k)}) for k, v in zip(keys, values, strict=True)]
        instruction, which = self.pick_instruction(rng)
        common = dict(
            instruction=instruction,
            question=f"q = {key - 1} ; key = q + 1",
            answers=[value],
            augmentations={"instruction": which},
            question_position="end",
            trace_info={"key": str(key), "value": value},
        )
        if self.pairs is None:  # fitted: the gold line is placed among as many others as fit
            return Draft(placed=lines[:1], distractors=iter(lines[1:]), **common)
        rng.shuffle(lines)  # natural length: every line is used, in this order
        common["augmentations"]["pairs"] = n
        return Draft(placed=[], distractors=iter(lines), fit_length=False, **common)

    def trace(self, row: Row, rng: random.Random) -> list[tuple[str, Any]]:
        # "worked" writes the step in two parts a ~1M-parameter model learns separately: ``n`` copied
        # after ``q =`` and ``n -> n + 1`` from a number a fixed few tokens back. "short" (``key = k``
        # alone) makes it find ``n`` and add at once, which it learnt late, at a step that varied from
        # run to run and between CPUs' rounding (docs/benchmarks.md, the toy demo).
        key = int(row.trace_info["key"])
        step = f"q = {key - 1} ; key = {key} " if self.trace_style == "worked" else f"key = {key} "
        return [("text", step), ("recall", 0)]
