"""Long-context tasks for RLMs, generated offline and deterministically from a seed, with scorers.

Four tasks, after the RLM paper's scaling study (lengths from 8K to 1M tokens and beyond) and its
RL experiment:

* ``s_niah`` - single needle in a haystack: one sentence ``The special magic number for
  <key> is <number>.`` among English-word sentences; the query asks for the number. Score 1 if
  the answer contains the number (as a whole number), else 0. Constant information per query.
* ``oolong`` - aggregation (after OOLONG's trec_coarse split): many short records
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
* ``oolong_pairs`` - pair enumeration (after OOLONG-Pairs): the same records; the query asks for
  every pair of user ids meeting a condition, one of eight kinds, as in the paper's query set:
  both users have an instance labelled A; both have A and B; both have A or B; both have at
  least k instances labelled A; both have exactly k; both have one labelled A dated after a
  date; and two asymmetric ones - one user has A and the other has B; one has A dated before a
  date and the other has B dated after it. Scored by F1 over the set of unordered pairs. The
  generator arranges for about ``3 * sqrt(users)`` users to meet the condition (no fixed cap;
  ``max_pair_users`` sets one), so the gold set grows with the length.
* ``mrcr`` - multi-round co-reference (after OpenAI's MRCR, the task of the paper's RL run): the
  context is a long conversation (a list of ``{"role", "content"}`` messages) in which a user asks
  for many pieces of writing ("write a poem about tapirs", "a riddle about lighthouses" ...) and
  the assistant writes them; ``needles`` of the requests are the same request (same form, same
  topic) with different answers. The query asks to prepend a random string to the k-th of them.
  Score (as MRCR's grader): 0 if the answer does not start with the string, else the
  ``difflib.SequenceMatcher`` ratio of the rest to that answer. The paper trains on 2 needles at
  32K-64K tokens and evaluates 8 needles at 512K-1M.

Lengths are in tokens, counted with ``TokenCounter``: a tokenizer's exact count, or 4
characters per token without one (the default) - on the text of the context (the JSON of a
conversation). Contexts land within ``tolerance`` of the target. The gold answer is always
computed from the context as finally generated.

Scoring reads the *stated* answer, as the benchmarks' graders do: the text after the last
``Answer:`` / ``answer is`` marker when there is one, else the whole answer; a count is the
first number stated there, a label or a comparison the first option stated there.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import json
import math
import random
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recallm.errors import RecallmError
from recallm.eval.types import parse_length

__all__ = [
    "TASKS",
    "LABELS",
    "PAIR_CONDITIONS",
    "TaskExample",
    "TaskScore",
    "TokenCounter",
    "make_task",
    "task_specs",
    "score_answer",
    "stated_answer",
    "label_of",
    "parse_pairs",
    "pairs_f1",
    "numeric_partial_credit",
    "pair_condition_met",
    "MIN_LENGTH",
    "MAX_LENGTH",
]

TASKS = ("s_niah", "oolong", "oolong_pairs", "mrcr")
LABELS = ("abbreviation", "entity", "description", "human", "location", "numeric")
PAIR_CONDITIONS = ("has", "has_all", "has_any", "at_least", "exactly", "after", "one_each", "one_each_dated")
MIN_LENGTH, MAX_LENGTH = 1024, 4 * 1024 * 1024
_LABEL_HELP = (
    "Each instance is a question. Its label is the kind of answer the question asks for, one of: abbreviation "
    "(what an abbreviation stands for), entity (a thing: an animal, a color, a food, an instrument, a sport ...), "
    "description (an explanation, a reason, a definition), human (a person), location (a place), numeric (a number, "
    "a date, a count, an amount). The labels are not written in the data: infer them from the questions."
)

# --- questions whose label needs reading -----------------------------------------------------------

# Every question names the thing it asks about *and* one or two other things about the same subject
# that it does not ask about (each of another label): "not the ...", "I already have the ...", "the
# remaining one". Which named thing is asked is said by the meaning of the sentence - its negation,
# "the first" / "the second", what is left over - not by the position or count of the names, so a
# classifier that spots the attribute phrases below (even the whole list) cannot tell the label.
# {a}: the thing asked about; {d1}, {d2}: things not asked about; {subj}: the subject.
_FRAMES = (
    "I already know the {d1} of {subj}. What is the {a} of {subj}?",
    "What is the {a} of {subj}? Not the {d1} - that one I have.",
    "Forget the {d1} of {subj} and the {d2}; what I need is the {a}.",
    "The {a} of {subj} is what I'm after, not its {d1} or its {d2}.",
    "Between the {d1} of {subj} and its {a}, only the second is missing from my notes; what is it?",
    "Between the {a} of {subj} and its {d1}, only the first is missing from my notes; what is it?",
    "Of the {d1}, the {a} and the {d2} of {subj}, I have written down the {d1} and the {d2}. Tell me the remaining one.",
    "Not the {d1} of {subj}, but the {a} - and not the {d2} either.",
    "I have the {d1} of {subj}, but not the {a}, and the {d2} I have too; could you find the missing one?",
    "Someone told me the {d1} of {subj}, could not give me the {a}, and added the {d2}; do you know the one "
    "they could not give?",
    "Not the {d1} of {subj}: the {a}. Yes, the {a}, not the {d2}.",
)
# label -> (the thing asked about, the kinds of subject it fits); subjects are shared by every label
_ATTRIBUTES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "abbreviation": (
        ("full form", ("acronym",)),
        ("expansion", ("acronym",)),
        ("long form", ("acronym",)),
        ("spelled-out name", ("acronym", "org")),
        ("meaning of the initials", ("acronym",)),
        ("unabbreviated title", ("acronym", "org")),
    ),
    "entity": (
        ("national animal", ("country",)),
        ("signature dish", ("city", "country")),
        ("official colour", ("org", "acronym", "country")),
        ("favourite instrument", ("person",)),
        ("best-known product", ("org", "acronym")),
        ("mascot", ("org", "acronym", "city")),
        ("main crop", ("country", "city")),
        ("preferred sport", ("person",)),
        ("currency", ("country",)),
    ),
    "description": (
        ("origin of the name", ("city", "org", "acronym", "country")),
        ("reason for the fame", ("person", "city", "org")),
        ("purpose", ("org", "acronym", "thing")),
        ("history", ("city", "org", "thing")),
        ("meaning of the motto", ("org", "city", "country")),
        ("significance", ("thing", "org")),
        ("cause of the decline", ("city", "org", "acronym")),
    ),
    "human": (
        ("founder", ("org", "acronym", "city")),
        ("first mayor", ("city",)),
        ("current leader", ("org", "country", "acronym")),
        ("inventor", ("thing",)),
        ("chief architect", ("thing", "org")),
        ("best-known resident", ("city",)),
        ("original owner", ("thing", "org")),
        ("spokesperson", ("org", "acronym")),
    ),
    "location": (
        ("capital", ("country",)),
        ("headquarters", ("org", "acronym")),
        ("birthplace", ("person",)),
        ("exact location", ("org", "thing")),
        ("hometown", ("person",)),
        ("largest port", ("country",)),
        ("nearest airport", ("city",)),
        ("home stadium", ("org",)),
    ),
    "numeric": (
        ("population", ("city", "country")),
        ("founding year", ("org", "city", "acronym")),
        ("height", ("thing", "person")),
        ("total area", ("country", "city")),
        ("number of employees", ("org", "acronym")),
        ("age", ("person",)),
        ("annual budget", ("org", "acronym", "city")),
        ("distance to the coast", ("city",)),
        ("elevation", ("city",)),
    ),
}
_ORG_KINDS = ("company", "society", "museum", "festival", "party", "club", "institute", "foundation")
_ATTR_LABEL = {attr: label for label, attrs in _ATTRIBUTES.items() for attr, _ in attrs}
_ATTR_BY_LENGTH = sorted(_ATTR_LABEL, key=len, reverse=True)
_ATTR_KINDS = {attr: kinds for attrs in _ATTRIBUTES.values() for attr, kinds in attrs}
_ANY_ATTR = "|".join(re.escape(a) for a in _ATTR_BY_LENGTH)


def _frame_pattern(frame: str) -> re.Pattern[str]:
    """The full-sentence grammar of one frame, the asked attribute captured (``label_of``)."""
    out, seen = [], set()
    for literal, field_name, _, _ in string.Formatter().parse(frame):
        out.append(re.escape(literal))
        if field_name is None:
            continue
        if field_name in seen:
            out.append(f"(?P={field_name})")
        elif field_name == "subj":
            out.append("(?P<subj>.+?)")
        else:
            out.append(f"(?P<{field_name}>{_ANY_ATTR})")
        seen.add(field_name)
    return re.compile("".join(out) + r"\Z")


_FRAME_PATTERNS = tuple(_frame_pattern(f) for f in _FRAMES)
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH_NAMES = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
    "December",
)  # fmt: skip


def label_of(question: str) -> str:
    """The label of a generated question (what the attribute it asks about asks for), read with
    the generator's own grammar (every frame, parsed whole); a ``RecallmError`` for text no
    generator wrote. Tests use it as a perfect classifier."""
    for pattern in _FRAME_PATTERNS:
        match = pattern.match(question)
        if match:
            return _ATTR_LABEL[match.group("a")]
    raise RecallmError(f"not a generated question: {question!r}")


class TokenCounter:
    """Counts tokens with ``tokenizer`` (exact) or 4 characters per token (``None``)."""

    def __init__(self, tokenizer=None) -> None:
        self.tokenizer = tokenizer

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return math.ceil(len(text) / 4)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def chars_per_token(self, sample: str) -> float:
        if self.tokenizer is None or not sample:
            return 4.0
        return len(sample) / max(1, self.count(sample))

    def describe(self) -> str:
        return "tokenizer" if self.tokenizer is not None else "4 chars/token"


@dataclass
class TaskExample:
    """One generated task: the context (a str, or a list of messages for ``mrcr``), the query,
    and what scoring needs."""

    task: str
    length: int
    index: int
    context: Any
    query: str
    reference: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0

    @property
    def task_id(self) -> str:
        return f"{self.task}/{self.length}/{self.index}"


@dataclass(frozen=True)
class TaskScore:
    score: float
    correct: bool
    metrics: dict[str, float] = field(default_factory=dict)


def context_text(context: Any) -> str:
    """The text a context's length is counted on (a conversation: its JSON)."""
    return context if isinstance(context, str) else json.dumps(context, ensure_ascii=False)


