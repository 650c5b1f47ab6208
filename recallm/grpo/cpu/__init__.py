"""Run verl's own GRPO trainer (``verl.trainer.main_ppo``) on a CPU — no fork, no edited file.

verl 0.9.1 assumes an accelerator in a few places. This package fills them from outside:

* a CPU platform (``platform.PlatformCPU``, registered as ``"cpu"``; ``VERL_PLATFORM=cpu``);
* patches, each applied when verl's module is imported (``patches``): a gloo-only process
  group, no pinned memory for the FSDP2 CPU-offloaded reference model, and vectorised token
  log-probs (verl's fallback loops over tokens);
* the ``hf_cpu`` rollout (``rollout``): a Ray actor generating with Hugging Face ``generate``,
  the recall logits processor active, returning the processed log-prob of every token.

Use: ``recallm-grpo grpo/platform=cpu`` (the CPU recipes choose it), or verl's own trainer with our
platform group added to its config (the group is the whole recipe of keys; your overrides win)::

    env = {**os.environ, **cpu_env()}             # every verl process imports the plugin
    cmd = ["python", "-m", "verl.trainer.main_ppo", f"hydra.searchpath=[file://{CONFIG_DIR}]",
           "+grpo/platform=cpu", *your_overrides]

The platform's keys live in ``configs/grpo/platform/cpu.yaml`` (trainer on ``cpu``, logical Ray GPUs, the
``hf_cpu`` rollout, FSDP2 in fp32, sdpa attention, no gradient checkpointing); ``cpu_env()`` makes every
verl process (driver, TaskRunner, Ray workers) import ``recallm.grpo.cpu.plugin``, which calls
:func:`activate`.

Rollout settings: ``+actor_rollout_ref.rollout.engine_kwargs.hf_cpu.<key>=<value>`` with the
keys of :class:`~recallm.grpo.cpu.hf_generate.HFCPUSettings` (``force_every``, ``force_length``,
``dtype``, ``attn_implementation``, ``threads``, ``max_batch_size``, ``batch_wait_ms``, ``seed``,
``seed_per_request``, ``span_draft_tokens``). The
recall constraint is not one of them: the rollout follows the model config's ``recall_constrained``,
which the launcher derives from ``recallm.recall_constrained`` (as the actor's masked log-probs do).

What a CPU step costs, and what the plugin removes (``bench/grpo_step.py`` prints the split by phase
and the step time against ``RECALLM_CPU_BASELINE=1`` with gradient checkpointing on, the step without these): the inherent work is
one generation, two forward passes (old and reference log-probs) and a forward + backward (update).
Not inherent, and removed: verl's per-token log-prob loop (patch 3), gradient checkpointing (a
second forward inside every backward, to save accelerator memory a CPU run does not need:
``enable_gradient_checkpointing: false`` in the platform, override it for a large model), and Ray's per-node
reporter and autoscaler polling every 5 s (``REPORTER_UPDATE_INTERVAL_MS``,
``AUTOSCALER_UPDATE_INTERVAL_S``: once a minute here; a single-node run uses neither).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["activate", "cpu_env", "PLUGIN_MODULE", "ROLLOUT_NAME"]

PLUGIN_MODULE = "recallm.grpo.cpu.plugin"
ROLLOUT_NAME = "hf_cpu"
_ROLLOUT_ADAPTER = "recallm.grpo.cpu.rollout.HFCPUServerAdapter"

_state = {"active": False}


def _load_replica():
    from recallm.grpo.cpu.rollout import HFCPUReplica

    return HFCPUReplica


def activate() -> None:
    """Register the CPU platform, install the two patches, register the ``hf_cpu`` rollout.

    Idempotent, and cheap: verl's heavy modules are not imported here (the patches wait for
    them, the rollout classes load when verl asks for them)."""
    if _state["active"]:
        return
    _state["active"] = True  # set first: registering imports verl, which may import the plugin again
    from recallm.grpo.cpu import patches, platform

    platform.register()
    patches.install()
    from verl.workers.rollout import base, replica

    replica.RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = _ROLLOUT_ADAPTER


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cpu_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables for the driver (Ray workers inherit them).

    ``environ`` (default ``os.environ``) supplies values the user already set: their thread
    counts are kept, and modules already listed in ``VERL_USE_EXTERNAL_MODULES`` stay after ours.
    """
    environ = os.environ if environ is None else environ
    modules = [PLUGIN_MODULE] + [
        m for m in environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != PLUGIN_MODULE
    ]
    threads = str(_threads())
    from recallm.grpo.cpu import patches

    quiet = (
        {}
        if patches.baseline()
        else {
            # Ray's per-node reporter (psutil over every worker, metrics export) and autoscaler poll every
            # 5 s; a single-node CPU run uses neither: once a minute
            "REPORTER_UPDATE_INTERVAL_MS": environ.get("REPORTER_UPDATE_INTERVAL_MS", "60000"),
            "AUTOSCALER_UPDATE_INTERVAL_S": environ.get("AUTOSCALER_UPDATE_INTERVAL_S", "60"),
        }
    )
    return {
        **quiet,
        "VERL_PLATFORM": "cpu",  # our platform (registered by the plugin)
        "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engines for cuda/npu only
        "VERL_USE_EXTERNAL_MODULES": ",".join(modules),
        # Ray sets OMP_NUM_THREADS=<actor num_cpus> (often 1) unless it is set: the trainer and the
        # rollout server take turns, each may use every core
        "OMP_NUM_THREADS": environ.get("OMP_NUM_THREADS", threads),
        "MKL_NUM_THREADS": environ.get("MKL_NUM_THREADS", threads),
        "TOKENIZERS_PARALLELISM": environ.get("TOKENIZERS_PARALLELISM", "false"),
        # Ray's `uv run` runtime-env hook breaks on verl's working_dir=None (verl sets it too)
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        # a Ray worker (verl + vLLM imports) that has not registered within Ray's 60 s is restarted, and
        # after 5 tries its actor is unschedulable (ActorUnschedulableError): seen for verl's vLLM server
        # on a loaded 2-core machine. A CPU run waits for its workers instead.
        "RAY_worker_register_timeout_seconds": environ.get("RAY_worker_register_timeout_seconds", "600"),
        # Ray starts its workers at nice 15: on a CPU the trainer, the rollout and the reward are those
        # workers, so anything else running beside them (another stage, a test) starves the whole run
        # (seen: a GRPO step of 14 s made no progress for 6 minutes beside two SFT processes)
        "RAY_worker_niceness": environ.get("RAY_worker_niceness", "0"),
    }
