"""KV retrieval and math retrieval (the lost-in-thought task): look a key up in a dictionary.

Both share the dictionary: keys and values of a configurable type, laid out as lines
(``key: value``), CSV (``key,value`` under a header) or JSON (``"key": "value"`` inside braces).
In math retrieval the key is not given: it is the integer answer of a generated problem (a linear
equation or an arithmetic expression), and keys near the answer are always in the dictionary as
distractors, so a reasoning slip lands on a real but wrong entry.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np

from data_gen.base import Draft, Piece, Row, Task, check_choice, register
from data_gen.text import alnum, uuid_str, words
from recallm.errors import RecallmError

__all__ = [
    "KVRetrieval",
    "MathRetrieval",
    "KVDictionary",
    "KV_FORMATS",
    "KEY_TYPES",
    "VALUE_TYPES",
    "PROBLEM_TYPES",
    "PAPER_PROBLEM_TYPES",
]

KV_FORMATS = ("lines", "csv", "json")
_ALNUM_CHARS = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789"))
KEY_TYPES = ("int", "signed", "uuid", "toy")  # signed: +-(1..10^d - 1), as the paper's Figure 5 (``Key -3328: ...``)
VALUE_TYPES = ("alnum", "uuid", "word", "toy")


class KVDictionary:
    """Key and value generators and the three layouts."""

    def __init__(self, key_type: str, value_type: str, key_digits: int, label: str = "") -> None:
        self.key_type, self.value_type, self.key_digits = key_type, value_type, key_digits
        self.label = label  # before each key of the line layout ("Key " in the paper's Figure 5a)
        if key_type == "int":
            self.key_lo, self.key_hi = 10 ** (key_digits - 1), 10**key_digits - 1
        elif key_type == "signed":
            self.key_lo, self.key_hi = -(10**key_digits - 1), 10**key_digits - 1
        elif key_type == "toy":
            self.key_lo, self.key_hi = 0, 999

    @property
    def numeric_keys(self) -> bool:
        return self.key_type in ("int", "signed", "toy")

    def key(self, rng: random.Random) -> str:
        if self.key_type == "uuid":
            return uuid_str(rng)
        return str(rng.randint(self.key_lo, self.key_hi))

    def value(self, rng: random.Random) -> str:
        if self.value_type == "alnum":
            return alnum(rng, 10)
        if self.value_type == "uuid":
            return uuid_str(rng)
        if self.value_type == "word":
            vocab = words()
            return "-".join(vocab[rng.randrange(len(vocab))] for _ in range(2))
        from recallm.tiny import TOY_VALUES

        return TOY_VALUES[rng.randrange(len(TOY_VALUES))]

    @staticmethod
    def line(fmt: str, key: str, value: str, label: str = "") -> str:
        if fmt == "csv":
            return f"{key},{value}"
        if fmt == "json":
            return f'  "{key}": "{value}"'
        return f"{label}{key}: {value}"

    @staticmethod
    def frame(fmt: str) -> tuple[str, str, str]:
        """(header, separator, footer)."""
        if fmt == "csv":
            return "key,value\n", "\n", ""
        if fmt == "json":
            return "{\n", ",\n", "\n}"
        return "", "\n", ""

    def _batch(self, np_rng: np.random.Generator, rng: random.Random, n: int) -> tuple[list[str], list[str]]:
        """``n`` keys and ``n`` values, vectorised where the type allows."""
        if self.numeric_keys:
            keys = [str(k) for k in np_rng.integers(self.key_lo, self.key_hi + 1, size=n).tolist()]
        else:
            keys = [self.key(rng) for _ in range(n)]
        if self.value_type == "alnum":
            chars = _ALNUM_CHARS[np_rng.integers(0, len(_ALNUM_CHARS), size=(n, 10))]
            values = chars.view("<U10").ravel().tolist()
        else:
            values = [self.value(rng) for _ in range(n)]
        return keys, values

    def entries(self, rng: random.Random, fmt: str, used: set[str]) -> Iterator[Piece]:
        """Distractor lines with keys not in ``used`` (which is extended); stops when keys run out."""
        space = (self.key_hi - self.key_lo + 1) if self.numeric_keys else None
        np_rng = np.random.default_rng(rng.getrandbits(64))
        label = self.label

        def line(fmt: str, key: str, value: str) -> str:
            return self.line(fmt, key, value, label)

        while space is None or len(used) < space:
            keys, values = self._batch(np_rng, rng, 256)
            for key, value in zip(keys, values, strict=True):
                if key in used:
                    continue
                used.add(key)
                yield Piece(line(fmt, key, value))
                if space is not None and len(used) >= space:
                    return


class _KVBase(Task):
    min_tokens = 128

    def __init__(
        self,
        formats=KV_FORMATS,
        key_type: str = "int",
        value_type: str = "alnum",
        key_digits: int = 6,
        question_positions=("end", "beginning", "both"),
        data_source: str | None = None,
    ) -> None:
        super().__init__(data_source)
        self.formats = check_choice("formats", formats, KV_FORMATS)
        check_choice("key_type", key_type, KEY_TYPES)
        check_choice("value_type", value_type, VALUE_TYPES)
        self.question_positions = check_choice("question_positions", question_positions, ("end", "beginning", "both"))
        if not 2 <= int(key_digits) <= 12:
            raise RecallmError(f"key_digits must be in [2, 12], got {key_digits}")
        self.dictionary = KVDictionary(key_type, value_type, int(key_digits))


@register
class KVRetrieval(_KVBase):
    """Find the value of a given key in a dictionary (retrieval, subEM, standard F1)."""

    name = "kv_retrieval"
    category = "retrieval"
    instructions = (
        "Below is a dictionary of key-value pairs in {fmt} format. Find the value stored under the key the question names.",
        "The following {fmt} data maps keys to values. Look up the requested key and report its value exactly.",
        "You are given a lookup table ({fmt}). Answer the question by retrieving the value for the given key.",
        "Read the key-value store below ({fmt} format) and return the value associated with the queried key, copied exactly.",
        "Each entry below pairs a key with a value ({fmt}). Locate the entry for the key in the question and give its value.",
    )

    def draft(self, rng: random.Random) -> Draft:
        fmt = rng.choice(self.formats)
        header, sep, footer = self.dictionary.frame(fmt)
        key, value = self.dictionary.key(rng), self.dictionary.value(rng)
        gold = Piece(self.dictionary.line(fmt, key, value), gold=True, meta={"key": key})
        instruction, which = self.pick_instruction(rng, fmt=fmt.upper() if fmt != "lines" else "line-by-line")
        return Draft(
            instruction=instruction,
            question=f"Question: what is the value for the key {key}?",
            placed=[gold],
            distractors=self.dictionary.entries(rng, fmt, {key}),
            answers=[value],
            augmentations={"kv_format": fmt, "instruction": which},
            header=header,
            separator=sep,
            footer=footer,
            question_position=self.pick_question_position(rng, self.question_positions),
            trace_info={"key": key, "value": value},
        )

    def trace(self, row: Row, rng: random.Random) -> list[tuple[str, Any]]:
        key = row.trace_info["key"]
        return [
            ("text", f"The question asks for the value of key {key}. I look it up: "),
            ("recall", 0),
            ("text", f" So the value is {row.trace_info['value']}."),
        ]


def _linear(rng: random.Random, x: int) -> tuple[str, list[str]]:
    a = rng.randint(3, 60)
    d = rng.randint(1, a - 1)
    b = rng.randint(1, 500)
    c = (a - d) * x + b
    problem = f"{a}x + {b} - {d}x = {c}"
    steps = [
        f"Combine the x terms: {a}x - {d}x = {a - d}x, so {a - d}x + {b} = {c}.",
        f"Subtract {b}: {a - d}x = {c - b}.",
        f"Divide by {a - d}: x = {x}.",
    ]
    return problem, steps


def _arithmetic(rng: random.Random, x: int) -> tuple[str, list[str]]:
    a, b = rng.randint(2, 90), rng.randint(2, 90)
    c = rng.randint(2, 12)
    total = (a + b) * c
    if total >= x:
        d = total - x
        problem = f"({a} + {b}) * {c} - {d}"
        last = f"{total} - {d} = {x}."
    else:
        d = x - total
        problem = f"({a} + {b}) * {c} + {d}"
        last = f"{total} + {d} = {x}."
    steps = [f"{a} + {b} = {a + b}.", f"{a + b} * {c} = {total}.", last]
    return problem, steps


def _offset(rng: random.Random, x: int) -> tuple[str, list[str]]:
    """``b + d`` or ``b - d`` with one digit ``d`` and no carry or borrow: only the last digit of
    ``b`` changes. The lightest reasoning step that still hides the key (a 135M model learns it in
    a few dozen SFT steps; the two-step problems above it does not)."""
    last = abs(x) % 10
    up, down = (last, 9 - last) if x >= 0 else (9 - last, last)  # room for + and - (in |b|'s last digit)
    ops = [op for op, room in (("+", up), ("-", down)) if room >= 1]
    op = rng.choice(ops)
    d = rng.randint(1, up if op == "+" else down)
    b = x - d if op == "+" else x + d
    return f"{b} {op} {d}", [f"{b} {op} {d} = {x}."]


PROBLEM_TYPES = {"linear": _linear, "arithmetic": _arithmetic, "offset": _offset}
#: the paper's problem types, the default of ``MathRetrieval`` and of the lost-in-thought benchmark
PAPER_PROBLEM_TYPES = ("linear", "arithmetic")


@register
class MathRetrieval(_KVBase):
    """Solve a math problem; its integer answer is the key to look up (reasoning retrieval)."""

    name = "math_retrieval"
    category = "reasoning_retrieval"
    instructions = (
        "Solve the math problem, then use its answer as a key: find that key in the {fmt} dictionary below and give its value.",
        "First work out the math problem. Its result is a key in the {fmt} table below; report the value stored under it.",
        "The answer to the math problem is the key you need. Look that key up in the following {fmt} data and return its value exactly.",
        "Compute the result of the problem, treat it as a lookup key, and retrieve the matching value from the {fmt} key-value pairs below.",
        "Below is a {fmt} dictionary. Solve the problem to obtain a key, then answer with the value associated with that key.",
    )

    def __init__(self, problem_types=PAPER_PROBLEM_TYPES, near_keys: int = 6, **kwargs) -> None:
        kwargs.setdefault("key_digits", 5)  # 90,000 keys: dictionaries up to ~128K tokens and beyond
        super().__init__(**kwargs)
        if not self.dictionary.numeric_keys:
            raise RecallmError("math_retrieval needs numeric keys (key_type int, signed or toy)")
        self.problem_types = check_choice("problem_types", problem_types, tuple(PROBLEM_TYPES))
        if not 0 <= int(near_keys) <= 50:
            raise RecallmError(f"near_keys must be in [0, 50], got {near_keys}")
        self.near_keys = int(near_keys)

    def draft(self, rng: random.Random) -> Draft:
        fmt = rng.choice(self.formats)
        header, sep, footer = self.dictionary.frame(fmt)
        d = self.dictionary
        x = rng.randint(max(d.key_lo, self.near_keys + 1), d.key_hi - self.near_keys)
        kind = rng.choice(self.problem_types)
        problem, steps = PROBLEM_TYPES[kind](rng, x)
        key, value = str(x), d.value(rng)
        used = {key}
        placed = [Piece(d.line(fmt, key, value), gold=True, meta={"key": key})]
        for delta in range(1, self.near_keys + 1):  # keys next to the answer are always there
            for k in (x - delta, x + delta):
                if d.key_lo <= k <= d.key_hi and str(k) not in used:
                    used.add(str(k))
                    placed.append(Piece(d.line(fmt, str(k), d.value(rng)), meta={"key": str(k)}))
        instruction, which = self.pick_instruction(rng, fmt=fmt.upper() if fmt != "lines" else "line-by-line")
        question = (
            f"Problem: solve for x: {problem}." if kind == "linear" else f"Problem: compute {problem}."
        ) + " Then give the value stored under that key."
        return Draft(
            instruction=instruction,
            question=question,
            placed=placed,
            distractors=d.entries(rng, fmt, used),
            answers=[value],
            augmentations={"kv_format": fmt, "problem_type": kind, "instruction": which},
            header=header,
            separator=sep,
            footer=footer,
            question_position=self.pick_question_position(rng, self.question_positions),
            trace_info={"key": key, "value": value, "steps": steps},
        )

    def trace(self, row: Row, rng: random.Random) -> list[tuple[str, Any]]:
        info = row.trace_info
        return [
            ("text", " ".join(info["steps"]) + f" The key is {info['key']}. I look it up: "),
            ("recall", 0),
            ("text", f" So the value is {info['value']}."),
        ]
