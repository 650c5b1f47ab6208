"""The RLM's hooks into verl's processes: imported by every verl process of ``recallm-rlm train``
(``VERL_USE_EXTERNAL_MODULES``, after ``recallm.grpo.worker_hooks``): adds
the RLM's metrics to the ones verl computes every step.

verl 0.9.1 has no hook for extra training metrics; its trainer calls
``verl.trainer.ppo.metric_utils.compute_data_metrics`` on the finished batch of every step, so
that function is wrapped (as ``recallm.grpo.worker_hooks`` does for the recall metrics; the two
wrappers stack) to also return, from the batch the actor trains on:

* ``rlm/response_tokens/trained`` and ``rlm/response_tokens/masked`` - mean per rollout of the
  response tokens inside the loss (``response_mask`` 1: the root's own tokens) and outside it
  (in the response but masked: the REPL observations the agent loop appended);
* ``rlm/turns``, ``rlm/final``, ``rlm/correct``, ``rlm/subcalls`` - means of the agent loop's
  ``reward_extra_info`` (root turns, share ended by FINAL, share correct, sub-calls).

It also gives a RecaLLM model (``model_type`` ``recallm_<base>``) its base's continuous-token
builder: verl picks the builder that renders multi-turn boundaries (the newline a Qwen template
puts after ``<|im_end|>``) by exact ``model_type`` (``verl/utils/tokenizer/
continuous_token_wiring.py``, ``_MODEL_TYPE_TO_FAMILY``), and would fall back to the generic one.
"""

from __future__ import annotations

import sys

__all__ = ["install_metrics", "rlm_batch_metrics", "register_continuous_token_families"]


def rlm_batch_metrics(batch) -> dict[str, float]:
    """The metrics of the module doc for a verl ``DataProto`` (empty when it has no responses)."""
    import numpy as np

    out: dict[str, float] = {}
    tensors = batch.batch
    if tensors is not None and "response_mask" in tensors.keys() and "attention_mask" in tensors.keys():
        mask = tensors["response_mask"].float()
        attention = tensors["attention_mask"][:, -mask.shape[1] :].float()
        out["rlm/response_tokens/trained"] = float(mask.sum(-1).mean())
        out["rlm/response_tokens/masked"] = float((attention - mask).clamp(min=0).sum(-1).mean())
    extra = batch.non_tensor_batch or {}
    for key, name in (("rlm_turns", "turns"), ("rlm_final", "final"), ("rlm_correct", "correct"),
                      ("rlm_subcalls", "subcalls")):  # fmt: skip
        if key in extra:
            values = np.asarray(extra[key], dtype=float)
            if values.size:
                out[f"rlm/{name}"] = float(values.mean())
    return out


def install_metrics() -> None:
    import verl.trainer.ppo.metric_utils as metric_utils

    original = metric_utils.compute_data_metrics
    if getattr(original, "_recallm_rlm", False):
        return

    def compute_data_metrics(batch, use_critic: bool = True):
        metrics = original(batch, use_critic=use_critic)
        metrics.update(rlm_batch_metrics(batch))
        return metrics

    compute_data_metrics._recallm_rlm = True  # type: ignore[attr-defined]
    compute_data_metrics._recallm = getattr(original, "_recallm", False)  # type: ignore[attr-defined]
    metric_utils.compute_data_metrics = compute_data_metrics
    trainer_module = sys.modules.get("verl.trainer.ppo.ray_trainer")
    if trainer_module is not None:  # imported before us: replace its copy of the name too
        trainer_module.compute_data_metrics = compute_data_metrics


def register_continuous_token_families() -> None:
    """``recallm_<base>`` model types use ``<base>``'s continuous-token builder (module doc)."""
    from verl.utils.tokenizer import continuous_token_wiring as wiring

    table = wiring._MODEL_TYPE_TO_FAMILY
    for model_type, family in list(table.items()):
        if not model_type.startswith("recallm_"):
            table.setdefault(f"recallm_{model_type}", family)


install_metrics()
register_continuous_token_families()
