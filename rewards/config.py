"""Reward settings: the per-category table as data (``configs/reward/paper.yaml``), and the
checks that a row's ground truth carries what its category needs.

Ground truth of a row (``reward_model.ground_truth`` in verl's parquet):

* ``category``: one of the keys of ``categories`` (``multi_hop_qa``, ..., ``entity_citation``);
* ``answers``: gold answer aliases (``sub_em``, ``exact_match``), or the gold items of a list
  answer (``net_recall``; each item a string or a list of aliases); with ``choices`` (multiple
  choice) the correct letter or option text;
* ``choices``: option texts, lettered A, B, ... in order (multiple choice only);
* ``gold``: gold passages ``{"text", "start", "end"}`` (character interval in the prompt text) —
  needed when ``recall: f1``;
* ``relevance``: ``{doc_id: grade}`` (grades finite, in ``[0, MAX_GRADE]``) and ``doc_ids``: every
  document id shown (``ndcg``);
* ``entities``: ``[{"answers": aliases, "docs": supporting ids}]`` (``citation``).

``check_ground_truth`` checks the presence *and the types* of what the row's category reads
(aliases are strings or finite numbers, intervals are integers inside ``0 <= start <= end`` whose
length is the text's, grades are finite numbers, ...): a hostile or corrupt row fails there with
one ``RecallmError`` naming the field, before training, instead of as a ``TypeError`` at its
first reward.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path

from recallm.config import MAX_CHARS, MAX_COUNT, MAX_TOKENS
from recallm.errors import RecallmError

try:  # numpy's bool is no numbers.Integral, but guard anyway: a grade of True is no grade
    from numpy import bool_ as np_bool
except ImportError:  # pragma: no cover - numpy is a dependency
    np_bool = bool

__all__ = [
    "ANSWER_METRICS",
    "RECALL_MODES",
    "CategoryReward",
    "DataSourceOverride",
    "RewardConfig",
    "OverlongSection",
    "load_reward_config",
    "check_ground_truth",
    "gold_choice",
    "check_rows",
    "as_ground_truth",
    "CITATION_MODES",
    "NDCG_GAINS",
    "MAX_GRADE",
]

ANSWER_METRICS = ("sub_em", "exact_match", "net_recall", "ndcg", "citation")
RECALL_MODES = ("f1", "always", "binary")
CITATION_MODES = ("ids", "entities")
NDCG_GAINS = ("linear", "exponential")
MAX_GRADE = 100.0  # relevance grades above this are refused (MS MARCO / TREC DL grades are 0-3)


@dataclass(frozen=True)
class CategoryReward:
    """One row of Table 5."""

    answer: str
    recall: str
    tau: float | None = None
    top_k: int | None = field(default=None, metadata={"max": MAX_COUNT})
    free_spans: int = field(default=2, metadata={"max": MAX_COUNT})
    min_span_chars: int = field(default=5, metadata={"max": MAX_CHARS})
    ndcg_k: int = field(default=10, metadata={"max": MAX_COUNT})
    citation_k: int = field(default=5, metadata={"max": MAX_COUNT})
    ndcg_gain: str = "linear"  # NDCG gains: the grade (linear) or 2**grade - 1 (exponential)
    citation_mode: str = "ids"  # citation F1 over exact document ids, or per matched entity
    citation_coverage_weight: float = 0.2  # answer = (1 - w) * citation F1 + w * coverage
    citation_unrecalled_credit: float = 1.0  # weight of a citation no recall span backs (ids mode)

    def __post_init__(self) -> None:
        if self.answer not in ANSWER_METRICS:
            raise RecallmError(f"unknown answer metric {self.answer!r}; expected one of {', '.join(ANSWER_METRICS)}")
        if self.recall not in RECALL_MODES:
            raise RecallmError(f"unknown recall mode {self.recall!r}; expected one of {', '.join(RECALL_MODES)}")
        if self.recall == "f1" and (self.tau is None or not 0 < self.tau <= 1):
            raise RecallmError(f"recall mode f1 needs tau in (0, 1], got {self.tau}")
        if self.top_k is not None and self.top_k < 1:
            raise RecallmError(f"top_k must be >= 1 or null, got {self.top_k}")
        for name in ("free_spans", "min_span_chars"):
            if getattr(self, name) < 0:
                raise RecallmError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("ndcg_k", "citation_k"):
            if getattr(self, name) < 1:
                raise RecallmError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.ndcg_gain not in NDCG_GAINS:
            raise RecallmError(f"unknown ndcg_gain {self.ndcg_gain!r}; expected one of {', '.join(NDCG_GAINS)}")
        if self.citation_mode not in CITATION_MODES:
            raise RecallmError(
                f"unknown citation_mode {self.citation_mode!r}; expected one of {', '.join(CITATION_MODES)}"
            )
        for name in ("citation_coverage_weight", "citation_unrecalled_credit"):
            if not 0 <= getattr(self, name) <= 1:
                raise RecallmError(f"{name} must be in [0, 1], got {getattr(self, name)}")


@dataclass(frozen=True)
class DataSourceOverride:
    """``data_sources.<data_source>``: one data set's exceptions to its category's row (the keys of
    ``CategoryReward``; an unset key keeps the category's value)."""

    category: str | None = None
    """required: the category whose row this changes (``RewardConfig`` checks it)"""
    answer: str | None = None
    recall: str | None = None
    tau: float | None = field(default=None, metadata={"min": 0, "max": 1})
    top_k: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    free_spans: int | None = field(default=None, metadata={"min": 0, "max": MAX_COUNT})
    min_span_chars: int | None = field(default=None, metadata={"min": 0, "max": MAX_CHARS})
    ndcg_k: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    citation_k: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    ndcg_gain: str | None = None
    citation_mode: str | None = None
    citation_coverage_weight: float | None = field(default=None, metadata={"min": 0, "max": 1})
    citation_unrecalled_credit: float | None = field(default=None, metadata={"min": 0, "max": 1})

    def changes(self) -> dict[str, object]:
        """The keys this override sets (``category`` aside)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "category"}
        return {k: v for k, v in values.items() if v is not None}


# The sections of a reward YAML (``configs/reward/*.yaml``), read with ``recallm.config.typed`` into
# ``RewardConfig`` itself: an unknown key or a value of the wrong kind is one line naming it. They carry
# no defaults: a reward recipe file states every value (with its source), and a partial mapping is
# merged onto ``configs/reward/paper.yaml`` (``load_reward_config``) - the values are held there once.
@dataclass(frozen=True)
class WeightsSection:
    """``weights``: eq. 1 and 3."""

    format: float
    additive: float
    multiplicative: float
    epsilon: float = field(metadata={"max": 1})

    def __post_init__(self) -> None:
        weights = (self.format, self.additive, self.multiplicative)
        if min(weights) < 0 or abs(sum(weights) - 1.0) > 1e-6:
            raise RecallmError(f"reward weights must be >= 0 and sum to 1, got {weights}")
        if self.epsilon <= 0:
            raise RecallmError(f"epsilon must be > 0, got {self.epsilon}")


@dataclass(frozen=True)
class FormatSection:
    """``format``: the task-specific answer-format terms."""

    task_specific: bool
    """add the reranking / citation answer-format terms"""
    task_weight: float
    """their share of the format reward when on"""

    def __post_init__(self) -> None:
        if not 0 <= self.task_weight <= 1:
            raise RecallmError(f"task_weight must be in [0, 1], got {self.task_weight}")


@dataclass(frozen=True)
class DensitySection:
    """``density``: P_density (eq. 6-7)."""

    delta: float = field(metadata={"min": 0, "max": MAX_COUNT})
    half_life: float = field(metadata={"max": MAX_COUNT})
    per_tokens: int = field(metadata={"max": MAX_TOKENS})

    def __post_init__(self) -> None:
        if self.half_life <= 0 or self.per_tokens <= 0:
            raise RecallmError("density half_life and per_tokens must be > 0")


@dataclass(frozen=True)
class OverlongSection:
    """``overlong``: DAPO's overlong shaping, multiplicative. A response's factor is 1 up to
    :attr:`onset` = ``max_response_length - buffer`` tokens, then falls linearly to 0 at
    ``max_response_length``, the generation cap (DAPO: the penalty starts ``buffer`` tokens before
    the longest response the rollout generates). In a GRPO run ``max_response_length`` *is* the
    generation cap ``data.max_response_length`` (``configs/grpo.yaml`` interpolates it; another value
    is refused)."""

    enable: bool
    max_response_length: int = field(metadata={"max": MAX_TOKENS})
    """the generation cap: no response is longer (DAPO's L_max)"""
    buffer: int
    """the tokens before the cap over which the factor falls from 1 to 0 (DAPO's overlong buffer)"""

    def __post_init__(self) -> None:
        if self.max_response_length < 1:
            raise RecallmError(f"max_response_length must be >= 1, got {self.max_response_length}")
        if self.buffer < 0:
            raise RecallmError(f"buffer must be >= 0, got {self.buffer}")
        if not self.enable:
            return
        if self.buffer == 0:
            raise RecallmError(
                f"buffer must be >= 1 with enable=true: with 0 the penalty would start at the generation cap "
                f"(max_response_length={self.max_response_length}), which no response passes; or set enable=false"
            )
        if self.buffer > self.max_response_length:
            raise RecallmError(
                f"buffer must be <= max_response_length={self.max_response_length} (the generation cap), "
                f"got {self.buffer}"
            )

    @property
    def onset(self) -> int:
        """The response length after which the penalty applies."""
        return self.max_response_length - self.buffer


@dataclass(frozen=True)
class RewardConfig:
    """The whole reward, and the schema of a reward YAML (``configs/reward/paper.yaml``): weights,
    penalties, overlong shaping, the category table and its per-data-set exceptions."""

    weights: WeightsSection
    recall_reward: bool
    """false: R_ret = 1 for every response (the paper's "No Recall Reward" ablation)"""
    format: FormatSection
    density: DensitySection
    overlong: OverlongSection
    categories: dict[str, CategoryReward]
    """name -> one row of Table 5"""
    data_sources: dict[str, DataSourceOverride] = field(default_factory=dict)
    """data_source -> that data set's exceptions to its category's row"""

    def __post_init__(self) -> None:
        if not self.categories:
            raise RecallmError("reward config has no categories")
        for source, override in self.data_sources.items():
            if override.category not in self.categories:
                raise RecallmError(
                    f"data_sources.{source} must name its category (one of {', '.join(sorted(self.categories))}), "
                    f"got {override.category!r}"
                )
            replace(self.categories[override.category], **override.changes())

    @classmethod
    def from_mapping(cls, cfg: Mapping) -> RewardConfig:
        """Build from a ``configs/reward/*.yaml``-shaped mapping (OmegaConf or plain dict)."""
        from recallm.config import typed

        return typed(cls, _plain(cfg), "reward")

    def for_row(self, category: str, data_source: str | None = None) -> CategoryReward:
        """The settings of one row: its category's, with its data source's exceptions."""
        return _row_settings(self, category, data_source)


def _row_settings(config: RewardConfig, category: str, data_source: str | None) -> CategoryReward:
    try:
        row = config.categories[category]
    except (KeyError, TypeError):
        raise RecallmError(
            f"unknown reward category {category!r}; known: {', '.join(sorted(config.categories))}"
        ) from None
    override = config.data_sources.get(data_source) if data_source else None
    if not override:
        return row
    if override.category != category:
        raise RecallmError(
            f"data_source {data_source!r} belongs to category {override.category!r}, but the row says {category!r}"
        )
    return replace(row, **override.changes())


def _plain(cfg) -> dict:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return dict(cfg)


@lru_cache(maxsize=8)
def _load(path: str, overrides: tuple[str, ...]) -> RewardConfig:
    from omegaconf import OmegaConf

    file = Path(path)
    if not file.is_file():
        raise RecallmError(f"reward config {file} does not exist")
    cfg = OmegaConf.load(file)
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    return RewardConfig.from_mapping(cfg)


def load_reward_config(source: str | Path | Mapping | RewardConfig | None = None, overrides: Sequence[str] = ()):
    """A ``RewardConfig`` from a YAML file, from a mapping merged onto the paper's defaults, or the
    paper's defaults (``None``).

    ``overrides`` are dotted ``key=value`` strings, e.g. ``categories.icl.tau=0.9``.
    """
    if isinstance(source, RewardConfig):
        return source
    if source is None or isinstance(source, (str, Path)):
        return _load(str(source if source is not None else _default_path()), tuple(overrides))
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.load(_default_path()), OmegaConf.create(_plain(source)))
    if overrides:
        merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
    return RewardConfig.from_mapping(merged)


def _default_path() -> Path:
    from recallm.paths import config_dir

    return config_dir() / "reward" / "paper.yaml"


def _seq(value) -> list:
    if value is None or isinstance(value, (str, bytes, Mapping)):
        return []
    try:
        return list(value)
    except TypeError:
        return []


def gold_choice(ground_truth: Mapping) -> int:
    """Index of the correct option of a multiple-choice row (``answers``: a letter or option text)."""
    choices = [str(c) for c in _seq(ground_truth.get("choices"))]
    from rewards.metrics import as_aliases, normalize_tokens

    for answer in as_aliases(ground_truth.get("answers")):
        a = answer.strip().strip("()[].").strip()
        if len(a) == 1 and a.isalpha() and ord(a.upper()) - ord("A") < len(choices):
            return ord(a.upper()) - ord("A")
        for i, choice in enumerate(choices):
            if normalize_tokens(choice) == normalize_tokens(answer) and normalize_tokens(answer):
                return i
    raise RecallmError(f"multiple-choice ground truth: answers {ground_truth.get('answers')!r} name no option")


@lru_cache(maxsize=4096)
def _parse_json(text: str) -> Mapping:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecallmError(f"ground truth is a string but not JSON ({exc.msg}): {text[:60]!r}") from exc
    except RecursionError:
        raise RecallmError(f"ground truth is JSON nested too deeply to read: {text[:60]!r}") from None
    if not isinstance(value, Mapping):
        raise RecallmError(f"ground truth must be a mapping, got JSON {type(value).__name__}")
    return value


def as_ground_truth(ground_truth) -> Mapping:
    """A row's ground truth as a mapping: verl parquet rows carry it as a JSON string (one schema for
    every category); parsed once per distinct string (the n rollouts of a prompt share it)."""
    if isinstance(ground_truth, str):
        return _parse_json(ground_truth)
    return ground_truth


def _number(value) -> bool:
    """A real number that is not a bool (numpy's included)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np_bool))


def _scalar(value) -> bool:
    """An answer alias, choice text or document id: a string or a finite number (not a bool)."""
    if isinstance(value, str):
        return True
    return _number(value) and math.isfinite(value)


def _integer(value) -> bool:
    if isinstance(value, numbers.Integral):
        return _number(value)
    return _number(value) and math.isfinite(value) and float(value).is_integer()


def _list(value) -> bool:
    return isinstance(value, (list, tuple))


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_aliases(value, field: str, where: str, *, nested: bool = False) -> None:
    """A string, or a non-empty list of strings/numbers (``nested``: whose items may also be lists
    of them: the gold items of a list answer)."""
    if _scalar(value):  # one alias (a number is read as its text)
        return
    if not _list(value) or not value:
        raise RecallmError(f"{where}: {field!r} must be a string or a non-empty list of strings, got {_short(value)}")
    for i, item in enumerate(value):
        if _scalar(item):
            continue
        if nested and _list(item) and item and all(_scalar(a) for a in item):
            continue
        raise RecallmError(f"{where}: {field}[{i}] must be a string or a number, got {_short(item)}")


def _check_gold(value, where: str) -> None:
    if not _list(value):
        raise RecallmError(f"{where}: 'gold' must be a list of passages {{text, start, end}}, got {_short(value)}")
    for i, gold in enumerate(value):
        if not isinstance(gold, Mapping) or not {"text", "start", "end"} <= set(gold):
            raise RecallmError(f"{where}: gold[{i}] needs 'text', 'start' and 'end', got {_short(gold)}")
        text, start, end = gold["text"], gold["start"], gold["end"]
        if not isinstance(text, str) or not text:
            raise RecallmError(f"{where}: gold[{i}].text must be a non-empty string, got {_short(text)}")
        for name, number in (("start", start), ("end", end)):
            if not _integer(number) or number < 0:
                raise RecallmError(f"{where}: gold[{i}].{name} must be a non-negative integer, got {_short(number)}")
        if int(end) - int(start) != len(text):
            raise RecallmError(
                f"{where}: gold[{i}] interval [{int(start)}, {int(end)}) does not have the length of its text "
                f"({len(text)} characters)"
            )


def _check_relevance(value, where: str) -> None:
    if not isinstance(value, Mapping) or not value:
        raise RecallmError(f"{where}: 'relevance' must be a non-empty mapping {{doc_id: grade}}, got {_short(value)}")
    for doc, grade in value.items():
        if not _scalar(doc):
            raise RecallmError(f"{where}: relevance has a document id that is not a string: {_short(doc)}")
        if not _number(grade) or not 0 <= grade <= MAX_GRADE:
            raise RecallmError(
                f"{where}: relevance[{str(doc)!r}] must be a finite number in [0, {MAX_GRADE:g}], got {_short(grade)}"
            )
    if not any(grade > 0 for grade in value.values()):
        raise RecallmError(f"{where}: 'relevance' has no document with a positive grade")


def _check_ids(value, field: str, where: str) -> None:
    if not _list(value) or not all(_scalar(d) for d in value):
        raise RecallmError(f"{where}: {field!r} must be a list of document ids (strings), got {_short(value)}")


def _check_entities(value, where: str) -> None:
    if not _list(value) or not value:
        raise RecallmError(f"{where}: 'entities' must be a non-empty list of {{answers, docs}}, got {_short(value)}")
    for i, entity in enumerate(value):
        if not isinstance(entity, Mapping):
            raise RecallmError(f"{where}: entities[{i}] must be a mapping {{answers, docs}}, got {_short(entity)}")
        if "answers" not in entity:
            raise RecallmError(f"{where}: entities[{i}] has no 'answers' (every entity needs 'answers' and 'docs')")
        _check_aliases(entity["answers"], f"entities[{i}].answers", where)
        _check_ids(entity.get("docs", []), f"entities[{i}].docs", where)


def check_ground_truth(ground_truth, data_source: str | None, config: RewardConfig) -> CategoryReward:
    """Raise ``RecallmError`` naming what a row's ground truth lacks or holds of the wrong type;
    return its settings."""
    ground_truth = as_ground_truth(ground_truth)
    if not isinstance(ground_truth, Mapping):
        raise RecallmError(f"ground truth must be a mapping, got {type(ground_truth).__name__}")
    category = ground_truth.get("category")
    if not isinstance(category, str):
        raise RecallmError(f"ground truth 'category' must be a string, got {_short(category)}")
    if data_source is not None and not isinstance(data_source, str):
        raise RecallmError(f"data_source must be a string, got {_short(data_source)}")
    row = config.for_row(category, data_source)
    where = f"ground truth of a {category} row (data_source={data_source})"

    def need(key: str, why: str):
        value = ground_truth.get(key)
        empty = (
            value is None
            or (isinstance(value, str) and not value)
            or (_list(value) and len(value) == 0)
            or (isinstance(value, Mapping) and not value)
        )
        if empty:
            raise RecallmError(f"{where} has no {key!r} ({why})")
        return value

    if row.answer in ("sub_em", "exact_match", "net_recall"):
        _check_aliases(need("answers", f"answer metric {row.answer}"), "answers", where, nested=True)
        choices = ground_truth.get("choices")
        if choices is not None:
            if not _list(choices) or not all(_scalar(c) for c in choices):
                raise RecallmError(f"{where}: 'choices' must be a list of option texts, got {_short(choices)}")
            if choices:
                gold_choice(ground_truth)
    elif row.answer == "ndcg":
        _check_relevance(need("relevance", "answer metric ndcg"), where)
        _check_ids(need("doc_ids", "the reranking format check"), "doc_ids", where)
    elif row.answer == "citation":
        _check_entities(need("entities", "answer metric citation"), where)
    if row.recall == "f1":
        _check_gold(need("gold", f"recall mode f1, tau={row.tau}"), where)
    return row


def check_rows(rows, config: RewardConfig | None = None) -> int:
    """Check the ground truth of every row of a dataset before training starts.

    ``rows``: an iterable of verl-style records (``{"data_source", "reward_model": {"ground_truth"}}``)
    or of ``(ground_truth, data_source)`` pairs. Raises ``RecallmError`` naming the first bad row;
    returns the number of rows checked.
    """
    config = config or load_reward_config()
    n = 0
    for n, row in enumerate(rows, 1):
        if isinstance(row, Mapping):
            reward_model = row.get("reward_model")
            ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
            data_source = row.get("data_source")
        else:
            ground_truth, data_source = row
        try:
            check_ground_truth(ground_truth, None if data_source is None else str(data_source), config)
        except RecallmError as exc:
            raise RecallmError(f"row {n - 1}: {exc}") from exc
    return n
