"""GRPO's plan: a composed GRPO config (``configs/grpo.yaml`` with a recipe) on a cluster, one term per
part of the printed plan, in its order: the actor's update, the vLLM rollout and its KV cache, attention
(packed or not), host RAM, the checkpoints on disk, the time of a save, the run's time. The formulas, with
their sources, are in :mod:`recallm.plan.memory`, :mod:`recallm.plan.lora`, :mod:`recallm.plan.checkpoints`
and :mod:`recallm.plan.throughput`; this module reads the config once (:class:`_Run`) and words the lines."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from recallm.plan.checkpoints import SAVE_SAFETY, TORCH_NCCL_TIMEOUT, VERL_SAVE_LEAD, checkpoint_bytes, kept_saves
from recallm.plan.cluster import Cluster
from recallm.plan.lora import lora_kept_bytes
from recallm.plan.memory import (
    CPU_PROCESS_RAM,
    CUDA_CONTEXT,
    FRAGMENTATION,
    PROCESS_RAM,
    actor_update_bytes,
    vllm_budget,
)
from recallm.plan.model import ModelShape
from recallm.plan.report import GB, Plan, gib
from recallm.plan.throughput import time_lines

__all__ = ["grpo_plan", "CPU_PLATFORMS"]

ARR = "actor_rollout_ref"
ROLLOUT = f"{ARR}.rollout"


def _sel(cfg: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(cfg, key, default=default, throw_on_missing=False)
    except Exception:  # an interpolation that cannot resolve yet (a ??? it depends on)
        return default
    return default if value == "???" else value


@dataclass(frozen=True)
class _Run:
    """What every term reads of the config: the sequences, the actor's micro-batch, offload, LoRA."""

    cfg: Any
    cluster: Cluster
    shape: ModelShape
    longest: int  # data.max_prompt_length + data.max_response_length
    packed: bool  # use_remove_padding
    attn: str
    checkpointing: bool
    tokens: int  # the actor's longest micro-batch
    how: str  # ... said in words
    defer: bool  # use_no_sync_for_gradient_accumulation
    param_off: bool
    optim_off: bool
    param_bytes: int  # the dtype verl loads the actor in
    rank: int  # lora_rank
    targets: Any
    lora: int  # the adapter's parameters (0 without LoRA)
    lora_kept: int  # under LoRA, what the actor keeps between phases (recallm.plan.lora.lora_kept_bytes)

    @property
    def vllm(self) -> bool:
        return _sel(self.cfg, f"{ROLLOUT}.name") == "vllm"

    @property
    def tp(self) -> int:
        return int(_sel(self.cfg, f"{ROLLOUT}.tensor_model_parallel_size", 1) or 1)


def _read(cfg: Any, cluster: Cluster, shape: ModelShape) -> _Run:
    prompt, response = int(_sel(cfg, "data.max_prompt_length")), int(_sel(cfg, "data.max_response_length"))
    longest = prompt + response
    packed = bool(_sel(cfg, f"{ARR}.model.use_remove_padding", False))
    attn = _sel(cfg, f"{ARR}.model.override_config.attn_implementation") or "flash_attention_2"
    checkpointing = bool(_sel(cfg, f"{ARR}.model.enable_gradient_checkpointing", False))
    if _sel(cfg, f"{ARR}.actor.use_dynamic_bsz", False):
        tokens = max(int(_sel(cfg, f"{ARR}.actor.ppo_max_token_len_per_gpu")), longest)
        how = f"token cap ppo_max_token_len_per_gpu={tokens:,}"
    else:
        micro = int(_sel(cfg, f"{ARR}.actor.ppo_micro_batch_size_per_gpu") or 1)
        tokens = micro * longest
        how = f"{micro} x {longest:,} tokens"
    defer = bool(_sel(cfg, f"{ARR}.actor.fsdp_config.use_no_sync_for_gradient_accumulation", False))
    param_off = bool(_sel(cfg, f"{ARR}.actor.fsdp_config.param_offload", False))
    optim_off = bool(_sel(cfg, f"{ARR}.actor.fsdp_config.optimizer_offload", False))
    model_dtype = str(_sel(cfg, f"{ARR}.actor.fsdp_config.model_dtype", "fp32") or "fp32")
    param_bytes = 2 if model_dtype in ("bf16", "bfloat16") else 4
    rank = int(_sel(cfg, f"{ARR}.model.lora_rank", 0) or 0)
    targets = _sel(cfg, f"{ARR}.model.target_modules", "all-linear")
    lora = shape.lora_params(rank, targets)
    return _Run(
        cfg,
        cluster,
        shape,
        longest=longest,
        packed=packed,
        attn=attn,
        checkpointing=checkpointing,
        tokens=tokens,
        how=how,
        defer=defer,
        param_off=param_off,
        optim_off=optim_off,
        param_bytes=param_bytes,
        rank=rank,
        targets=targets,
        lora=lora,
        lora_kept=lora_kept_bytes(shape, lora, param_bytes),
    )


