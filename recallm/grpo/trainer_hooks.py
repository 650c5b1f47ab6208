"""RecaLLM's hooks in verl's trainer: DAPO's dynamic sampling and the training-health checks.

``recallm.grpo.worker_hooks`` calls :func:`install` in every verl process; the hooks act where verl's trainer
runs (its ``TaskRunner`` Ray actor), on verl 0.9.1's synchronous trainer (``RayPPOTrainer``) and its
one-step-off-policy trainer (``OneStepOffRayTrainer``, built on ``SeparateRayPPOTrainer``). Each replaces
one attribute from outside, when verl's module is imported (``recallm.grpo.cpu.patches.after_import``);
nothing of verl is edited:

* ``RayPPOTrainer._load_checkpoint`` (the first thing every ``fit`` does): afterwards, the run's health
  monitor is set up from ``trainer.config.recallm.health``, and a resumed synchronous run whose data loader
  is exhausted says so (``recallm.grpo.health.exhausted_resume``; with ``strict``, it stops);
* ``RayPPOTrainer._create_dataloader``: with ``algorithm.filter_groups.enable``, the training loader is
  wrapped so that refills draw from the epoch's own iterator (``recallm.grpo.dynamic_sampling.RefillLoader``);
* ``extract_reward`` (in ``verl.trainer.ppo.ray_trainer`` and ``verl.experimental.separation.ray_trainer``,
  which call it once per training step right after the batch is scored): the batch is filtered and
  refilled (dynamic sampling), and the share of generated prompt groups whose rewards are all equal is
  recorded for the step; ``RayPPOTrainer._validate`` marks validation, which neither touches;
* ``verl.utils.tracking.Tracking.log`` (the step's metrics, on their way to the console, file and W&B
  loggers): the step's recorded metrics are added, the liveness probe asks the rollout, the health monitor
  checks the step and adds its metrics; after verl has logged them, each warning is printed, and with
  ``strict`` the run stops (``recallm.grpo.health.Unhealthy``);
* ``OneStepOffRayTrainer.fit``: the rollout-dump executor verl 0.9.1 forgets to create there (:func:`_wrap_one_step_off`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = ["install", "state"]


@dataclass
class _State:
    trainer: Any = None
    monitor: Any = None
    settings: Any = None
    probe: Any = None
    probe_ready: bool = False
    validating: int = 0
    pending: dict[str, float] = field(default_factory=dict)


state = _State()


def _lora(config: Any) -> bool:
    from omegaconf import OmegaConf

    rank = OmegaConf.select(config, "actor_rollout_ref.model.lora_rank", default=0) or 0
    rank = rank or (OmegaConf.select(config, "actor_rollout_ref.model.lora.rank", default=0) or 0)
    return int(rank) > 0 or bool(OmegaConf.select(config, "actor_rollout_ref.model.lora_adapter_path", default=None))


def _one_step_off(config: Any) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, "recallm.rollout", default="sync") == "one_step_off"


def _start(trainer: Any) -> None:
    """After ``_load_checkpoint``: the run's monitor; the exhausted-resume check."""
    from recallm.grpo.health import HealthMonitor, Unhealthy, exhausted_resume, settings_from, warning_text

    config = trainer.config
    settings = settings_from(config)
    state.trainer, state.settings = trainer, settings
    state.probe, state.probe_ready, state.pending = None, False, {}
    state.monitor = HealthMonitor(
        settings,
        recall=bool(os.environ.get("RECALLM_RECALL_TOKEN_IDS")),
        max_response_length=int(config.data.max_response_length),
        sync_carries_previous_update=_one_step_off(config),
    )
    if _one_step_off(config) or not trainer.global_steps:
        return
    why = exhausted_resume(int(trainer.global_steps), len(trainer.train_dataloader), int(config.trainer.total_epochs))
    if why:
        print(warning_text(why), flush=True)
        if settings.strict:
            raise Unhealthy(int(trainer.global_steps), [why])


def _record_groups(batch: Any) -> None:
    """The step's share of generated groups whose reward is the same for every response (all of them
    when dynamic sampling refills: the refills' too)."""
    from recallm.grpo import dynamic_sampling as ds

    trainer = state.trainer
    if ds.enabled(trainer.config):
        metrics, parts = ds.fill(trainer, batch)
        state.pending.update(metrics)
    else:
        parts = [(list(batch.non_tensor_batch["uid"]), ds.scores(batch))]
    generated = zero = 0
    for uids, values in parts:
        for rows in ds.groups_of(uids).values():
            generated += 1
            zero += ds.zero_variance([values[i] for i in rows])
    if generated:
        state.pending["recallm/health/generated_groups"] = float(generated)
        state.pending["recallm/health/zero_variance_share"] = zero / generated


