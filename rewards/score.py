"""The composite reward of one response (paper §4.3): format, answer, recall, overlong.

``score_response`` parses the response, scores the answer with its category's metric, computes
R_ret against the gold passages (character intervals of the prompt text), combines them
(eq. 1-3) and applies the multiplicative overlong factor. It returns a ``RewardBreakdown``
whose every field is a finite number, whatever the response.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Mapping
from typing import NamedTuple

from recallm.errors import RecallmError
from rewards import metrics
from rewards.config import (
    CategoryReward,
    RewardConfig,
    as_ground_truth,
    check_ground_truth,
    gold_choice,
    load_reward_config,
)
from rewards.parsing import ParsedResponse, parse_response
from rewards.recall import (
    GoldPassage,
    clean_span,
    correctness_penalty,
    density_penalty,
    recall_overlap_detail,
)

__all__ = ["RewardBreakdown", "score_response", "composite", "overlong_factor", "format_reward", "answer_reward"]


class RewardBreakdown(NamedTuple):
    """Score and components (all finite; components that do not apply have a defined value:
    ``recall_overlap`` is 1 for ``always``, ``format_part`` is 1 where there is no task part)."""

    score: float
    format: float
    answer: float
    recall: float  # R_ret = overlap * density * correctness
    recall_overlap: float
    density_penalty: float
    correctness_penalty: float
    overlong_penalty: float  # the multiplicative factor (1 = no penalty)
    format_part: float  # task-specific part of the format reward
    n_spans: float
    n_short_spans: float
    n_mismatch: float
    spans_in_prompt: float  # fraction of spans found verbatim in the prompt text (1 without spans)
    used_recall: float
    answer_parsed: float
    n_tokens: float

    def as_dict(self) -> dict[str, float]:
        return self._asdict()


def composite(format_score: float, answer: float, recall: float, config: RewardConfig) -> float:
    """Eq. 1-3."""
    eps = config.weights.epsilon
    additive = 0.5 * answer + 0.5 * recall
    multiplicative = math.sqrt((answer + eps) * (recall + eps)) - eps
    return (
        config.weights.format * format_score
        + config.weights.additive * additive
        + config.weights.multiplicative * multiplicative
    )


def overlong_factor(n_tokens: int, config: RewardConfig) -> float:
    """1 up to the onset (``overlong.max_response_length - overlong.buffer`` tokens), then linearly
    down to 0 at ``overlong.max_response_length``, the generation cap (DAPO's overlong buffer)."""
    overlong = config.overlong
    if not overlong.enable or n_tokens <= overlong.onset:
        return 1.0
    return max(0.0, 1.0 - (n_tokens - overlong.onset) / overlong.buffer)


def format_reward(
    parsed: ParsedResponse, row: CategoryReward, ground_truth: Mapping, config: RewardConfig | None = None
) -> tuple[float, float]:
    """(format reward, its task-specific part).

    The paper's R_format (§4.3: "verifies the required interleaved output format"), 0 or 1:
    exactly one ``</think>``, no ``<think>`` but the opening one, exactly one ``Answer:`` after the
    think block, and no recall marker after it (recall spans interleave with the reasoning inside
    the think block). The task-specific part is reported as 1 and does not count unless
    ``format.task_specific`` is on (the authors' release has it on, at weight 0.5); then
    reranking's part is the fraction of ranked ids that are documents of the prompt and entity
    citation's the fraction of answer items that carry text and a citation, and the format reward
    is ``(1 - w) * base + w * part``.
    """
    base = float(
        parsed.n_think_end == 1
        and parsed.n_stray_think == 0
        and parsed.n_answers == 1
        and parsed.n_markers_after_think == 0
    )
    if config is None or not config.format.task_specific or row.answer not in ("ndcg", "citation"):
        return base, 1.0
    if row.answer == "ndcg":
        ranked = metrics.parse_ranking(parsed.answer)
        valid = {str(d) for d in ground_truth.get("doc_ids") or ()}
        part = sum(d in valid for d in ranked) / len(ranked) if ranked else 0.0
    else:
        items = metrics.parse_citations(parsed.answer)
        part = sum(bool(text) and bool(ids) for text, ids in items) / len(items) if items else 0.0
    w = config.format.task_weight
    return (1 - w) * base + w * part, part


def answer_reward(
    answer: str | None, row: CategoryReward, ground_truth: Mapping, spans: tuple[str, ...] | list[str] = ()
) -> float:
    """The category's answer metric (``answer`` is the parsed final answer, None if missing;
    ``spans`` the recall spans' texts, which back citations when ``citation_unrecalled_credit`` < 1)."""
    if answer is None:
        return 0.0
    if (
        row.answer in ("sub_em", "exact_match")
        and ground_truth.get("choices") is not None
        and len(ground_truth.get("choices"))
    ):
        choices = [str(c) for c in ground_truth["choices"]]
        return float(metrics.extract_choice(answer, len(choices), choices) == gold_choice(ground_truth))
    if row.answer == "sub_em":
        return metrics.sub_em(answer, metrics.as_aliases(ground_truth.get("answers")))
    if row.answer == "exact_match":
        return metrics.exact_match(answer, metrics.as_aliases(ground_truth.get("answers")))
    if row.answer == "net_recall":
        answers = ground_truth.get("answers")
        return metrics.net_recall(answer, [answers] if isinstance(answers, (str, int, float)) else list(answers))
    if row.answer == "ndcg":
        ranking = metrics.parse_ranking(answer)
        return metrics.ndcg_at_k(ranking, ground_truth.get("relevance") or {}, row.ndcg_k, row.ndcg_gain)
    entities = list(ground_truth.get("entities") or ())
    w = row.citation_coverage_weight
    if row.citation_mode == "entities":
        f1, coverage = metrics.entity_citation_scores(answer, entities, row.citation_k)
    else:
        recalled = None
        if row.citation_unrecalled_credit < 1:
            recalled = set().union(*(metrics.cited_ids(t) for t in spans)) if spans else set()
        scores = metrics.citation_id_scores(
            answer, entities, row.citation_k, recalled_ids=recalled, unrecalled_credit=row.citation_unrecalled_credit
        )
        f1, coverage = scores.f1, scores.coverage
    return (1 - w) * f1 + w * coverage


def _golds(ground_truth: Mapping) -> list[GoldPassage]:
    return [GoldPassage(str(g["text"]), int(g["start"]), int(g["end"])) for g in ground_truth.get("gold") or ()]


def score_response(
    response: str,
    ground_truth: Mapping,
    *,
    prompt_text: str | None = None,
    n_tokens: int | None = None,
    data_source: str | None = None,
    config: RewardConfig | None = None,
) -> RewardBreakdown:
    """Score one response.

    Args:
        response: the generated text, decoded *with* the recall tokens.
        ground_truth: the row's ground truth (see ``rewards.config``), a mapping or its JSON string.
        prompt_text: the prompt as text; required when the category scores recall with ``f1``.
        n_tokens: generated tokens (density and overlong); estimated as ``len(response) / 4``
            when not given.
        data_source: the row's data source (per-dataset exceptions, e.g. ``multi_niah``).
        config: reward settings; the paper's by default.

    Raises ``RecallmError`` (a ``ValueError``) for ground truth that lacks what its category needs
    or holds it with the wrong type, for a gold passage that is not in ``prompt_text``, and for an
    ``n_tokens`` that is not a finite non-negative number, and for a response that is not text
    (``bytes``: decode it first); never for what the text says, and in time bounded by its length
    and the prompt's (``rewards.recall``).
    """
    config = config or load_reward_config()
    ground_truth = as_ground_truth(ground_truth)
    row = check_ground_truth(ground_truth, data_source, config)
    if response is None:
        response = ""
    elif not isinstance(response, str):  # bytes would be scored as their repr ("b'...'"), not as the text
        raise RecallmError(f"the response must be text (str), got {type(response).__name__}; decode it first")
    if n_tokens is None:
        n_tokens = max(1, round(len(response) / 4))
    elif isinstance(n_tokens, bool) or not isinstance(n_tokens, numbers.Real) or not 0 <= n_tokens < 2**53:
        raise RecallmError(f"n_tokens must be a non-negative finite number of tokens, got {n_tokens!r}")
    n_tokens = int(n_tokens)
    parsed = parse_response(response)
    span_texts = [s.text for s in parsed.spans]
    fmt, part = format_reward(parsed, row, ground_truth, config)
    answer = answer_reward(parsed.answer, row, ground_truth, span_texts)

    cleaned = [clean_span(t) for t in span_texts]
    n_spans = len(span_texts)
    n_short = sum(len(t) < row.min_span_chars for t in cleaned)
    n_mismatch = abs(parsed.n_start - parsed.n_end)
    in_prompt = None
    if row.recall == "always":
        overlap = 1.0
    elif row.recall == "binary":
        overlap = float(n_spans > 0)
    else:
        if not isinstance(prompt_text, str):
            raise RecallmError(
                f"category {ground_truth.get('category')} scores recall against gold passages: prompt_text is required"
            )
        detail = recall_overlap_detail(prompt_text, span_texts, _golds(ground_truth), tau=row.tau, top_k=row.top_k)
        overlap, in_prompt = detail.overlap, detail.spans_in_prompt
    p_density = density_penalty(
        n_spans,
        n_tokens,
        free_spans=row.free_spans,
        delta=config.density.delta,
        half_life=config.density.half_life,
        per_tokens=config.density.per_tokens,
    )
    p_correct = correctness_penalty(n_short, n_mismatch, n_spans)
    # R_ret; with recall_reward=false it is 1 for every response (the paper's "No Recall Reward"
    # ablation), while overlap and the penalties are still measured and reported
    recall = overlap * p_density * p_correct if config.recall_reward else 1.0
    factor = overlong_factor(n_tokens, config)
    score = composite(fmt, answer, recall, config) * factor
    if in_prompt is None and isinstance(prompt_text, str):
        in_prompt = sum(n for t, n in Counter(cleaned).items() if t and t in prompt_text)
    in_prompt_fraction = in_prompt / n_spans if n_spans and in_prompt is not None else 1.0
    return RewardBreakdown(
        score=min(1.0, max(0.0, score)),
        format=fmt,
        answer=answer,
        recall=recall,
        recall_overlap=overlap,
        density_penalty=p_density,
        correctness_penalty=p_correct,
        overlong_penalty=factor,
        format_part=part,
        n_spans=float(n_spans),
        n_short_spans=float(n_short),
        n_mismatch=float(n_mismatch),
        spans_in_prompt=float(in_prompt_fraction),
        used_recall=float(n_spans > 0),
        answer_parsed=float(parsed.answer is not None),
        n_tokens=float(n_tokens),
    )