def _actor_line(plan: Plan, run: _Run) -> None:
    shape = run.shape
    parts = actor_update_bytes(
        shape,
        run.cluster.gpus,
        run.tokens,
        checkpointing=run.checkpointing,
        defer_grad_sync=run.defer,
        attn=run.attn if not run.packed else "flash_attention_2",
        longest_sequence=run.longest,
        lora_params=run.lora,
        lora_width=shape.lora_width(run.rank, run.targets),
        param_bytes=run.param_bytes if run.lora else 4,
    )
    tensors = sum(parts.values())
    update = int(tensors * (1 + FRAGMENTATION)) + 2 * CUDA_CONTEXT
    detail = ", ".join(f"{k} {gib(v)}" for k, v in parts.items())
    plan.add(
        "GPU memory (per GPU)",
        "actor update (FSDP2)",
        update,
        run.cluster.gpu_memory,
        "GiB",
        f"micro-batch of {run.how}; {detail}; +{FRAGMENTATION:.0%} allocator, 2 CUDA contexts",
        fix=f"lower {ARR}.actor.ppo_max_token_len_per_gpu (not below {run.longest:,}), more GPUs, or "
        "enable_gradient_checkpointing=true",
    )


def _vllm_lora_rank(rank: int) -> int:
    from recallm.modeling import vllm_lora_rank  # (loads torch and transformers: only for a LoRA run)

    return vllm_lora_rank(rank)


def _rollout_lines(plan: Plan, run: _Run, mean_tokens: int) -> None:
    """vLLM awake next to what the actor leaves on the GPU, and how many sequences its KV cache holds."""
    if not run.vllm:
        return
    cfg, shape, n, gpu = run.cfg, run.shape, run.cluster.gpus, run.cluster.gpu_memory
    util = float(_sel(cfg, f"{ROLLOUT}.gpu_memory_utilization", 0.5))
    tp = run.tp
    v = vllm_budget(
        shape,
        gpu,
        util,
        tp=tp,
        batched_tokens=int(_sel(cfg, f"{ROLLOUT}.max_num_batched_tokens", 8192) or 8192),
        max_seqs=int(_sel(cfg, f"{ROLLOUT}.max_num_seqs", 256) or 256),
        eager=bool(_sel(cfg, f"{ROLLOUT}.enforce_eager", False)),
        lora_params=shape.lora_params(_vllm_lora_rank(run.rank), run.targets) if run.lora else 0,
    )
    if run.param_off and run.optim_off:
        resident = 0
    elif run.lora:  # the frozen base and the adapter with its two moments (its gradients are freed)
        resident = run.lora_kept // n
    else:
        resident = 12 * shape.params // n
    plan.add(
        "GPU memory (per GPU)",
        "vLLM awake (rollout)",
        v["budget"] + resident + 2 * CUDA_CONTEXT,
        gpu,
        "GiB",
        f"gpu_memory_utilization={util} of {gib(gpu)} = {gib(v['budget'])}"
        + (f"; the actor's unoffloaded shards {gib(resident)}" if resident else "; the actor offloaded")
        + "; 2 CUDA contexts",
        fix=f"lower {ROLLOUT}.gpu_memory_utilization",
    )
    longest = run.longest
    kv_tokens = max(v["kv cache"], 0) // shape.kv_bytes_per_token
    per_gpu_rollouts = int(_sel(cfg, "data.train_batch_size")) * int(_sel(cfg, f"{ROLLOUT}.n")) // max(n // tp, 1)
    plan.add(
        "GPU memory (per GPU)",
        "vLLM KV cache",
        longest,
        kv_tokens,
        "",
        f"{gib(v['kv cache'])} after weights {gib(v['weights'])}, activations {gib(v['activations'])}, "
        f"graphs {gib(v['cuda graphs'])}: {kv_tokens:,} tokens at {shape.kv_bytes_per_token:,} B/token hold "
        f"{kv_tokens // longest} longest ({longest:,}-token) sequences or {kv_tokens // mean_tokens} typical "
        f"({mean_tokens:,}-token) ones at once, of the {per_gpu_rollouts:,} rollouts per engine per step "
        "(need: one longest sequence)",
        fix=f"raise {ROLLOUT}.gpu_memory_utilization or {ROLLOUT}.tensor_model_parallel_size",
    )


