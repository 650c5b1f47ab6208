"""``oolong_pairs`` - pair enumeration (after OOLONG-Pairs): the same records; the query asks for
every pair of user ids meeting a condition, one of eight kinds, as in the paper's query set:
both users have an instance labelled A; both have A and B; both have A or B; both have at
least k instances labelled A; both have exactly k; both have one labelled A dated after a
date; and two asymmetric ones - one user has A and the other has B; one has A dated before a
date and the other has B dated after it. Scored by F1 over the set of unordered pairs. The
generator arranges for about ``3 * sqrt(users)`` users to meet the condition (no fixed cap;
``max_pair_users`` sets one), so the gold set grows with the length.
"""

from __future__ import annotations

import datetime as _dt
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recallm.errors import RecallmError
from recallm.rlm.tasks.common import TaskScore, TokenCounter
from recallm.rlm.tasks.questions import LABEL_HELP, LABELS
from recallm.rlm.tasks.records import Record, long_date, random_day, record_lines, user_ids

__all__ = ["PAIR_CONDITIONS", "pair_condition_met", "generate", "parse_pairs", "pairs_f1", "score"]

PAIR_CONDITIONS = ("has", "has_all", "has_any", "at_least", "exactly", "after", "one_each", "one_each_dated")
_PAIR = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)|\[\s*(\d+)\s*,\s*(\d+)\s*\]|^\s*(\d+)\s*,\s*(\d+)\s*$", re.MULTILINE)


def pair_condition_met(condition: Mapping[str, Any], records: Sequence[Record]) -> tuple[bool, bool]:
    """For one user's records: (meets side A, meets side B) of ``condition``. Symmetric conditions
    have one side (both values equal); a pair qualifies when one user meets A and the other B."""
    kind = condition["type"]
    labels = condition["labels"]
    a = labels[0]
    count_a = sum(1 for _, label, _ in records if label == a)
    if kind == "has":
        ok = count_a >= 1
    elif kind == "has_all":
        ok = count_a >= 1 and any(label == labels[1] for _, label, _ in records)
    elif kind == "has_any":
        ok = any(label in labels for _, label, _ in records)
    elif kind == "at_least":
        ok = count_a >= int(condition["k"])
    elif kind == "exactly":
        ok = count_a == int(condition["k"])
    elif kind == "after":
        cut = _dt.date.fromisoformat(condition["date"])
        ok = any(label == a and day > cut for _, label, day in records)
    elif kind == "one_each":
        return count_a >= 1, any(label == labels[1] for _, label, _ in records)
    elif kind == "one_each_dated":
        cut = _dt.date.fromisoformat(condition["date"])
        return (
            any(label == a and day < cut for _, label, day in records),
            any(label == labels[1] and day > cut for _, label, day in records),
        )
    else:
        raise RecallmError(f"unknown pair condition {kind!r}; known: {', '.join(PAIR_CONDITIONS)}")
    return ok, ok


def _condition_text(condition: Mapping[str, Any]) -> str:
    kind, labels = condition["type"], condition["labels"]
    a = f"the label '{labels[0]}'"
    b = f"the label '{labels[1]}'" if len(labels) > 1 else ""
    day = long_date(_dt.date.fromisoformat(condition["date"])) if "date" in condition else ""
    return {
        "has": f"both users have at least one instance with {a}",
        "has_all": f"both users have at least one instance with {a} and at least one instance with {b}",
        "has_any": f"both users have at least one instance with {a} or {b}",
        "at_least": f"both users have at least {condition.get('k')} instances with {a}",
        "exactly": f"both users have exactly {condition.get('k')} instances with {a}",
        "after": f"both users have at least one instance with {a} dated after {day}",
        "one_each": f"one of the two users has at least one instance with {a} and the other has at least one "
        f"instance with {b}",
        "one_each_dated": f"one of the two users has an instance with {a} dated before {day} and the other has an "
        f"instance with {b} dated after {day}",
    }[kind]


def _make_condition(rng: random.Random, index: int) -> dict[str, Any]:
    kind = PAIR_CONDITIONS[index % len(PAIR_CONDITIONS)]
    a, b = rng.sample(LABELS, 2)
    condition: dict[str, Any] = {
        "type": kind,
        "labels": [a] if kind in ("has", "at_least", "exactly", "after") else [a, b],
    }
    if kind in ("at_least", "exactly"):
        condition["k"] = rng.choice((2, 3)) if kind == "at_least" else rng.choice((1, 2))
    if kind in ("after", "one_each_dated"):
        condition["date"] = _dt.date(rng.choice((2021, 2022)), rng.randint(1, 12), 1).isoformat()
    return condition


