"""``recallm-rlm train``: GRPO of the RLM root on verl 0.9.1, through its multi-turn agent loop.

The config (``configs/rlm_train.yaml``) composes verl's own ``ppo_trainer`` config, the
``recallm.rlm`` section (the RLM's settings, its sub-model, the task data) and a recipe from
``configs/rlm_train/`` (``tiny_cpu``: two steps of the tiny model on a CPU; ``mrcr_qwen3_4b``:
the paper's RL run). Any verl key can be overridden on the command line. The launcher:

1. writes the data set, unless ``data.train_files`` is given: ``recallm.rlm.data.train`` /
   ``.val`` task sets (``recallm.rlm.tasks``; the paper's: MRCR-style, 2 needles at 32K-64K
   tokens to train, 8 needles at 512K-1M to evaluate) as parquet rows whose ``prompt`` is the
   root's first messages (what verl's prompt-length filter measures), ``agent_name`` ``rlm``,
   and ``extra_info.rlm`` the task (context and reference as JSON); it checks that every prompt
   fits ``data.max_prompt_length``;
2. registers our agent loop through verl's extension point: a file listing
   ``recallm.rlm.agent_loop.RLMAgentLoop`` as ``rlm`` (``actor_rollout_ref.rollout.agent.
   agent_loop_config_path``), the default agent loop;
3. wires the rest through the one GRPO launch (``recallm.grpo.app.run``, with the steps of
   :data:`PREPARE_STEPS` around grpo's): a RecaLLM model gets the masked model classes and the
   rollout's recall processor (``recallm.recall_constrained``), a plain one runs without; the
   platform is the recipe's (``grpo/platform=cpu``: the CPU plugin and its ``hf_cpu`` rollout;
   ``vllm_cpu``: verl's vLLM rollout on vLLM's CPU build); no reward manager (the agent loop sets each
   rollout's reward, the task's score); ``recallm.rlm.worker_hooks`` adds the metrics of the masking
   (``rlm/...``);
4. checks the config (grpo's checks: platform, mask, batch sizes, lengths, files; verl's
   ``validate_config``) and runs verl's trainer. Checkpoints and resume are verl's
   (``trainer.save_freq``, ``trainer.resume_mode=auto``).

The command line is composed once, by ``recallm.cli.rlm`` (``recallm.grpo.app.compose`` with
``config_name="rlm_train"`` is the same call for code and tests).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from recallm.errors import RecallmError
from recallm.grpo.app import PREPARE_STEPS as GRPO_STEPS
from recallm.grpo.app import Prepared
from recallm.io import atomic_path
from recallm.rlm.budget import BudgetLimits
from recallm.rlm.runner import RLMSettings
from recallm.rlm.sandbox import SandboxLimits
from recallm.rlm.subcalls import SubCallSettings

__all__ = [
    "RLMTrainSettings",
    "prepare_data",
    "prepare",
    "PREPARE_STEPS",
    "main",
    "WORKER_HOOKS",
    "trajectory_tokens",
    "train_settings",
]


def _policy_sub() -> dict[str, Any]:
    return {"name": "policy", "temperature": None, "top_p": None, "top_k": None}


@dataclass(frozen=True)
class RLMTrainSettings:
    """The schema of ``recallm.rlm`` in ``configs/rlm_train.yaml`` (registered with Hydra, read with
    ``recallm.config.typed``): what the launcher and the agent loop (``recallm.rlm.agent_loop``) read."""

    out_dir: str
    """the data set and the agent-loop registry (the YAML interpolates the experiment's name)"""
    trajectory_dir: str | None = None
    """a directory: every rollout's RLM trajectory (``recallm-rlm show`` reads them)"""
    sub: dict[str, Any] = field(default_factory=_policy_sub)
    """the sub-model: ``policy`` (the model being trained, through the rollout server; its tokens are
    never trained; temperature/top_p/top_k null: the server's sampling defaults) or a ``recallm-rlm``
    model section (``recallm.rlm.models.make_model``: openai, hf, ...)"""
    rlm: RLMSettings = field(default_factory=RLMSettings)
    subcalls: SubCallSettings = field(default_factory=SubCallSettings)
    """per rollout"""
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)
    budget: BudgetLimits = field(default_factory=BudgetLimits)
    """per rollout"""
    data: dict[str, Any] = field(default_factory=dict)
    """``train``/``val``: task sets (``recallm.rlm.tasks.TaskSet``) written to ``<out_dir>/data`` unless
    ``data.train_files`` is set"""


def train_settings(section: Any) -> RLMTrainSettings:
    """The ``recallm.rlm`` section (a mapping or config node), checked."""
    from recallm.config import typed

    if OmegaConf.is_config(section):
        section = OmegaConf.to_container(section, resolve=True)
    return typed(RLMTrainSettings, section, "recallm.rlm")


