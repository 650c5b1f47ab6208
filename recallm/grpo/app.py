"""``recallm-grpo``: GRPO on upstream verl 0.9.1 with masked rollouts and the RecaLLM reward.

The config (``configs/grpo.yaml``) composes verl's own ``ppo_trainer`` config, our reward table
(``recallm.reward``, the same ``configs/reward/*.yaml`` the data and the scorer use) and a recipe
from ``configs/grpo/`` (the paper's Qwen2.5-7B and Llama-3.1-8B runs, ``tiny_cpu``); any verl key
can be overridden on the command line. The launcher then

1. fills in what RecaLLM needs: the reward manager (``rewards.verl_adapter.RecallRewardManager``
   with the reward table), ``external_lib=recallm`` (actor and reference load the masked model
   classes, so their log-probs are computed under the rollout's mask), the recall logits
   processor of the rollout engine (vLLM on GPUs, with ``hf_overrides`` so vLLM serves the base
   architecture; the HF rollout on CPUs), the modules every verl process imports, and the CPU
   plugin and its overrides when ``recallm.cpu=true``;
2. checks the config before Ray starts: a model without recall tokens, fused kernels or sequence
   parallelism on (both would bypass or split the recall mask), a rollout without the recall
   processor, batch sizes that do not divide, data whose ground truth the reward cannot score —
   each a one-line ``RecallmError`` — then verl's own ``validate_config``;
3. runs ``verl.trainer.main_ppo``'s ``run_ppo`` (the legacy trainer, ``trainer.use_v1=false``) and
   says where checkpoints, rollouts and logs go.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from recallm.errors import RecallmError
from recallm.paths import CONFIG_DIR

__all__ = ["compose_config", "prepare", "validate", "launch", "RUNTIME_MODULE"]

log = logging.getLogger(__name__)
RUNTIME_MODULE = "recallm.grpo.runtime"
VLLM_PROCESSOR = "recallm.recall.vllm:RecallLogitsProcessorV1"
RECALL_ROLLOUTS = ("vllm", "hf_cpu")


def compose_config(overrides: list[str]) -> DictConfig:
    """Compose ``configs/grpo.yaml`` (verl's ``ppo_trainer`` + ours) with command-line overrides;
    CPU recipes get the CPU plugin's overrides first (the user's still win)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    def _compose(items: list[str]) -> DictConfig:
        try:
            with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
                return compose("grpo", overrides=items)
        except (HydraException, OmegaConfBaseException) as exc:
            raise RecallmError(f"bad GRPO config: {str(exc).splitlines()[0]}") from exc

    cfg = _compose(list(overrides))
    if cfg.recallm.cpu:
        from recallm.grpo.cpu import cpu_overrides

        cfg = _compose(list(cpu_overrides()) + list(overrides))
    return cfg


def _set(cfg: DictConfig, key: str, value: Any, *, only_if_unset: bool = False) -> None:
    if only_if_unset and OmegaConf.select(cfg, key, default=None) not in (None, "", [], {}):
        return
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, force_add=True)


def prepare(cfg: DictConfig) -> dict[str, str]:
    """Fill in the RecaLLM wiring (see module doc); returns the environment the run needs."""
    from recallm.modeling import check_recallm_model, vllm_hf_overrides

    model_path = Path(str(cfg.actor_rollout_ref.model.path))
    summary = check_recallm_model(model_path)  # raises for a model without the recall tokens
    start, end = summary["recall_start_token_id"], summary["recall_end_token_id"]
    rm = cfg.recallm
    if rm.reward_manager:
        _set(cfg, "reward.reward_manager.source", "importlib")
        _set(cfg, "reward.reward_manager.name", "RecallRewardManager")
        _set(cfg, "reward.reward_manager.module.path", "pkg://rewards.verl_adapter")
        _set(cfg, "reward.reward_kwargs.recallm", OmegaConf.to_container(rm.reward, resolve=True))
    libs = cfg.actor_rollout_ref.model.get("external_lib")
    libs = [libs] if isinstance(libs, str) else list(libs or [])
    if "recallm" not in libs:
        _set(cfg, "actor_rollout_ref.model.external_lib", "recallm" if not libs else ["recallm", *libs])
    rollout = cfg.actor_rollout_ref.rollout.name
    if rm.recall and rollout == "vllm":
        processors = list(
            OmegaConf.select(cfg, "actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors", default=None) or []
        )
        if VLLM_PROCESSOR not in processors:
            _set(cfg, "actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors", [*processors, VLLM_PROCESSOR])
        base = json.dumps(vllm_hf_overrides(_model_config(model_path)))
        _set(cfg, "actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides", base, only_if_unset=True)
    elif rollout == "hf_cpu":
        _set(cfg, "actor_rollout_ref.rollout.engine_kwargs.hf_cpu.recall", bool(rm.recall))
    if not rm.recall:  # the ablation without constrained decoding: plain log-probs too
        _set(cfg, "actor_rollout_ref.model.override_config.recall_constrained", False)
    env: dict[str, str] = {}
    if rm.cpu:
        from recallm.grpo.cpu import cpu_env

        env.update(cpu_env())
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    for module in (["recallm.grpo.cpu.plugin"] if rm.cpu else []) + [RUNTIME_MODULE]:
        if module not in modules:
            modules.append(module)
    env.update(
        VERL_USE_EXTERNAL_MODULES=",".join(modules),
        RECALLM_RECALL_TOKEN_IDS=f"{start},{end}",
        RECALLM_GRPO_CPU="1" if rm.cpu else "0",
    )
    metrics_log = metrics_log_path(cfg)
    if metrics_log is not None:  # verl's JSONL logger writes next to the checkpoints (recallm.grpo.curves reads it)
        env["VERL_FILE_LOGGER_PATH"] = str(metrics_log)
    for key, value in env.items():  # Ray workers on other nodes get them through the runtime env
        _set(cfg, f"ray_kwargs.ray_init.runtime_env.env_vars.{key}", value)
    return env


