"""The key-value prompt of ``recallm-decoding-demo``: a dictionary over the tiny model's toy vocabulary
(keys and values are single tokens of the tiny tokenizer) and a question for one key, deterministic
in a seed. Not a training task: the toy task the tiny pipeline trains on is ``data_gen.tasks.toy``."""

from __future__ import annotations

import random
from dataclasses import dataclass

from recallm.errors import RecallmError
from recallm.tiny import TOY_KEYS, TOY_VALUES

__all__ = ["ToyKVExample", "toy_kv_example"]


@dataclass(frozen=True)
class ToyKVExample:
    messages: list[dict[str, str]]
    key: str
    value: str
    dictionary: str  # the key-value lines exactly as they appear in the prompt


def toy_kv_example(seed: int, n_pairs: int = 24) -> ToyKVExample:
    """A dictionary of ``n_pairs`` distinct ``key: value`` lines and a question for one key."""
    if not 1 <= n_pairs <= min(len(TOY_KEYS), len(TOY_VALUES)):
        raise RecallmError(f"n_pairs must be in [1, {min(len(TOY_KEYS), len(TOY_VALUES))}], got {n_pairs}")
    rng = random.Random(seed)
    keys = rng.sample(TOY_KEYS, n_pairs)
    values = rng.sample(TOY_VALUES, n_pairs)
    target = rng.randrange(n_pairs)
    dictionary = "\n".join(f"{k}: {v}" for k, v in zip(keys, values, strict=True))
    question = f"Find the value of key {keys[target]} in the dictionary below.\n\n{dictionary}\n\nWhat is the value of key {keys[target]}?"
    return ToyKVExample(
        messages=[{"role": "user", "content": question}], key=keys[target], value=values[target], dictionary=dictionary
    )