def _shape_user(rng: random.Random, condition: Mapping[str, Any], side: str, records: list[list]) -> None:
    """Rewrite a user's records (lists of [label, day]) so it meets ``side`` of the condition:
    ``a``, ``b``, ``both`` or ``none``."""
    kind, labels = condition["type"], condition["labels"]
    a = labels[0]
    b = labels[1] if len(labels) > 1 else None
    cut = _dt.date.fromisoformat(condition["date"]) if "date" in condition else None
    others = [label for label in LABELS if label not in labels]

    def put(label: str, day: _dt.date | None = None) -> None:
        slot = rng.choice([r for r in records if r[0] not in labels] or records)
        slot[0] = label
        if day is not None:
            slot[1] = day

    def purge(label: str, keep_if: Callable[[_dt.date], bool] | None = None) -> None:
        for r in records:
            if r[0] == label and (keep_if is None or not keep_if(r[1])):
                r[0] = rng.choice(others)

    if side == "none":
        if kind in ("has", "at_least", "exactly", "after"):
            if kind == "has":
                purge(a)
            elif kind == "at_least":
                extra = sum(r[0] == a for r in records) - (int(condition["k"]) - 1)
                for r in [r for r in records if r[0] == a][: max(0, extra)]:
                    r[0] = rng.choice(others)
            elif kind == "exactly":
                if sum(r[0] == a for r in records) == int(condition["k"]):
                    if len(records) > int(condition["k"]) and rng.random() < 0.5:
                        put(a)
                    else:
                        purge(a)
            else:
                for r in records:
                    if r[0] == a and r[1] > cut:
                        r[1] = random_day(rng, hi=cut)
        elif kind == "has_all":
            purge(rng.choice((a, b)))
        elif kind in ("has_any", "one_each"):
            purge(a)
            purge(b)
        else:  # one_each_dated: A only after the date, B only before it
            for r in records:
                if r[0] == a and r[1] < cut:
                    r[1] = random_day(rng, lo=cut + _dt.timedelta(days=1))
                elif r[0] == b and r[1] > cut:
                    r[1] = random_day(rng, hi=cut - _dt.timedelta(days=1))
        return
    if kind == "has":
        put(a)
    elif kind == "has_all":
        put(a)
        put(b)
    elif kind == "has_any":
        put(rng.choice((a, b)))
    elif kind in ("at_least", "exactly"):
        k = int(condition["k"])
        purge(a)
        for r in rng.sample(records, min(k, len(records))):
            r[0] = a
    elif kind == "after":
        put(a, random_day(rng, lo=cut + _dt.timedelta(days=1)))
    elif kind == "one_each":
        if side in ("a", "both"):
            put(a)
        if side in ("b", "both"):
            put(b)
        if side == "a":
            purge(b)
        elif side == "b":
            purge(a)
    else:  # one_each_dated
        if side in ("a", "both"):
            put(a, random_day(rng, hi=cut - _dt.timedelta(days=1)))
        if side in ("b", "both"):
            put(b, random_day(rng, lo=cut + _dt.timedelta(days=1)))


def generate(
    rng: random.Random,
    length: int,
    index: int,
    counter: TokenCounter,
    tolerance: float,
    max_pair_users: int | None,
):
    condition = _make_condition(rng, index)
    asymmetric = condition["type"] in ("one_each", "one_each_dated")
    need = max(2, int(condition.get("k", 1)) + 1)  # records a user meeting the condition needs

    def records_for(n: int) -> list[Record]:
        n_users = max(8, n // 5)
        users = user_ids(rng, n_users)
        q = max(3, min(n_users // 3, round(3 * math.sqrt(n_users))))
        if max_pair_users is not None:
            q = min(q, max_pair_users)
        per_user: dict[int, list[list]] = {u: [] for u in users}
        chosen = users[:q] if not asymmetric else users[: 2 * q]
        for user in chosen:  # users meant to meet the condition get enough records for it
            for _ in range(need):
                per_user[user].append([rng.choice(LABELS), random_day(rng)])
        for user in users:
            if not per_user[user]:
                per_user[user].append([rng.choice(LABELS), random_day(rng)])
        placed = sum(len(v) for v in per_user.values())
        for _ in range(max(0, n - placed)):
            per_user[rng.choice(users)].append([rng.choice(LABELS), random_day(rng)])
        for i, user in enumerate(users):
            if not asymmetric:
                side = "both" if i < q else "none"
            else:
                side = ("a", "b", "both")[i % 3] if i < 2 * q else "none"
            _shape_user(rng, condition, side, per_user[user])
        records = [(user, label, day) for user, recs in per_user.items() for label, day in recs]
        rng.shuffle(records)
        return records

    lines, records = record_lines(rng, length, counter, tolerance, records_for)
    by_user: dict[int, list[Record]] = {}
    for record in records:
        by_user.setdefault(record[0], []).append(record)
    side_a = sorted(u for u, recs in by_user.items() if pair_condition_met(condition, recs)[0])
    side_b = sorted(u for u, recs in by_user.items() if pair_condition_met(condition, recs)[1])
    pairs = sorted({(min(x, y), max(x, y)) for x in side_a for y in side_b if x != y})
    query = (
        f"List all pairs of user IDs such that {_condition_text(condition)}. {LABEL_HELP} Dates are those of the "
        "instances. Give each pair once, as (smaller ID, larger ID), one pair per line."
    )
    reference = {
        "kind": "pairs",
        "condition": condition,
        "pairs": [list(p) for p in pairs],
        "users": side_a if not asymmetric else {"a": side_a, "b": side_b},
    }
    return "\n".join(lines), query, reference


def parse_pairs(text: str) -> set[tuple[int, int]]:
    """Unordered pairs of ids written as ``(a, b)``, ``[a, b]`` or ``a, b`` lines (a == b is dropped)."""
    pairs = set()
    for match in _PAIR.finditer(text):
        numbers = [g for g in match.groups() if g is not None]
        x, y = int(numbers[0]), int(numbers[1])
        if x != y:
            pairs.add((min(x, y), max(x, y)))
    return pairs


def pairs_f1(predicted: set[tuple[int, int]], gold: set[tuple[int, int]]) -> tuple[float, float, float]:
    """(precision, recall, F1); two empty sets score 1."""
    if not predicted and not gold:
        return 1.0, 1.0, 1.0
    hits = len(predicted & gold)
    precision = hits / len(predicted) if predicted else 0.0
    recall = hits / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def score(answer: str | None, reference: Mapping[str, Any]) -> TaskScore:
    """F1 over the set of unordered pairs."""
    text = answer or ""
    gold = {(min(x, y), max(x, y)) for x, y in reference["pairs"]}
    precision, recall, f1 = pairs_f1(parse_pairs(text), gold)
    return TaskScore(f1, f1 == 1.0, {"precision": precision, "recall": recall, "f1": f1})
