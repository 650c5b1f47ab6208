"""The benchmark interface and what the generated benchmarks share.

A benchmark plans its examples cheaply (``specs``: ids, tasks, lengths; every config check
happens here, before anything is generated), builds one example on demand (``build``: a prompt
fitted to its length with the model's tokenizer and chat template, deterministic in the run's
seed and the example's id), may ask for a second generation that continues the first
(``followup``: the lost-in-thought injection), scores an output (``score``) and may add its own
tables to the summary (``summarize``).
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from data_gen.base import Draft, Row, Task
from data_gen.fit import PromptRenderer
from recallm.config import MAX_COUNT
from recallm.errors import RecallmError
from recallm.eval.scoring import ANSWER_REGIONS
from recallm.eval.types import Example, Generation, GenerationSettings, Score, Spec, parse_length

__all__ = ["Benchmark", "BenchmarkOptions", "BenchmarkSettings", "Followup", "EvalTask", "example_seed"]


@dataclass(frozen=True)
class BenchmarkOptions:
    """The schema of ``eval.benchmarks.<name>`` (``recallm.config.typed``): the keys every benchmark
    has; a benchmark's ``Options`` subclass adds its own, with their defaults."""

    enabled: bool = True
    lengths: Any = None
    """target prompt lengths in tokens: integers or ``4K``-style strings (one or a list)"""
    per_cell: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    """examples per task and length"""
    generation: dict[str, Any] | None = None
    """keys that override the suite's generation settings, e.g. ``max_new_tokens``"""


COMMON_KEYS = tuple(f.name for f in fields(BenchmarkOptions))


@dataclass(frozen=True)
class BenchmarkSettings:
    """Suite-wide settings every benchmark receives."""

    seed: int = 0
    answer_region: str = "after_think"
    tolerance: float = 0.05
    generation: Mapping[str, Any] | None = None  # the suite's generation settings (a benchmark may override keys)
    reward_config: Any = None  # rewards.RewardConfig (in-domain scoring)
    judge: Any = None  # recallm.eval.judge.Judge, or None (the deterministic fallbacks)
    nli: Any = None  # the citation NLI (recallm.eval.judge.make_nli: TrueNLI or the judge's), or None (fallback)
    # nominal length -> the prompt length fitted in its place (e.g. 131072 -> 128000: the 128K cells leave room
    # to generate within the model's positions); the cell keeps its nominal length in ids and tables
    fit_lengths: Mapping[int, int] | None = None

    def __post_init__(self) -> None:
        if self.answer_region not in ANSWER_REGIONS:
            raise RecallmError(f"answer_region must be one of {', '.join(ANSWER_REGIONS)}, got {self.answer_region!r}")
        if not 0 <= self.tolerance < 0.5:
            raise RecallmError(f"tolerance must be in [0, 0.5), got {self.tolerance}")


@dataclass(frozen=True)
class Followup:
    """A second generation that continues an output: the model reads the prompt, then
    ``prefix`` (assistant text), and writes at most ``max_new_tokens``."""

    prefix: str
    max_new_tokens: int


class EvalTask(Task):
    """A ``data_gen`` task stand-in so that ``build_row`` can fit benchmark drafts (never registered)."""

    category = "retrieval"

    def __init__(self, name: str, category: str = "retrieval", min_tokens: int = 64) -> None:
        self.name = name
        self.category = category
        self.min_tokens = min_tokens
        super().__init__(name)

    def draft(self, rng: random.Random) -> Draft:  # pragma: no cover - drafts are made by the benchmark
        raise NotImplementedError