# --- generation --------------------------------------------------------------------------------


def _acronym(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPRSTUVW") for _ in range(rng.randint(2, 4)))


def _subject(rng: random.Random, kind: str) -> str:
    from data_gen.text import cities, countries, first_names, words

    if kind == "city":
        return rng.choice(cities())
    if kind == "country":
        return rng.choice(countries())
    if kind == "person":
        return rng.choice(first_names())
    if kind == "acronym":
        return _acronym(rng)
    if kind == "org":
        return f"the {rng.choice(words()).capitalize()} {rng.choice(_ORG_KINDS)}"
    return f"the {rng.choice(words())} {rng.choice(words())}"  # a thing


def _question(rng: random.Random, label: str) -> str:
    attr, kinds = rng.choice(_ATTRIBUTES[label])
    kind = rng.choice(kinds)
    others = [a for a, k in _ATTR_KINDS.items() if kind in k and _ATTR_LABEL[a] != label]  # fit the subject
    frame = rng.choice(_FRAMES)
    labels = list({_ATTR_LABEL[a] for a in others})
    if "{d2}" in frame and len(labels) < 2:
        frame = _FRAMES[0]
    d1_label, d2_label = rng.sample(labels, 2) if len(labels) >= 2 else (labels[0], labels[0])
    d1 = rng.choice([a for a in others if _ATTR_LABEL[a] == d1_label])
    d2 = rng.choice([a for a in others if _ATTR_LABEL[a] == d2_label])
    return frame.format(a=attr, d1=d1, d2=d2, subj=_subject(rng, kind))


_FIRST_DAY, _LAST_DAY = _dt.date(2019, 1, 1), _dt.date(2024, 12, 28)


def _random_day(rng: random.Random, lo: _dt.date = _FIRST_DAY, hi: _dt.date = _LAST_DAY) -> _dt.date:
    return lo + _dt.timedelta(days=rng.randint(0, max(0, (hi - lo).days)))


def _date_text(day: _dt.date) -> str:
    return f"{_MONTHS[day.month - 1]} {day.day:02d}, {day.year}"


def _long_date(day: _dt.date) -> str:
    return f"{_MONTH_NAMES[day.month - 1]} {day.day}, {day.year}"


def parse_record_date(text: str) -> _dt.date:
    """The date of a record (``Mon DD, YYYY``)."""
    month, day, year = text.replace(",", "").split()
    return _dt.date(int(year), _MONTHS.index(month) + 1, int(day))


def _record(rng: random.Random, user: int, label: str, day: _dt.date | None = None) -> str:
    day = day or _random_day(rng)
    return f"Date: {_date_text(day)} || User: {user} || Instance: {_question(rng, label)}"


def _fit(lines: list[str], target: int, counter: TokenCounter, tolerance: float, keep: set[int]) -> list[str]:
    """Drop lines (never those in ``keep``) from the end until ``"\\n".join(lines)`` fits
    ``target`` tokens (+ ``tolerance``)."""
    text = "\n".join(lines)
    tokens = counter.count(text)
    if tokens <= target * (1 + tolerance):
        return lines
    ratio = len(text) / max(1, tokens)
    excess = len(text) - int(target * ratio)
    out = list(lines)
    i = len(out) - 1
    while excess > 0 and i >= 0:
        if i not in keep:
            excess -= len(out[i]) + 1
            out[i] = None  # type: ignore[call-overload]
        i -= 1
    return [line for line in out if line is not None]


def _niah(rng: random.Random, length: int, counter: TokenCounter, tolerance: float) -> tuple[str, str, dict]:
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
    lines = _fit(sentences, length, counter, tolerance, keep={at})
    query = f"What is the special magic number for {key} mentioned in the context? Answer with the number."
    return " ".join(lines), query, {"value": value, "key": key, "depth": round(at / max(1, len(sentences)), 4)}


#: one record: (user, label, date)
Record = tuple[int, str, _dt.date]


def _records(
    rng: random.Random,
    length: int,
    counter: TokenCounter,
    tolerance: float,
    records_for: Callable[[int], list[Record]],
) -> tuple[list[str], list[Record]]:
    """Record lines filling ``length`` tokens, and the records they show. ``records_for(n)``
    returns ``n`` records (about: a generator may round)."""
    sample = "\n".join(_record(rng, 10000 + i, LABELS[i % len(LABELS)]) for i in range(120))
    per_record = len(sample) / 120 + 1
    aim = length * (1 - tolerance / 2)
    n = max(8, int(aim * counter.chars_per_token(sample) / per_record))
    for _ in range(3):  # re-aim on the records actually drawn (their mix moves the mean length)
        records = records_for(n)
        lines = [_record(rng, user, label, day) for user, label, day in records]
        tokens = counter.count("\n".join(lines))
        if length * (1 - tolerance) <= tokens <= length * (1 + tolerance):
            break
        n = max(8, round(n * aim / max(1, tokens)))
    kept = _fit(lines, length, counter, tolerance, keep=set())
    return kept, records[: len(kept)]


def _weights(rng: random.Random) -> list[float]:
    """Distinct label weights (so counts rarely tie)."""
    weights = [0.5 + 2.5 * rng.random() for _ in LABELS]
    return [w / sum(weights) for w in weights]


def _user_ids(rng: random.Random, n: int) -> list[int]:
    return rng.sample(range(10000, 10000 + max(90000, 20 * n)), n)


def _oolong(rng: random.Random, length: int, index: int, counter: TokenCounter, tolerance: float):
    weights = _weights(rng)

    def records_for(n: int) -> list[Record]:
        users = _user_ids(rng, max(4, n // 6))
        return [(rng.choice(users), rng.choices(LABELS, weights)[0], _random_day(rng)) for _ in range(n)]

    lines, records = _records(rng, length, counter, tolerance, records_for)
    counts = Counter(label for _, label, _ in records)
    kind = ("count", "compare", "most_common")[index % 3]
    if kind == "count":
        label = rng.choice(LABELS)
        query = f"How many instances in the data have the label '{label}'? {_LABEL_HELP} Answer with the number."
        reference = {"kind": "count", "label": label, "value": counts[label]}
    elif kind == "compare":
        a, b = rng.sample(LABELS, 2)
        relation = (
            "more common" if counts[a] > counts[b] else "less common" if counts[a] < counts[b] else "same frequency"
        )
        query = (
            f"In the data, is the label '{a}' more common, less common, or the same frequency as the label '{b}'? "
            f"{_LABEL_HELP} Answer with exactly one of: more common, less common, same frequency."
        )
        reference = {"kind": "compare", "labels": [a, b], "value": relation, "counts": [counts[a], counts[b]]}
    else:
        top = counts.most_common()
        if len(top) > 1 and top[0][1] == top[1][1]:  # a tie: ask the count question of the first instead
            label = top[0][0]
            query = f"How many instances in the data have the label '{label}'? {_LABEL_HELP} Answer with the number."
            reference = {"kind": "count", "label": label, "value": counts[label]}
        else:
            query = (
                f"Which label is the most common among the instances in the data? {_LABEL_HELP} Answer with the label."
            )
            reference = {"kind": "label", "value": top[0][0]}
    reference["counts_by_label"] = {label: counts[label] for label in LABELS}
    return "\n".join(lines), query, reference


# --- oolong_pairs ------------------------------------------------------------------------------


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
    day = _long_date(_dt.date.fromisoformat(condition["date"])) if "date" in condition else ""
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
                        r[1] = _random_day(rng, hi=cut)
        elif kind == "has_all":
            purge(rng.choice((a, b)))
        elif kind in ("has_any", "one_each"):
            purge(a)
            purge(b)
        else:  # one_each_dated: A only after the date, B only before it
            for r in records:
                if r[0] == a and r[1] < cut:
                    r[1] = _random_day(rng, lo=cut + _dt.timedelta(days=1))
                elif r[0] == b and r[1] > cut:
                    r[1] = _random_day(rng, hi=cut - _dt.timedelta(days=1))
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
        put(a, _random_day(rng, lo=cut + _dt.timedelta(days=1)))
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
            put(a, _random_day(rng, hi=cut - _dt.timedelta(days=1)))
        if side in ("b", "both"):
            put(b, _random_day(rng, lo=cut + _dt.timedelta(days=1)))


def _oolong_pairs(
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
        users = _user_ids(rng, n_users)
        q = max(3, min(n_users // 3, round(3 * math.sqrt(n_users))))
        if max_pair_users is not None:
            q = min(q, max_pair_users)
        per_user: dict[int, list[list]] = {u: [] for u in users}
        chosen = users[:q] if not asymmetric else users[: 2 * q]
        for user in chosen:  # users meant to meet the condition get enough records for it
            for _ in range(need):
                per_user[user].append([rng.choice(LABELS), _random_day(rng)])
        for user in users:
            if not per_user[user]:
                per_user[user].append([rng.choice(LABELS), _random_day(rng)])
        placed = sum(len(v) for v in per_user.values())
        for _ in range(max(0, n - placed)):
            per_user[rng.choice(users)].append([rng.choice(LABELS), _random_day(rng)])
        for i, user in enumerate(users):
            if not asymmetric:
                side = "both" if i < q else "none"
            else:
                side = ("a", "b", "both")[i % 3] if i < 2 * q else "none"
            _shape_user(rng, condition, side, per_user[user])
        records = [(user, label, day) for user, recs in per_user.items() for label, day in recs]
        rng.shuffle(records)
        return records

    lines, records = _records(rng, length, counter, tolerance, records_for)
    by_user: dict[int, list[Record]] = {}
    for record in records:
        by_user.setdefault(record[0], []).append(record)
    side_a = sorted(u for u, recs in by_user.items() if pair_condition_met(condition, recs)[0])
    side_b = sorted(u for u, recs in by_user.items() if pair_condition_met(condition, recs)[1])
    pairs = sorted({(min(x, y), max(x, y)) for x in side_a for y in side_b if x != y})
    query = (
        f"List all pairs of user IDs such that {_condition_text(condition)}. {_LABEL_HELP} Dates are those of the "
        "instances. Give each pair once, as (smaller ID, larger ID), one pair per line."
    )
    reference = {
        "kind": "pairs",
        "condition": condition,
        "pairs": [list(p) for p in pairs],
        "users": side_a if not asymmetric else {"a": side_a, "b": side_b},
    }
    return "\n".join(lines), query, reference


# --- mrcr ----------------------------------------------------------------------------------------

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


def _mrcr(rng: random.Random, length: int, counter: TokenCounter, tolerance: float, needles: int):
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
        context, query, reference = _niah(rng, length, counter, tolerance)
    elif task == "oolong":
        context, query, reference = _oolong(rng, length, index, counter, tolerance)
    elif task == "oolong_pairs":
        context, query, reference = _oolong_pairs(rng, length, index, counter, tolerance, max_pair_users)
    else:
        context, query, reference = _mrcr(rng, length, counter, tolerance, needles)
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


# --- scoring -----------------------------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
_PAIR = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)|\[\s*(\d+)\s*,\s*(\d+)\s*\]|^\s*(\d+)\s*,\s*(\d+)\s*$", re.MULTILINE)
_MARKER = re.compile(r"(?:final\s+answer|answer)\s*(?:is\s*:?|:)", re.IGNORECASE)
_COMPARISONS = ("more common", "less common", "same frequency")


def stated_answer(text: str) -> str:
    """The part of ``text`` that states the answer: after the last ``Answer:`` / ``answer is``
    marker, or all of it."""
    markers = list(_MARKER.finditer(text))
    return text[markers[-1].end() :] if markers else text


def numeric_partial_credit(predicted: float | None, gold: float) -> float:
    """OOLONG's score of a numeric answer: ``0.75 ** |predicted - gold|`` (0 without a number)."""
    if predicted is None:
        return 0.0
    return float(0.75 ** abs(predicted - gold))


def _first_number(text: str) -> float | None:
    found = _NUMBER.search(text.replace(",", ""))
    return float(found.group(0)) if found else None


def _first_option(text: str, options: Sequence[str]) -> str | None:
    """The option stated first in ``text`` (normalised, whole words)."""
    norm = _normalize(text)
    found = [(m.start(), o) for o in options for m in [re.search(rf"\b{re.escape(o)}\b", norm)] if m]
    return min(found)[1] if found else None


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


def _normalize(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split())


def mrcr_score(answer: str, prefix: str, gold: str) -> float:
    """MRCR's grade: 0 without the prefix, else the similarity of the rest to the gold answer."""
    text = answer.strip()
    if not text.startswith(prefix):
        return 0.0
    return difflib.SequenceMatcher(None, text[len(prefix) :].strip(), gold.strip()).ratio()


def score_answer(task: str, answer: str | None, reference: Mapping[str, Any]) -> TaskScore:
    """The score of ``answer`` (None: no answer) for an example of ``task`` (module doc)."""
    if task not in TASKS:
        raise RecallmError(f"unknown RLM task {task!r}; known: {', '.join(TASKS)}")
    text = answer or ""
    if task == "s_niah":
        found = re.search(rf"(?<!\d){re.escape(str(reference['value']))}(?!\d)", text) is not None
        return TaskScore(float(found), found)
    if task == "mrcr":
        score = mrcr_score(text, str(reference["prefix"]), str(reference["answer"]))
        return TaskScore(score, score == 1.0, {"similarity": score})
    kind = reference.get("kind")
    if task == "oolong":
        stated = stated_answer(text)
        if kind == "count":
            predicted = _first_number(stated) if answer is not None else None
            score = numeric_partial_credit(predicted, float(reference["value"]))
            metrics = {"abs_error": abs(predicted - reference["value"])} if predicted is not None else {}
            return TaskScore(score, score == 1.0, metrics)
        if kind == "compare":
            ok = _first_option(stated, _COMPARISONS) == reference["value"]
            return TaskScore(float(ok), ok)
        if kind == "label":
            ok = _first_option(stated, LABELS) == reference["value"]
            return TaskScore(float(ok), ok)
        raise RecallmError(f"oolong reference has unknown kind {kind!r}")
    gold = {(min(x, y), max(x, y)) for x, y in reference["pairs"]}
    precision, recall, f1 = pairs_f1(parse_pairs(text), gold)
    return TaskScore(f1, f1 == 1.0, {"precision": precision, "recall": recall, "f1": f1})
