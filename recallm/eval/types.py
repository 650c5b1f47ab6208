"""Plain records shared by the backends, the benchmarks and the runner."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recallm.config import MAX_SEED, MAX_TOKENS
from recallm.errors import RecallmError

__all__ = [
    "GenerationSettings",
    "TextRequest",
    "Generation",
    "SpanStats",
    "Spec",
    "Example",
    "Score",
    "parse_length",
]


@dataclass(frozen=True)
class GenerationSettings:
    """Sampling settings of one benchmark. ``temperature == 0`` is greedy decoding."""

    max_new_tokens: int = field(metadata={"min": 1, "max": MAX_TOKENS})
    """at most this many tokens per generation; within the model's positions too (``recallm.eval.app``)"""
    temperature: float = field(default=0.0, metadata={"min": 0.0, "max": 2.0})
    top_p: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0})
    """(0, 1]"""
    top_k: int = field(default=0, metadata={"min": 0, "max": 1_000_000})
    """0: off"""
    seed: int = field(default=0, metadata={"min": 0, "max": MAX_SEED})
    """base of the per-example sampling seeds"""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise RecallmError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            raise RecallmError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise RecallmError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise RecallmError(f"top_k must be >= 0 (0: off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any], where: str = "generation") -> GenerationSettings:
        """From a ``generation`` config section (``recallm.config.typed``: this class is its schema)."""
        from recallm.config import typed

        return typed(cls, cfg, where)


@dataclass(frozen=True)
class TextRequest:
    """One generation asked of any backend, as text: the model reads ``prompt_text + prefix``
    (``prompt_text`` is the chat-templated prompt, generation prompt included; ``prefix`` is
    assistant text already written, e.g. a truncated output plus an injection) and writes at most
    ``max_new_tokens``. ``messages`` are the chat messages of ``prompt_text`` (chat servers). The
    HF backend encodes it into a token-level ``recallm.generation.GenRequest``."""

    prompt_text: str
    messages: tuple[Mapping[str, str], ...] | None
    max_new_tokens: int
    seed: int = 0
    prefix: str = ""


@dataclass(frozen=True)
class SpanStats:
    """Recall spans of one output: how many, how many are verbatim copies of their searchable
    context, and whether that was judged on token ids (``tokens``) or on text (``text``);
    ``flags``: each span's verdict, in output order (the HTML report colours spans by it)."""

    count: int
    verbatim: int
    source: str
    flags: tuple[bool, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.count, "verbatim": self.verbatim, "source": self.source}
        if self.flags:
            out["flags"] = [bool(f) for f in self.flags]
        return out


@dataclass(frozen=True)
class Generation:
    """What a backend returns for one request. ``finish_reason``: ``stop`` (end of sequence) or
    ``length`` (``max_new_tokens`` reached); ``spans`` when the backend saw the token ids."""

    text: str
    n_tokens: int
    finish_reason: str
    spans: SpanStats | None = None


@dataclass(frozen=True, order=True)
class Spec:
    """One example to run, known before it is built: ``example_id`` is unique in a run."""

    length: int
    benchmark: str
    index: int
    task: str

    @property
    def example_id(self) -> str:
        return f"{self.benchmark}/{self.task}/{self.length}/{self.index}"


@dataclass
class Example:
    """A built example: the prompt (fitted to ``spec.length`` tokens) and what scoring needs."""

    spec: Spec
    messages: list[dict[str, str]]
    prompt_text: str
    prompt_tokens: int
    reference: dict[str, Any] = field(default_factory=dict)

    @property
    def example_id(self) -> str:
        return self.spec.example_id


@dataclass
class Score:
    """The score of one output: ``score`` in [0, 1] (the benchmark's main metric), whether it
    counts as correct, the answer it was read from, and further metrics (all numbers)."""

    score: float
    correct: bool
    answer: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    gold: list[str] | None = None  # the reference answers, where the benchmark has them (shown in reports)


_SUFFIX = {"k": 1024, "m": 1024 * 1024}


def parse_length(value: Any, where: str) -> int:
    """A context length: a positive integer, or ``4K`` / ``128k`` (multiples of 1024)."""
    if isinstance(value, bool):
        raise RecallmError(f"{where}: bad length {value!r}; expected a positive integer such as 4096 or 4K")
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip().lower()
        try:
            number = int(float(text[:-1]) * _SUFFIX[text[-1]]) if text and text[-1] in _SUFFIX else int(text)
        except ValueError:
            raise RecallmError(
                f"{where}: bad length {value!r}; expected a positive integer such as 4096 or 4K"
            ) from None
    if number < 1:
        raise RecallmError(f"{where}: bad length {value!r}; lengths must be positive")
    return number
