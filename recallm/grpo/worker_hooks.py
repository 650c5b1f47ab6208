"""RecaLLM's hooks into verl's processes: imported by every verl process of a RecaLLM run
(``VERL_USE_EXTERNAL_MODULES``, set by the launch: ``recallm.grpo.prepare.WORKER_HOOKS``).

* registers the masked model classes (``import recallm.modeling``), so actor and reference load
  ``recallm_<base>`` checkpoints as the classes that apply the recall mask;
* activates the CPU plugin (``recallm.grpo.cpu``) when ``RECALLM_GRPO_CPU=1``;
* with ``RECALLM_VLLM_CPU=1``, lets verl's vLLM rollout run on vLLM's CPU build
  (``recallm.grpo.vllm_cpu``);
* merges the vLLM rollout's ``hf_overrides`` (``RECALLM_VLLM_HF_OVERRIDES``) into the ones verl
  builds itself (``recallm.grpo.vllm_rollout``);
* adds the RecaLLM metrics to the ones verl computes every step. verl 0.9.1 has no hook for
  extra training metrics: its trainer calls ``verl.trainer.ppo.metric_utils.compute_data_metrics``
  on the finished batch of every step, so that function is wrapped (once, before the trainer
  module imports it) to also return ``recallm.grpo.metrics.recall_batch_metrics``. Nothing of
  verl's own output changes. The recall token ids come from ``RECALLM_RECALL_TOKEN_IDS``
  (``"<start>,<end>"``), set by ``recallm-grpo``;
* gives every ``recallm_<base>`` model type its base's continuous-token builder family in verl's
  agent loop (``verl.utils.tokenizer.continuous_token_wiring``: an exact ``model_type`` lookup, so a
  RecaLLM Qwen2 would get the generic builder — and a warning per rollout — instead of Qwen's);
* makes verl's JSONL ``file`` logger append instead of truncate: verl 0.9.1's ``FileLogger``
  opens its file with ``"wb"``, so a resumed run would erase the metrics of the steps before its
  checkpoint. Its ``__init__`` is replaced by one that opens the same path with ``"ab"``; readers
  (``recallm.eval.curves``) keep the last record of a step logged twice;
* gives the training workers' process group the timeout of ``actor_rollout_ref.nccl_timeout``
  (``RECALLM_COLLECTIVE_TIMEOUT``, seconds): verl 0.9.1's engine workers call
  ``initialize_global_process_group_ray(timeout_second=None)``, so torch's default (10 minutes for
  NCCL) would bound the barrier every rank waits in while the slowest writes its checkpoint shard;
* checksums every checkpoint after verl saves it, then (with ``RECALLM_KEEP_CHECKPOINTS``) prunes
  the checkpoint directory (``recallm.grpo.checkpoints``, ``recallm.grpo.retention``);
* with ``RECALLM_STOP_FILE``, saves and stops once ``recallm-grpo`` was sent SIGTERM or SIGUSR1
  (``recallm.grpo.preemption``).
"""

from __future__ import annotations

import os
import sys

import recallm.modeling  # noqa: F401  (registers the recallm_<base> classes)

__all__ = [
    "install_metrics",
    "install_appending_file_logger",
    "install_token_builder_families",
    "install_collective_timeout",
    "recall_token_ids",
    "TIMEOUT_ENV",
]

TIMEOUT_ENV = "RECALLM_COLLECTIVE_TIMEOUT"


def recall_token_ids() -> tuple[int | None, int | None]:
    value = os.environ.get("RECALLM_RECALL_TOKEN_IDS", "")
    try:
        start, end = (int(x) for x in value.split(","))
    except ValueError:
        return None, None
    return start, end


