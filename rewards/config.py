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
* ``relevance``: ``{doc_id: grade}`` and ``doc_ids``: every document id shown (``ndcg``);
* ``entities``: ``[{"answers": aliases, "docs": supporting ids}]`` (``citation``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path

from recallm.errors import RecallmError

__all__ = [
    "ANSWER_METRICS",
    "RECALL_MODES",
    "CategoryReward",
    "RewardConfig",
    "load_reward_config",
    "check_ground_truth",
    "gold_choice",
    "check_rows",
    "as_ground_truth",
]

ANSWER_METRICS = ("sub_em", "exact_match", "net_recall", "ndcg", "citation")
RECALL_MODES = ("f1", "always", "binary")


@dataclass(frozen=True)
class CategoryReward:
    """One row of Table 5."""

    answer: str
    recall: str
    tau: float | None = None
    top_k: int | None = None
    free_spans: int = 2
    min_span_chars: int = 5
    ndcg_k: int = 10
    citation_k: int = 5

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


@dataclass(frozen=True)
class RewardConfig:
    """The whole reward: weights, penalties, overlong shaping, the category table."""

    categories: Mapping[str, CategoryReward]
    data_sources: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    format_weight: float = 0.2
    additive_weight: float = 0.4
    multiplicative_weight: float = 0.4
    epsilon: float = 0.01
    density_delta: float = 4.0
    density_half_life: float = 4.0
    density_per_tokens: int = 1024
    overlong_enable: bool = True
    max_response_length: int = 4096
    overlong_buffer: int = 1024
    recall_reward: bool = True  # False: R_ret = 1 for every response (the paper's "No Recall Reward" ablation)

    def __post_init__(self) -> None:
        weights = (self.format_weight, self.additive_weight, self.multiplicative_weight)
        if min(weights) < 0 or abs(sum(weights) - 1.0) > 1e-6:
            raise RecallmError(f"reward weights must be >= 0 and sum to 1, got {weights}")
        if self.epsilon <= 0:
            raise RecallmError(f"epsilon must be > 0, got {self.epsilon}")
        if self.density_half_life <= 0 or self.density_per_tokens <= 0:
            raise RecallmError("density half_life and per_tokens must be > 0")
        if self.max_response_length < 1 or self.overlong_buffer < 0:
            raise RecallmError(
                f"overlong max_response_length must be >= 1 and buffer >= 0, got "
                f"{self.max_response_length} and {self.overlong_buffer}"
            )
        known = {f.name for f in fields(CategoryReward)}
        for source, override in self.data_sources.items():
            category = override.get("category")
            if category not in self.categories:
                raise RecallmError(
                    f"data_sources.{source} must name its category (one of {', '.join(sorted(self.categories))}), "
                    f"got {category!r}"
                )
            bad = set(override) - known - {"category"}
            if bad:
                raise RecallmError(f"data_sources.{source} has unknown keys {sorted(bad)}")
            replace(self.categories[category], **{k: v for k, v in override.items() if k != "category"})

    @classmethod
    def from_mapping(cls, cfg: Mapping) -> RewardConfig:
        """Build from a ``configs/reward/*.yaml``-shaped mapping (OmegaConf or plain dict)."""
        cfg = _plain(cfg)
        try:
            weights, density, overlong = cfg.get("weights", {}), cfg.get("density", {}), cfg.get("overlong", {})
            categories = {name: CategoryReward(**row) for name, row in (cfg.get("categories") or {}).items()}
        except TypeError as exc:
            raise RecallmError(f"bad reward config: {exc}") from exc
        if not categories:
            raise RecallmError("reward config has no categories")
        return cls(
            categories=categories,
            data_sources={k: dict(v) for k, v in (cfg.get("data_sources") or {}).items()},
            format_weight=float(weights.get("format", 0.2)),
            additive_weight=float(weights.get("additive", 0.4)),
            multiplicative_weight=float(weights.get("multiplicative", 0.4)),
            epsilon=float(weights.get("epsilon", 0.01)),
            density_delta=float(density.get("delta", 4.0)),
            density_half_life=float(density.get("half_life", 4.0)),
            density_per_tokens=int(density.get("per_tokens", 1024)),
            overlong_enable=bool(overlong.get("enable", True)),
            max_response_length=int(overlong.get("max_response_length", 4096)),
            overlong_buffer=int(overlong.get("buffer", 1024)),
            recall_reward=bool(cfg.get("recall_reward", True)),
        )

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
    if override["category"] != category:
        raise RecallmError(
            f"data_source {data_source!r} belongs to category {override['category']!r}, but the row says {category!r}"
        )
    return replace(row, **{k: v for k, v in override.items() if k != "category"})


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
    if not isinstance(value, Mapping):
        raise RecallmError(f"ground truth must be a mapping, got JSON {type(value).__name__}")
    return value


def as_ground_truth(ground_truth) -> Mapping:
    """A row's ground truth as a mapping: verl parquet rows carry it as a JSON string (one schema for
    every category); parsed once per distinct string (the n rollouts of a prompt share it)."""
    if isinstance(ground_truth, str):
        return _parse_json(ground_truth)
    return ground_truth


def check_ground_truth(ground_truth, data_source: str | None, config: RewardConfig) -> CategoryReward:
    """Raise ``RecallmError`` naming what a row's ground truth lacks; return its settings."""
    ground_truth = as_ground_truth(ground_truth)
    if not isinstance(ground_truth, Mapping):
        raise RecallmError(f"ground truth must be a mapping, got {type(ground_truth).__name__}")
    row = config.for_row(ground_truth.get("category"), data_source)
    where = f"ground truth of a {ground_truth.get('category')} row (data_source={data_source})"

    def need(key: str, why: str):
        value = ground_truth.get(key)
        empty = (
            value is None
            or (isinstance(value, str) and not value)
            or (not isinstance(value, (str, Mapping)) and len(_seq(value)) == 0)
            or (isinstance(value, Mapping) and not value)
        )
        if empty:
            raise RecallmError(f"{where} has no {key!r} ({why})")
        return value

    if row.answer in ("sub_em", "exact_match", "net_recall"):
        need("answers", f"answer metric {row.answer}")
        if _seq(ground_truth.get("choices")):
            gold_choice(ground_truth)
    elif row.answer == "ndcg":
        relevance = need("relevance", "answer metric ndcg")
        if not any(float(v) > 0 for v in relevance.values()):
            raise RecallmError(f"{where}: 'relevance' has no document with a positive grade")
        need("doc_ids", "the reranking format check")
    elif row.answer == "citation":
        for entity in _seq(need("entities", "answer metric citation")):
            if (
                not isinstance(entity, Mapping)
                or not _seq(entity.get("answers"))
                and not isinstance(entity.get("answers"), str)
            ):
                raise RecallmError(f"{where}: every entity needs 'answers' (and 'docs')")
    if row.recall == "f1":
        for gold in _seq(need("gold", f"recall mode f1, tau={row.tau}")):
            if not isinstance(gold, Mapping) or not {"text", "start", "end"} <= set(gold):
                raise RecallmError(f"{where}: every gold passage needs 'text', 'start' and 'end', got {gold!r}")
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