def _wrap_extract_reward(module: Any) -> None:
    original = getattr(module, "extract_reward", None)
    if original is None or getattr(original, "_recallm", False):
        return

    def extract_reward(batch):
        if state.trainer is not None and not state.validating and "rm_scores" in batch.batch.keys():
            _record_groups(batch)
        return original(batch)

    extract_reward._recallm = True  # type: ignore[attr-defined]
    module.extract_reward = extract_reward


def _wrap_ray_trainer(module: Any) -> None:
    cls = module.RayPPOTrainer
    load = cls._load_checkpoint
    if getattr(load, "_recallm_hooks", False):
        return
    create, validate = cls._create_dataloader, cls._validate

    def _load_checkpoint(self, *args, **kwargs):
        result = load(self, *args, **kwargs)
        _start(self)
        return result

    def _create_dataloader(self, *args, **kwargs):
        from recallm.grpo.dynamic_sampling import RefillLoader, enabled

        result = create(self, *args, **kwargs)
        if enabled(self.config) and not isinstance(self.train_dataloader, RefillLoader):
            self.train_dataloader = RefillLoader(self.train_dataloader)
        return result

    def _validate(self, *args, **kwargs):
        state.validating += 1
        try:
            return validate(self, *args, **kwargs)
        finally:
            state.validating -= 1

    _load_checkpoint._recallm_hooks = True  # type: ignore[attr-defined]
    cls._load_checkpoint = _load_checkpoint
    cls._create_dataloader = _create_dataloader
    cls._validate = _validate
    _wrap_extract_reward(module)


def _probe_change() -> float | None:
    from recallm.grpo.health import RolloutProbe

    settings, trainer = state.settings, state.trainer
    if not state.probe_ready:
        state.probe_ready = True
        wanted = settings.probe == "always" or (settings.probe == "lora" and _lora(trainer.config))
        state.probe = RolloutProbe.for_trainer(trainer, settings.probe_tokens) if wanted else None
    if state.probe is None:
        return None
    change = state.probe.change()
    return None if change is None else min(change, 1e6)  # (a greedy token changed: "infinitely" different)


def _wrap_tracking(module: Any) -> None:
    cls = getattr(module, "Tracking", None)
    original = getattr(cls, "log", None)
    if original is None or getattr(original, "_recallm_hooks", False):
        return

    def log(self, data, step, backend=None):
        if state.monitor is None or not isinstance(data, dict) or "training/global_step" not in data:
            return original(self, data, step, backend)
        from recallm.grpo.health import Unhealthy, warning_text

        data.update(state.pending)
        state.pending = {}
        change = _probe_change()
        if change is not None and math.isfinite(change):
            data["recallm/health/rollout_probe_change"] = change
        health, warnings = state.monitor.observe(int(step), data)
        data.update(health)
        result = original(self, data, step, backend)
        for line in warnings:
            print(warning_text(line), flush=True)
        if warnings and state.settings.strict:
            raise Unhealthy(int(step), warnings)
        return result

    log._recallm_hooks = True  # type: ignore[attr-defined]
    cls.log = log


def _wrap_one_step_off(module: Any) -> None:
    """verl 0.9.1's ``OneStepOffRayTrainer.__init__`` skips ``RayPPOTrainer.__init__``, which creates the executor
    that writes ``trainer.rollout_data_dir``'s dumps: the first dump fails (``no attribute '_dump_executor'``).
    Its ``fit`` gets one, and waits for the last dump before it returns (as the synchronous ``fit`` does)."""
    cls = module.OneStepOffRayTrainer
    fit = cls.fit
    if getattr(fit, "_recallm_hooks", False):
        return

    async def _fit(self, *args, **kwargs):
        if getattr(self, "_dump_executor", None) is None:
            self._init_dump_executor()
        try:
            return await fit(self, *args, **kwargs)
        finally:
            self._shutdown_dump_executor()

    _fit._recallm_hooks = True  # type: ignore[attr-defined]
    cls.fit = _fit


def install() -> None:
    """Install the hooks (module doc) when verl's modules are imported; idempotent, imports nothing heavy."""
    from recallm.grpo.cpu.patches import after_import

    after_import("verl.trainer.ppo.ray_trainer", _wrap_ray_trainer)
    after_import("verl.experimental.separation.ray_trainer", _wrap_extract_reward)
    after_import("verl.utils.tracking", _wrap_tracking)
    after_import("verl.experimental.one_step_off_policy.ray_trainer", _wrap_one_step_off)
