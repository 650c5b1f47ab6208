"""Offline text material: haystack sentences, names, places, keys and values.

Word lists come from the ``faker`` package (its English lorem words, first and last names,
cities and countries) — they ship inside the wheel, nothing is downloaded. All generation goes
through the caller's ``random.Random``, so output is deterministic in the seed.
"""

from __future__ import annotations

import random
import string
import uuid
from functools import lru_cache

__all__ = [
    "words",
    "sentence",
    "haystack",
    "first_names",
    "cities",
    "countries",
    "alnum",
    "uuid_str",
    "number_str",
]


@lru_cache(maxsize=1)
def words() -> tuple[str, ...]:
    from faker.providers.lorem.en_US import Provider

    return tuple(sorted(set(w for w in Provider.word_list if w.isalpha())))


@lru_cache(maxsize=1)
def first_names() -> tuple[str, ...]:
    from faker.providers.person.en_US import Provider

    return tuple(sorted(set(Provider.first_names)))


@lru_cache(maxsize=1)
def cities() -> tuple[str, ...]:
    from faker.providers.address.en_US import Provider

    # faker composes city names as <first name><suffix> ("Helenfurt"); do the same, deterministically
    return tuple(sorted({f"{n}{s}" for n in first_names()[:300] for s in Provider.city_suffixes}))


@lru_cache(maxsize=1)
def countries() -> tuple[str, ...]:
    from faker.providers.address import Provider

    return tuple(sorted(set(Provider.countries)))


def sentence(rng: random.Random, min_words: int = 8, max_words: int = 18) -> str:
    vocab = words()
    n = rng.randint(min_words, max_words)
    text = " ".join(vocab[rng.randrange(len(vocab))] for _ in range(n))
    return text[0].upper() + text[1:] + "."


def haystack(rng: random.Random):
    """An endless stream of sentences."""
    while True:
        yield sentence(rng)


_ALNUM = string.ascii_lowercase + string.digits


def alnum(rng: random.Random, length: int = 10) -> str:
    return "".join(rng.choices(_ALNUM, k=length))


def uuid_str(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def number_str(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randrange(10 ** (digits - 1), 10**digits))
