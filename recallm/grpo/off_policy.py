"""One-step-off-policy rollouts (``rollout=one_step_off``) on verl's own experimental trainer.

verl 0.9.1's ``verl.experimental.one_step_off_policy`` (``OneStepTaskRunner``, ``OneStepOffRayTrainer``)
puts the rollout on devices of its own (a standalone rollout replica, ``actor_rollout_ref.hybrid_engine=false``)
and, while the trainer trains on batch k, generates batch k+1 with the weights of the step before: every
batch is one update behind the policy it trains. RecaLLM launches it unchanged (``recallm.grpo.app.launch``
runs its task runner instead of the synchronous one); this module derives what it needs from
``recallm.rollout`` (:func:`prepare`, the one place):

* ``actor_rollout_ref.hybrid_engine=false``, ``rollout.free_cache_engine=false`` (the standalone engine keeps
  its weights between syncs) and ``rollout.calculate_log_probs=true`` (the rollout's log-probs, which the
  rollout-correction weights need);
* the weight sync from the actor to the standalone rollout: verl's checkpoint engine, ``nccl`` on GPUs; on the
  CPU platforms ``object_store`` (``recallm.grpo.cpu.weight_transfer``: through Ray's object store), named in
  ``checkpoint_engine.custom_backend_module``, verl's extension point for engines;
* on the CPU platforms, the logical Ray GPUs of both pools (``ray_kwargs.ray_init.num_gpus``: the trainer's
  plus the rollout's ``actor_rollout_ref.rollout.n_gpus_per_node x nnodes``) and the CPUs verl's task runner
  asks for.

What ``configs/rollout/one_step_off.yaml`` chooses (overridable): one rollout node of
``trainer.n_gpus_per_node`` devices, and token-level truncated importance sampling (``rollout_is=token``,
threshold 2, as the paper recipes) computed in decoupled mode (``bypass_mode=false``): the trainer recomputes
the batch's masked log-probs with its current weights, so the importance weights compare the rollout's
masked log-probs (the recall processor's ``processed_logprobs``) with the trainer's masked ones, and
``recallm/logprob_gap_in_spans`` measures the rollout against the trainer (it includes the one-update lag).

The recall constraint needs nothing more: the standalone rollout serves the same model config (the CPU
rollout's ``override_config``, vLLM's ``hf_overrides`` and logits processor) as a synchronous one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from omegaconf import OmegaConf

__all__ = ["prepare", "check", "task_runner", "CPU_BACKEND", "CPU_BACKEND_MODULE", "RUNNER_CPUS"]

#: the checkpoint engine that moves the actor's weights to a standalone rollout on the CPU platforms
CPU_BACKEND = "object_store"
CPU_BACKEND_MODULE = "recallm.grpo.cpu.weight_transfer"
#: CPUs verl's ``OneStepTaskRunner`` asks Ray for (``@ray.remote(num_cpus=10)``)
RUNNER_CPUS = 10
_ENGINE = "actor_rollout_ref.rollout.checkpoint_engine"


def _set(cfg: Any, key: str, value: Any) -> None:
    from omegaconf import open_dict

    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, force_add=True)


def _devices(cfg: Any) -> tuple[int, int]:
    """(trainer devices, rollout devices)."""
    t = cfg.trainer
    r = cfg.actor_rollout_ref.rollout
    return int(t.n_gpus_per_node) * int(t.nnodes), int(r.n_gpus_per_node) * int(r.nnodes)


def prepare(cfg: Any, run: Any) -> None:
    """The keys verl's one-step-off trainer needs, derived from ``recallm.rollout=one_step_off`` (module doc)."""
    from recallm.grpo.settings import settings_of

    rm = settings_of(cfg)
    if rm.rollout != "one_step_off":
        return
    _set(cfg, "actor_rollout_ref.hybrid_engine", False)
    _set(cfg, "actor_rollout_ref.rollout.free_cache_engine", False)
    _set(cfg, "actor_rollout_ref.rollout.calculate_log_probs", True)
    if rm.cpu:
        if OmegaConf.select(cfg, f"{_ENGINE}.backend", default="naive") == "naive":
            _set(cfg, f"{_ENGINE}.backend", CPU_BACKEND)
        if OmegaConf.select(cfg, f"{_ENGINE}.backend") == CPU_BACKEND:
            _set(cfg, f"{_ENGINE}.custom_backend_module", CPU_BACKEND_MODULE)
        trainer, rollout = _devices(cfg)
        _set(cfg, "ray_kwargs.ray_init.num_gpus", trainer + rollout)
        cpus = int(OmegaConf.select(cfg, "ray_kwargs.ray_init.num_cpus", default=0) or 0)
        _set(cfg, "ray_kwargs.ray_init.num_cpus", cpus + RUNNER_CPUS)
        run.derived["ray_kwargs.ray_init.num_gpus"] = (
            f"one-step-off: the trainer's {trainer} and the rollout's {rollout} logical device(s)"
        )
    elif OmegaConf.select(cfg, f"{_ENGINE}.backend", default="naive") == "naive":
        _set(cfg, f"{_ENGINE}.backend", "nccl")


def check(cfg: Any) -> Iterator[str]:
    """What verl's one-step-off trainer cannot run with (one line each)."""
    from recallm.grpo.settings import settings_of

    rm = settings_of(cfg)
    if rm.rollout != "one_step_off":
        return
    r = cfg.actor_rollout_ref.rollout
    if int(r.nnodes) < 1 or int(r.n_gpus_per_node) < 1:
        yield (
            f"rollout=one_step_off puts the rollout on devices of its own: actor_rollout_ref.rollout.nnodes={r.nnodes} "
            f"x n_gpus_per_node={r.n_gpus_per_node} gives it none; use 1 node or more of 1 device or more"
        )
    if str(r.mode) != "async":
        yield f"rollout=one_step_off needs verl's server rollout (actor_rollout_ref.rollout.mode=async), not {r.mode}"
    backend = OmegaConf.select(cfg, f"{_ENGINE}.backend")
    if backend == "naive":
        yield (
            f"{_ENGINE}.backend=naive passes weights inside one process; a standalone rollout needs a checkpoint "
            f"engine ({CPU_BACKEND} on a CPU, nccl on GPUs)"
        )
    if rm.cpu and backend == "nccl":
        yield f"{_ENGINE}.backend=nccl needs GPUs; on the {rm.platform} platform use {CPU_BACKEND}"
    lora = int(OmegaConf.select(cfg, "actor_rollout_ref.model.lora_rank", default=0) or 0) > 0
    if lora and not OmegaConf.select(cfg, "actor_rollout_ref.model.lora.merge", default=False):
        yield (
            "rollout=one_step_off with a LoRA adapter sent unmerged: verl 0.9.1's checkpoint-engine path sends the "
            "adapter's tensors without its config, as if they were base weights; set actor_rollout_ref.model.lora.merge=true"
        )
    if OmegaConf.select(cfg, "algorithm.adv_estimator") == "remax":
        yield "rollout=one_step_off with algorithm.adv_estimator=remax: verl's one-step-off trainer has no greedy baseline pass"


def task_runner(cfg: Any) -> Any:
    """The Ray task runner that trains ``cfg``: verl's synchronous one, or its one-step-off one."""
    from recallm.grpo.settings import settings_of

    if settings_of(cfg).rollout == "one_step_off":
        from verl.experimental.one_step_off_policy.main_ppo import OneStepTaskRunner

        return OneStepTaskRunner
    from verl.trainer.main_ppo_v0 import TaskRunner

    return TaskRunner
