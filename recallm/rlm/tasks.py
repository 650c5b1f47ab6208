"""Long-context tasks for RLMs, generated offline and deterministically from a seed, with scorers.

Three tasks, after the RLM paper's scaling study (lengths from 8K to 1M tokens and beyond):

* ``s_niah`` - single needle in a haystack: one sentence ``The special magic number for
  <key> is <number>.`` among English-word sentences; the query asks for the number. Score 1 if
  the answer contains the number (as a whole number), else 0. Constant information per query.
* ``oolong`` - aggregation (after OOLONG's trec_coarse split): many short records
  ``Date: ... || User: <id> || Instance: <question>``. Each question has a hidden label - the
  kind of answer it asks for: abbreviation, entity, description, human, location, numeric - that
  must be inferred from its wording (the labels are never written). Queries: how many instances
  have label L (a number, partial credit ``0.75 ** |error|``); is label A more common, less
  common or the same frequency as label B; which label is the most common (exact match).
  Linear information per query.
* ``oolong_pairs`` - pair enumeration (after OOLONG-Pairs): the same records; the query asks
  for every pair of user ids satisfying a condition on the users' labels (both have an instance
  labelled A; or both have instances labelled A and B). Scored by F1 over the set of unordered
  pairs. Quadratic output; the generator caps the qualifying users (``max_pair_users``) so the
  gold set stays manageable at 1M tokens.

Lengths are in tokens, counted with ``TokenCounter``: a tokenizer's exact count, or 4
characters per token without one (the default). Contexts land within ``tolerance`` of the
target. The gold answer is always computed from the context as finally generated.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recallm.errors import RecallmError
from recallm.eval.types import parse_length

__all__ = [
    "TASKS",
    "LABELS",
    "TaskExample",
    "TaskScore",
    "TokenCounter",
    "make_task",
    "task_specs",
    "score_answer",
    "label_of",
    "parse_pairs",
    "pairs_f1",
    "numeric_partial_credit",
    "MIN_LENGTH",
    "MAX_LENGTH",
]

TASKS = ("s_niah", "oolong", "oolong_pairs")
LABELS = ("abbreviation", "entity", "description", "human", "location", "numeric")
MIN_LENGTH, MAX_LENGTH = 1024, 4 * 1024 * 1024
_LABEL_HELP = (
    "Each instance is a question. Its label is the kind of answer the question asks for, one of: abbreviation "
    "(what an abbreviation stands for), entity (a thing: an animal, a color, a food, an instrument, a sport ...), "
    "description (an explanation, a reason, a definition), human (a person), location (a place), numeric (a number, "
    "a date, a count, an amount). The labels are not written in the data: infer them from the questions."
)

# question templates per label; {w} {w2}: words, {n}: a first name, {c}: a city, {k}: a country, {a}: an acronym
_TEMPLATES: dict[str, tuple[str, ...]] = {
    "abbreviation": (
        "What does {a} stand for?",
        "What is the full form of the abbreviation {a}?",
        "The acronym {a} is short for what?",
        "What do the letters {a} mean in the name of the {w} committee?",
    ),
    "entity": (
        "What kind of animal is the mascot of {c}?",
        "Which color is used on the flag of {k}?",
        "What musical instrument did {n} play in the {w} band?",
        "Which sport is most popular in {c}?",
        "What food is {c} famous for?",
    ),
    "description": (
        "Why do people in {c} celebrate the {w} festival?",
        "How does a {w} {w2} work?",
        "What is the meaning of the word {w}?",
        "What is the difference between a {w} and a {w2}?",
        "How can one explain the popularity of {w} in {k}?",
    ),
    "human": (
        "Who invented the {w} {w2}?",
        "Who was the first mayor of {c}?",
        "Who wrote the novel about {w} and {w2}?",
        "Which person founded the {w} company in {k}?",
        "Who is the current leader of the {w} party?",
    ),
    "location": (
        "Where is {c} located?",
        "In which country is the city of {c}?",
        "On which continent is {k}?",
        "Where did {n} grow up?",
        "What river flows through {c}?",
    ),
    "numeric": (
        "How many {w}s live in {c}?",
        "When was {c} founded?",
        "What is the population of {k}?",
        "How far is {c} from the sea in kilometers?",
        "In what year did {n} move to {c}?",
    ),
}
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def label_of(question: str) -> str:
    """The label of a generated question (which template family wrote it); a ``RecallmError``
    for text no template wrote. Tests use it as a perfect classifier."""
    for label, templates in _TEMPLATES.items():
        for template in templates:
            pattern = re.escape(template)
            for slot in ("\\{w\\}", "\\{w2\\}", "\\{n\\}", "\\{c\\}", "\\{k\\}", "\\{a\\}"):
                pattern = pattern.replace(slot, r".+?")
            if re.fullmatch(pattern, question):
                return label
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
    """One generated task: the context (a str), the query, and what scoring needs."""

    task: str
    length: int
    index: int
    context: str
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


# --- generation --------------------------------------------------------------------------------


def _acronym(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPRSTUVW") for _ in range(rng.randint(2, 4)))


def _question(rng: random.Random, label: str) -> str:
    from data_gen.text import cities, countries, first_names, words

    vocab = words()
    template = rng.choice(_TEMPLATES[label])
    return template.format(
        w=rng.choice(vocab),
        w2=rng.choice(vocab),
        n=rng.choice(first_names()),
        c=rng.choice(cities()),
        k=rng.choice(countries()),
        a=_acronym(rng),
    )


def _date(rng: random.Random) -> str:
    return f"{rng.choice(_MONTHS)} {rng.randint(1, 28):02d}, {rng.randint(2019, 2024)}"


def _record(rng: random.Random, user: int, label: str) -> str:
    return f"Date: {_date(rng)} || User: {user} || Instance: {_question(rng, label)}"


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


def _records(
    rng: random.Random, length: int, counter: TokenCounter, tolerance: float, users_for: Any
) -> tuple[list[str], list[int], list[str]]:
    """Records filling ``length`` tokens: (lines, user of each, label of each). ``users_for(n)``
    returns the (user, label) of each of ``n`` records."""
    sample = "\n".join(_record(rng, 10000 + i, LABELS[i % len(LABELS)]) for i in range(120))
    per_record = len(sample) / 120 + 1
    aim = length * (1 - tolerance / 2)
    n = max(8, int(aim * counter.chars_per_token(sample) / per_record))
    for _ in range(3):  # re-aim on the records actually drawn (their mix moves the mean length)
        assigned = users_for(n)
        lines = [_record(rng, user, label) for user, label in assigned]
        tokens = counter.count("\n".join(lines))
        if length * (1 - tolerance) <= tokens <= length * (1 + tolerance):
            break
        n = max(8, round(n * aim / max(1, tokens)))
    kept = _fit(lines, length, counter, tolerance, keep=set())
    assigned = assigned[: len(kept)]
    return kept, [u for u, _ in assigned], [lab for _, lab in assigned]


def _weights(rng: random.Random) -> list[float]:
    """Distinct label weights (so counts rarely tie)."""
    weights = [0.5 + 2.5 * rng.random() for _ in LABELS]
    return [w / sum(weights) for w in weights]


def _user_ids(rng: random.Random, n: int) -> list[int]:
    return rng.sample(range(10000, 100000), n)


def _oolong(rng: random.Random, length: int, index: int, counter: TokenCounter, tolerance: float):
    weights = _weights(rng)

    def users_for(n: int) -> list[tuple[int, str]]:
        users = _user_ids(rng, max(4, n // 6))
        return [(rng.choice(users), rng.choices(LABELS, weights)[0]) for _ in range(n)]

    lines, _, labels = _records(rng, length, counter, tolerance, users_for)
    counts = Counter(labels)
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


def _oolong_pairs(
    rng: random.Random, length: int, index: int, counter: TokenCounter, tolerance: float, max_pair_users: int
):
    a, b = rng.sample(LABELS, 2)
    both = index % 2 == 1  # condition: has a (and b)
    need = [a, b] if both else [a]
    others = [lab for lab in LABELS if lab not in need]

    def users_for(n: int) -> list[tuple[int, str]]:
        users = _user_ids(rng, max(6, n // 5))
        q = max(3, min(max_pair_users, len(users) // 4))
        qualifying = set(users[:q])
        records: list[tuple[int, str]] = []
        for user in users[:q]:  # make sure each qualifying user meets the condition
            records.extend((user, label) for label in need)
        while len(records) < n:
            user = rng.choice(users)
            if user in qualifying:
                label = rng.choice(LABELS)
            else:  # non-qualifying users never meet it: they lack `a` (and for `both`, also half lack b)
                label = rng.choice(others + ([b] if both and user % 2 else []))
            records.append((user, label))
        rng.shuffle(records)
        return records

    lines, users, labels = _records(rng, length, counter, tolerance, users_for)
    has: dict[int, set[str]] = {}
    for user, label in zip(users, labels, strict=True):
        has.setdefault(user, set()).add(label)
    meeting = sorted(u for u, labs in has.items() if all(lab in labs for lab in need))
    pairs = [[x, y] for i, x in enumerate(meeting) for y in meeting[i + 1 :]]
    condition = f"both users have at least one instance with the label '{a}'"
    if both:
        condition = f"both users have at least one instance with the label '{a}' and at least one with the label '{b}'"
    query = (
        f"List all pairs of user IDs such that {condition}. {_LABEL_HELP} Give each pair once, as (smaller ID, "
        "larger ID), one pair per line."
    )
    return "\n".join(lines), query, {"kind": "pairs", "condition": need, "pairs": pairs, "users": meeting}


def make_task(
    task: str,
    length: int,
    index: int,
    *,
    seed: int = 0,
    counter: TokenCounter | None = None,
    tolerance: float = 0.02,
    max_pair_users: int = 40,
) -> TaskExample:
    """One example of ``task`` at ``length`` tokens, deterministic in (seed, task, length, index)."""
    if task not in TASKS:
        raise RecallmError(f"unknown RLM task {task!r}; known: {', '.join(TASKS)}")
    if not MIN_LENGTH <= length <= MAX_LENGTH:
        raise RecallmError(f"bad length {length} for task {task}: expected {MIN_LENGTH} to {MAX_LENGTH} tokens")
    if not 0 < tolerance < 0.5:
        raise RecallmError(f"tolerance must be in (0, 0.5), got {tolerance}")
    counter = counter or TokenCounter()
    rng = random.Random(f"{seed}|{task}|{length}|{index}")
    if task == "s_niah":
        context, query, reference = _niah(rng, length, counter, tolerance)
    elif task == "oolong":
        context, query, reference = _oolong(rng, length, index, counter, tolerance)
    else:
        context, query, reference = _oolong_pairs(rng, length, index, counter, tolerance, max_pair_users)
    return TaskExample(task, length, index, context, query, reference, tokens=counter.count(context))


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


def numeric_partial_credit(predicted: float | None, gold: float) -> float:
    """OOLONG's score of a numeric answer: ``0.75 ** |predicted - gold|`` (0 without a number)."""
    if predicted is None:
        return 0.0
    return float(0.75 ** abs(predicted - gold))


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


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


