"""``s_niah`` - single needle in a haystack: one sentence ``The special magic number for
<key> is <number>.`` among English-word sentences; the query asks for the number. Score 1 if
the answer contains the number (as a whole number), else 0. Constant information per query.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from recallm.rlm.tasks.common import TaskScore, TokenCounter, fit

__all__ = ["generate", "score"]


def generate(rng: random.Random, length: int, counter: TokenCounter, tolerance: float) -> tuple[str, str, dict]:
    from data_gen.text import haystack, number_str, words

    vocab = words()
    key = f"{rng.choice(vocab)}-{rng.choice(vocab)}"
    value = number_str(rng, 7)
    needle = f"The special magic number for {key} is {value}."
    stream = haystack(rng)
    sample = " ".join(next(stream) for _ in range(200))
    target_chars = int(length * counter.chars_per_token(sample) * (1 - tolerance / 2))
    sentences, chars = [], len(needle)
    while chars < target_chars:
        sentence = next(stream)
        sentences.append(sentence)
        chars += len(sentence) + 1
    at = rng.randint(0, len(sentences))
    sentences.insert(at, needle)
    lines = fit(sentences, length, counter, tolerance, keep={at})
    query = f"What is the special magic number for {key} mentioned in the context? Answer with the number."
    return " ".join(lines), query, {"value": value, "key": key, "depth": round(at / max(1, len(sentences)), 4)}


def score(answer: str | None, reference: Mapping[str, Any]) -> TaskScore:
    """1 if the answer contains the number (as a whole number), else 0."""
    text = answer or ""
    found = re.search(rf"(?<!\d){re.escape(str(reference['value']))}(?!\d)", text) is not None
    return TaskScore(float(found), found)