def _attention_lines(plan: Plan, run: _Run, flash_attn_installed: bool | None, mean_tokens: int) -> None:
    """Packed sequences need flash-attn; what running unpacked costs (or costs now)."""
    packed, attn, longest = run.packed, run.attn, run.longest
    if packed and attn.startswith("flash_attention") and flash_attn_installed is False:
        plan.add(
            "attention",
            "flash-attn for packed sequences",
            1,
            0,
            "flag",
            "use_remove_padding=true needs flash-attn's varlen kernels and flash-attn is not installed here",
            fix=f"install it (scripts/install_gpu.sh), or run unpacked: {ARR}.model.use_remove_padding=false "
            f"{ARR}.model.override_config.attn_implementation=sdpa (see the unpacked cost below)",
        )
    if packed:
        cost = longest / mean_tokens
        plan.add(
            "attention",
            "cost of running unpacked",
            cost,
            None,
            "x",
            f"use_remove_padding=false pads every sequence to {longest:,} tokens: {cost:.2f}x the token work of "
            f"packed {mean_tokens:,}-token sequences (--mean-tokens) in the actor's and reference's passes",
        )
    else:
        cost = longest / mean_tokens
        plan.add(
            "attention",
            "unpacked (use_remove_padding=false)",
            cost,
            None,
            "x",
            f"{attn}: every sequence padded to {longest:,} tokens, {cost:.2f}x the token work of packed "
            f"{mean_tokens:,}-token sequences in the actor's and reference's passes",
        )


def _host_line(plan: Plan, run: _Run) -> None:
    cfg, shape, cluster, lora = run.cfg, run.shape, run.cluster, run.lora
    share = cluster.gpus_per_node / cluster.gpus
    vllm = run.vllm
    tp = run.tp
    # with LoRA the reference is the actor with its adapter off (verl's ref_in_actor): no second copy
    state = run.lora_kept + run.param_bytes * lora if lora else 16 * shape.params  # + the adapter's gradients
    host_parts = {
        "actor state offloaded": int(state * share) if (run.param_off or run.optim_off) else 0,
        "reference (bf16)": int(2 * shape.params * share)
        if _sel(cfg, f"{ARR}.actor.use_kl_loss", False) and not lora
        else 0,
        "sleeping vLLM weights": 2 * shape.params * cluster.gpus_per_node // tp if vllm else 0,
        "save staging": int((run.lora_kept if lora else 12 * shape.params) * share),
        "processes": PROCESS_RAM * cluster.gpus_per_node,
    }
    plan.add(
        "host RAM (per node)",
        "host RAM",
        sum(host_parts.values()),
        cluster.host_ram,
        "GiB",
        ", ".join(f"{k} {gib(v)}" for k, v in host_parts.items() if v),
        fix="fewer GPUs per node share the node's RAM, or param_offload=false where the GPU has room",
    )