log = logging.getLogger(__name__)
#: the RLM's hooks into verl, imported by every verl process of the run (after grpo's)
WORKER_HOOKS = "recallm.rlm.worker_hooks"
#: the file verl's ``agent_loop_config_path`` reads (``recallm.rlm.agent_loop``)
AGENT_LOOPS = [{"name": "rlm", "_target_": "recallm.rlm.agent_loop.RLMAgentLoop"}]


def _set(cfg: DictConfig, key: str, value: Any) -> None:
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, force_add=True)


@dataclass(frozen=True)
class _Roots:
    """The RLM's settings as ``initial_messages`` reads them."""

    settings: RLMSettings
    subcall_settings: SubCallSettings
    sandbox_limits: SandboxLimits


def _rows(spec: dict[str, Any], where: str, rlm, tokenizer, max_prompt: int) -> list[dict[str, Any]]:
    from recallm.config import typed
    from recallm.rlm.runner import initial_messages
    from recallm.rlm.tasks import TaskSet, make_task

    task_set = typed(TaskSet, spec, where)
    rows = []
    for index, (task, length, i) in enumerate(task_set.specs()):
        example = make_task(task, length, i, **task_set.task_kwargs())
        messages = initial_messages(rlm, example.context, example.query)
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        n = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if n > max_prompt:
            raise RecallmError(
                f"{where}: the root's first prompt has {n} tokens, more than data.max_prompt_length={max_prompt} "
                "(the context stays in the REPL; the prompt is the system prompt and the context's metadata)"
            )
        reference = json.dumps(example.reference)
        rows.append(
            {
                "data_source": f"rlm/{task}",
                "prompt": messages,
                "agent_name": "rlm",
                "reward_model": {"style": "rule", "ground_truth": reference},
                "extra_info": {
                    "index": index,
                    "rlm": {
                        "task": task,
                        "task_id": example.task_id,
                        "query": example.query,
                        "context_json": json.dumps(example.context, ensure_ascii=False),
                        "reference_json": reference,
                    },
                },
            }
        )
    return rows


