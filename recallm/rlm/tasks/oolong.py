"""``oolong`` - aggregation (after OOLONG's trec_coarse split): many short records
``Date: ... || User: <id> || Instance: <question>``. Each question has a hidden label - the
kind of answer it asks for: abbreviation, entity, description, human, location, numeric. The
label must be *read*: every question names the thing it asks about (its founder, its
population, its capital, its full form ...) together with one or two things of other labels
about the same subject that it does not ask about ("not the ...", "I already have the ...",
"only the second is missing", "the remaining one"), in frames shared by every label that put
the asked thing first, last or in the middle, once or twice. Spotting the attribute phrases
therefore tells little (a keyword rule scores 0.27-0.38, tests/unit/test_rlm_tasks.py); the
generator's own grammar (``label_of``) reads every question exactly. Queries: how many instances have label L (a number, partial credit
``0.75 ** |error|``); is label A more common, less common or the same frequency as label B;
which label is the most common. Linear information per query.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from typing import Any

from recallm.errors import RecallmError
from recallm.rlm.tasks.common import (
    TaskScore,
    TokenCounter,
    first_number,
    first_option,
    numeric_partial_credit,
    stated_answer,
)
from recallm.rlm.tasks.questions import LABEL_HELP, LABELS
from recallm.rlm.tasks.records import Record, random_day, record_lines, user_ids

__all__ = ["generate", "score"]

_COMPARISONS = ("more common", "less common", "same frequency")


def _weights(rng: random.Random) -> list[float]:
    """Distinct label weights (so counts rarely tie)."""
    weights = [0.5 + 2.5 * rng.random() for _ in LABELS]
    return [w / sum(weights) for w in weights]


def generate(rng: random.Random, length: int, index: int, counter: TokenCounter, tolerance: float):
    weights = _weights(rng)

    def records_for(n: int) -> list[Record]:
        users = user_ids(rng, max(4, n // 6))
        return [(rng.choice(users), rng.choices(LABELS, weights)[0], random_day(rng)) for _ in range(n)]

    lines, records = record_lines(rng, length, counter, tolerance, records_for)
    counts = Counter(label for _, label, _ in records)
    kind = ("count", "compare", "most_common")[index % 3]
    if kind == "count":
        label = rng.choice(LABELS)
        query = f"How many instances in the data have the label '{label}'? {LABEL_HELP} Answer with the number."
        reference = {"kind": "count", "label": label, "value": counts[label]}
    elif kind == "compare":
        a, b = rng.sample(LABELS, 2)
        relation = (
            "more common" if counts[a] > counts[b] else "less common" if counts[a] < counts[b] else "same frequency"
        )
        query = (
            f"In the data, is the label '{a}' more common, less common, or the same frequency as the label '{b}'? "
            f"{LABEL_HELP} Answer with exactly one of: more common, less common, same frequency."
        )
        reference = {"kind": "compare", "labels": [a, b], "value": relation, "counts": [counts[a], counts[b]]}
    else:
        top = counts.most_common()
        if len(top) > 1 and top[0][1] == top[1][1]:  # a tie: ask the count question of the first instead
            label = top[0][0]
            query = f"How many instances in the data have the label '{label}'? {LABEL_HELP} Answer with the number."
            reference = {"kind": "count", "label": label, "value": counts[label]}
        else:
            query = (
                f"Which label is the most common among the instances in the data? {LABEL_HELP} Answer with the label."
            )
            reference = {"kind": "label", "value": top[0][0]}
    reference["counts_by_label"] = {label: counts[label] for label in LABELS}
    return "\n".join(lines), query, reference


def score(answer: str | None, reference: Mapping[str, Any]) -> TaskScore:
    """A count: OOLONG's partial credit; a comparison or a label: 1 if the first option stated is the gold one."""
    text = answer or ""
    kind = reference.get("kind")
    stated = stated_answer(text)
    if kind == "count":
        predicted = first_number(stated) if answer is not None else None
        score = numeric_partial_credit(predicted, float(reference["value"]))
        metrics = {"abs_error": abs(predicted - reference["value"])} if predicted is not None else {}
        return TaskScore(score, score == 1.0, metrics)
    if kind == "compare":
        ok = first_option(stated, _COMPARISONS) == reference["value"]
        return TaskScore(float(ok), ok)
    if kind == "label":
        ok = first_option(stated, LABELS) == reference["value"]
        return TaskScore(float(ok), ok)
    raise RecallmError(f"oolong reference has unknown kind {kind!r}")
