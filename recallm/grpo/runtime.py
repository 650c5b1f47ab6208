"""Imported by every verl process of a RecaLLM run (``VERL_USE_EXTERNAL_MODULES``).

* registers the masked model classes (``import recallm``), so actor and reference load
  ``recallm_<base>`` checkpoints as the classes that apply the recall mask;
* activates the CPU plugin (``recallm.grpo.cpu``) when ``RECALLM_GRPO_CPU=1``;
* with ``RECALLM_VLLM_CPU=1``, lets verl's vLLM rollout run on vLLM's CPU build
  (``recallm.grpo.vllm_cpu``);
* merges the vLLM rollout's ``hf_overrides`` (``RECALLM_VLLM_HF_OVERRIDES``) into the ones verl
  builds itself (``recallm.grpo.vllm_rollout``);
* adds the RecaLLM metrics to the ones verl computes every step. verl 0.9.1 has no hook for
  extra training metrics: its trainer calls ``verl.trainer.ppo.metric_utils.compute_data_metrics``
  on the finished batch of every step, so that function is wrapped (once, before the trainer
  module imports it) to also return ``recallm.grpo.metrics.recall_batch_metrics``. Nothing of
  verl's own output changes. The recall token ids come from ``RECALLM_RECALL_TOKEN_IDS``
  (``"<start>,<end>"``), set by ``recallm-grpo``.
"""

from __future__ import annotations

import os
import sys

import recallm  # noqa: F401  (registers the recallm_<base> classes)

__all__ = ["install_metrics", "recall_token_ids"]


def recall_token_ids() -> tuple[int | None, int | None]:
    value = os.environ.get("RECALLM_RECALL_TOKEN_IDS", "")
    try:
        start, end = (int(x) for x in value.split(","))
    except ValueError:
        return None, None
    return start, end


def install_metrics() -> None:
    import verl.trainer.ppo.metric_utils as metric_utils

    original = metric_utils.compute_data_metrics
    if getattr(original, "_recallm", False):
        return

    def compute_data_metrics(batch, use_critic: bool = True):
        from recallm.grpo.metrics import recall_batch_metrics

        metrics = original(batch, use_critic=use_critic)
        metrics.update(recall_batch_metrics(batch, *recall_token_ids()))
        return metrics

    compute_data_metrics._recallm = True  # type: ignore[attr-defined]
    metric_utils.compute_data_metrics = compute_data_metrics
    trainer_module = sys.modules.get("verl.trainer.ppo.ray_trainer")
    if trainer_module is not None:  # imported before us: replace its copy of the name too
        trainer_module.compute_data_metrics = compute_data_metrics


if os.environ.get("RECALLM_GRPO_CPU") == "1":
    from recallm.grpo.cpu import activate

    activate()
install_metrics()
if os.environ.get("RECALLM_VLLM_CPU") == "1":
    from recallm.grpo.vllm_cpu import activate as _activate_vllm_cpu

    _activate_vllm_cpu()
if os.environ.get("RECALLM_VLLM_HF_OVERRIDES"):
    from recallm.grpo.vllm_rollout import install as _install_hf_overrides

    _install_hf_overrides()
