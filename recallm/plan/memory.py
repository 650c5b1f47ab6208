"""GPU memory of a GRPO run: the actor's update under verl's FSDP2 engine, the vLLM rollout beside it,
and what the node's host RAM holds. LoRA's terms: :mod:`recallm.plan.lora`.

GRPO: the actor under verl 0.9.1's FSDP2 engine (per GPU, world size ``N``)
-----------------------------------------------------------------------
``verl/workers/engine/fsdp/transformer_impl.py`` and ``verl/trainer/config/engine/fsdp.yaml``:

* training loads the actor in fp32 (``model_dtype: fp32``: ``torch_dtype = float32`` when not
  forward-only) and computes in bf16 (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``);
* ``param_offload`` / ``optimizer_offload`` move the sharded parameters and AdamW state to the host
  *between* phases (``BaseEngineCtx._context_switch`` -> ``FSDPEngine.to``): while the actor trains both
  are on the GPU. So the update holds ``4P/N`` (fp32 shard) + ``4P/N`` (fp32 gradient shard; unsharded
  ``4P`` when ``use_no_sync_for_gradient_accumulation`` defers the reduce-scatter, ``_gradient_sync_context``)
  + ``8P/N`` (AdamW's two fp32 moments), whatever the offload flags say;
* FSDP2 all-gathers one decoder layer at a time in bf16, prefetching the next: ``2 * 2 * layer``
  bytes, plus the root module's embeddings and ``lm_head`` (``2 * V*h`` each) while they compute;
* activations of the longest micro-batch, ``T`` tokens (with ``use_dynamic_bsz`` the token cap
  ``ppo_max_token_len_per_gpu``, else ``micro_batch * (prompt + response)``): with gradient
  checkpointing each layer keeps its bf16 input (``L*T*h*2``) and one layer is recomputed at a time,
  whose saved set is ``T*(12h + 4*K*d + 8I) * 2`` bytes (q/k/v/o and their rotated copies, norms and
  residuals, the MLP's gate/up/act/product and what autograd keeps of them: the per-layer set measured
  on the CPU, ``tests/unit/test_plan.py``). Without checkpointing every layer keeps that set;
* the logits: ``logits_copies`` tensors of ``T*V``: on GPUs 3 in bf16 (the logits, the recall-masked
  copy of ``recallm.modeling``, one gradient: flash-attn's cross-entropy kernel, which verl's
  ``logprobs_from_logits`` uses, writes its gradient in place and never materialises the log-softmax);
  on the CPU test 5 in fp32 (plus the log-softmax and its gradient). Flash attention keeps attention O(T); eager attention over an unpacked
  (padded) micro-batch would add ``H*T^2*2`` bytes per layer recomputed (:func:`attention_bytes`);
* CUDA context and allocator slack: :data:`CUDA_CONTEXT` per process on the GPU (trainer, vLLM) and
  :data:`FRAGMENTATION` of what the allocator holds.

The reference (``use_kl_loss``) is forward-only: verl 0.9.1 gives it ``CPUOffloadPolicy`` (parameters on
the host, bf16); its peak is the gathered layers and one layer's forward plus the logits at
``log_prob_max_token_len_per_gpu``: below the actor's update, so the update is what is checked.

GRPO: the vLLM rollout (vLLM 0.24.0, colocated, ``free_cache_engine``)
-----------------------------------------------------------------
``vllm/v1/worker/gpu_worker.py`` (``determine_available_memory``): the engine may use
``gpu_memory_utilization * total`` bytes; from them it takes its weights (bf16 ``2P / TP``), the peak
activations of its profiling run at ``max_num_batched_tokens`` (we take ``tokens*(4h + 2I)*2 +
max_num_seqs*V*4``: the widest MLP intermediate and the sampler's fp32 logits) and the CUDA graphs
(:data:`CUDA_GRAPHS`, none with ``enforce_eager``); the rest is the KV cache, ``2 * L * K * d * 2``
bytes per token in bf16 (``vllm/v1/kv_cache_interface.py``, ``FullAttentionSpec.page_size_bytes``).
While vLLM is awake the actor is offloaded only if both offload flags are set; otherwise its fp32
shards (``12P/N``) stay on the GPU next to vLLM's budget. The engine sleeps at level 1 while the actor
trains (``vllm_async_server.py``: ``engine.sleep(level=1)`` for the hybrid engine): its weights go to
host RAM (pinned), its KV cache is freed.

Host RAM (per node)
-------------------
What the node's ranks offload: the actor's fp32 parameters, gradients and AdamW state (``16P`` in all,
when offloaded), the reference's bf16 parameters (``2P``), the sleeping vLLM engines' weights
(``2P`` per engine), the staging of one save (each rank's shard of model and optimizer state,
``12P`` in all), and :data:`PROCESS_RAM` per GPU (Python, torch, CUDA libraries, Ray, vLLM).

The CPU platform (``recallm.plan.grpo``: ``recallm.platform`` ``cpu``/``vllm_cpu``; ``recallm.plan.sft`` with ``cpu``)
-----------------------------------------------------------------------------------------------------------------
Everything is in the machine's RAM and in fp32 (``configs/grpo/platform/cpu.yaml``: fp32 mixed precision; SFT:
bf16 only on a GPU): the actor's update is :func:`actor_update_bytes` with ``compute_bytes=4``, five fp32 copies
of the logits (the step measured on the CPU) and, with one training process, nothing gathered; its state, the
fp32 reference and the rollout engines' weights stay resident, the update and the rollout's KV cache take turns,
and each process costs :data:`CPU_PROCESS_RAM`.
"""

