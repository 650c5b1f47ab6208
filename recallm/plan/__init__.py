"""``recallm-plan``: will a run fit (GPU memory, host RAM, disk, the time a save takes) before it starts?

Every formula of the plan lives in this package, each with where it comes from (in the docstring of the
module that holds it). The plan is an estimate from the composed config and a description of the
cluster; it never loads a model. Units: bytes and seconds; ``GiB`` = 2**30 bytes, ``GB`` = 1e9 bytes
(disks and bandwidths are sold in GB).

The modules, in the order of a printed plan:

* :mod:`recallm.plan.model`: the model's shape and parameter count (a model directory's, or a paper base's);
* :mod:`recallm.plan.cluster`: what the plan is checked against (flags, or this node's own values; a run on the
  CPU: this machine's RAM, :func:`host_memory`);
* :mod:`recallm.plan.memory`: GPU memory of GRPO's actor update (verl's FSDP2 engine) and of the vLLM
  rollout; what host RAM holds;
* :mod:`recallm.plan.lora`: what LoRA changes in those terms (GRPO's ``lora_rank``, SFT's ``sft.lora.rank``);
* :mod:`recallm.plan.checkpoints`: one save's size, how many are on disk, the save's time limits;
* :mod:`recallm.plan.throughput`: steps per hour, the run's jobs;
* :mod:`recallm.plan.report`: the printed plan (lines by section, the verdict) and its units;
* :mod:`recallm.plan.grpo`, :mod:`recallm.plan.sft`: the plan of a composed GRPO or SFT config, term by term.

The names below are this package's face (``recallm-plan``, the tests); ``vllm_lora_rank`` is
``recallm.modeling``'s, the one rounding of a LoRA rank to vLLM's ``max_lora_rank``.
"""

from __future__ import annotations

from typing import Any

from recallm.plan.checkpoints import SAVE_SAFETY, TORCH_NCCL_TIMEOUT, VERL_SAVE_LEAD, checkpoint_bytes
from recallm.plan.cluster import Cluster, gpu_driver_loaded, host_memory, measure_write_bandwidth, node_cluster
from recallm.plan.grpo import CPU_PLATFORMS, grpo_plan
from recallm.plan.memory import (
    CPU_PROCESS_RAM,
    CUDA_CONTEXT,
    CUDA_GRAPHS,
    FRAGMENTATION,
    PROCESS_RAM,
    actor_update_bytes,
    attention_bytes,
    vllm_budget,
)
from recallm.plan.model import PAPER_MODELS, ModelShape, model_shape
from recallm.plan.report import GB, GiB, Line, Plan, gib
from recallm.plan.sft import sft_plan
from recallm.plan.throughput import mean_step_seconds

__all__ = [
    "ModelShape",
    "PAPER_MODELS",
    "Cluster",
    "Line",
    "Plan",
    "model_shape",
    "node_cluster",
    "host_memory",
    "measure_write_bandwidth",
    "gpu_driver_loaded",
    "grpo_plan",
    "CPU_PLATFORMS",
    "sft_plan",
    "actor_update_bytes",
    "vllm_budget",
    "attention_bytes",
    "checkpoint_bytes",
    "mean_step_seconds",
    "GiB",
    "GB",
    "gib",
    "CUDA_CONTEXT",
    "FRAGMENTATION",
    "CUDA_GRAPHS",
    "PROCESS_RAM",
    "CPU_PROCESS_RAM",
    "VERL_SAVE_LEAD",
    "TORCH_NCCL_TIMEOUT",
    "SAVE_SAFETY",
]


def __getattr__(name: str) -> Any:
    """``recallm.plan.vllm_lora_rank`` is ``recallm.modeling``'s (imported on first use: it loads torch)."""
    if name == "vllm_lora_rank":
        from recallm.modeling import vllm_lora_rank

        return vllm_lora_rank
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
