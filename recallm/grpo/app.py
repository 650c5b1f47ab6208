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
   ``trainer.use_v1=false``; with ``rollout=one_step_off`` verl's one-step-off-policy task runner,
   ``recallm.grpo.off_policy``), after saying where checkpoints, rollouts and logs go (:func:`run`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from recallm.errors import RecallmError
from recallm.grpo import algorithms
from recallm.grpo.settings import closed, settings_of

__all__ = [
    "compose",
    "closed",
    "Prepared",
    "PREPARE_STEPS",
    "prepare",
    "recall_constraint",
    "CHECKS",
    "problems",
    "validate",
    "length_warnings",
    "describe",
    "run",
    "launch",
    "metrics_log_path",
    "RUNTIME_MODULE",
    "FLASH_VARLEN_ATTENTION",
    "HF_OVERRIDES_ENV",
    "FORWARDED_ENV",
    "VLLM_PROCESSOR",
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


# ------------------------------------------------------------------------------------------ compose
def compose(overrides: Sequence[str], *, config_name: str = "grpo") -> DictConfig:
    """The one composition of a GRPO launch: ``configs/<config_name>.yaml`` (``grpo`` or
    ``rlm_train``) with the overrides, each checked (``recallm.config.check_overrides``; register the
    schemas first, ``recallm.cli.schemas.register``). What the command line does before :func:`run`."""
    from recallm.config import check_overrides

    return check_overrides(config_name, list(overrides), closed=closed)


# ------------------------------------------------------------------------------------------ prepare
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


@dataclass
class Prepared:
    """What the prepare steps of one launch share, and what the run needs from them."""

    plain_models: bool = False
    """a model without recall tokens is accepted, with ``recallm.recall_constrained=false`` (RLM
    training of a plain root); ``recallm-grpo`` trains RecaLLM models only"""
    env: dict[str, str] = field(default_factory=dict)
    """the environment the run needs: set in this process, and in every Ray worker's runtime env"""
    modules: list[str] = field(default_factory=list)
    """what every verl process imports (``VERL_USE_EXTERNAL_MODULES``), in order"""
    model: dict[str, Any] | None = None
    """``check_recallm_model``'s summary of a RecaLLM model; None for a plain one"""
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    """what a vLLM rollout's server must serve, besides the base architecture (the recall constraint)"""
    derived: dict[str, str] = field(default_factory=dict)
    """keys the steps set from the data or the model, and from what (printed at the launch)"""

    def add_module(self, module: str) -> None:
        if module not in self.modules:
            self.modules.append(module)


#: one step of :func:`prepare`: fills in keys of the composed config, and what the run needs
Step = Callable[[DictConfig, Prepared], None]


def resolve_names(cfg: DictConfig, run: Prepared) -> None:
    """The values that go through the project's resolvers (``${recallm.model_name:...}``: the own-model and
    tiny recipes name the run after the model), resolved here: Ray workers resolve the config again and
    do not have them."""
    from recallm.paths import RESOLVERS

    if OmegaConf.select(cfg, "actor_rollout_ref.model.path", default=None) is None:
        raise RecallmError(
            "actor_rollout_ref.model.path is required: the model to train (after SFT: "
            "actor_rollout_ref.model.path=outputs/sft/<name>/full/final)"
        )

    def walk(node: Any, prefix: str) -> Iterator[str]:
        for key in node.keys() if OmegaConf.is_dict(node) else []:
            path = f"{prefix}.{key}" if prefix else str(key)
            child = node._get_node(key)
            if OmegaConf.is_dict(child):
                yield from walk(child, path)
            elif isinstance(child._value(), str) and any(f"${{{name}:" in child._value() for name in RESOLVERS):
                yield path

    for key in list(walk(cfg, "")):
        _set(cfg, key, OmegaConf.select(cfg, key))


def data_lengths(cfg: DictConfig, run: Prepared) -> None:
    """``data.max_prompt_length`` / ``data.max_response_length`` left null (the own-model recipe): the
    data's own, from the ``summary.json`` of the training file's directory (``data_gen.generate.data_lengths``)
    — the longest training prompt; the longest SFT trace's completion plus the overlong buffer, so that the
    responses the policy was taught to write are neither cut nor penalised. Rounded up to a multiple of 16.
    What cannot be derived stays null, and :func:`_check_data_lengths` says what to set."""
    prompt, response = cfg.data.get("max_prompt_length"), cfg.data.get("max_response_length")
    if prompt is not None and response is not None:
        return
    found = data_lengths_of(_data_dir(cfg)) if _data_dir(cfg) else {}
    if prompt is None and "prompt_max" in found:
        _set(cfg, "data.max_prompt_length", _round_up(found["prompt_max"]))
        run.derived["data.max_prompt_length"] = f"the longest training prompt, {found['prompt_max']} tokens"
    if response is None and "completion_max" in found:
        buffer = _overlong_buffer(cfg)
        _set(cfg, "data.max_response_length", _round_up(found["completion_max"] + buffer))
        run.derived["data.max_response_length"] = (
            f"the longest SFT trace, {found['completion_max']} tokens" + (f", + the overlong buffer {buffer}" if buffer else "")
        )


def data_lengths_of(folder: Path) -> dict[str, int]:
    from data_gen.generate import data_lengths as lengths_of

    return lengths_of(folder)


def _round_up(n: int, to: int = 16) -> int:
    return -(-int(n) // to) * to


def _data_dir(cfg: DictConfig) -> Path | None:
    """The directory ``recallm-data`` wrote the training file into (its summary.json beside it)."""
    files = OmegaConf.select(cfg, "data.train_files", default=None)
    files = [files] if isinstance(files, str) else list(files or [])
    return Path(str(files[0])).parent if len(files) == 1 else None


def _overlong_buffer(cfg: DictConfig) -> int:
    """Tokens before the generation cap where the overlong penalty starts (0: shaping off)."""
    overlong = OmegaConf.select(cfg, "recallm.reward.overlong", default=None) or {}
    if not overlong.get("enable", False) or not OmegaConf.select(cfg, "recallm.reward_manager", default=False):
        return 0
    buffer = overlong.get("buffer")
    return int(buffer) if isinstance(buffer, int) else 0


def absolute_paths(cfg: DictConfig, run: Prepared) -> None:
    """The model, data, checkpoint and dump paths, absolute (before anything reads them)."""
    for key in _PATH_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if value not in (None, ""):
            _set(cfg, key, _absolute(value))


def model(cfg: DictConfig, run: Prepared) -> None:
    """A RecaLLM model: checked (``check_recallm_model``: one line for a directory that is not, or whose weights
    are truncated, altered or not finite: verl's workers would fail on them with a traceback each), its recall
    token ids for the metrics, ``external_lib`` so that actor and reference load the masked classes. A plain
    model where the recipe accepts one (:attr:`Prepared.plain_models`), only without the constraint."""
    from recallm.modeling import check_recallm_model, check_weights, read_model_config

    path = Path(str(cfg.actor_rollout_ref.model.path))
    if run.plain_models and not read_model_config(path).model_type.startswith("recallm_"):
        if settings_of(cfg).recall_constrained:
            raise RecallmError(
                f"{path} is a plain model without recall tokens: set recallm.recall_constrained=false (or convert "
                "it with recallm-create-model)"
            )
        check_weights(path)
        return
    run.model = check_recallm_model(path, weights=True)  # raises for a model without the recall tokens
    run.env["RECALLM_RECALL_TOKEN_IDS"] = f"{run.model['recall_start_token_id']},{run.model['recall_end_token_id']}"
    libs = cfg.actor_rollout_ref.model.get("external_lib")
    libs = [libs] if isinstance(libs, str) else list(libs or [])
    if MODEL_LIB not in libs:
        _set(cfg, "actor_rollout_ref.model.external_lib", MODEL_LIB if not libs else [MODEL_LIB, *libs])


def reward_manager(cfg: DictConfig, run: Prepared) -> None:
    """``recallm.reward_manager``: verl's reward loop scores with ``RecallRewardManager`` and the table."""
    rm = settings_of(cfg)
    if rm.reward_manager:
        _set(cfg, "reward.reward_manager.source", "importlib")
        _set(cfg, "reward.reward_manager.name", "RecallRewardManager")
        _set(cfg, "reward.reward_manager.module.path", "pkg://rewards.verl_adapter")
        _set(cfg, "reward.reward_kwargs.recallm", rm.reward)


def recall_constraint(cfg: DictConfig, run: Prepared) -> None:
    """The one place verl's keys are derived from ``recallm.recall_constrained`` (and never read back):

    * ``actor_rollout_ref.model.override_config.recall_constrained``: the masked model classes of actor and
      reference compute their log-probs under the mask or not, and the ``hf_cpu`` rollout, which loads
      the model with ``override_config``, constrains its spans or not;
    * a vLLM rollout: the recall logits processor in ``engine_kwargs.vllm.logits_processors`` (when on),
      and ``recall_constrained`` in the ``hf_overrides`` of its server's model config, which the
      processor reads.

    A plain model has nothing to constrain (:func:`model` accepts it only with the constraint off)."""
    if run.model is None:
        return
    constrained = settings_of(cfg).recall_constrained
    _set(cfg, "actor_rollout_ref.model.override_config.recall_constrained", constrained)
    if cfg.actor_rollout_ref.rollout.name == "vllm":
        key = "actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors"
        processors = list(OmegaConf.select(cfg, key, default=None) or [])
        if constrained and VLLM_PROCESSOR not in processors:
            _set(cfg, key, [*processors, VLLM_PROCESSOR])
        run.hf_overrides["recall_constrained"] = constrained


def lora(cfg: DictConfig, run: Prepared) -> None:
    """verl's own LoRA (``actor_rollout_ref.model.lora_rank`` > 0; verl builds the ``LoraConfig`` and the
    reference is the actor with its adapter off). The ``hf_cpu`` rollout takes whole weights: the adapter is
    merged before each weight push (``model.lora.merge=true``); verl's vLLM rollout loads the adapter itself.
    The four RecaLLM token rows stay frozen, as the embedding stage left them: verl's ``LoraConfig`` has no
    ``trainable_token_indices``, and the rows need no further training (README, "One GPU")."""
    if int(OmegaConf.select(cfg, "actor_rollout_ref.model.lora_rank", default=0) or 0) <= 0:
        return
    if cfg.actor_rollout_ref.rollout.name == "hf_cpu":
        _set(cfg, "actor_rollout_ref.model.lora.merge", True)


def vllm_rollout(cfg: DictConfig, run: Prepared) -> None:
    """verl's vLLM rollout: every vLLM rollout (the ablation too) serves a RecaLLM model as its base
    architecture. The ``hf_overrides`` reach the server through the environment (``HF_OVERRIDES_ENV``)
    and are merged into verl's own there (quantization), which a value in ``engine_kwargs`` would
    replace. The engine's context: the longest sequence, unless set."""
    if cfg.actor_rollout_ref.rollout.name != "vllm":
        return
    if run.model is not None:
        from recallm.modeling import read_model_config, served_hf_overrides, vllm_hf_overrides

        key = "actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides"
        base = vllm_hf_overrides(read_model_config(Path(str(cfg.actor_rollout_ref.model.path))))
        merged = served_hf_overrides(OmegaConf.select(cfg, key, default=None), {**base, **run.hf_overrides}, key)
        _set(cfg, key, None)
        run.env[HF_OVERRIDES_ENV] = json.dumps(merged, sort_keys=True)
    total = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    _set(cfg, "actor_rollout_ref.rollout.max_model_len", total, only_if_unset=True)


def platform(cfg: DictConfig, run: Prepared) -> None:
    """The platform's environment (its keys are the config group's): on CPUs the plugin's
    (``recallm.grpo.cpu.cpu_env``: every verl process imports it), with vLLM's CPU build its patch."""
    rm = settings_of(cfg)
    if rm.cpu:
        from recallm.grpo.cpu import PLUGIN_MODULE, cpu_env

        run.env.update(cpu_env())
        for module in run.env["VERL_USE_EXTERNAL_MODULES"].split(","):
            run.add_module(module)
        run.add_module(PLUGIN_MODULE)
    if rm.platform == "vllm_cpu":
        from recallm.grpo.vllm_cpu import VLLM_CPU_ENV

        run.env[VLLM_CPU_ENV] = "1"
    run.env["RECALLM_GRPO_CPU"] = "1" if rm.cpu else "0"


#: what ``ray.init`` refuses when it joins a running cluster (the cluster's ``ray start`` declared them)
RAY_NODE_KEYS = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_system_config")


def ray_cluster(cfg: DictConfig, run: Prepared) -> None:
    """Joining a running Ray cluster (``RAY_ADDRESS`` set: the sbatch scripts start Ray themselves):
    ``ray_kwargs.ray_init`` loses the node resources a platform declares for a Ray of its own (the CPU
    platform's logical CPUs and GPUs), which ``ray.init`` refuses when it connects; the cluster's nodes
    declared theirs (``ray start --num-cpus --num-gpus``)."""
    address = os.environ.get("RAY_ADDRESS", "")
    if address in ("", "local"):
        return
    ray_init = OmegaConf.select(cfg, "ray_kwargs.ray_init", default=None)
    if ray_init is None:
        return
    dropped = [key for key in RAY_NODE_KEYS if ray_init.get(key) not in (None, {}, [])]
    if dropped:
        with open_dict(cfg):
            for key in dropped:
                ray_init[key] = None
        log.info("joining the Ray cluster at %s: its nodes declare %s, not ray_kwargs.ray_init", address, ", ".join(dropped))


def runtime(cfg: DictConfig, run: Prepared) -> None:
    """``recallm.grpo.runtime`` in every verl process (the masked classes, the platform's patches, the
    recall metrics); verl's JSONL metrics log next to the checkpoints (``recallm.eval.curves`` reads it)."""
    run.add_module(RUNTIME_MODULE)
    metrics_log = metrics_log_path(cfg)
    if metrics_log is not None:  # verl's JSONL logger writes next to the checkpoints (recallm.eval.curves reads it)
        run.env["VERL_FILE_LOGGER_PATH"] = str(metrics_log)


def operations(cfg: DictConfig, run: Prepared) -> None:
    """What keeps a long run alive: the process group's timeout (``actor_rollout_ref.nccl_timeout``, which
    verl 0.9.1's engine workers do not pass on: ``recallm.grpo.runtime``), the save-and-stop on SIGTERM or
    SIGUSR1 (``recallm.grpo.preemption``), the checkpoint retention (``recallm.keep_checkpoints``,
    ``recallm.eval_step``: ``recallm.grpo.retention``), and W&B offline unless credentials are configured
    (``recallm.tracking``)."""
    from recallm.grpo.preemption import STOP_ENV, stop_file
    from recallm.grpo.retention import EVAL_STEP_ENV, KEEP_ENV
    from recallm.grpo.runtime import TIMEOUT_ENV

    timeout = OmegaConf.select(cfg, "actor_rollout_ref.nccl_timeout", default=None)
    if timeout:
        run.env[TIMEOUT_ENV] = str(int(timeout))
    rm = settings_of(cfg)
    run.env[STOP_ENV] = str(stop_file(cfg.trainer.default_local_dir))  # (recallm.grpo.preemption)
    if rm.keep_checkpoints:
        run.env[KEEP_ENV] = str(rm.keep_checkpoints)
        if rm.eval_step:
            run.env[EVAL_STEP_ENV] = str(rm.eval_step)
    if "wandb" in _loggers(cfg) and not os.environ.get("WANDB_MODE"):
        from recallm.tracking import wandb_mode

        mode, _ = wandb_mode()
        run.env["WANDB_MODE"] = mode


def _loggers(cfg: DictConfig) -> list[str]:
    loggers = cfg.trainer.get("logger") or []
    return [loggers] if isinstance(loggers, str) else list(loggers)


#: the steps of :func:`prepare`, in order: a new GRPO feature adds its own here, and both launches
#: (``recallm-grpo``, ``recallm-rlm train``) run it
PREPARE_STEPS: tuple[Step, ...] = (
    resolve_names,
    absolute_paths,
    data_lengths,
    model,
    reward_manager,
    algorithms.constraint_not_split,
    recall_constraint,
    lora,
    vllm_rollout,
    algorithms.off_policy.prepare,
    platform,
    ray_cluster,
    runtime,
    operations,
)


def prepare(cfg: DictConfig, steps: Iterable[Step] = PREPARE_STEPS, *, plain_models: bool = False) -> dict[str, str]:
    """Fill in the RecaLLM wiring (module doc, step 2): run ``steps`` on the composed config, then put the
    environment the run needs (and the forwarded variables of :data:`FORWARDED_ENV`) into Ray's runtime
    env; returns that environment."""
    run = Prepared(plain_models=plain_models)
    for step in steps:
        step(cfg, run)
    for key, source in run.derived.items():  # (stderr: --print-config's YAML stays alone on stdout)
        print(f"{key}={OmegaConf.select(cfg, key)}: {source}", file=sys.stderr, flush=True)
    env = dict(run.env)
    if run.modules:
        env["VERL_USE_EXTERNAL_MODULES"] = ",".join(run.modules)
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


# -------------------------------------------------------------------------------------------- check
#: one check of :func:`problems`: yields one-line messages, each naming the key and what would work
Check = Callable[[DictConfig], Iterable[str]]


def _check_platform(cfg: DictConfig) -> Iterator[str]:
    """The platform group's rollout and device, as the launcher prepares for them."""
    rm = settings_of(cfg)
    name, device = cfg.actor_rollout_ref.rollout.name, OmegaConf.select(cfg, "trainer.device", default=None)
    rollout = {"cpu": "hf_cpu", "vllm_cpu": "vllm"}.get(rm.platform)
    if rollout and name != rollout:
        other = {"hf_cpu": "cpu", "vllm": "vllm_cpu"}.get(name)
        hint = f"use grpo/platform={other}" if other else f"use actor_rollout_ref.rollout.name={rollout}"
        yield f"actor_rollout_ref.rollout.name={name} on the {rm.platform} platform, whose rollout is {rollout}: {hint}"
    if rm.cpu and device != "cpu":
        yield f"trainer.device={device} on the {rm.platform} platform: choose the platform with grpo/platform=NAME"
    if rm.platform == "gpu" and (name == "hf_cpu" or device == "cpu"):
        what = "actor_rollout_ref.rollout.name=hf_cpu" if name == "hf_cpu" else "trainer.device=cpu"
        yield f"{what} needs the CPU plugin: use grpo/platform=cpu"


def _check_mask_is_kept(cfg: DictConfig) -> Iterator[str]:
    """What would bypass, split or mismatch the recall mask of the actor and the reference."""
    arr = cfg.actor_rollout_ref
    for role in ("actor_rollout_ref.model", "critic.model"):
        if OmegaConf.select(cfg, f"{role}.use_fused_kernels", default=False):
            yield f"{role}.use_fused_kernels=true bypasses the logits, so the recall mask would not apply"
    for role in ("actor", "ref"):
        # the deprecated top-level key (copied into fsdp_config by verl) and the one the engine reads
        for key in (
            f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size",
            f"actor_rollout_ref.{role}.fsdp_config.ulysses_sequence_parallel_size",
        ):
            sp = OmegaConf.select(cfg, key, default=1) or 1
            if int(sp) != 1:
                yield (
                    f"{key}={sp}: a sequence split across ranks loses the searchable context of its recall spans "
                    "(verbatim tokens would get ~-1e4 log-probs); use 1"
                )
        strategy = OmegaConf.select(cfg, f"actor_rollout_ref.{role}.strategy", default=None)
        if strategy not in MASKED_STRATEGIES:
            yield (
                f"actor_rollout_ref.{role}.strategy={strategy}: only {' / '.join(MASKED_STRATEGIES)} build the "
                "Hugging Face model that applies the recall mask"
            )
    if arr.model.get("use_remove_padding", False):
        attn = OmegaConf.select(cfg, "actor_rollout_ref.model.override_config.attn_implementation", default=None)
        attn = attn or VERL_DEFAULT_ATTENTION
        if attn not in FLASH_VARLEN_ATTENTION:
            yield (
                f"actor_rollout_ref.model.use_remove_padding=true with attn_implementation={attn}: packed sequences "
                f"would attend to each other; use flash attention ({', '.join(FLASH_VARLEN_ATTENTION[:2])}) or "
                "use_remove_padding=false"
            )
    mode = arr.rollout.get("logprobs_mode", "processed_logprobs")
    if mode != "processed_logprobs":
        yield (
            f"actor_rollout_ref.rollout.logprobs_mode={mode}: the rollout's log-probs must be the processed ones "
            "(after the recall mask), as the masked actor computes them; use processed_logprobs"
        )


def _check_rollout(cfg: DictConfig) -> Iterator[str]:
    arr = cfg.actor_rollout_ref
    if settings_of(cfg).recall_constrained and arr.rollout.name not in RECALL_ROLLOUTS:
        yield (
            f"rollout {arr.rollout.name!r} has no recall logits processor (use one of {', '.join(RECALL_ROLLOUTS)}, "
            "or recallm.recall_constrained=false for the unconstrained ablation)"
        )
    n = int(arr.rollout.n)
    if n < 2:
        yield f"GRPO needs at least 2 rollouts per prompt (actor_rollout_ref.rollout.n={n})"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _near(value: int, allowed: list[int]) -> int:
    """The largest allowed value not above ``value`` (a batch no larger than the one asked for), else the
    smallest allowed."""
    below = [a for a in allowed if a <= value]
    return max(below) if below else min(allowed, default=1)


def _check_batches(cfg: DictConfig) -> Iterator[str]:
    """Batch sizes that divide: into mini batches, micro batches, devices (verl asserts some of these
    inside a Ray worker). Each problem names its key and a value that divides."""
    arr = cfg.actor_rollout_ref
    n = int(arr.rollout.n)
    train_batch, mini = int(cfg.data.train_batch_size), int(arr.actor.ppo_mini_batch_size)
    if not (mini >= 1 and train_batch % mini == 0):
        yield (
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} must divide data.train_batch_size={train_batch}: "
            f"use actor_rollout_ref.actor.ppo_mini_batch_size={_near(mini, _divisors(train_batch))}"
        )
    gpus = int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)
    micro = arr.actor.get("ppo_micro_batch_size_per_gpu")
    if micro and not arr.actor.get("use_dynamic_bsz", False) and (mini * n) % (int(micro) * gpus) != 0:
        per_device = mini * n // gpus if (mini * n) % gpus == 0 else 0
        fix = (
            f"use actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={_near(int(micro), _divisors(per_device))}"
            if per_device
            else "change ppo_mini_batch_size or rollout.n"
        )
        yield (
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}: a mini batch of ppo_mini_batch_size x "
            f"rollout.n = {mini * n} responses on {gpus} device(s) does not split into micro batches of {micro}; {fix}"
        )
    if (train_batch * n) % gpus != 0:
        yield (
            f"data.train_batch_size={train_batch} x actor_rollout_ref.rollout.n={n} = {train_batch * n} responses per "
            f"step do not divide over trainer.n_gpus_per_node x trainer.nnodes = {gpus} device(s)"
        )
        return
    per_device = train_batch * n // max(gpus, 1)
    for role in ("rollout", "ref"):  # verl's compute_log_prob asserts it, inside a Ray worker
        lp_micro = arr[role].get("log_prob_micro_batch_size_per_gpu")
        if lp_micro and not arr[role].get("log_prob_use_dynamic_bsz", False) and per_device % int(lp_micro) != 0:
            yield (
                f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu={lp_micro}: {per_device} responses per "
                f"device (data.train_batch_size x rollout.n / devices) do not split into micro batches of {lp_micro}; "
                f"use actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu="
                f"{_near(int(lp_micro), _divisors(per_device))}"
            )


