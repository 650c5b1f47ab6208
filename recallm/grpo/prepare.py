"""Step 2 of the GRPO launch (``recallm.grpo.app``), **prepare** (:func:`prepare`): :data:`PREPARE_STEPS`, small
functions of the config that fill in what RecaLLM needs: paths made absolute (Ray workers on other nodes do not
share the launcher's working directory); the model checked and ``external_lib=recallm.modeling`` (actor and
reference load the masked model classes); the reward manager (``rewards.verl_adapter.RecallRewardManager`` with
the reward table); the recall constraint (:func:`recall_constraint`: the one place verl's keys are derived from
``recallm.recall_constrained``); a vLLM rollout's ``hf_overrides`` (vLLM serves the base architecture) and
context length; the platform's environment (the CPU plugin's, vLLM's CPU build's); the node resources
``ray.init`` refuses when it joins a running cluster (``RAY_ADDRESS``: the sbatch scripts start Ray themselves);
the modules every verl process imports; the environment every Ray worker must carry (W&B mode, NCCL/Gloo
interfaces, the job's expiration timestamp). A recipe adds its own steps (``recallm.rlm.train``: the data set
and the agent loop); a new feature of GRPO adds one function to :data:`PREPARE_STEPS`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from recallm.errors import RecallmError
from recallm.grpo import algorithms
from recallm.grpo.settings import settings_of

__all__ = [
    "Prepared",
    "Step",
    "PREPARE_STEPS",
    "prepare",
    "recall_constraint",
    "metrics_log_path",
    "WORKER_HOOKS",
    "HF_OVERRIDES_ENV",
    "FORWARDED_ENV",
    "VLLM_PROCESSOR",
]

log = logging.getLogger(__name__)
#: the module every verl process of a run imports (``VERL_USE_EXTERNAL_MODULES``): RecaLLM's hooks into verl
WORKER_HOOKS = "recallm.grpo.worker_hooks"
MODEL_LIB = "recallm.modeling"  # actor_rollout_ref.model.external_lib: importing it registers the masked classes
#: the recall processor verl's vLLM rollout loads: the V1 interface's name, as verl 0.9.1 runs only with vLLM 0.24
#: (the one tested pair for GRPO, ``recallm.engines``; vLLM 0.24 has no other interface)
VLLM_PROCESSOR = "recallm.recall.vllm:RecallLogitsProcessorV1"

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
    "ATEN_CPU_CAPABILITY",  # the CPU kernels a run pins (the toy demo's experiment.env): the same in every worker
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
)
_PATH_KEYS = (
    "actor_rollout_ref.model.path",
    "data.train_files",
    "data.val_files",
    "trainer.default_local_dir",
    "trainer.rollout_data_dir",
    "trainer.validation_data_dir",
)


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
    ``trainable_token_indices``, and the rows need no further training (docs/guide/one-gpu.md)."""
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


def worker_hooks(cfg: DictConfig, run: Prepared) -> None:
    """``recallm.grpo.worker_hooks`` in every verl process (the masked classes, the platform's patches, the
    recall metrics); verl's JSONL metrics log next to the checkpoints (``recallm.eval.curves`` reads it)."""
    run.add_module(WORKER_HOOKS)
    metrics_log = metrics_log_path(cfg)
    if metrics_log is not None:  # verl's JSONL logger writes next to the checkpoints (recallm.eval.curves reads it)
        run.env["VERL_FILE_LOGGER_PATH"] = str(metrics_log)


def operations(cfg: DictConfig, run: Prepared) -> None:
    """What keeps a long run alive: the process group's timeout (``actor_rollout_ref.nccl_timeout``, which
    verl 0.9.1's engine workers do not pass on: ``recallm.grpo.worker_hooks``), the save-and-stop on SIGTERM or
    SIGUSR1 (``recallm.grpo.preemption``), the checkpoint retention (``recallm.keep_checkpoints``,
    ``recallm.eval_step``: ``recallm.grpo.retention``), and W&B offline unless credentials are configured
    (``recallm.tracking``)."""
    from recallm.grpo.preemption import STOP_ENV, stop_file
    from recallm.grpo.retention import EVAL_STEP_ENV, KEEP_ENV
    from recallm.grpo.worker_hooks import TIMEOUT_ENV

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
    worker_hooks,
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
    from recallm.paths import METRICS_FILE

    return Path(str(cfg.trainer.default_local_dir)).resolve() / METRICS_FILE