def _disk_line(plan: Plan, run: _Run) -> tuple[int, int]:
    """The checkpoints on disk at once; returns one save's bytes and the run's steps."""
    cfg, shape, lora, param_bytes = run.cfg, run.shape, run.lora, run.param_bytes
    contents = list(_sel(cfg, f"{ARR}.actor.checkpoint.save_contents", ["model", "optimizer", "extra"]))
    one = checkpoint_bytes(shape, contents, model_dtype_bytes=param_bytes, lora_params=lora)
    total = int(_sel(cfg, "trainer.total_training_steps") or 0)
    freq = int(_sel(cfg, "trainer.save_freq", -1))
    keep = _sel(cfg, "recallm.keep_checkpoints")
    verl_keep = _sel(cfg, "trainer.max_actor_ckpt_to_keep")
    eval_step = _sel(cfg, "recallm.eval_step")
    kept = kept_saves(total, freq, keep or verl_keep)
    extra_eval = 0
    if keep and eval_step:
        extra_eval = checkpoint_bytes(shape, ["model"], model_dtype_bytes=param_bytes, lora_params=lora)
    # one more full save exists while the next is written (verl removes the oldest before writing only
    # with max_actor_ckpt_to_keep >= 2; our retention removes after the save)
    in_flight = one if keep else 0
    disk = one * kept + extra_eval + in_flight
    if keep:
        keep_why = f"recallm.keep_checkpoints={keep} newest + 1 being written"
    elif verl_keep:
        keep_why = f"trainer.max_actor_ckpt_to_keep={verl_keep} (a requeued job leaves older ones behind)"
    else:
        keep_why = "every save kept (nothing removes them)"
    plan.add(
        "disk (checkpoint directory)",
        "checkpoints",
        disk,
        run.cluster.disk_free,
        "GB",
        f"{one / GB:,.0f} GB per save ({'+'.join(contents)}) x {kept} ({keep_why})"
        + (f" + the step-{eval_step} weights {extra_eval / GB:,.0f} GB (recallm.eval_step)" if extra_eval else ""),
        fix="recallm.keep_checkpoints=N (fewer kept), a larger trainer.save_freq, or a larger disk",
    )
    return one, total


def _save_time_lines(plan: Plan, run: _Run, one: int) -> None:
    """One save (and its checksums) against verl's deadline lead; each rank's write against the collective timeout."""
    cfg, cluster, n = run.cfg, run.cluster, run.cluster.gpus
    save_s = one / cluster.write_bandwidth
    check_s = one / cluster.write_bandwidth  # the checksum pass reads it back (recallm.grpo.checkpoints)
    redundant = float(_sel(cfg, "trainer.esi_redundant_time", 0) or 0)
    margin = VERL_SAVE_LEAD + redundant
    plan.add(
        "time",
        "deadline save",
        (save_s + check_s) * SAVE_SAFETY,
        margin,
        "s",
        f"one save {one / GB:,.0f} GB at {cluster.write_bandwidth / GB:.2f} GB/s = {save_s:,.0f} s, and its "
        f"checksums as long again (x{SAVE_SAFETY} slack), must end before SLURM's USR1: verl starts it at least "
        f"60 + trainer.esi_redundant_time={redundant:g} s before",
        fix=f"trainer.esi_redundant_time={math.ceil((save_s + check_s) * SAVE_SAFETY - VERL_SAVE_LEAD)} "
        "(or a faster disk)",
    )
    timeout = int(_sel(cfg, f"{ARR}.nccl_timeout", TORCH_NCCL_TIMEOUT) or TORCH_NCCL_TIMEOUT)
    rank_s = (one / n) / (cluster.write_bandwidth / cluster.gpus_per_node)
    plan.add(
        "time",
        "collective timeout at a save",
        rank_s * SAVE_SAFETY,
        timeout,
        "s",
        f"each rank writes {one / n / GB:,.1f} GB at its share of the bandwidth ({rank_s:,.0f} s, x{SAVE_SAFETY}) "
        f"while the others wait in a collective: {ARR}.nccl_timeout={timeout}",
        fix=f"{ARR}.nccl_timeout={math.ceil(rank_s * SAVE_SAFETY * 2)}",
    )