def _check_data_lengths(cfg: DictConfig) -> Iterator[str]:
    """Token caps left null that could not be derived from the data (:func:`data_lengths`): what to set."""
    folder = _data_dir(cfg)
    where = f"{folder}/summary.json" if folder else "the data's summary.json (one data.train_files)"
    for key, what in (("max_prompt_length", "the longest training prompt"), ("max_response_length", "the longest SFT trace")):
        if cfg.data.get(key) is None:
            yield (
                f"data.{key} is null and {where} does not give {what}: set data.{key}=<tokens> (or run recallm-data "
                "again: it writes the lengths into the summary)"
            )


def length_warnings(cfg: DictConfig) -> Iterator[str]:
    """The token caps against the data's own lengths (``data_gen.generate.data_lengths`` of the training
    file's directory), said before the run: prompts longer than ``data.max_prompt_length`` are dropped
    (verl's ``filter_overlong_prompts``); SFT traces longer than ``data.max_response_length`` less the overlong
    buffer are responses the model was taught to write that would be penalised or cut. Warnings, not
    refusals: a short cap is how a CPU smoke run stays short; each names the value that fits the data."""
    folder = _data_dir(cfg)
    found = data_lengths_of(folder) if folder else {}
    prompt, response = cfg.data.get("max_prompt_length"), cfg.data.get("max_response_length")
    where = f"{folder}/summary.json"
    if prompt is not None and "prompt_max" in found and found["prompt_max"] > int(prompt):
        yield (
            f"data.max_prompt_length={prompt} is shorter than the longest training prompt ({found['prompt_max']} "
            f"tokens, {where}): longer prompts are dropped; data.max_prompt_length={_round_up(found['prompt_max'])} "
            "keeps them all"
        )
    buffer = _overlong_buffer(cfg)
    if response is not None and "completion_max" in found and found["completion_max"] > int(response) - buffer:
        room = int(response) - buffer
        most = "most of " if found.get("completion_median", 0) > room else "some of "
        penalty = f" less the overlong buffer {buffer} (recallm.reward.overlong.buffer)" if buffer else ""
        yield (
            f"data.max_response_length={response}{penalty} leaves {room} tokens: {most}the SFT traces are longer "
            f"(median {found.get('completion_median', '?')}, longest {found['completion_max']} tokens, {where}), so the "
            f"responses the model was taught to write are {'penalised or ' if buffer else ''}cut; "
            f"data.max_response_length={_round_up(found['completion_max'] + buffer)} fits them"
        )