def prepare_data(cfg: DictConfig, tokenizer=None) -> dict[str, str]:
    """Write the train/val parquet files of ``recallm.rlm.data`` into ``recallm.rlm.out_dir``
    (unless ``data.train_files`` is set) and point ``data.*_files`` at them; returns the paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    section = train_settings(cfg.recallm.rlm)  # checked, also when the data set is given
    if OmegaConf.select(cfg, "data.train_files", default=None):
        return {}
    if tokenizer is None:
        from recallm.tokens import load_tokenizer

        tokenizer = load_tokenizer(Path(str(cfg.actor_rollout_ref.model.path)))
    out = Path(section.out_dir) / "data"
    out.mkdir(parents=True, exist_ok=True)
    rlm = _Roots(section.rlm, section.subcalls, section.sandbox)
    paths = {}
    for split in ("train", "val"):
        spec = section.data.get(split)  # a task set, or null / absent: none
        if not spec:
            continue
        rows = _rows(dict(spec), f"recallm.rlm.data.{split}", rlm, tokenizer, int(cfg.data.max_prompt_length))
        path = out / f"{split}.parquet"
        with atomic_path(path) as tmp:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
        paths[split] = str(path.resolve())
    if "train" not in paths:
        raise RecallmError("recallm.rlm.data.train is empty and data.train_files is not set: no training data")
    _set(cfg, "data.train_files", paths["train"])
    _set(cfg, "data.val_files", paths.get("val", paths["train"]))
    return paths


def write_data(cfg: DictConfig, run: Prepared) -> None:
    """Step 1 of the launch (module doc): the data set (:func:`prepare_data`)."""
    prepare_data(cfg)


def agent_loop(cfg: DictConfig, run: Prepared) -> None:
    """Our agent loop registered with verl (the default agent loop); no reward manager (the agent loop sets
    each rollout's reward); the trajectory directory absolute."""
    section = cfg.recallm.rlm
    out_dir = Path(str(section.out_dir)).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    registry = out_dir / "agent_loops.yaml"
    registry.write_text(OmegaConf.to_yaml(OmegaConf.create(AGENT_LOOPS)))
    _set(cfg, "actor_rollout_ref.rollout.agent.agent_loop_config_path", str(registry))
    _set(cfg, "actor_rollout_ref.rollout.agent.default_agent_loop", "rlm")
    if section.trajectory_dir:
        _set(cfg, "recallm.rlm.trajectory_dir", str(Path(str(section.trajectory_dir)).resolve()))
    model_path = Path(str(cfg.actor_rollout_ref.model.path))
    if not (model_path / "config.json").is_file():
        raise RecallmError(f"actor_rollout_ref.model.path={model_path} is not a model directory (no config.json)")
    _set(cfg, "recallm.reward_manager", False)  # the agent loop sets each rollout's reward


def rlm_worker_hooks(cfg: DictConfig, run: Prepared) -> None:
    """``recallm.rlm.worker_hooks`` in every verl process (the metrics of the masking); a warning when the
    longest trajectory would not fit ``data.max_response_length``."""
    run.add_module(WORKER_HOOKS)
    section = cfg.recallm.rlm
    needed = trajectory_tokens(section.rlm)
    if needed > int(cfg.data.max_response_length):
        log.warning(
            "a longest trajectory (%d root turns of <= %s tokens and their observations) needs about %d response "
            "tokens, more than data.max_response_length=%d: such rollouts are cut short",
            int(section.rlm.max_iterations) + 1, section.rlm.root_max_new_tokens, needed,
            int(cfg.data.max_response_length),
        )  # fmt: skip


#: the RLM's prepare steps (module doc, steps 2-3): the agent loop, every step of grpo's launch (a plain
#: model is accepted, with ``recallm.recall_constrained=false``), the RLM's metrics
PREPARE_STEPS = (agent_loop, *GRPO_STEPS, rlm_worker_hooks)


def prepare(cfg: DictConfig) -> dict[str, str]:
    """Fill in the wiring (module doc, steps 2-3; the data set is :func:`prepare_data`'s); returns the
    environment the run needs."""
    from recallm.grpo.app import prepare as grpo_prepare

    return grpo_prepare(cfg, PREPARE_STEPS, plain_models=True)


#: characters per token assumed for REPL output when bounding a trajectory (code output - numbers, ids,
#: JSON - tokenizes denser than prose, at about 3 characters per token for Qwen-style BPE tokenizers)
OBSERVATION_CHARS_PER_TOKEN = 3.0
#: tokens of one observation besides the blocks' output: the chat template's turn markers, the
#: ``[block i output]`` headers, the per-turn reminder that repeats the query and a nudge
OBSERVATION_OVERHEAD_TOKENS = 256


def trajectory_tokens(
    rlm: Any,
    *,
    chars_per_token: float = OBSERVATION_CHARS_PER_TOKEN,
    overhead_tokens: int = OBSERVATION_OVERHEAD_TOKENS,
) -> int:
    """The response tokens of a longest root trajectory of one output block per turn:
    ``max_iterations`` turns plus the one last call for the answer, each of at most
    ``root_max_new_tokens``, and ``max_iterations`` observations of at most
    ``max_observation_chars`` characters (at ``chars_per_token``) plus ``overhead_tokens``.
    ``rlm`` is the ``recallm.rlm.rlm`` section. A recipe whose ``data.max_response_length`` is below
    this ends its longest trajectories early (the agent loop stops a rollout whose response length
    is spent); a turn with several blocks can still pass it."""
    import math

    from recallm.rlm.runner import RLMSettings

    settings = RLMSettings.from_mapping(
        OmegaConf.to_container(rlm, resolve=True) if isinstance(rlm, DictConfig) else rlm, "recallm.rlm.rlm"
    )
    if settings.root_max_new_tokens is None:
        raise RecallmError("recallm.rlm.rlm.root_max_new_tokens must be set to bound a training trajectory")
    turns = settings.max_iterations + 1
    observation = math.ceil(settings.max_observation_chars / chars_per_token) + overhead_tokens
    return turns * settings.root_max_new_tokens + settings.max_iterations * observation


def describe(cfg: DictConfig) -> str:
    t, r = cfg.trainer, cfg.recallm.rlm
    arr = cfg.actor_rollout_ref
    return "\n".join(
        [
            f"model:        {arr.model.path}",
            f"rollout:      {arr.rollout.name} (n={arr.rollout.n}), agent loop rlm: {r.rlm.max_iterations} turns of "
            f"<= {r.rlm.root_max_new_tokens} tokens, response <= {cfg.data.max_response_length} tokens, "
            f"sub-model {r.sub.name}, depth {r.rlm.max_depth}",
            f"data:         {cfg.data.train_files} (val {cfg.data.val_files})",
            f"checkpoints:  {t.default_local_dir} (every {t.save_freq} steps, resume_mode={t.resume_mode})",
            f"steps:        {t.get('total_training_steps') or 'one pass over the data'}",
        ]
    )


def main(cfg: DictConfig, print_config: bool = False) -> int:
    """``recallm-rlm train [--print-config] key=value ...`` on its composed config (module doc; the command
    line is read and composed by ``recallm.cli.rlm``): grpo's one launch with the RLM's steps."""
    from recallm.grpo.app import run

    return run(cfg, print_config=print_config, steps=(write_data, *PREPARE_STEPS), plain_models=True, describe=describe)