def score_answer(task: str, answer: str | None, reference: Mapping[str, Any]) -> TaskScore:
    """The score of ``answer`` (None: no answer) for an example of ``task`` (module doc)."""
    if task not in TASKS:
        raise RecallmError(f"unknown RLM task {task!r}; known: {', '.join(TASKS)}")
    text = answer or ""
    if task == "s_niah":
        found = re.search(rf"(?<!\d){re.escape(str(reference['value']))}(?!\d)", text) is not None
        return TaskScore(float(found), found)
    kind = reference.get("kind")
    if task == "oolong":
        if kind == "count":
            predicted = _last_number(text) if answer is not None else None
            score = numeric_partial_credit(predicted, float(reference["value"]))
            metrics = {"abs_error": abs(predicted - reference["value"])} if predicted is not None else {}
            return TaskScore(score, score == 1.0, metrics)
        norm = _normalize(text)
        if kind == "compare":
            options = ("more common", "less common", "same frequency")
            said = [o for o in options if o in norm]
            ok = said == [reference["value"]]
            return TaskScore(float(ok), ok)
        if kind == "label":
            said = [lab for lab in LABELS if re.search(rf"\b{lab}\b", norm)]
            ok = said == [reference["value"]]
            return TaskScore(float(ok), ok)
        raise RecallmError(f"oolong reference has unknown kind {kind!r}")
    gold = {(min(x, y), max(x, y)) for x, y in reference["pairs"]}
    precision, recall, f1 = pairs_f1(parse_pairs(text), gold)
    return TaskScore(f1, f1 == 1.0, {"precision": precision, "recall": recall, "f1": f1})
