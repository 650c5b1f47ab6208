"""Grouped-query attention without copying the key-value cache, on a CPU, for batched decoding.

Transformers' ``sdpa`` attention repeats every key and value head ``num_attention_heads /
num_key_value_heads`` times before calling ``torch.nn.functional.scaled_dot_product_attention`` whenever
an attention mask is given, because on CUDA that function's grouped-query mode (``enable_gqa``) falls
back to its slow kernel with a mask. A left-padded decoding batch always has a mask, so on a CPU every
decoding step copies the whole cache, in every layer: SmolLM2-135M (9 query heads, 3 key-value heads,
30 layers) decoding 16 rows at 2,000 tokens spent 44% of an evaluation in that copy (``py-spy``), one
layer's attention 45 ms against 2.5 ms without it.

On a CPU, torch's grouped-query mode takes a mask at full speed and gives the same numbers (the same
products, summed in the same order: identical outputs in ``tests/unit/test_attention.py``). So
:data:`GQA_SDPA` (``"recallm_sdpa"``) is ``sdpa`` with ``enable_gqa=True`` for a masked call on CPU
tensors, and transformers' own ``sdpa`` function for everything else (CUDA, no mask, no grouping). It
is registered with transformers' attention and mask interfaces (on first use) under its own name: ``sdpa`` itself is
untouched, and a model uses it only when asked (:func:`use_gqa_sdpa`, which ``recallm.generation``
calls on the model it decodes with). The name is not saved with a model: a saved config carries no
attention implementation.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["GQA_SDPA", "gqa_sdpa_attention", "use_gqa_sdpa"]

GQA_SDPA = "recallm_sdpa"


def gqa_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function signature (``AttentionInterface``); see the module doc."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    if not grouped or attention_mask is None or query.device.type != "cpu" or kwargs.get("output_attentions"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # with a mask, transformers' sdpa never sets is_causal (the mask carries the causal pattern)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    """Register :data:`GQA_SDPA` with transformers (on first use: importing transformers' model code
    takes a second, which a command that never decodes should not pay)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
    AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)


def use_gqa_sdpa(model) -> bool:
    """Switch ``model`` from ``sdpa`` to :data:`GQA_SDPA` when it groups its query heads; True when it
    uses it now. Any other implementation (eager, flash attention) is left as it is."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == GQA_SDPA:
        return True
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if current != "sdpa" or not heads or kv_heads == heads or not hasattr(model, "set_attn_implementation"):
        return False
    _register()
    model.set_attn_implementation(GQA_SDPA)
    return model.config._attn_implementation == GQA_SDPA
