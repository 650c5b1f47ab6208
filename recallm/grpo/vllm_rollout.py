"""What RecaLLM adds to verl 0.9.1's vLLM rollout server, from outside: merged ``hf_overrides``.

A RecaLLM checkpoint's config names ``Recall<Base>ForCausalLM`` / ``recallm_<base>``, which vLLM
does not know; vLLM serves it as its base architecture through ``hf_overrides``
(``recallm.modeling.vllm_hf_overrides``), with the recall processor reading the recall token ids
from the same config. verl's ``vLLMHttpServer.launch_server`` builds an ``hf_overrides`` dict of
its own (``_apply_quantization``: FP8 / QAT ``quantization_config``) and then spreads
``engine_kwargs.vllm`` over its arguments, so a value there *replaces* verl's dict. Instead,
``recallm-grpo`` puts the merged overrides (the user's, then the architecture) in the
environment (:data:`recallm.grpo.app.HF_OVERRIDES_ENV`), and every verl process of the run
(``recallm.grpo.worker_hooks``) wraps ``vLLMHttpServer._apply_quantization`` once, so that what it
returns is verl's dict with ours merged in. Nothing else of verl changes.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["merge_hf_overrides", "patch_server_class", "install", "SERVER_MODULE"]

log = logging.getLogger(__name__)

SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"
_ENV = "RECALLM_VLLM_HF_OVERRIDES"  # recallm.grpo.app.HF_OVERRIDES_ENV (not imported: keep this light)


def merge_hf_overrides(verl_overrides: Mapping[str, Any] | None, ours: Mapping[str, Any]) -> dict[str, Any]:
    """verl's ``hf_overrides`` with ours added; nested mappings are merged key by key, ours win on
    a conflicting leaf (they name the architecture vLLM must build)."""
    merged: dict[str, Any] = dict(verl_overrides or {})
    for key, value in ours.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_hf_overrides(merged[key], value)
        else:
            merged[key] = value
    return merged


def patch_server_class(server_cls: type, ours: Mapping[str, Any]) -> None:
    """Wrap ``server_cls._apply_quantization`` so that its ``hf_overrides`` include ``ours`` (once)."""
    original = server_cls._apply_quantization
    if getattr(original, "_recallm_hf_overrides", False):
        return

    def _apply_quantization(self):
        quantization, hf_overrides = original(self)
        return quantization, merge_hf_overrides(hf_overrides, ours)

    _apply_quantization._recallm_hf_overrides = True  # type: ignore[attr-defined]
    _apply_quantization.__wrapped__ = original  # type: ignore[attr-defined]
    server_cls._apply_quantization = _apply_quantization


def install(environ: Mapping[str, str] | None = None) -> bool:
    """Patch verl's vLLM server class when (or as soon as) its module is imported; a no-op without
    the environment variable. Returns whether a patch was registered."""
    raw = (os.environ if environ is None else environ).get(_ENV)
    if not raw:
        return False
    ours = json.loads(raw)
    from recallm.grpo.cpu.patches import after_import

    after_import(SERVER_MODULE, lambda module: patch_server_class(module.vLLMHttpServer, ours))
    return True
