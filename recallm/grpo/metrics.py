"""Per-step RecaLLM metrics of a GRPO batch (a verl ``DataProto``).

* ``recallm/reward/<component>``: mean of every reward component the reward manager returned
  (score, format, answer, recall, recall_overlap, density_penalty, correctness_penalty,
  n_spans, used_recall, spans_in_prompt, ...);
* ``recallm/answer/<category>``: mean answer score of the responses of each task category (the
  rows' ``extra_info.category``, else their ground truth's), Figure 10d's per-category curves;
* ``recallm/spans_per_response``, ``recallm/recall_usage`` (share of responses with a span),
  ``recallm/spans_checked`` (closed spans judged), ``recallm/spans_verbatim`` (share of them that are
  verbatim copies of their searchable context: 1.0 whenever the recall processor is active; not
  logged at a step without a span), ``recallm/response_length``;
* ``recallm/logprob_gap_in_spans`` and ``recallm/logprob_gap_outside_spans``: mean absolute
  difference between the rollout's log-probs and the actor's (``rollout_log_probs`` vs
  ``old_log_probs``), over response tokens inside and outside recall spans — near zero when the
  rollout and the masked actor see the same distribution (each left out when there is no such token).

``recall_batch_metrics`` is a pure function of the batch; ``recallm.grpo.worker_hooks`` adds it to the
metrics verl computes every step.
"""

from __future__ import annotations

import json

import numpy as np
import torch

__all__ = ["recall_batch_metrics", "span_token_mask"]

_NUMERIC_KINDS = "biuf"


def span_token_mask(responses: torch.Tensor, start_id: int, end_id: int) -> torch.Tensor:
    """Boolean mask of response tokens generated inside a recall span (the content tokens and the
    closing token; the opening token itself is generated outside)."""
    inside = torch.zeros_like(responses, dtype=torch.bool)
    is_start = (responses == start_id).int()
    is_end = (responses == end_id).int()
    # open after a start token, closed after its end token: depth = starts before - ends before
    depth = torch.cumsum(is_start, dim=1) - is_start - (torch.cumsum(is_end, dim=1) - is_end)
    inside |= depth > 0
    return inside


def recall_batch_metrics(batch, start_id: int | None, end_id: int | None) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for key, values in batch.non_tensor_batch.items():  # the reward breakdown
        arr = np.asarray(values)
        if arr.dtype.kind in _NUMERIC_KINDS and arr.size and key not in ("index", "uid") and not key.startswith("_"):
            metrics[f"recallm/reward/{key}"] = float(np.mean(arr.astype(np.float64)))
    metrics.update(_answer_by_category(batch.non_tensor_batch))
    tensors = batch.batch
    if start_id is None or end_id is None or "responses" not in tensors.keys():
        return metrics
    responses = tensors["responses"]
    if "response_mask" in tensors.keys():
        valid = tensors["response_mask"].bool()
    else:
        valid = tensors["attention_mask"][:, -responses.shape[1] :].bool()
    inside = span_token_mask(responses, start_id, end_id) & valid
    n_spans = ((responses == start_id) & valid).sum(dim=1)
    metrics["recallm/spans_per_response"] = float(n_spans.float().mean())
    metrics["recallm/recall_usage"] = float((n_spans > 0).float().mean())
    metrics["recallm/response_length"] = float(valid.sum(dim=1).float().mean())
    checked, verbatim = _verbatim_counts(batch, responses, valid, start_id, end_id)
    metrics["recallm/spans_checked"] = float(checked)
    if checked:  # no span: nothing measured (never a perfect 1.0); the curves report says "n/a (0 spans)"
        metrics["recallm/spans_verbatim"] = verbatim / checked
    if "rollout_log_probs" in tensors.keys() and "old_log_probs" in tensors.keys():
        gap = (tensors["rollout_log_probs"].float() - tensors["old_log_probs"].float()).abs()
        outside = valid & ~inside
        if inside.any():  # (no span token: no gap to report, not a 0.000)
            metrics["recallm/logprob_gap_in_spans"] = float(gap[inside].mean())
        if outside.any():
            metrics["recallm/logprob_gap_outside_spans"] = float(gap[outside].mean())
    return metrics


def _category(extra_info, reward_model) -> str | None:
    if isinstance(extra_info, dict) and extra_info.get("category"):
        return str(extra_info["category"])
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if isinstance(truth, str):
        try:
            truth = json.loads(truth)
        except ValueError:
            return None
    return str(truth["category"]) if isinstance(truth, dict) and truth.get("category") else None


def _answer_by_category(non_tensor) -> dict[str, float]:
    """``recallm/answer/<category>``: the mean ``answer`` reward of each category's responses."""
    answers = non_tensor.get("answer")
    if answers is None:
        return {}
    n = len(answers)
    extra = non_tensor.get("extra_info", [None] * n)
    truth = non_tensor.get("reward_model", [None] * n)
    sums: dict[str, list[float]] = {}
    for answer, info, rm in zip(answers, extra, truth, strict=True):
        category = _category(info, rm)
        if category is not None:
            sums.setdefault(category, []).append(float(answer))
    return {f"recallm/answer/{c}": float(np.mean(v)) for c, v in sorted(sums.items())}


def _verbatim_counts(batch, responses, valid, start_id: int, end_id: int) -> tuple[int, int]:
    from recallm.recall import find_spans

    tensors = batch.batch
    prompts = tensors["prompts"] if "prompts" in tensors.keys() else None
    total = verbatim = 0
    for b in range(responses.shape[0]):
        if not bool((responses[b] == start_id).any()):
            continue
        response = responses[b][valid[b]].tolist()
        prompt: list[int] = []
        if prompts is not None:
            mask = tensors["attention_mask"][b, : prompts.shape[1]].bool()
            prompt = prompts[b][mask].tolist()
        for span in find_spans(prompt + response, start_id, end_id):
            if span.start >= len(prompt) and span.closed:
                total += 1
                verbatim += span.verbatim
    return total, verbatim
