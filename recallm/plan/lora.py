"""What LoRA changes in a plan: GRPO with ``actor_rollout_ref.model.lora_rank`` > 0, SFT's stage ``full`` with
``sft.lora.rank`` > 0. The adapter's size is the shape's (:meth:`recallm.plan.model.ModelShape.lora_params`);
vLLM's adapter slot is at ``recallm.modeling.vllm_lora_rank``.

verl wraps the actor in PEFT (``transformer_impl.py``, ``_build_lora_module``): ``A`` and ``B`` of rank ``r``
on each targeted linear layer, ``r*(in+out)`` parameters each (:meth:`ModelShape.lora_params`; PEFT's
``all-linear`` leaves the output head out). The base is frozen: it keeps its parameters (in the dtype verl
loads a training actor in, ``fsdp_config.model_dtype``, fp32 by default; the adapter is cast to it) but has
no gradient and no optimizer state; the adapter ``a`` has both. Each adapted layer also keeps the rank-wide
output of its ``A`` for the backward. The reference is the actor with its adapter off (``ray_trainer.py``:
``ref_in_actor``), so no reference copy exists. vLLM holds one adapter slot (``max_loras=1``) at
``max_lora_rank``, the rank rounded up to one vLLM allows (``recallm.modeling.vllm_lora_rank``), in bf16. A
save holds the base and the adapter in the model shards and the adapter's two moments. SFT's stage ``full`` with
``sft.lora.rank`` > 0 (PEFT in ``recallm.sft``): the adapter, and the four recall rows when
``sft.lora.token_rows``, is what trains and what a checkpoint holds; the final model is merged.
"""

from __future__ import annotations

from recallm.plan.model import ModelShape

__all__ = ["adapter_activation_bytes", "lora_update_parts", "lora_kept_bytes"]


def adapter_activation_bytes(
    shape: ModelShape, tokens: int, width: int, *, checkpointing: bool, compute_bytes: int = 2
) -> int:
    """What each adapted linear layer keeps for the backward: its ``A``'s rank-wide output (``width``: the rank
    times the adapted layers of one decoder layer, :meth:`ModelShape.lora_width`), for the recomputed layer
    with gradient checkpointing, else for every layer."""
    return (1 if checkpointing else shape.layers) * tokens * width * compute_bytes


def lora_update_parts(
    shape: ModelShape,
    gpus: int,
    lora_params: int,
    *,
    param_bytes: int,
    defer_grad_sync: bool,
    gathered: int,
    activations: int,
    logits: int,
) -> dict[str, int]:
    """Per-GPU bytes of the actor's update under verl's LoRA (``recallm.plan.memory.actor_update_bytes`` with
    ``lora_params`` > 0), by part: the frozen base (no gradient, no optimizer state), the adapter with both,
    in the dtype verl loads the actor in (``param_bytes``)."""
    p, n, a = shape.params, gpus, lora_params
    dtype = "fp32" if param_bytes == 4 else "bf16"
    return {
        f"base parameters (frozen, {dtype} shard)": param_bytes * p // n,
        f"adapter ({dtype} shard)": param_bytes * a // n,
        f"adapter gradients ({dtype} " + ("unsharded)" if defer_grad_sync else "shard)"): (
            param_bytes * a if defer_grad_sync else param_bytes * a // n
        ),
        f"adapter AdamW state ({dtype} shard)": 2 * param_bytes * a // n,
        "gathered layers (bf16)": gathered,
        "activations": activations,
        "logits": logits,
    }


def lora_kept_bytes(shape: ModelShape, lora_params: int, param_bytes: int) -> int:
    """What a LoRA actor keeps between phases, all ranks together: the frozen base, the adapter and its two
    AdamW moments (the rollout's resident shards, the offloaded state, a save's staging)."""
    return param_bytes * (shape.params + 3 * lora_params)