def example_seed(*parts: Any) -> int:
    """A 63-bit seed from the run's seed and an example's coordinates."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class Benchmark(ABC):
    """One benchmark (see module doc). Subclasses set ``name``, ``Options`` (the schema of their
    config section: a ``BenchmarkOptions`` subclass with their own keys and defaults) and
    ``min_length``, and write ``specs``, ``build`` and ``score``. ``self.cfg`` holds the values of
    the benchmark's own keys (``BenchmarkOptions``' common keys aside).
    """

    name: ClassVar[str]
    Options: ClassVar[type[BenchmarkOptions]] = BenchmarkOptions
    min_length: ClassVar[int] = 128
    needs_lengths: ClassVar[bool] = True

    def __init__(self, cfg: Mapping[str, Any], settings: BenchmarkSettings) -> None:
        from recallm.config import typed

        options = typed(self.Options, cfg, f"eval.benchmarks.{self.name}")
        self.settings = settings
        self.cfg = self.own_options(options)
        self.lengths = self._lengths(options.lengths)
        self.per_cell = options.per_cell
        generation = dict(settings.generation or {})
        generation.update(options.generation or {})
        self.generation = GenerationSettings.from_mapping(generation, f"benchmark {self.name}: generation")

    @classmethod
    def own_options(cls, options: BenchmarkOptions | None = None) -> dict[str, Any]:
        """The benchmark's own keys (the common ones aside) -> their values in ``options`` (default:
        the defaults)."""
        options = options if options is not None else cls.Options()
        return {f.name: getattr(options, f.name) for f in fields(options) if f.name not in COMMON_KEYS}

    def _lengths(self, value) -> list[int]:
        if value is None:
            if self.needs_lengths:
                raise RecallmError(f"benchmark {self.name}: lengths is required (e.g. [4096, 8192])")
            return []
        if isinstance(value, (str, int)):
            value = [value]
        lengths = [parse_length(v, f"benchmark {self.name}: lengths") for v in value]
        small = [n for n in lengths if n < self.min_length]
        if small:
            raise RecallmError(
                f"benchmark {self.name}: bad length {small[0]}; it needs at least {self.min_length} tokens"
            )
        if len(set(lengths)) != len(lengths):
            raise RecallmError(f"benchmark {self.name}: lengths repeat: {lengths}")
        return sorted(lengths)

    # --- the interface -----------------------------------------------------------------------

    @abstractmethod
    def specs(self) -> list[Spec]:
        """Every example of the benchmark, cheaply (ids only); raises for bad settings."""

    @abstractmethod
    def build(self, spec: Spec, renderer: PromptRenderer) -> Example:
        """The example of ``spec``, deterministically."""

    @abstractmethod
    def score(self, example: Example, generation: Generation, followup: Generation | None) -> Score:
        """Score one output (and its follow-up, if ``followup`` asked for one)."""

    def followup(self, example: Example, generation: Generation) -> Followup | None:
        """A continuation of ``generation`` to generate before scoring, or None."""
        return None

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Benchmark-specific tables for ``summary.json`` (the generic metrics are the runner's)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """What identifies this benchmark's examples (for the run's fingerprint)."""
        out = {"lengths": self.lengths, "per_cell": self.per_cell, **self.cfg}
        fitted = {n: self.target(n) for n in self.lengths if self.target(n) != n}
        if fitted:  # (absent otherwise, so that runs without a mapping keep their fingerprint)
            out["fit_lengths"] = fitted
        return out

    def score_batch(
        self, examples: Sequence[Example], generations: Sequence[Generation], followups: Sequence[Generation | None]
    ) -> list[Score]:
        """Scores of a batch (``score`` one by one; a benchmark that asks a judge overrides this to
        ask concurrently)."""
        return [self.score(e, g, f) for e, g, f in zip(examples, generations, followups, strict=True)]

    def followup_batch(self, examples: Sequence[Example], generations: Sequence[Generation]) -> list[Followup | None]:
        """``followup`` of a batch (overridden where a judge is asked)."""
        return [self.followup(e, g) for e, g in zip(examples, generations, strict=True)]

    # --- helpers -------------------------------------------------------------------------------

    def target(self, length: int) -> int:
        """The prompt length fitted for a cell of nominal ``length`` (``fit_lengths``)."""
        return int((self.settings.fit_lengths or {}).get(length, length))

    def rng(self, *parts: Any) -> random.Random:
        return random.Random(example_seed(self.settings.seed, self.name, *parts))

    def example_from_row(self, spec: Spec, row: Row, reference: dict[str, Any]) -> Example:
        return Example(
            spec=spec,
            messages=list(row.messages),
            prompt_text=row.prompt_text,
            prompt_tokens=int(row.prompt_tokens),
            reference=reference,
        )


def score_with_reward(
    example: Example, generation: Generation, reward_config, answer_region: str = "after_think"
) -> Score:
    """An output scored by the training reward (``rewards.score_response`` with ``reward_config``,
    the reference's ``ground_truth`` and ``data_source``): the score is the answer reward R_ans,
    the composite reward (``reward``) and every component are metrics.

    With ``answer_region="full"`` (models that do not think, e.g. an untrained base) the answer is
    read from the whole output (``recallm.eval.scoring.final_answer``: after its last ``Answer:``
    marker, else all of it) and scored with the category's answer metric; the composite reward and
    its components stay as the training reward computes them."""
    from rewards import parse_response, score_response
    from rewards.score import answer_reward

    ref = example.reference
    try:
        breakdown = score_response(
            generation.text,
            ref["ground_truth"],
            prompt_text=example.prompt_text,
            n_tokens=generation.n_tokens,
            data_source=ref["data_source"],
            config=reward_config,
        )
    except ValueError as exc:
        raise RecallmError(f"{example.spec.benchmark} {example.example_id}: {exc}") from None
    values: dict[str, Any] = breakdown.as_dict()
    metrics = {"reward": values.pop("score"), **{k: float(v) for k, v in values.items() if k != "n_tokens"}}
    answer, score = parse_response(generation.text).answer, float(breakdown.answer)
    if answer_region == "full":
        from recallm.eval.scoring import final_answer
        from rewards.config import as_ground_truth, check_ground_truth

        ground_truth = as_ground_truth(ref["ground_truth"])
        row = check_ground_truth(ground_truth, ref["data_source"], reward_config)
        answer = final_answer(generation.text, "full")
        score = float(answer_reward(answer, row, ground_truth))
    return Score(score=score, correct=score >= 1.0, answer=answer, metrics=metrics, gold=_gold(ref["ground_truth"]))


def _gold(ground_truth) -> list[str] | None:
    """The reference answers of a ground truth as text (an answer with aliases: its first form)."""
    from rewards.config import as_ground_truth

    answers = as_ground_truth(ground_truth).get("answers")
    if not isinstance(answers, (list, tuple)):
        return None
    out = []
    for answer in answers:
        if isinstance(answer, (list, tuple)):
            answer = answer[0] if answer else ""
        out.append(str(answer))
    return out