def install_metrics() -> None:
    import verl.trainer.ppo.metric_utils as metric_utils

    original = metric_utils.compute_data_metrics
    if getattr(original, "_recallm", False):
        return

    def compute_data_metrics(batch, use_critic: bool = True):
        from recallm.grpo.metrics import recall_batch_metrics

        metrics = original(batch, use_critic=use_critic)
        metrics.update(recall_batch_metrics(batch, *recall_token_ids()))
        return metrics

    compute_data_metrics._recallm = True  # type: ignore[attr-defined]
    metric_utils.compute_data_metrics = compute_data_metrics
    trainer_module = sys.modules.get("verl.trainer.ppo.ray_trainer")
    if trainer_module is not None:  # imported before us: replace its copy of the name too
        trainer_module.compute_data_metrics = compute_data_metrics


def _append_file_logger(tracking) -> None:
    cls = getattr(tracking, "FileLogger", None)
    if cls is None or getattr(cls.__init__, "_recallm", False):
        return

    def __init__(self, project_name: str, experiment_name: str) -> None:
        # verl's own path rules (VERL_FILE_LOGGER_PATH, else <VERL_FILE_LOGGER_ROOT>/<project>/<experiment>.jsonl)
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.filepath = os.getenv("VERL_FILE_LOGGER_PATH", None)
        if self.filepath is None:
            root = os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", "."))
            self.filepath = os.path.join(root, project_name, f"{experiment_name}.jsonl")
        os.makedirs(os.path.dirname(os.path.abspath(self.filepath)), exist_ok=True)
        print(f"Appending file logger at {os.path.abspath(self.filepath)}")
        self.fp = open(self.filepath, "ab", buffering=0)  # noqa: SIM115 - closed by FileLogger.finish

    __init__._recallm = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _register_token_builder_families(wiring) -> None:
    from recallm.modeling import RECALL_CLASSES

    families = getattr(wiring, "_MODEL_TYPE_TO_FAMILY", None)
    if not isinstance(families, dict):
        return
    for base in RECALL_CLASSES:
        if base in families:
            families.setdefault(f"recallm_{base}", families[base])


def install_token_builder_families() -> None:
    from recallm.grpo.cpu.patches import after_import

    after_import("verl.utils.tokenizer.continuous_token_wiring", _register_token_builder_families)


def install_appending_file_logger() -> None:
    from recallm.grpo.cpu.patches import after_import

    after_import("verl.utils.tracking", _append_file_logger)


def _timeout_process_group(distributed) -> None:
    from recallm.grpo.cpu.patches import wrap_process_group_init

    def wrap(original):
        def initialize_global_process_group_ray(timeout_second=None, backend=None):
            if timeout_second is None and os.environ.get(TIMEOUT_ENV, "").isdigit():
                timeout_second = int(os.environ[TIMEOUT_ENV])
            return original(timeout_second=timeout_second, backend=backend)

        return initialize_global_process_group_ray

    wrap_process_group_init(distributed, "_recallm_timeout", wrap)


def install_collective_timeout() -> None:
    from recallm.grpo.cpu.patches import after_import

    after_import("verl.utils.distributed", _timeout_process_group)


if os.environ.get("RECALLM_GRPO_CPU") == "1":
    from recallm.grpo.cpu import activate

    activate()
install_metrics()
install_appending_file_logger()
install_token_builder_families()
if os.environ.get(TIMEOUT_ENV):
    install_collective_timeout()
from recallm.grpo.checkpoints import install as _install_checkpoints  # noqa: E402

_install_checkpoints()
from recallm.grpo.preemption import STOP_ENV as _STOP_ENV  # noqa: E402

if os.environ.get(_STOP_ENV):
    from recallm.grpo.preemption import install as _install_preemption

    _install_preemption()
if os.environ.get("RECALLM_VLLM_CPU") == "1":
    from recallm.grpo.vllm_cpu import activate as _activate_vllm_cpu

    _activate_vllm_cpu()
if os.environ.get("RECALLM_VLLM_HF_OVERRIDES"):
    from recallm.grpo.vllm_rollout import install as _install_hf_overrides

    _install_hf_overrides()
