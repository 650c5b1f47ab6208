"""Task interface, row schema and registry.

A task turns a seeded RNG into a ``Draft``: the instruction, the question, the gold pieces of
context, a stream of distractor pieces, the answers and whatever else the reward needs.
``data_gen.fit.build_row`` then fits the draft to a target prompt length with the real
tokenizer and chat template and renders the final ``Row``: chat messages, the prompt text, the
gold evidence both as strings and as character intervals of that text, the answers, and the
augmentation choices made.

Tasks register themselves with ``@register``; ``make_task(name, **params)`` builds one with its
parameters validated up front (a bad value is a ``RecallmError`` before any work starts;
``check_choice``, ``int_range`` and ``check_int`` are the checks the tasks share).
"""

from __future__ import annotations

import importlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from recallm.errors import RecallmError

__all__ = [
    "CATEGORIES",
    "QUESTION_POSITIONS",
    "Piece",
    "Draft",
    "Row",
    "Task",
    "register",
    "make_task",
    "task_names",
    "TASKS",
    "check_choice",
    "int_range",
    "check_int",
]

CATEGORIES = (
    "multi_hop_qa",
    "single_hop_qa",
    "retrieval",
    "reasoning_retrieval",
    "short_math",
    "icl",
    "long_doc_qa",
    "aggregation",
    "reranking",
    "entity_citation",
)
QUESTION_POSITIONS = ("end", "beginning", "both")


# ---------------------------------------------------------- parameter checks (shared by every task)
def check_choice(name: str, values, allowed) -> tuple:
    """A task parameter that is a non-empty subset of ``allowed`` (a single value is a one-element subset)."""
    values = (values,) if isinstance(values, (str, int)) else tuple(values)
    bad = [v for v in values if v not in allowed]
    if not values or bad:
        raise RecallmError(f"{name} must be a non-empty subset of {list(allowed)}, got {list(values)}")
    return values


def int_range(name: str, value) -> tuple[int, int]:
    """A task parameter that is an integer or a ``[min, max]`` range with ``0 <= min <= max``, as
    ``(min, max)`` (an integer ``n`` is ``(n, n)``)."""
    try:
        lo, hi = (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))
    except (TypeError, ValueError, IndexError):
        lo, hi = -1, -1
    if not 0 <= lo <= hi:
        raise RecallmError(f"{name} must be an integer or a [min, max] range with 0 <= min <= max, got {value}")
    return lo, hi