def _check_lengths(cfg: DictConfig) -> Iterator[str]:
    """Context length of the rollout engine and the dynamic-batching token caps vs the longest sequence."""
    arr = cfg.actor_rollout_ref
    if cfg.data.get("max_prompt_length") is None or cfg.data.get("max_response_length") is None:
        return  # _check_data_lengths names it
    longest = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    max_model_len = arr.rollout.get("max_model_len")
    if max_model_len is not None and int(max_model_len) < longest:
        yield (
            f"actor_rollout_ref.rollout.max_model_len={max_model_len} is shorter than data.max_prompt_length + "
            f"data.max_response_length = {longest}"
        )
    caps = []
    if arr.actor.get("use_dynamic_bsz", False):
        caps.append("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    for role in ("ref", "rollout"):
        if arr[role].get("log_prob_use_dynamic_bsz", False):
            caps.append(f"actor_rollout_ref.{role}.log_prob_max_token_len_per_gpu")
    for key in caps:
        cap = int(OmegaConf.select(cfg, key))
        if cap < longest:
            yield (
                f"{key}={cap} is below the longest sequence (data.max_prompt_length + data.max_response_length = "
                f"{longest}): one sequence would not fit in a micro batch"
            )


def _check_reward(cfg: DictConfig) -> Iterator[str]:
    """The reward table, and DAPO's overlong shaping against the generation cap: the penalty ends at
    ``data.max_response_length`` and starts ``recallm.reward.overlong.buffer`` tokens before it."""
    rm = settings_of(cfg)
    if not rm.reward_manager:
        return
    overlong = rm.reward.get("overlong") or {}
    if cfg.data.get("max_response_length") is None:
        return  # _check_data_lengths names it
    cap = int(cfg.data.max_response_length)
    end, buffer = overlong.get("max_response_length"), overlong.get("buffer")
    if end != cap:
        yield (
            f"recallm.reward.overlong.max_response_length={end}: in a GRPO run the overlong penalty ends at the "
            f"generation cap, data.max_response_length={cap}; set that (the penalty starts "
            "recallm.reward.overlong.buffer tokens before it)"
        )
        return
    if overlong.get("enable") and isinstance(buffer, int) and not 1 <= buffer <= cap:
        why = (
            f"the overlong penalty would start at the generation cap data.max_response_length={cap}, which no "
            "response passes"
            if buffer < 1
            else f"longer than the generation cap data.max_response_length={cap}"
        )
        yield f"recallm.reward.overlong.buffer={buffer}: {why}; use 1 to {cap}, or recallm.reward.overlong.enable=false"
        return
    from rewards import load_reward_config

    try:
        load_reward_config(rm.reward)
    except RecallmError as exc:
        yield f"recallm.{exc}" if str(exc).startswith("reward") else f"recallm.reward: {exc}"


def _check_eval_step(cfg: DictConfig) -> Iterator[str]:
    """``recallm.eval_step``: the checkpoint the paper evaluates must be saved and kept."""
    step = settings_of(cfg).eval_step
    if step is None:
        return
    t = cfg.trainer
    step, total, freq = int(step), int(t.total_training_steps or 0), int(t.save_freq)
    if not 0 < step <= total:
        yield f"recallm.eval_step={step} must be within trainer.total_training_steps={total}"
        return
    if not (freq > 0 and (step % freq == 0 or step == total)):
        yield f"recallm.eval_step={step} is not saved with trainer.save_freq={freq}"
        return
    keep = t.get("max_actor_ckpt_to_keep")
    if keep is not None:
        later = (total // freq) - (step // freq)  # checkpoints saved after it
        if int(keep) <= later:
            yield (
                f"trainer.max_actor_ckpt_to_keep={keep} would delete the step-{step} checkpoint (recallm.eval_step) "
                f"before step {total}; use null or more than {later}"
            )


def _check_checkpoints(cfg: DictConfig) -> Iterator[str]:
    """On GPUs, checkpoints go outside the source checkout (a paper-scale save is ~100 GB), and the
    retention keeps the newest saves resumable."""
    rm = settings_of(cfg)
    if rm.platform == "gpu":
        from recallm.paths import CONFIG_DIR

        checkout = CONFIG_DIR.parent.resolve()
        where = Path(str(cfg.trainer.default_local_dir)).expanduser().resolve()
        if (checkout / "pyproject.toml").is_file() and where.is_relative_to(checkout):
            yield (
                f"trainer.default_local_dir={where} is inside the source checkout {checkout}: a paper-scale "
                "checkpoint is ~100 GB; set it to your run directory outside it (e.g. /scratch/$USER/grpo-qwen)"
            )
    keep = cfg.trainer.get("max_actor_ckpt_to_keep")
    if rm.keep_checkpoints and keep is not None:
        yield (
            f"trainer.max_actor_ckpt_to_keep={keep} with recallm.keep_checkpoints={rm.keep_checkpoints}: choose one "
            "(recallm.keep_checkpoints also holds across requeues and keeps recallm.eval_step)"
        )


def _check_data(cfg: DictConfig) -> Iterator[str]:
    """The data files exist, and the reward can score every row's ground truth (``recallm.check_data``)."""
    rm = settings_of(cfg)
    files = []
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(cfg, key, default=None)
        files += [value] if isinstance(value, str) else list(value or [])
    files = list(dict.fromkeys(str(file) for file in files))  # train and val may name the same file
    missing = [file for file in files if not Path(file).is_file()]
    for file in missing:
        yield f"data file {file} does not exist; generate it with `recallm-data`"
    if missing or not (rm.reward_manager and rm.check_data):
        return
    from data_gen.io import read_records
    from rewards import check_rows, load_reward_config

    try:
        reward = load_reward_config(rm.reward)
    except RecallmError:
        return  # _check_reward says why
    for file in files:
        try:
            check_rows(read_records(file), reward)
        except RecallmError as exc:
            yield f"{file}: {exc}"


#: the checks of :func:`problems`, in order
CHECKS: tuple[Check, ...] = (
    _check_platform,
    _check_mask_is_kept,
    _check_rollout,
    _check_batches,
    _check_lengths,
    _check_data_lengths,
    _check_reward,
    _check_eval_step,
    _check_checkpoints,
    _check_data,
    *algorithms.CHECKS,
)


def problems(cfg: DictConfig, checks: Iterable[Check] = CHECKS) -> list[str]:
    """Every problem RecaLLM's checks find in a prepared config, each one line naming its key (empty: none)."""
    import functools

    from recallm.errors import collect

    return collect(*(functools.partial(check, cfg) for check in checks))


def validate(cfg: DictConfig) -> None:
    """RecaLLM's checks (:data:`CHECKS`), then verl's ``validate_config`` — all before Ray starts.

    Raises ``recallm.errors.Problems`` (every problem found, one line each; the CLI prints them all) for: a platform whose rollout or device
    was changed; fused kernels; Ulysses sequence parallelism (any of the four keys, actor and
    reference); a training backend other than FSDP/FSDP2; packed sequences without flash attention;
    rollout log-probs other than the processed ones; a rollout without the recall processor; fewer
    than 2 rollouts; batch sizes that do not divide; a rollout context or dynamic-batching token cap
    below the longest sequence; a reward table that does not read, or an overlong penalty that ends
    elsewhere than the generation cap or cannot be reached; an evaluated checkpoint
    (``recallm.eval_step``) that would not be saved or kept; missing data files and rows the reward
    cannot score; and whatever verl's own ``validate_config`` rejects.
    """
    from recallm.errors import raise_problems

    raise_problems(problems(cfg))
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except (AssertionError, ValueError) as exc:
        raise RecallmError(
            f"verl rejects the config: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc


# ---------------------------------------------------------------------------------------------- run
def describe(cfg: DictConfig) -> str:
    t = cfg.trainer
    rm = settings_of(cfg)
    lines = [
        f"model:        {cfg.actor_rollout_ref.model.path}",
        f"rollout:      {cfg.actor_rollout_ref.rollout.name} on the {rm.platform} platform "
        f"(n={cfg.actor_rollout_ref.rollout.n}, recall processor {'on' if rm.recall_constrained else 'OFF'})",
        f"algorithm:    {algorithms.describe(cfg)}",
        f"checkpoints:  {t.default_local_dir} (every {t.save_freq} steps, resume_mode={t.resume_mode}, "
        + (f"the newest {rm.keep_checkpoints} kept" if rm.keep_checkpoints else "every save kept")
        + ")",
        f"rollouts:     {t.get('rollout_data_dir') or '(not saved: trainer.rollout_data_dir=<dir> to dump them)'}",
        f"logs:         {', '.join(t.logger) if not isinstance(t.logger, str) else t.logger} "
        f"(project {t.project_name}, run {t.experiment_name})"
        + (f"; {_wandb_line(cfg)}" if "wandb" in _loggers(cfg) else ""),
        f"steps:        {t.get('total_training_steps') or 'one pass over the data'}"
        + (
            f" (the checkpoint to evaluate: global_step_{rm.eval_step}; export it with"
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
    resume_point(cfg)
    from recallm.grpo.health import check_resume, stopped_unhealthy

    check_resume(cfg)
    from recallm.grpo.console import console_to_log
    from recallm.grpo.preemption import stop_file, stop_on_signals, stopped_by

    with stop_on_signals(stop_file(cfg.trainer.default_local_dir)) as received:
        try:
            with console_to_log(cfg, mode=settings_of(cfg).console):
                launch(cfg, env)
        except Exception as exc:
            if (code := stopped_unhealthy(exc)) is not None:
                return code
            stopped = stopped_by(exc)
            if stopped is None or not received:
                raise
            name = signal.Signals(received["signal"]).name
            print(
                f"stopped by {name} after step {stopped.step}: checkpoint "
                f"{Path(str(cfg.trainer.default_local_dir)) / f'global_step_{stopped.step}'} saved; run the same "
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
    from verl.utils.device import auto_set_device

    auto_set_device(cfg)
    run_ppo(cfg, task_runner_class=algorithms.off_policy.task_runner(cfg))
