"""``mrcr`` - multi-round co-reference (after OpenAI's MRCR, the task of the paper's RL run): the
context is a long conversation (a list of ``{"role", "content"}`` messages) in which a user asks
for many pieces of writing ("write a poem about tapirs", "a riddle about lighthouses" ...) and
the assistant writes them; ``needles`` of the requests are the same request (same form, same
topic) with different answers. The query asks to prepend a random string to the k-th of them.
Score (as MRCR's grader): 0 if the answer does not start with the string, else the
``difflib.SequenceMatcher`` ratio of the rest to that answer. The paper trains on 2 needles at
32K-64K tokens and evaluates 8 needles at 512K-1M.
"""

from __future__ import annotations

import difflib
import json
import random
from collections.abc import Mapping
from typing import Any

from recallm.rlm.tasks.common import TaskScore, TokenCounter

__all__ = ["generate", "mrcr_score", "score"]

_FORMS = {  # form -> (lines or sentences, words per line) of its text
    "poem": (6, 7),
    "short story": (5, 16),
    "riddle": (3, 9),
    "limerick": (5, 7),
    "haiku": (3, 4),
    "song": (8, 6),
    "letter": (4, 14),
    "speech": (5, 15),
    "blog post": (5, 16),
    "social media post": (2, 12),
    "joke": (2, 10),
    "essay": (6, 17),
}
_TOPICS = (
    "tapirs", "lighthouses", "rain", "bicycles", "volcanoes", "coffee", "trains", "owls", "glaciers", "libraries",
    "octopuses", "lanterns", "deserts", "kites", "bridges", "honeybees", "thunderstorms", "violins", "harbors",
    "comets", "gardens", "foxes", "clocks", "markets", "canyons", "penguins", "windmills", "snowfall", "teapots",
    "orchards", "submarines", "cathedrals", "fireflies", "mountains", "typewriters", "rivers", "elephants",
    "bakeries", "satellites", "autumn", "whales", "maps", "tigers", "islands", "umbrellas", "forests", "robots",
    "sunsets", "chess", "dragons",
)  # fmt: skip
_ASKS = (
    "Write a {form} about {topic}.",
    "Could you write me a {form} about {topic}?",
    "I'd love a {form} about {topic}.",
    "Please write a {form} about {topic}.",
    "Give me a {form} about {topic}.",
    "Compose a {form} about {topic}, please.",
)
_ORDINALS = ("1st", "2nd", "3rd")


def _ordinal(k: int) -> str:
    return _ORDINALS[k - 1] if k <= 3 else f"{k}th"


def _writing(rng: random.Random, form: str, topic: str) -> str:
    from data_gen.text import words

    vocab = words()
    lines, per_line = _FORMS[form]
    out = []
    for i in range(lines):
        n = max(2, per_line + rng.randint(-2, 2))
        text = [rng.choice(vocab) for _ in range(n)]
        if i == 0 or rng.random() < 0.3:
            text.insert(rng.randrange(len(text) + 1), topic)
        line = " ".join(text)
        out.append(line[0].upper() + line[1:] + ("." if per_line > 8 else ""))
    return ("\n" if per_line <= 8 else " ").join(out)


def generate(rng: random.Random, length: int, counter: TokenCounter, tolerance: float, needles: int):
    from data_gen.text import alnum

    form = rng.choice(list(_FORMS))
    topic = rng.choice(_TOPICS)
    k = rng.randint(1, needles)
    prefix = alnum(rng, 10)

    def exchange(f: str, t: str) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": rng.choice(_ASKS).format(form=f, topic=t)},
            {"role": "assistant", "content": _writing(rng, f, t)},
        ]

    def filler() -> list[dict[str, str]]:
        while True:  # near misses on purpose: the same form about another topic, or the other way round
            f = form if rng.random() < 0.2 else rng.choice(list(_FORMS))
            t = topic if rng.random() < 0.2 else rng.choice(_TOPICS)
            if (f, t) != (form, topic):
                return exchange(f, t)

    sample = [m for _ in range(40) for m in filler()]
    per_exchange = max(1.0, counter.count(json.dumps(sample, ensure_ascii=False)) / 40)
    aim = length * (1 - tolerance / 2)
    n = max(needles + 2, int(aim / per_exchange))
    exchanges = [filler() for _ in range(n - needles)]
    is_needle = [False] * len(exchanges)
    for spot in sorted(rng.sample(range(n), needles)):
        exchanges.insert(spot, exchange(form, topic))
        is_needle.insert(spot, True)
    for _ in range(12):  # add or drop fillers (anywhere but the needles) until the length fits
        tokens = counter.count(json.dumps([m for pair in exchanges for m in pair], ensure_ascii=False))
        if length * (1 - tolerance) <= tokens <= length * (1 + tolerance):
            break
        delta = round((aim - tokens) / per_exchange) or (1 if tokens < aim else -1)
        if delta > 0:
            for _ in range(delta):
                at = rng.randint(0, len(exchanges))
                exchanges.insert(at, filler())
                is_needle.insert(at, False)
        else:
            fillers = [i for i, needle in enumerate(is_needle) if not needle]
            for i in sorted(rng.sample(fillers, min(-delta, len(fillers))), reverse=True):
                del exchanges[i]
                del is_needle[i]
    messages = [m for pair in exchanges for m in pair]
    spots = [i for i, needle in enumerate(is_needle) if needle]
    answers = [exchanges[s][1]["content"] for s in spots]
    query = (
        f"Prepend {prefix} to the {_ordinal(k)} {form} about {topic} in the conversation (`context` is the list of its "
        f"messages). Reply with {prefix} immediately followed by that {form}, exactly as it was written, and nothing "
        "else."
    )
    reference = {"kind": "mrcr", "prefix": prefix, "answer": answers[k - 1], "k": k, "needles": needles,
                 "form": form, "topic": topic}  # fmt: skip
    return messages, query, reference


def mrcr_score(answer: str, prefix: str, gold: str) -> float:
    """MRCR's grade: 0 without the prefix, else the similarity of the rest to the gold answer."""
    text = answer.strip()
    if not text.startswith(prefix):
        return 0.0
    return difflib.SequenceMatcher(None, text[len(prefix) :].strip(), gold.strip()).ratio()


def score(answer: str | None, reference: Mapping[str, Any]) -> TaskScore:
    """MRCR's grade (:func:`mrcr_score`); correct when it is 1."""
    text = answer or ""
    score = mrcr_score(text, str(reference["prefix"]), str(reference["answer"]))
    return TaskScore(score, score == 1.0, {"similarity": score})