def check_int(name: str, value, lo: int, hi: int) -> int:
    """A task parameter that is an integer in ``[lo, hi]``."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = lo - 1
    if isinstance(value, bool) or not lo <= number <= hi:
        raise RecallmError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return number


@dataclass(slots=True)
class Piece:
    """One unit of context (a document, a dictionary line, a needle, a vote...)."""

    text: str
    gold: bool = False
    doc_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Draft:
    """Everything about one example except its length (see module doc).

    ``placed`` pieces (the gold evidence, and distractors that must be there, such as decoy
    needles) go to uniformly random positions among the streamed distractors; those with
    ``gold=True`` are the evidence. With ``keep_order`` there is no placement: the stream gives
    every piece, gold ones flagged, in order (e.g. the chunks of one long document). ``ground_truth`` holds the reward fields other than ``category``,
    ``answers`` and ``gold`` (``choices``, ``relevance``, ``doc_ids``, ``entities``...).
    """

    instruction: str
    question: str
    placed: list[Piece]
    distractors: Iterator[Piece]
    answers: list[Any]
    augmentations: dict[str, Any]
    ground_truth: dict[str, Any] = field(default_factory=dict)
    header: str = ""
    footer: str = ""
    separator: str = "\n"
    question_position: str = "end"
    keep_order: bool = False
    evidence: bool = True  # gold pieces are evidence the reward scores recall against
    trace_info: dict[str, Any] = field(default_factory=dict)  # what a programmatic SFT trace needs
    # False: not fitted to a length — every streamed piece is used (a short problem, one whole
    # document) and the target is an upper bound
    fit_length: bool = True
    # called with the final, ordered pieces before rendering: may rewrite their text (number the
    # documents [1]..[n]) and returns ground-truth updates (``answers`` included) that depend on it
    finalize: Callable[[list[Piece]], dict[str, Any]] | None = None
    # a fixed layout instead of instruction / question / blank lines: the prompt is this text with the joined pieces
    # (between ``header`` and ``footer``) in place of its one ``{context}`` (a benchmark's template, as upstream words it)
    template: str | None = None


@dataclass
class Row:
    """A finished example."""

    task: str
    category: str
    data_source: str
    seed: int
    messages: list[dict[str, str]]
    prompt_text: str  # the chat-templated prompt, generation prompt included
    prompt_tokens: int  # its actual length in tokens
    target_tokens: int
    question: str
    answers: list[Any]
    gold: list[dict[str, Any]]  # {"text", "start", "end"}: character intervals of prompt_text
    augmentations: dict[str, Any]
    ground_truth: dict[str, Any]  # everything the reward needs (category, answers, gold, ...)
    n_pieces: int = 0
    trace_info: dict[str, Any] = field(default_factory=dict)
    instruction: str = ""  # the task instructions of the prompt (the annotator recalls from them)


class Task(ABC):
    """A task family. Subclasses set ``name``, ``category`` and the length range they can reach,
    declare their parameters as keyword arguments of ``__init__`` (validated there) and write
    ``draft``. Synthetic tasks also write ``trace`` (a programmatic SFT trace)."""

    name: ClassVar[str]
    category: ClassVar[str]
    natural_length: ClassVar[bool] = False  # drafts use fit_length=False; lengths are upper bounds
    min_tokens: ClassVar[int] = 256
    max_tokens: ClassVar[int | None] = None  # None: no upper bound (synthetic distractors never run out)
    instructions: ClassVar[tuple[str, ...]] = ()

    def __init__(self, data_source: str | None = None) -> None:
        self.data_source = data_source or self.name

    @abstractmethod
    def draft(self, rng: random.Random) -> Draft: ...

    def trace(self, row: Row, rng: random.Random) -> list[tuple[str, Any]] | None:
        """A programmatic reasoning trace: ``[("text", str) | ("recall", gold_index) |
        ("recall_at", (start, end))...]``, ending before ``Answer:``; None if the task has none."""
        return None

    def answer_text(self, row: Row) -> str:
        """The final answer as the trace states it."""
        first = row.answers[0]
        return first if isinstance(first, str) else ", ".join(a if isinstance(a, str) else a[0] for a in row.answers)

    def check_length(self, target: int) -> None:
        """Raise if ``target`` tokens is out of this task's reach (for natural-length tasks: if
        it is below ``min_tokens``, as no draft could fit under it)."""
        if self.natural_length:
            if target < self.min_tokens:
                raise RecallmError(f"task {self.name}: prompts have at least {self.min_tokens} tokens, not {target}")
            return
        if target < self.min_tokens or (self.max_tokens is not None and target > self.max_tokens):
            reach = f"[{self.min_tokens}, {self.max_tokens if self.max_tokens is not None else 'inf'}]"
            raise RecallmError(f"task {self.name} cannot reach a prompt of {target} tokens (it can do {reach})")

    # helpers for subclasses
    def pick_instruction(self, rng: random.Random, **fields: Any) -> tuple[str, int]:
        index = rng.randrange(len(self.instructions))
        return self.instructions[index].format(**fields), index

    @staticmethod
    def pick_question_position(rng: random.Random, allowed: tuple[str, ...] = QUESTION_POSITIONS) -> str:
        return rng.choice(allowed)


TASKS: dict[str, type[Task]] = {}
#: the packages whose modules register tasks (``@register``), imported by name when a task is looked
#: up: the registry sits below the tasks it holds (ARCHITECTURE.md), so it names them, not imports them
TASK_PACKAGES = ("data_gen.tasks", "data_gen.datasets")


def register(cls: type[Task]) -> type[Task]:
    if cls.category not in CATEGORIES:
        raise ValueError(f"task {cls.__name__}: unknown category {cls.category!r}")
    if len(cls.instructions) < 4:
        raise ValueError(f"task {cls.__name__}: needs at least 4 instruction paraphrases")
    TASKS[cls.name] = cls
    return cls


def task_names() -> list[str]:
    for package in TASK_PACKAGES:  # (registers every task)
        importlib.import_module(package)
    return sorted(TASKS)


def make_task(name: str, **params: Any) -> Task:
    """Build a registered task; unknown names and bad parameters are ``RecallmError``s."""
    names = task_names()
    if name not in TASKS:
        raise RecallmError(f"unknown task {name!r}; known: {', '.join(names)}")
    try:
        return TASKS[name](**params)
    except TypeError as exc:
        raise RecallmError(f"task {name}: {exc}") from exc
