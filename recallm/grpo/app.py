"""The one GRPO launch on upstream verl 0.9.1, with masked rollouts and the RecaLLM reward:
``recallm-grpo`` (``configs/grpo.yaml``) and ``recallm-rlm train`` (``configs/rlm_train.yaml``,
``recallm.rlm.train``) both go through it, so every platform, every derived key and every guard
applies to both. Four steps:

1. **compose** — one Hydra composition of the command's config (verl's own ``ppo_trainer``, our
   reward table ``recallm.reward`` — the same ``configs/reward/*.yaml`` the data and the scorer use —,
   a recipe from ``configs/grpo/`` or ``configs/rlm_train/`` and the platform it chooses from
   ``configs/grpo/platform/``: ``gpu``, ``cpu``, ``vllm_cpu``), every override checked
   (``recallm.config.check_overrides``). The command line does it once
   (``recallm.cli.common.hydra_command``) and passes the object down; :func:`compose` is the same
   call for code and tests. Any verl key can be overridden.
2. **prepare** (:func:`prepare`) — :data:`PREPARE_STEPS`, small functions of the config that fill
   in what RecaLLM needs: paths made absolute (Ray workers on other nodes do not share the
   launcher's working directory); the model checked and ``external_lib=recallm.modeling`` (actor and
   reference load the masked model classes); the reward manager
   (``rewards.verl_adapter.RecallRewardManager`` with the reward table); the recall constraint
   (:func:`recall_constraint`: the one place verl's keys are derived from
   ``recallm.recall_constrained``); a vLLM rollout's ``hf_overrides`` (vLLM serves the base
   architecture) and context length; the platform's environment (the CPU plugin's, vLLM's CPU
   build's); the node resources ``ray.init`` refuses when it joins a running cluster (``RAY_ADDRESS``:
   the sbatch scripts start Ray themselves); the modules every verl process imports; the environment every Ray worker must carry
   (W&B mode, NCCL/Gloo interfaces, the job's expiration timestamp). A recipe adds its own steps
   (``recallm.rlm.train``: the data set and the agent loop); a new feature of GRPO adds one function
   to :data:`PREPARE_STEPS`;
3. **check** (:func:`problems`, :func:`validate`) — before Ray starts: the platform and the
   rollout agree; nothing would bypass, split or mismatch the recall mask; batch sizes divide;
   token caps cover the longest sequence; the overlong penalty can be reached; the evaluated
   checkpoint is kept; data files exist and the reward can score their rows. Each check yields its
   problems as one-line messages naming the key; then verl's own ``validate_config``;
4. **run** (:func:`launch`) — ``verl.trainer.main_ppo``'s ``run_ppo`` (the legacy trainer,
   ``trainer.use_v1=false``), after saying where checkpoints, rollouts and logs go (:func:`run`).

Steps 1-3 are modules of their own (:mod:`recallm.grpo.compose`, :mod:`recallm.grpo.prepare`,
:mod:`recallm.grpo.checks`); this one runs them (:func:`run`) and holds the launch (:func:`launch`). Their
names are importable from here, the launch's face (``recallm-grpo``, ``recallm-rlm train``, the tests).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterable

from omegaconf import DictConfig, OmegaConf

from recallm.grpo.checks import (
    CHECKS,
    FLASH_VARLEN_ATTENTION,
    MASKED_STRATEGIES,
    RECALL_ROLLOUTS,
    VERL_DEFAULT_ATTENTION,
    Check,
    length_warnings,
    problems,
    validate,
)
from recallm.grpo.compose import compose
from recallm.grpo.prepare import (
    FORWARDED_ENV,
    HF_OVERRIDES_ENV,
    MODEL_LIB,
    PREPARE_STEPS,
    RAY_NODE_KEYS,
    VLLM_PROCESSOR,
    WORKER_HOOKS,
    Prepared,
    Step,
    _loggers,
    absolute_paths,
    data_lengths,
    data_lengths_of,
    lora,
    metrics_log_path,
    model,
    operations,
    platform,
    prepare,
    ray_cluster,
    recall_constraint,
    resolve_names,
    reward_manager,
    vllm_rollout,
    worker_hooks,
)
from recallm.grpo.settings import closed, settings_of
from recallm.paths import step_dir, step_name

__all__ = [
    "compose",
    "closed",
    "Prepared",
    "Step",
    "PREPARE_STEPS",
    "prepare",
    "recall_constraint",
    "resolve_names",
    "absolute_paths",
    "data_lengths",
    "data_lengths_of",
    "model",
    "reward_manager",
    "lora",
    "vllm_rollout",
    "platform",
    "ray_cluster",
    "worker_hooks",
    "operations",
    "Check",
    "CHECKS",
    "problems",
    "validate",
    "length_warnings",
    "describe",
    "run",
    "launch",
    "resume_point",
    "metrics_log_path",
    "WORKER_HOOKS",
    "MODEL_LIB",
    "RAY_NODE_KEYS",
    "MASKED_STRATEGIES",
    "RECALL_ROLLOUTS",
    "FLASH_VARLEN_ATTENTION",
    "VERL_DEFAULT_ATTENTION",
    "HF_OVERRIDES_ENV",
    "FORWARDED_ENV",
    "VLLM_PROCESSOR",
]


def describe(cfg: DictConfig) -> str:
    t = cfg.trainer
    rm = settings_of(cfg)
    lines = [
        f"model:        {cfg.actor_rollout_ref.model.path}",
        f"rollout:      {cfg.actor_rollout_ref.rollout.name} on the {rm.platform} platform "
        f"(n={cfg.actor_rollout_ref.rollout.n}, recall processor {'on' if rm.recall_constrained else 'OFF'})",
        f"checkpoints:  {t.default_local_dir} (every {t.save_freq} steps, resume_mode={t.resume_mode}, "
        + (f"the newest {rm.keep_checkpoints} kept" if rm.keep_checkpoints else "every save kept")
        + ")",
        f"rollouts:     {t.get('rollout_data_dir') or '(not saved: trainer.rollout_data_dir=<dir> to dump them)'}",
        f"logs:         {', '.join(t.logger) if not isinstance(t.logger, str) else t.logger} "
        f"(project {t.project_name}, run {t.experiment_name})"
        + (f"; {_wandb_line(cfg)}" if "wandb" in _loggers(cfg) else ""),
        f"steps:        {t.get('total_training_steps') or 'one pass over the data'}"
        + (
            f" (the checkpoint to evaluate: {step_name(rm.eval_step)}; export it with"
            f" recallm-export --checkpoint {t.default_local_dir} --step {rm.eval_step} --out DIR)"
            if rm.eval_step
            else ""
        ),
        f"metrics:      {metrics_log_path(cfg) or '(console only: trainer.logger=[console,file] to keep them)'}",
    ]
    return "\n".join(lines)


def _wandb_line(cfg: DictConfig) -> str:
    from recallm.tracking import wandb_mode

    env = dict(os.environ)
    mode = OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE", default=None)
    if mode and not env.get("WANDB_MODE"):
        env["WANDB_MODE"] = str(mode)
        return wandb_mode({k: v for k, v in env.items() if k != "WANDB_MODE"})[1]
    return wandb_mode(env)[1]


def run(
    cfg: DictConfig,
    *,
    print_config: bool = False,
    steps: Iterable[Step] = PREPARE_STEPS,
    plain_models: bool = False,
    describe: Callable[[DictConfig], str] = describe,
) -> int:
    """The launch of a composed config (module doc, steps 2-4): prepare it with ``steps``, check it, then
    print it (``print_config``) or say what runs where (``describe``) and run verl's trainer."""
    env = prepare(cfg, steps, plain_models=plain_models)
    validate(cfg)
    for line in length_warnings(cfg):  # (stderr: --print-config's YAML stays alone on stdout)
        print(f"warning: {line}", file=sys.stderr, flush=True)
    if print_config:
        print(OmegaConf.to_yaml(cfg))
        return 0
    print(describe(cfg), flush=True)
    from recallm.grpo.checkpoints import hold_run_dir
    from recallm.grpo.console import console_to_log
    from recallm.grpo.memory import memory_guard
    from recallm.grpo.preemption import stop_file, stop_on_signals, stopped_by

    with hold_run_dir(cfg), stop_on_signals(stop_file(cfg.trainer.default_local_dir)) as received:
        resume_point(cfg)
        try:
            with console_to_log(cfg, mode=settings_of(cfg).console), memory_guard(cfg):
                launch(cfg, env)
        except Exception as exc:
            stopped = stopped_by(exc)
            if stopped is None or not received:
                raise
            name = signal.Signals(received["signal"]).name
            print(
                f"stopped by {name} after step {stopped.step}: checkpoint "
                f"{step_dir(str(cfg.trainer.default_local_dir), stopped.step)} saved; run the same "
                "command again to continue from it (trainer.resume_mode=auto)",
                flush=True,
            )
            return 128 + received["signal"]
    return 0


def resume_point(cfg: DictConfig) -> None:
    """Verify the checkpoint the run resumes from, and move damaged newer ones aside
    (``recallm.grpo.checkpoints.prepare_resume``); says where it resumes."""
    from recallm.grpo.checkpoints import prepare_resume

    t = cfg.trainer
    if t.get("default_hdfs_dir"):
        return  # verl itself refuses to resume from HDFS
    resume = prepare_resume(str(t.default_local_dir), str(t.resume_mode), t.get("resume_from_path"))
    for line in resume.moved:
        print(f"warning: checkpoint {line}", file=sys.stderr, flush=True)
    print(f"resume:       {resume.describe()}", flush=True)


def launch(cfg: DictConfig, env: dict[str, str]) -> None:
    """Run verl's GRPO trainer in this process (Ray is started by verl)."""
    import importlib

    os.environ.update(env)
    for module in env["VERL_USE_EXTERNAL_MODULES"].split(","):  # verl may already be imported here
        importlib.import_module(module)
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.main_ppo_v0 import TaskRunner
    from verl.utils.device import auto_set_device

    auto_set_device(cfg)
    run_ppo(cfg, task_runner_class=TaskRunner)
