"""``recallm-grpo``: GRPO on upstream verl 0.9.1 with masked rollouts and the RecaLLM reward.

The config (``configs/grpo.yaml``) composes verl's own ``ppo_trainer`` config, our reward table
(``recallm.reward``, the same ``configs/reward/*.yaml`` the data and the scorer use) and a recipe
from ``configs/grpo/`` (the paper's Qwen2.5-7B and Llama-3.1-8B runs, ``tiny_cpu``); any verl key
can be overridden on the command line. The launcher then

1. fills in what RecaLLM needs: the reward manager (``rewards.verl_adapter.RecallRewardManager``
   with the reward table), ``external_lib=recallm.modeling`` (actor and reference load the masked model
   classes, so their log-probs are computed under the rollout's mask), the recall logits
   processor of the rollout engine (vLLM on GPUs, with ``hf_overrides`` so vLLM serves the base
   architecture; the HF rollout on CPUs), the modules every verl process imports, and the CPU
   plugin and its overrides when ``recallm.cpu=true``;
   Paths (model, data, checkpoints, dumps) become absolute — Ray workers on other nodes do not
   share the launcher's working directory — and the environment a run must carry to every Ray
   worker (W&B mode, NCCL/Gloo interfaces, the job's expiration timestamp) goes into Ray's
   runtime environment;
2. checks the config before Ray starts (:func:`validate`): anything that would bypass, split or
   mismatch the recall mask, batch sizes that do not divide, token caps below the longest
   sequence, data whose ground truth the reward cannot score — each a one-line ``RecallmError``
   — then verl's own ``validate_config``;
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
from recallm.grpo.settings import settings_of
from recallm.paths import CONFIG_DIR

__all__ = [
    "compose_config",
    "prepare",
    "validate",
    "launch",
    "RUNTIME_MODULE",
    "FLASH_VARLEN_ATTENTION",
    "HF_OVERRIDES_ENV",
    "FORWARDED_ENV",
]

log = logging.getLogger(__name__)
RUNTIME_MODULE = "recallm.grpo.runtime"
MODEL_LIB = "recallm.modeling"  # actor_rollout_ref.model.external_lib: importing it registers the masked classes
VLLM_PROCESSOR = "recallm.recall.vllm:RecallLogitsProcessorV1"
RECALL_ROLLOUTS = ("vllm", "hf_cpu")
#: verl training backends that build the Hugging Face model (so the masked ``recallm_<base>``
#: classes run): FSDP1 and FSDP2. megatron, veomni, torchtitan, automodel and fsdp_turbo build
#: their own models, which know nothing of the recall mask.
MASKED_STRATEGIES = ("fsdp", "fsdp2")
#: Attention implementations that keep packed sequences (``use_remove_padding=true``: one row,
#: boundaries at ``position_ids`` resets) apart: flash attention's varlen kernels. ``sdpa`` and
#: ``eager`` attend across the boundary.
FLASH_VARLEN_ATTENTION = (
    "flash_attention_2",
    "flash_attention_3",
    "kernels-community/flash-attn",
    "kernels-community/flash-attn2",
    "kernels-community/flash-attn3",
    "kernels-community/vllm-flash-attn3",
)
#: verl's default when ``model.override_config.attn_implementation`` is unset (``HFModelConfig``).
VERL_DEFAULT_ATTENTION = "flash_attention_2"
#: The merged ``hf_overrides`` of a vLLM rollout, JSON; ``recallm.grpo.vllm_rollout`` merges it
#: into the dict verl builds itself (quantization) inside every rollout server.
HF_OVERRIDES_ENV = "RECALLM_VLLM_HF_OVERRIDES"
#: Environment variables a run carries to every Ray worker, when set where it is launched
#: (plus every ``NCCL_*`` and ``VLLM_CPU_*``): W&B mode and directory, network interfaces, offline hubs, and the
#: expiration timestamp verl saves a checkpoint before (``slurm/grpo*.sbatch`` set it).
FORWARDED_ENV = (
    "WANDB_MODE",
    "WANDB_DIR",
    "WANDB_PROJECT",
    "WANDB_ENTITY",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP",
)
_PATH_KEYS = (
    "actor_rollout_ref.model.path",
    "data.train_files",
    "data.val_files",
    "trainer.default_local_dir",
    "trainer.rollout_data_dir",
    "trainer.validation_data_dir",
)


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

        extra = list(cpu_overrides())
        if OmegaConf.select(cfg, "actor_rollout_ref.rollout.name", default=None, throw_on_missing=False) == "vllm":
            from recallm.grpo.vllm_cpu import vllm_cpu_overrides  # verl's vLLM rollout on vLLM's CPU build

            extra += vllm_cpu_overrides()
        cfg = _compose(extra + list(overrides))
    return cfg


def _set(cfg: DictConfig, key: str, value: Any, *, only_if_unset: bool = False) -> None:
    if only_if_unset and OmegaConf.select(cfg, key, default=None) not in (None, "", [], {}):
        return
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, force_add=True)


def _absolute(value: Any) -> Any:
    """A local path made absolute (lists element-wise); URLs and empty values unchanged."""
    if isinstance(value, (list, tuple)) or OmegaConf.is_list(value):
        return [_absolute(v) for v in value]
    if value in (None, "") or "://" in str(value):
        return value
    return str(Path(str(value)).expanduser().absolute())


def prepare(cfg: DictConfig) -> dict[str, str]:
    """Fill in the RecaLLM wiring (see module doc); returns the environment the run needs."""
    from recallm.modeling import check_recallm_model, vllm_hf_overrides
    from recallm.serve import served_hf_overrides

    for key in _PATH_KEYS:  # before anything reads them: Ray workers have another working directory
        value = OmegaConf.select(cfg, key, default=None)
        if value not in (None, ""):
            _set(cfg, key, _absolute(value))
    model_path = Path(str(cfg.actor_rollout_ref.model.path))
    summary = check_recallm_model(model_path)  # raises for a model without the recall tokens
    start, end = summary["recall_start_token_id"], summary["recall_end_token_id"]
    rm = settings_of(cfg)
    if rm.reward_manager:
        _set(cfg, "reward.reward_manager.source", "importlib")
        _set(cfg, "reward.reward_manager.name", "RecallRewardManager")
        _set(cfg, "reward.reward_manager.module.path", "pkg://rewards.verl_adapter")
        _set(cfg, "reward.reward_kwargs.recallm", rm.reward)
    libs = cfg.actor_rollout_ref.model.get("external_lib")
    libs = [libs] if isinstance(libs, str) else list(libs or [])
    if MODEL_LIB not in libs:
        _set(cfg, "actor_rollout_ref.model.external_lib", MODEL_LIB if not libs else [MODEL_LIB, *libs])
    rollout = cfg.actor_rollout_ref.rollout.name
    env: dict[str, str] = {}
    if rollout == "vllm":
        vllm_key = "actor_rollout_ref.rollout.engine_kwargs.vllm"
        if rm.recall:
            processors = list(OmegaConf.select(cfg, f"{vllm_key}.logits_processors", default=None) or [])
            if VLLM_PROCESSOR not in processors:
                _set(cfg, f"{vllm_key}.logits_processors", [*processors, VLLM_PROCESSOR])
        # every vLLM rollout (the ablation too) serves the base architecture; the overrides reach
        # the server through the environment and are merged into verl's own (quantization), which
        # a value in engine_kwargs would replace
        merged = served_hf_overrides(
            OmegaConf.select(cfg, f"{vllm_key}.hf_overrides", default=None),
            vllm_hf_overrides(_model_config(model_path)),
            f"{vllm_key}.hf_overrides",
        )
        _set(cfg, f"{vllm_key}.hf_overrides", None)
        env[HF_OVERRIDES_ENV] = json.dumps(merged, sort_keys=True)
        total = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
        _set(cfg, "actor_rollout_ref.rollout.max_model_len", total, only_if_unset=True)
    elif rollout == "hf_cpu":
        _set(cfg, "actor_rollout_ref.rollout.engine_kwargs.hf_cpu.recall", bool(rm.recall))
    if not rm.recall:  # the ablation without constrained decoding: plain log-probs too
        _set(cfg, "actor_rollout_ref.model.override_config.recall_constrained", False)
    if rm.cpu:
        from recallm.grpo.cpu import cpu_env

        env.update(cpu_env())
        if rollout == "vllm":
            from recallm.grpo.vllm_cpu import VLLM_CPU_ENV

            env[VLLM_CPU_ENV] = "1"
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
    if metrics_log is not None:  # verl's JSONL logger writes next to the checkpoints (recallm.eval.curves reads it)
        env["VERL_FILE_LOGGER_PATH"] = str(metrics_log)
    forwarded = {k: v for k, v in os.environ.items() if k in FORWARDED_ENV or k.startswith(("NCCL_", "VLLM_CPU_"))}
    for key, value in {**forwarded, **env}.items():  # Ray workers on other nodes get them through the runtime env
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
    from recallm.grpo import METRICS_FILE

    return Path(str(cfg.trainer.default_local_dir)).resolve() / METRICS_FILE


def _model_config(path: Path):
    from recallm.modeling import read_model_config

    return read_model_config(path)


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise RecallmError(message)


def _check_mask_is_kept(cfg: DictConfig) -> None:
    """What would bypass, split or mismatch the recall mask of the actor and the reference."""
    arr = cfg.actor_rollout_ref
    for role in ("actor_rollout_ref.model", "critic.model"):
        if OmegaConf.select(cfg, f"{role}.use_fused_kernels", default=False):
            raise RecallmError(f"{role}.use_fused_kernels=true bypasses the logits, so the recall mask would not apply")
    for role in ("actor", "ref"):
        # the deprecated top-level key (copied into fsdp_config by verl) and the one the engine reads
        for key in (
            f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size",
            f"actor_rollout_ref.{role}.fsdp_config.ulysses_sequence_parallel_size",
        ):
            sp = OmegaConf.select(cfg, key, default=1) or 1
            _need(
                int(sp) == 1,
                f"{key}={sp}: a sequence split across ranks loses the searchable context of its recall spans "
                "(verbatim tokens would get ~-1e4 log-probs); use 1",
            )
        strategy = OmegaConf.select(cfg, f"actor_rollout_ref.{role}.strategy", default=None)
        _need(
            strategy in MASKED_STRATEGIES,
            f"actor_rollout_ref.{role}.strategy={strategy}: only {' / '.join(MASKED_STRATEGIES)} build the Hugging "
            "Face model that applies the recall mask",
        )
    if arr.model.get("use_remove_padding", False):
        attn = OmegaConf.select(cfg, "actor_rollout_ref.model.override_config.attn_implementation", default=None)
        attn = attn or VERL_DEFAULT_ATTENTION
        _need(
            attn in FLASH_VARLEN_ATTENTION,
            f"actor_rollout_ref.model.use_remove_padding=true with attn_implementation={attn}: packed sequences "
            f"would attend to each other; use flash attention ({', '.join(FLASH_VARLEN_ATTENTION[:2])}) or "
            "use_remove_padding=false",
        )
    mode = arr.rollout.get("logprobs_mode", "processed_logprobs")
    _need(
        mode == "processed_logprobs",
        f"actor_rollout_ref.rollout.logprobs_mode={mode}: the rollout's log-probs must be the processed ones "
        "(after the recall mask), as the masked actor computes them; use processed_logprobs",
    )


def _check_lengths(cfg: DictConfig) -> None:
    """Context length of the rollout engine and the dynamic-batching token caps vs the longest sequence."""
    arr = cfg.actor_rollout_ref
    longest = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    max_model_len = arr.rollout.get("max_model_len")
    if max_model_len is not None:
        _need(
            int(max_model_len) >= longest,
            f"actor_rollout_ref.rollout.max_model_len={max_model_len} is shorter than data.max_prompt_length + "
            f"data.max_response_length = {longest}",
        )
    caps = []
    if arr.actor.get("use_dynamic_bsz", False):
        caps.append("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    for role in ("ref", "rollout"):
        if arr[role].get("log_prob_use_dynamic_bsz", False):
            caps.append(f"actor_rollout_ref.{role}.log_prob_max_token_len_per_gpu")
    for key in caps:
        cap = int(OmegaConf.select(cfg, key))
        _need(
            cap >= longest,
            f"{key}={cap} is below the longest sequence (data.max_prompt_length + data.max_response_length = "
            f"{longest}): one sequence would not fit in a micro batch",
        )


def _check_eval_step(cfg: DictConfig) -> None:
    """``recallm.eval_step``: the checkpoint the paper evaluates must be saved and kept."""
    step = settings_of(cfg).eval_step
    if step is None:
        return
    t = cfg.trainer
    step, total, freq = int(step), int(t.total_training_steps or 0), int(t.save_freq)
    _need(0 < step <= total, f"recallm.eval_step={step} must be within trainer.total_training_steps={total}")
    _need(
        freq > 0 and (step % freq == 0 or step == total),
        f"recallm.eval_step={step} is not saved with trainer.save_freq={freq}",
    )
    keep = t.get("max_actor_ckpt_to_keep")
    if keep is not None:
        later = (total // freq) - (step // freq)  # checkpoints saved after it
        _need(
            int(keep) > later,
            f"trainer.max_actor_ckpt_to_keep={keep} would delete the step-{step} checkpoint (recallm.eval_step) "
            f"before step {total}; use null or more than {later}",
        )


def validate(cfg: DictConfig) -> None:
    """RecaLLM's checks, then verl's ``validate_config`` — all before Ray starts.

    Raises ``RecallmError`` (one line) for: fused kernels; Ulysses sequence parallelism (any of
    the four keys, actor and reference); a training backend other than FSDP/FSDP2; packed
    sequences without flash attention; rollout log-probs other than the processed ones; a
    rollout without the recall processor; fewer than 2 rollouts; batch sizes that do not divide;
    a rollout context or dynamic-batching token cap below the longest sequence; an evaluated
    checkpoint (``recallm.eval_step``) that would not be saved or kept; missing data files and
    rows the reward cannot score; and whatever verl's own ``validate_config`` rejects.
    """
    arr = cfg.actor_rollout_ref
    rm = settings_of(cfg)
    _check_mask_is_kept(cfg)
    if rm.recall:
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
    if micro and not arr.actor.get("use_dynamic_bsz", False):
        _need(
            (mini * n) % (int(micro) * gpus) == 0,
            f"ppo_mini_batch_size x rollout.n = {mini * n} responses must split into micro batches of {micro} on "
            f"{gpus} device(s)",
        )
    _need((train_batch * n) % gpus == 0, f"{train_batch * n} responses per step do not divide over {gpus} device(s)")
    per_device = train_batch * n // max(gpus, 1)
    for role in ("rollout", "ref"):  # verl's compute_log_prob asserts it, inside a Ray worker
        lp_micro = arr[role].get("log_prob_micro_batch_size_per_gpu")
        if lp_micro and not arr[role].get("log_prob_use_dynamic_bsz", False):
            _need(
                per_device % int(lp_micro) == 0,
                f"{per_device} responses per device must split into micro batches of "
                f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu={lp_micro}",
            )
    _check_lengths(cfg)
    _check_eval_step(cfg)
    files = []
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(cfg, key, default=None)
        files += [value] if isinstance(value, str) else list(value or [])
    for file in files:
        _need(Path(str(file)).is_file(), f"data file {file} does not exist; generate it with `recallm-data`")
    if rm.reward_manager and rm.check_data:
        from data_gen.io import read_records
        from rewards import check_rows, load_reward_config

        reward = load_reward_config(rm.reward)
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
        f"steps:        {t.get('total_training_steps') or 'one pass over the data'}"
        + (
            f" (the checkpoint to evaluate: global_step_{cfg.recallm.eval_step}; export it with"
            f" recallm-export --checkpoint {t.default_local_dir} --step {cfg.recallm.eval_step} --out DIR)"
            if settings_of(cfg).eval_step
            else ""
        ),
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
