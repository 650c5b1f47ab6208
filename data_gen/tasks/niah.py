"""Multi-needle in a haystack: find every value stored for some keys among decoy needles.

The haystack is sentences of English words (``data_gen.text``). Needles read
``The special code for <key> is <value>.``; decoy needles use other keys. Varied per example:
decoy count, number of target keys, values per key, value type (numbers, words, UUIDs).
Answer: every value of the target keys (net recall); evidence: the target needles, at most
``max_needles`` of them (6: the paper's Table 5 gives retrieval 1-6 gold pieces; when the drawn
values per key add up to more, keys lose values at random, each keeping at least one).

Programmatic traces (``trace_style``): ``scan`` recalls the target needles in the order they stand
in the context (``Found one: <span> Another: <span> ...``); ``by_key`` goes through the keys in
the order the question names them and recalls each key's needles after naming it
(``key-a: <span>The special code for key-a is ...</span> key-b: ...``): the span starts with
what the question gives, as in key-value retrieval.
"""

from __future__ import annotations

import random
from typing import Any

from data_gen.base import Draft, Piece, Row, Task, check_choice, int_range, register
from data_gen.text import haystack, number_str, uuid_str, words
from recallm.errors import RecallmError

__all__ = ["MultiNIAH", "NEEDLE_VALUE_TYPES", "TRACE_STYLES"]

NEEDLE_VALUE_TYPES = ("number", "word", "uuid")
TRACE_STYLES = ("scan", "by_key")


@register
class MultiNIAH(Task):
    name = "multi_niah"
    category = "retrieval"
    min_tokens = 256
    instructions = (
        "Some special codes are hidden in the text below. Find every code given for the key(s) the question asks about.",
        "The passage below hides several statements of the form 'The special code for X is Y'. Report all codes for the requested key(s).",
        "Read the following text carefully: it contains special codes for various keys. List every code belonging to the key(s) in the question.",
        "Hidden in the long text below are special codes. Retrieve all of the codes that belong to the key(s) named in the question.",
    )

    def __init__(
        self,
        decoys=(0, 6),
        target_keys=(1, 3),
        values_per_key=(1, 3),
        value_types=NEEDLE_VALUE_TYPES,
        question_positions=("end", "beginning", "both"),
        max_needles: int = 6,
        trace_style: str = "scan",
        data_source: str | None = None,
    ) -> None:
        super().__init__(data_source)
        self.decoys = int_range("decoys", decoys)
        self.target_keys = int_range("target_keys", target_keys)
        self.values_per_key = int_range("values_per_key", values_per_key)
        if self.target_keys[0] < 1 or self.values_per_key[0] < 1:
            raise RecallmError("target_keys and values_per_key must be at least 1")
        if isinstance(max_needles, bool) or not isinstance(max_needles, int) or max_needles < self.target_keys[1]:
            raise RecallmError(
                f"max_needles must be an integer >= the most target keys ({self.target_keys[1]}), got {max_needles!r}"
            )
        self.max_needles = max_needles
        self.value_types = check_choice("value_types", value_types, NEEDLE_VALUE_TYPES)
        self.question_positions = check_choice("question_positions", question_positions, ("end", "beginning", "both"))
        if trace_style not in TRACE_STYLES:
            raise RecallmError(f"trace_style must be one of {list(TRACE_STYLES)}, got {trace_style!r}")
        self.trace_style = trace_style

    @staticmethod
    def _key(rng: random.Random) -> str:
        vocab = words()
        return "-".join(vocab[rng.randrange(len(vocab))] for _ in range(2))

    @staticmethod
    def _value(rng: random.Random, kind: str) -> str:
        if kind == "number":
            return number_str(rng, 7)
        if kind == "uuid":
            return uuid_str(rng)
        vocab = words()
        return vocab[rng.randrange(len(vocab))] + str(rng.randint(10, 99))

    def draft(self, rng: random.Random) -> Draft:
        kind = rng.choice(self.value_types)
        n_keys = rng.randint(*self.target_keys)
        n_decoys = rng.randint(*self.decoys)
        keys: list[str] = []
        while len(keys) < n_keys + n_decoys:
            k = self._key(rng)
            if k not in keys:
                keys.append(k)
        targets = keys[:n_keys]
        values: set[str] = set()
        drawn: list[tuple[str, str]] = []  # (key, value) in draw order
        for key in keys:
            for _ in range(rng.randint(*self.values_per_key)):
                value = self._value(rng, kind)
                while value in values:
                    value = self._value(rng, kind)
                values.add(value)
                drawn.append((key, value))
        targets_drawn = [i for i, (key, _) in enumerate(drawn) if key in targets]
        if len(targets_drawn) > self.max_needles:  # Table 5: at most max_needles gold needles
            left = {key: sum(k == key for k, _ in drawn) for key in targets}
            for i in rng.sample(targets_drawn, len(targets_drawn)):  # drop at random, one value per key kept
                if len(targets_drawn) <= self.max_needles:
                    break
                if left[drawn[i][0]] > 1:
                    left[drawn[i][0]] -= 1
                    targets_drawn.remove(i)
            drawn = [kv for i, kv in enumerate(drawn) if kv[0] not in targets or i in targets_drawn]
        placed, answers, per_key = [], [], {}
        for key, value in drawn:
            is_target = key in targets
            placed.append(Piece(f"The special code for {key} is {value}.", gold=is_target, meta={"key": key}))
            if is_target:
                answers.append(value)
                per_key.setdefault(key, []).append(value)
        rng.shuffle(placed)
        named = ", ".join(targets[:-1]) + (" and " if len(targets) > 1 else "") + targets[-1]
        instruction, which = self.pick_instruction(rng)
        return Draft(
            instruction=instruction,
            question=f"Question: what are all the special codes for {named}? List them separated by commas.",
            placed=placed,
            distractors=(Piece(s) for s in haystack(rng)),
            answers=answers,
            augmentations={
                "value_type": kind,
                "target_keys": n_keys,
                "decoys": n_decoys,
                "values": len(answers),
                "instruction": which,
            },
            separator=" ",
            question_position=self.pick_question_position(rng, self.question_positions),
            trace_info={"per_key": per_key},
        )

    def trace(self, row: Row, rng: random.Random) -> list[tuple[str, Any]]:
        if self.trace_style == "by_key":
            return self._trace_by_key(row)
        out: list[tuple[str, Any]] = [("text", "I need every special code for the requested keys. ")]
        for i, _gold in enumerate(row.gold):
            out.append(("text", "Found one: " if i == 0 else " Another: "))
            out.append(("recall", i))
        out.append(("text", f" That makes {len(row.gold)} code(s) in total."))
        return out

    def _trace_by_key(self, row: Row) -> list[tuple[str, Any]]:
        per_key = row.trace_info["per_key"]  # the target keys in the order the question names them
        out: list[tuple[str, Any]] = [("text", f"The question names {len(per_key)} key(s).")]
        for key in per_key:
            out.append(("text", f" {key}:"))
            prefix = f"The special code for {key} is "
            for i, gold in enumerate(row.gold):
                if gold["text"].startswith(prefix):
                    out += [("text", " "), ("recall", i)]
        out.append(("text", f" That makes {len(row.gold)} code(s) in total."))
        return out

    def answer_text(self, row: Row) -> str:
        return ", ".join(row.answers)
