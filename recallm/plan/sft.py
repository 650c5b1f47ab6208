"""SFT's plan: one stage of ``recallm-sft`` on a cluster.

SFT (``recallm-sft deepspeed=zero2``: DeepSpeed ZeRO-2, optimizer offloaded to the host)
---------------------------------------------------------------------------------------
``deepspeed/runtime/zero/stage_1_and_2.py``: every rank holds the whole bf16 model (``2P``), its
partition of the bf16 gradients (``2P/N``) and the reduce bucket; the fp32 master weights and Adam
moments live on the host (``12P`` per node, plus the fp32 gradient partition ``4P``). Activations as
above at ``per_device_batch_size * max_length`` tokens. A save of the Trainer writes the bf16 model
(``2P``) and DeepSpeed's optimizer state (``12P``), ``save_total_limit`` of them kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError
from recallm.plan.cluster import Cluster
from recallm.plan.lora import adapter_activation_bytes
from recallm.plan.memory import CPU_PROCESS_RAM, CUDA_CONTEXT, FRAGMENTATION, PROCESS_RAM
from recallm.plan.model import ModelShape
from recallm.plan.report import GB, Plan, gib
from recallm.plan.throughput import time_lines

__all__ = ["sft_plan"]


def sft_plan(
    cfg: Mapping[str, Any],
    cluster: Cluster,
    shape: ModelShape,
    *,
    step_seconds: float | None = None,
    time_limit_h: float | None = None,
    cpu: bool = False,
) -> Plan:
    """The plan of a composed SFT config (``configs/sft.yaml``, a plain dict) on ``cluster``: one stage
    under DeepSpeed ZeRO-2 with the optimizer offloaded (``deepspeed=zero2``); ``cpu``: the stage as
    ``recallm-sft`` runs it on a machine without a GPU (:func:`_cpu_plan`)."""
    sft = cfg["sft"]
    n = cluster.gpus
    p = shape.params
    stage = cfg.get("stage", "full")
    trainable = shape.embedding_params if stage == "embed" else p
    tokens = int(sft["per_device_batch_size"]) * int(sft["max_length"])
    checkpointing = bool(sft.get("gradient_checkpointing", True))
    dtype = 4 if cpu else 2  # (the CPU trains in fp32: bf16 only where a GPU is, recallm.sft.train)
    if checkpointing:
        activations = shape.layers * tokens * shape.hidden * dtype + shape.layer_activation_bytes(tokens, dtype)
    else:
        activations = shape.layers * shape.layer_activation_bytes(tokens, dtype)
    # stage full as a LoRA finetune (sft.lora.rank > 0): the adapter (and, with token_rows, the four recall
    # rows of the embeddings, and of lm_head when untied) is what trains; each adapted layer keeps its A's output
    lora_cfg = sft.get("lora") or {}
    rank = int(lora_cfg.get("rank", 0) or 0) if stage == "full" else 0
    adapter = 0
    if rank > 0:
        targets = lora_cfg.get("target_modules", "all-linear")
        adapter = shape.lora_params(rank, targets)
        trainable = adapter + (4 * shape.hidden * (1 if shape.tied else 2) if lora_cfg.get("token_rows") else 0)
        width = shape.lora_width(rank, targets)
        activations += adapter_activation_bytes(shape, tokens, width, checkpointing=checkpointing, compute_bytes=dtype)
    ds = (cfg.get("deepspeed") or {}).get("file")
    if cpu:
        terms = {"trainable": trainable, "adapter": adapter, "rank": rank, "tokens": tokens, "activations": activations}
        return _cpu_plan(cfg, cluster, shape, terms, step_seconds=step_seconds, time_limit_h=time_limit_h)
    offload = False
    if ds:
        from recallm.paths import CONFIG_DIR

        path = Path(ds) if Path(ds).is_absolute() else CONFIG_DIR / "deepspeed" / ds
        try:
            zero = json.loads(path.read_text()).get("zero_optimization", {})
        except (OSError, ValueError):
            raise RecallmError(f"deepspeed.file {path}: not a readable DeepSpeed JSON") from None
        offload = (zero.get("offload_optimizer") or {}).get("device") == "cpu"
    parts = {
        "model (bf16)": 2 * p,
        "gradients (bf16 partition)": 2 * trainable // n,
        "optimizer": 0 if offload else 12 * trainable // n,
        "activations": activations,
        "logits": 3 * 2 * tokens * shape.vocab,
    }
    plan = Plan(
        f"plan: SFT stage {stage} {shape.name} ({p / 1e9:.2f}B parameters) on {cluster.nodes} node(s) x "
        f"{cluster.gpus_per_node} GPU(s) of {gib(cluster.gpu_memory)}, DeepSpeed {ds or 'none'}"
        + (f", LoRA rank {rank} ({adapter / 1e6:,.0f}M adapter parameters)" if adapter else "")
    )
    plan.add(
        "GPU memory (per GPU)",
        "training step (ZeRO-2)" if ds else "training step",
        int(sum(parts.values()) * (1 + FRAGMENTATION)) + CUDA_CONTEXT,
        cluster.gpu_memory,
        "GiB",
        f"{tokens:,} tokens per device; " + ", ".join(f"{k} {gib(v)}" for k, v in parts.items() if v),
        fix="sft.max_length or sft.per_device_batch_size lower, gradient_checkpointing=true, deepspeed=zero2",
    )
    share = cluster.gpus_per_node / n
    host = int((16 * trainable if offload else 0) * share) + PROCESS_RAM * cluster.gpus_per_node
    plan.add(
        "host RAM (per node)",
        "host RAM",
        host,
        cluster.host_ram,
        "GiB",
        "fp32 master weights, Adam moments and gradient partition (16 bytes per trainable parameter) + processes",
    )
    # a LoRA checkpoint holds the adapter (fp32 at most), not the model; the final model is merged
    one = (4 * trainable if adapter else 2 * p) + 12 * trainable
    keep = int(sft.get("save_total_limit") or 0)
    disk = one * ((keep + 1) if keep else 1)
    plan.add(
        "disk (checkpoint directory)",
        "checkpoints",
        disk + 2 * p,
        cluster.disk_free,
        "GB",
        f"{one / GB:,.0f} GB per save ({'adapter' if adapter else 'bf16 model'} + fp32 optimizer state) x "
        f"{keep or 'every'} kept + 1 being written + the final model {2 * p / GB:,.0f} GB",
        fix="sft.save_total_limit lower or a larger disk",
    )
    plan.add(
        "time",
        "one save",
        one / cluster.write_bandwidth,
        None,
        "s",
        f"{one / GB:,.0f} GB at {cluster.write_bandwidth / GB:.2f} GB/s; a requeue loses the steps since the "
        "last save (sft.save_steps)",
    )
    time_lines(plan, None, step_seconds, time_limit_h)
    return plan


def _cpu_plan(
    cfg: Mapping[str, Any],
    cluster: Cluster,
    shape: ModelShape,
    terms: Mapping[str, int],
    *,
    step_seconds: float | None,
    time_limit_h: float | None,
) -> Plan:
    """One stage of ``recallm-sft`` on the CPU: one process (``use_cpu``), the model in fp32 with its gradients and
    AdamW's two moments for what trains (in the process, or in DeepSpeed's CPU Adam with ``deepspeed=zero2_cpu``:
    the same bytes), fp32 activations, the logits in five fp32 copies (the step measured on the CPU,
    ``tests/integration/test_plan.py``), all in this machine's RAM. A save holds the fp32 model (or the adapter) and
    the optimizer state; the final model is fp32."""
    p, stage = shape.params, cfg.get("stage", "full")
    trainable, adapter, tokens = terms["trainable"], terms["adapter"], terms["tokens"]
    parts = {
        "model (fp32)": 4 * p,
        "gradients (fp32)": 4 * trainable,
        "AdamW state (fp32)": 8 * trainable,
        "activations": terms["activations"],
        "logits": 5 * 4 * tokens * shape.vocab,
        "process": CPU_PROCESS_RAM,
    }
    ds = (cfg.get("deepspeed") or {}).get("file")
    plan = Plan(
        f"plan: SFT stage {stage} {shape.name} ({p / 1e9:.2f}B parameters) on the CPU (one process, fp32), "
        f"DeepSpeed {ds or 'none'}"
        + (f", LoRA rank {terms['rank']} ({adapter / 1e6:,.1f}M adapter parameters)" if adapter else "")
    )
    plan.add(
        "host RAM (this machine)",
        "training step (CPU)",
        sum(parts.values()),
        cluster.host_ram,
        "GiB",
        f"{tokens:,} tokens per step; " + ", ".join(f"{k} {gib(v)}" for k, v in parts.items() if v),
        fix="sft.max_length or sft.per_device_batch_size lower (sft.global_batch_size keeps the batch), "
        "sft.gradient_checkpointing=true, or sft.lora.rank=N for stage full",
    )
    one = (4 * trainable if adapter else 4 * p) + 8 * trainable
    keep = int(cfg["sft"].get("save_total_limit") or 0)
    disk = one * ((keep + 1) if keep else 1)
    plan.add(
        "disk (checkpoint directory)",
        "checkpoints",
        disk + 4 * p,
        cluster.disk_free,
        "GB",
        f"{one / GB:,.2f} GB per save ({'adapter' if adapter else 'fp32 model'} + AdamW state) x {keep or 'every'} "
        f"kept + 1 being written + the final model {4 * p / GB:,.2f} GB",
        fix="sft.save_total_limit lower or a larger disk",
    )
    if cluster.write_bandwidth:
        plan.add("time", "one save", one / cluster.write_bandwidth, None, "s",
                 f"{one / GB:,.2f} GB at {cluster.write_bandwidth / GB:.2f} GB/s")  # fmt: skip
    time_lines(plan, None, step_seconds, time_limit_h)
    return plan