#: the platforms that train on the CPU (``recallm.grpo.settings.GRPOSettings.cpu``)
CPU_PLATFORMS = ("cpu", "vllm_cpu")
_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}


def _cpu_rollout_parts(run: _Run) -> tuple[int, int, str]:
    """The CPU rollout's engines (one per training process, ``tensor_model_parallel_size`` 1): their weights, the
    KV cache of the sequences one engine generates at once (fp32 K and V of every layer), and those words. The
    ``hf_cpu`` server generates up to ``engine_kwargs.hf_cpu.max_batch_size`` requests together in its ``dtype``
    (``recallm.grpo.cpu.hf_generate.HFCPUSettings``); vLLM's CPU build (``vllm_cpu``) in ``rollout.dtype``, up to
    ``max_num_seqs`` at once."""
    cfg, shape, ranks = run.cfg, run.shape, run.cluster.gpus
    engines = max(ranks // run.tp, 1)
    rollouts = int(_sel(cfg, "data.train_batch_size")) * int(_sel(cfg, f"{ROLLOUT}.n"))
    if run.vllm:
        dtype = str(_sel(cfg, f"{ROLLOUT}.dtype", "float32") or "float32")
        at_once = int(_sel(cfg, f"{ROLLOUT}.max_num_seqs", 256) or 256)
        name = "vLLM (CPU build)"
    else:
        from recallm.config import typed
        from recallm.grpo.cpu.hf_generate import HFCPUSettings

        settings = typed(
            HFCPUSettings, _sel(cfg, f"{ROLLOUT}.engine_kwargs.hf_cpu") or {}, f"{ROLLOUT}.engine_kwargs.hf_cpu"
        )
        dtype, at_once, name = settings.dtype, settings.max_batch_size, "hf_cpu"
    weights = _DTYPE_BYTES.get(dtype, 4) * (shape.params + run.lora) * engines
    sequences = min(at_once, -(-rollouts // engines))
    kv = engines * sequences * run.longest * shape.kv_bytes_per_token * 2  # (kv_bytes_per_token is bf16's)
    return weights, kv, f"{engines} {name} engine(s) in {dtype}, {sequences} of {rollouts:,} rollouts at once each"


def _cpu_host_line(plan: Plan, run: _Run) -> None:
    """On the CPU platform everything is in this machine's RAM: the actor's training processes (fp32: state,
    update), the reference, the rollout's engines and every process; the update and the generation take turns."""
    cfg, shape, cluster, ranks = run.cfg, run.shape, run.cluster, run.cluster.gpus
    parts = actor_update_bytes(
        shape,
        ranks,
        run.tokens,
        checkpointing=run.checkpointing,
        defer_grad_sync=run.defer,
        attn=run.attn,
        longest_sequence=run.longest,
        compute_bytes=4,  # (the CPU platform computes in fp32: configs/grpo/platform/cpu.yaml)
        sharded=ranks > 1,
        logits_copies=5,  # (fp32: the logits, the masked copy, the log-softmax and their gradients; measured)
        lora_params=run.lora,
        lora_width=shape.lora_width(run.rank, run.targets),
        param_bytes=run.param_bytes,
    )
    working = {"gathered layers", "activations", "logits"}
    state = ranks * sum(v for k, v in parts.items() if k.split(" (")[0] not in working)
    update = ranks * sum(v for k, v in parts.items() if k.split(" (")[0] in working)
    ref_dtype = str(_sel(cfg, f"{ARR}.ref.fsdp_config.model_dtype", "fp32") or "fp32")
    use_ref = _sel(cfg, f"{ARR}.actor.use_kl_loss", False) and not run.lora  # (LoRA: the actor without its adapter)
    reference = _DTYPE_BYTES.get(ref_dtype, 4) * shape.params if use_ref else 0
    weights, kv, engines = _cpu_rollout_parts(run)
    workers = int(_sel(cfg, f"{ROLLOUT}.agent.num_workers", 1) or 1) + int(_sel(cfg, "reward.num_workers", 1) or 1)
    processes = ranks + max(ranks // run.tp, 1) + workers + 2  # (+ the driver's task runner and Ray's own)
    host = {
        "actor state": state,
        "reference": reference,
        "rollout weights": weights,
        f"{processes} processes": processes * CPU_PROCESS_RAM,
    }
    phase = max(update, kv)
    plan.add(
        "host RAM (this machine)",
        "host RAM",
        sum(host.values()) + phase,
        cluster.host_ram,
        "GiB",
        ", ".join(f"{k} {gib(v)}" for k, v in host.items() if v)
        + f", and the larger of the actor's update {gib(update)} ({ranks} process(es): micro-batch of {run.how}) "
        f"and the rollout's KV cache {gib(kv)} ({engines})",
        fix=f"lower {ARR}.actor.ppo_micro_batch_size_per_gpu and the log-prob micro batches (to 2), "
        "data.max_response_length or actor_rollout_ref.rollout.n",
    )


def _cpu_plan(run: _Run, rollout: str, step_seconds: float | None, time_limit_h: float | None) -> Plan:
    """The plan of a run on the CPU platform (``recallm.platform`` ``cpu`` or ``vllm_cpu``): host RAM, disk, the
    time of a save (when the write bandwidth is known), the run's time. No GPU, no SLURM deadline, no NCCL."""
    shape, cluster = run.shape, run.cluster
    plan = Plan(
        f"plan: GRPO {shape.name} ({shape.params / 1e9:.2f}B parameters) on the CPU platform: {cluster.gpus} "
        f"training process(es), the {rollout} rollout"
        + (f", LoRA rank {run.rank} ({run.lora / 1e6:,.1f}M adapter parameters)" if run.lora else "")
    )
    _cpu_host_line(plan, run)
    one, total = _disk_line(plan, run)
    if cluster.write_bandwidth:
        plan.add(
            "time",
            "one save",
            2 * one / cluster.write_bandwidth,
            None,
            "s",
            f"{one / GB:,.2f} GB at {cluster.write_bandwidth / GB:.2f} GB/s, and its checksums as long again",
        )
    time_lines(plan, total, step_seconds, time_limit_h)
    return plan


def grpo_plan(
    cfg: Any,
    cluster: Cluster,
    shape: ModelShape,
    *,
    step_seconds: float | None = None,
    time_limit_h: float | None = None,
    flash_attn_installed: bool | None = None,
    mean_tokens: int = 11000,
) -> Plan:
    """The plan of a composed GRPO config (``configs/grpo.yaml`` with a recipe) on ``cluster``; on the CPU platform
    (``recallm.platform``: :data:`CPU_PLATFORMS`) the CPU's plan, ``cluster`` holding its training processes
    (``gpus_per_node``) and this machine's RAM."""
    run = _read(cfg, cluster, shape)
    if _sel(cfg, "recallm.platform") in CPU_PLATFORMS:
        return _cpu_plan(run, str(_sel(cfg, f"{ROLLOUT}.name")), step_seconds, time_limit_h)
    plan = Plan(
        f"plan: GRPO {shape.name} ({shape.params / 1e9:.2f}B parameters) on {cluster.nodes} node(s) x "
        f"{cluster.gpus_per_node} GPU(s) of {gib(cluster.gpu_memory)}"
        + (f", LoRA rank {run.rank} ({run.lora / 1e6:,.0f}M adapter parameters)" if run.lora else "")
    )
    _actor_line(plan, run)
    _rollout_lines(plan, run, mean_tokens)
    _attention_lines(plan, run, flash_attn_installed, mean_tokens)
    _host_line(plan, run)
    one, total = _disk_line(plan, run)
    _save_time_lines(plan, run, one)
    time_lines(plan, total, step_seconds, time_limit_h)
    return plan