from __future__ import annotations

from recallm.plan.lora import adapter_activation_bytes, lora_update_parts
from recallm.plan.model import ModelShape
from recallm.plan.report import GiB

__all__ = [
    "CUDA_CONTEXT",
    "FRAGMENTATION",
    "CUDA_GRAPHS",
    "PROCESS_RAM",
    "CPU_PROCESS_RAM",
    "attention_bytes",
    "actor_update_bytes",
    "vllm_budget",
]

#: per process on a GPU: the CUDA context and the libraries' workspaces (cuBLAS, NCCL)
CUDA_CONTEXT = 1 * GiB
#: what the caching allocator holds beyond what tensors use (fragmentation): a share of the peak
FRAGMENTATION = 0.10
#: vLLM's captured CUDA graphs (verl's default ``enforce_eager: false``)
CUDA_GRAPHS = 1 * GiB
#: host memory per GPU besides the offloaded state: the Python processes (trainer, vLLM, Ray workers)
PROCESS_RAM = 8 * GiB
#: host memory of one process of a run on the CPU platform beyond its tensors (Python with torch, transformers,
#: verl and Ray imported is 0.47 GiB resident before it builds anything: measured with VmRSS on the 2-core test
#: machine; tokenizer, data loader and Ray's plumbing come on top)
CPU_PROCESS_RAM = 1 * GiB


def attention_bytes(shape: ModelShape, tokens: int, attn: str) -> int:
    """Extra memory of one layer's attention at ``tokens`` in one sequence: none for flash / sdpa's
    memory-efficient kernels (O(T)), the ``H*T^2`` bf16 score matrix for eager attention."""
    return shape.heads * tokens * tokens * 2 if attn == "eager" else 0


def actor_update_bytes(
    shape: ModelShape,
    gpus: int,
    tokens: int,
    *,
    checkpointing: bool = True,
    defer_grad_sync: bool = False,
    attn: str = "flash_attention_2",
    longest_sequence: int | None = None,
    compute_bytes: int = 2,
    sharded: bool = True,
    logits_copies: int = 3,
    lora_params: int = 0,
    lora_width: int = 0,
    param_bytes: int = 4,
) -> dict[str, int]:
    """Per-GPU bytes of the actor's update under verl's FSDP2 engine (module doc), by part. ``compute_bytes``
    4 and ``sharded=False``: the same step of a plain fp32 model in one process (the CPU's; the test that
    measures it, ``tests/unit/test_plan.py``). ``lora_params`` > 0: verl's LoRA (module doc, "LoRA"): the base
    is frozen (no gradient, no optimizer state), the adapter (cast to the base's dtype, ``param_bytes``) has
    both; ``lora_width``: the rank times the adapted linear layers of one decoder layer (what their A's outputs
    keep per token). ``param_bytes``: the dtype verl loads the actor in (``fsdp_config.model_dtype``: fp32 by default)."""
    p, n = shape.params, gpus
    layer_act = shape.layer_activation_bytes(tokens, compute_bytes)
    if checkpointing:
        activations = shape.layers * tokens * shape.hidden * compute_bytes + layer_act
    else:
        activations = shape.layers * layer_act
    activations += attention_bytes(shape, longest_sequence or tokens, attn) * (1 if checkpointing else shape.layers)
    gathered = (2 * compute_bytes * shape.layer_params + compute_bytes * shape.embedding_params) if sharded else 0
    logits = logits_copies * compute_bytes * tokens * shape.vocab
    if lora_params > 0:  # (recallm.plan.lora)
        activations += adapter_activation_bytes(
            shape, tokens, lora_width, checkpointing=checkpointing, compute_bytes=compute_bytes
        )
        return lora_update_parts(
            shape,
            gpus,
            lora_params,
            param_bytes=param_bytes,
            defer_grad_sync=defer_grad_sync,
            gathered=gathered,
            activations=activations,
            logits=logits,
        )
    return {
        "parameters (fp32 shard)": 4 * p // n,
        "gradients (fp32 " + ("unsharded)" if defer_grad_sync else "shard)"): 4 * p if defer_grad_sync else 4 * p // n,
        "AdamW state (fp32 shard)": 8 * p // n,
        "gathered layers (bf16)": gathered,
        "activations": activations,
        "logits": logits,
    }


def vllm_budget(
    shape: ModelShape,
    gpu_memory: int,
    utilization: float,
    *,
    tp: int = 1,
    batched_tokens: int = 8192,
    max_seqs: int = 256,
    eager: bool = False,
    lora_params: int = 0,
) -> dict[str, int]:
    """vLLM's budget ``utilization * gpu_memory`` split as vLLM 0.24.0 does (module doc); the KV cache is
    what is left (negative: the engine cannot start). ``lora_params``: one adapter slot at the engine's
    ``max_lora_rank`` (verl starts it with ``max_loras=1``), in bf16 next to the weights."""
    budget = int(utilization * gpu_memory)
    weights = 2 * (shape.params + lora_params) // tp
    activations = batched_tokens * (4 * shape.hidden + 2 * shape.intermediate) * 2 // tp + max_seqs * shape.vocab * 4
    graphs = 0 if eager else CUDA_GRAPHS
    return {
        "budget": budget,
        "weights": weights,
        "activations": activations,
        "cuda graphs": graphs,
        "kv cache": budget - weights - activations - graphs,
    }