def metrics_log_path(cfg: DictConfig) -> Path | None:
    """Where verl's ``file`` logger writes this run's per-step metrics: ``VERL_FILE_LOGGER_PATH``
    if set, else ``<trainer.default_local_dir>/metrics.jsonl``; ``None`` without the file logger."""
    loggers = cfg.trainer.get("logger") or []
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    if "file" not in loggers:
        return None
    if os.environ.get("VERL_FILE_LOGGER_PATH"):
        return Path(os.environ["VERL_FILE_LOGGER_PATH"])
    from recallm.grpo.curves import METRICS_FILE

    return Path(str(cfg.trainer.default_local_dir)).resolve() / METRICS_FILE


def _model_config(path: Path):
    from transformers import AutoConfig

    import recallm  # noqa: F401

    return AutoConfig.from_pretrained(path)


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise RecallmError(message)


def validate(cfg: DictConfig) -> None:
    """RecaLLM's checks, then verl's ``validate_config`` — all before Ray starts."""
    arr = cfg.actor_rollout_ref
    for role in ("actor_rollout_ref.model", "critic.model"):
        if OmegaConf.select(cfg, f"{role}.use_fused_kernels", default=False):
            raise RecallmError(f"{role}.use_fused_kernels=true bypasses the logits, so the recall mask would not apply")
    for role in ("actor", "ref"):
        sp = OmegaConf.select(cfg, f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size", default=1) or 1
        _need(
            int(sp) == 1,
            f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size={sp}: a sequence split across "
            "ranks loses the searchable context of its recall spans; use 1",
        )
    if cfg.recallm.recall:
        _need(
            arr.rollout.name in RECALL_ROLLOUTS,
            f"rollout {arr.rollout.name!r} has no recall logits processor (use one of {', '.join(RECALL_ROLLOUTS)}, "
            "or recallm.recall=false for the unconstrained ablation)",
        )
    n = int(arr.rollout.n)
    _need(n >= 2, f"GRPO needs at least 2 rollouts per prompt (actor_rollout_ref.rollout.n={n})")
    train_batch, mini = int(cfg.data.train_batch_size), int(arr.actor.ppo_mini_batch_size)
    _need(
        mini >= 1 and train_batch % mini == 0,
        f"data.train_batch_size={train_batch} must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
    )
    gpus = int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)
    micro = arr.actor.get("ppo_micro_batch_size_per_gpu")
    if micro:
        _need(
            (mini * n) % (int(micro) * gpus) == 0,
            f"ppo_mini_batch_size x rollout.n = {mini * n} responses must split into micro batches of {micro} on "
            f"{gpus} device(s)",
        )
    _need((train_batch * n) % gpus == 0, f"{train_batch * n} responses per step do not divide over {gpus} device(s)")
    files = []
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(cfg, key, default=None)
        files += [value] if isinstance(value, str) else list(value or [])
    for file in files:
        _need(Path(str(file)).is_file(), f"data file {file} does not exist; generate it with `recallm-data`")
    if cfg.recallm.reward_manager and cfg.recallm.check_data:
        from data_gen.io import read_records
        from rewards import check_rows, load_reward_config

        reward = load_reward_config(OmegaConf.to_container(cfg.recallm.reward, resolve=True))
        for file in files:
            try:
                check_rows(read_records(file), reward)
            except RecallmError as exc:
                raise RecallmError(f"{file}: {exc}") from exc
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except (AssertionError, ValueError) as exc:
        raise RecallmError(
            f"verl rejects the config: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc


def describe(cfg: DictConfig) -> str:
    t = cfg.trainer
    lines = [
        f"model:        {cfg.actor_rollout_ref.model.path}",
        f"rollout:      {cfg.actor_rollout_ref.rollout.name} (n={cfg.actor_rollout_ref.rollout.n}, "
        f"recall processor {'on' if cfg.recallm.recall else 'OFF'})",
        f"checkpoints:  {t.default_local_dir} (every {t.save_freq} steps, resume_mode={t.resume_mode})",
        f"rollouts:     {t.get('rollout_data_dir') or '(not saved: trainer.rollout_data_dir=<dir> to dump them)'}",
        f"logs:         {', '.join(t.logger) if not isinstance(t.logger, str) else t.logger} "
        f"(project {t.project_name}, run {t.experiment_name})",
        f"steps:        {t.get('total_training_steps') or 'one pass over the data'}",
        f"metrics:      {metrics_log_path(cfg) or '(console only: trainer.logger=[console,file] to keep them)'}",
    ]
    return "\n".join(lines)


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
