"""Training health, said while it happens: a check of every GRPO step for the ways a run trains on no
signal while it looks busy.

Every training step, in verl's trainer process (``recallm.grpo.trainer_hooks`` hands each step's
metrics to :meth:`HealthMonitor.observe` just before verl logs them), the monitor checks:

* ``zero_variance`` — more than ``recallm.health.zero_variance_share`` of the step's generated prompt
  groups gave every response the same reward: GRPO's advantage is zero for all of them
  (``recallm/health/zero_variance_share``, counted over every group generated, before DAPO's dynamic
  sampling drops any);
* ``clipped`` — more than ``clipped_share`` of the responses hit the generation cap
  ``data.max_response_length`` (verl's ``response_length/clip_ratio``): cut responses have no answer;
* ``no_spans`` — a recall run (the recall tokens known) in which no response opened a recall span for
  ``span_patience`` steps in a row (``recallm/recall_usage`` is 0): the recall reward has nothing to score;
* ``logprob_gap`` — the mean |rollout − trainer| log-prob inside spans (``recallm/logprob_gap_in_spans``)
  is above ``logprob_gap``: the rollout samples from a distribution the trainer does not compute (a
  recall mask on one side only biases every importance ratio inside spans). With one-step-off rollouts
  the batch is one update behind, which opens a gap everywhere: there, the excess inside spans over the
  gap outside them (``recallm/logprob_gap_outside_spans``) is checked;
* ``adapter_live`` — the rollout engine answers a fixed greedy probe (:class:`RolloutProbe`, after every
  step) exactly as before although the update its last weight sync carried moved the actor (grad norm and
  learning rate above zero): the weights — a LoRA adapter, typically — never reach the rollout. Runs with
  LoRA by default (``probe=lora``; ``always`` or ``off``).

Each check that fires is one line, ``warning: step N: ...`` on the console (the trainer prints it as
``[recallm health] warning: ...``; ``recallm.grpo.console`` shows it below the step's summary line, which
ends ``health ok`` or ``health: <the checks that fired>``), and the metrics carry ``recallm/health/<check>``
(1 when it fired), ``recallm/health/warnings`` and the values checked. With ``recallm.health.strict=true``
the run stops after the step is logged (:class:`Unhealthy`; ``recallm-grpo`` exits 3 with one line).

One more, before any step runs: a resumed run whose data loader is already exhausted (verl's epoch loop
starts past ``trainer.total_epochs``) would exit 0 having trained nothing. The launcher says so from the
checkpoint it resumes and the training file's row count (:func:`check_resume`: a refusal with ``strict``),
and the trainer from its own data loader (:func:`exhausted_resume`).

This module is light (no torch, no verl at import): the launcher and the settings import it.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recallm.errors import RecallmError
from recallm.grpo.settings import HealthSettings

__all__ = [
    "HealthMonitor",
    "Unhealthy",
    "unhealthy_by",
    "stopped_unhealthy",
    "exhausted_resume",
    "check_resume",
    "summary_part",
    "warning_text",
    "RolloutProbe",
    "WARNING_MARK",
    "EXIT_UNHEALTHY",
    "CHECK_NAMES",
]

#: the trainer prints each warning after this mark (the console shows the text after it)
WARNING_MARK = "[recallm health] "
#: ``recallm-grpo``'s exit status when ``recallm.health.strict`` stopped the run
EXIT_UNHEALTHY = 3
#: the per-step checks, in the order a summary line names them
CHECK_NAMES = ("zero_variance", "clipped", "no_spans", "logprob_gap", "adapter_live")


def settings_from(config: Any) -> HealthSettings:
    """The ``recallm.health`` section of a (verl-side) config; the defaults where it has none."""
    from omegaconf import OmegaConf

    from recallm.config import typed

    section = OmegaConf.select(config, "recallm.health", default=None) if OmegaConf.is_config(config) else None
    if OmegaConf.is_config(section):
        section = OmegaConf.to_container(section, resolve=True)
    return typed(HealthSettings, section or {}, "recallm.health")


class Unhealthy(RecallmError):
    """Raised in verl's trainer when ``recallm.health.strict`` stops a run (after the step is logged)."""

    def __init__(self, step: int, warnings: list[str]) -> None:
        self.step = step
        self.warnings = list(warnings)
        first = warnings[0] if warnings else "a health check fired"
        super().__init__(
            f"training stopped by recallm.health.strict=true after step {step}: {first}"
            + (f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else "")
        )

    def __reduce__(self):  # (crosses from the Ray actor to the driver)
        return (Unhealthy, (self.step, self.warnings))


def unhealthy_by(exc: BaseException) -> Unhealthy | None:
    """The :class:`Unhealthy` an error from Ray carries, else None. Ray raises an actor's exception as a class
    derived from both its own error and the original (whose message is Ray's traceback) and keeps the
    original as ``cause``: the original is looked for first."""
    found: Unhealthy | None = None
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        candidate = todo.pop(0)
        if candidate is None or id(candidate) in seen:
            continue
        seen.add(id(candidate))
        if type(candidate) is Unhealthy:
            return candidate
        if found is None and isinstance(candidate, Unhealthy) and hasattr(candidate, "step"):
            found = candidate
        todo += [getattr(candidate, "cause", None), candidate.__cause__, candidate.__context__]
    return None if found is None else Unhealthy(found.step, getattr(found, "warnings", []))


def stopped_unhealthy(exc: BaseException) -> int | None:
    """``recallm-grpo``'s handling of a run the strict health check stopped: one line on stderr and the exit
    status (:data:`EXIT_UNHEALTHY`); None for any other error."""
    unhealthy = unhealthy_by(exc)
    if unhealthy is None:
        return None
    print(f"error: {unhealthy}", file=sys.stderr, flush=True)
    return EXIT_UNHEALTHY


def _finite(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


@dataclass
class HealthMonitor:
    """The per-step checks (module doc) over a run's step metrics; keeps what spans steps (steps without a
    span, whether the update the next weight sync carries moved the actor)."""

    settings: HealthSettings = field(default_factory=HealthSettings)
    recall: bool = True
    """a recall run: the recall tokens are known, ``recallm/recall_usage`` is logged"""
    max_response_length: int | None = None
    sync_carries_previous_update: bool = False
    """one-step-off: the weight sync of step k carries the update of step k-1 (synchronous: of step k)"""
    steps_without_span: int = 0
    _moved: dict[int, bool] = field(default_factory=dict)

    def observe(self, step: int, metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
        """``(health metrics to log with the step, warning lines)`` for one training step's metrics."""
        s = self.settings
        out: dict[str, float] = {}
        warnings: list[str] = []
        fired: dict[str, bool] = {}

        share = _finite(metrics, "recallm/health/zero_variance_share")
        if share is not None:
            fired["zero_variance"] = share > s.zero_variance_share
            if fired["zero_variance"]:
                groups = _finite(metrics, "recallm/health/generated_groups")
                of = f" ({share * groups:.0f} of {groups:.0f})" if groups else ""
                warnings.append(
                    f"step {step}: {_pct(share)} of the prompt groups{of} gave every response the same reward "
                    f"(recallm.health.zero_variance_share={s.zero_variance_share}): their advantage is zero, no "
                    "learning signal; DAPO's dynamic sampling (algorithm=dapo) trains on the others, or make the "
                    "prompts harder or easier"
                )

        clipped = _finite(metrics, "response_length/clip_ratio")
        if clipped is not None:
            fired["clipped"] = clipped > s.clipped_share
            if fired["clipped"]:
                cap = f" data.max_response_length={self.max_response_length}" if self.max_response_length else ""
                warnings.append(
                    f"step {step}: {_pct(clipped)} of the responses hit the generation cap{cap} "
                    f"(recallm.health.clipped_share={s.clipped_share}): cut responses give no answer to score; "
                    "raise data.max_response_length"
                )

        usage = _finite(metrics, "recallm/recall_usage")
        if self.recall and usage is not None:
            self.steps_without_span = self.steps_without_span + 1 if usage == 0 else 0
            out["recallm/health/steps_without_span"] = float(self.steps_without_span)
            fired["no_spans"] = self.steps_without_span >= s.span_patience
            if fired["no_spans"]:
                warnings.append(
                    f"step {step}: no response opened a recall span for {self.steps_without_span} steps "
                    f"(recallm.health.span_patience={s.span_patience}): the recall reward has nothing to score; "
                    "check the SFT model writes spans (recallm-eval) and the rollout's temperature"
                )

        gap = _finite(metrics, "recallm/logprob_gap_in_spans")
        if gap is not None:
            # one-step-off: the batch is one update behind, a gap the policy's change opens everywhere; what the
            # mask would add shows inside spans only, above the gap outside them
            outside = _finite(metrics, "recallm/logprob_gap_outside_spans") if self.sync_carries_previous_update else None
            excess = gap - outside if outside is not None else gap
            fired["logprob_gap"] = excess > s.logprob_gap
            if fired["logprob_gap"]:
                lag = f" ({outside:.3g} outside them: the one-update lag)" if outside is not None else ""
                warnings.append(
                    f"step {step}: the rollout's and the trainer's log-probs differ by {gap:.3g} on average inside "
                    f"recall spans{lag} (recallm.health.logprob_gap={s.logprob_gap}): the rollout samples from another "
                    "distribution than the masked one the trainer computes, which biases every importance ratio "
                    "there; check that both sides apply the recall mask (recallm.recall_constrained, the rollout's "
                    "recall processor) and serve the same weights"
                )

        grad, lr = _finite(metrics, "actor/grad_norm"), _finite(metrics, "actor/lr")
        if grad is not None:
            self._moved[step] = grad > 0 and (lr is None or lr > 0)
        change = _finite(metrics, "recallm/health/rollout_probe_change")
        if change is not None:
            carried = step - 1 if self.sync_carries_previous_update else step
            moved = self._moved.get(carried)
            if moved is not None:
                fired["adapter_live"] = moved and change == 0.0
                if fired["adapter_live"]:
                    what = f"step {carried}'s update (grad norm {grad:.3g})" if carried == step and grad else (
                        f"step {carried}'s update"
                    )
                    warnings.append(
                        f"step {step}: the rollout engine answers the liveness probe exactly as before the weight "
                        f"sync that carried {what}: the new weights (a LoRA adapter) do not reach the rollout, "
                        "which keeps sampling the old policy"
                    )
        self._moved = {k: v for k, v in self._moved.items() if k >= step - 1}

        for name, value in fired.items():
            out[f"recallm/health/{name}"] = 1.0 if value else 0.0
        out["recallm/health/warnings"] = float(len(warnings))
        return out, warnings


def warning_text(line: str) -> str:
    """A warning as the trainer prints it (the console recognises :data:`WARNING_MARK`)."""
    return f"{WARNING_MARK}warning: {line}"


def summary_part(metrics: Mapping[str, Any]) -> str | None:
    """The summary line's health part: ``health ok`` or ``health: clipped, no_spans``; None for a step
    without the health metrics (a run from before this check)."""
    if _finite(metrics, "recallm/health/warnings") is None:
        return None
    fired = [name for name in CHECK_NAMES if _finite(metrics, f"recallm/health/{name}") == 1.0]
    return f"health: {', '.join(fired)}" if fired else "health ok"


# ----------------------------------------------------------------------------------- resume check
def exhausted_resume(step: int, steps_per_epoch: int, total_epochs: int) -> str | None:
    """Why a synchronous run resumed at ``step`` trains zero steps (verl's epoch loop starts at epoch
    ``step // steps_per_epoch`` and ends before ``total_epochs``), else None."""
    if steps_per_epoch <= 0 or step <= 0:
        return None
    epoch = step // steps_per_epoch
    if epoch < total_epochs:
        return None
    return (
        f"resumed at step {step}: the data is used up (trainer.total_epochs={total_epochs} epochs of "
        f"{steps_per_epoch} steps end at step {total_epochs * steps_per_epoch}), so this run trains zero steps "
        f"and exits as if it had finished; raise trainer.total_epochs to train on, or start a new "
        "trainer.default_local_dir"
    )


def _rows(files: Any) -> int | None:
    """Rows of the training files (parquet metadata; None when a file does not read that way)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - a dependency of verl's data loader
        return None
    files = [files] if isinstance(files, str) else list(files or [])
    total = 0
    for file in files:
        try:
            total += pq.ParquetFile(str(file)).metadata.num_rows
        except Exception:  # noqa: BLE001 - not a parquet file: the trainer's own check says it
            return None
    return total


def check_resume(cfg: Any) -> None:
    """Before Ray starts, after the resume point is chosen: a run resumed at a step past its data's last
    epoch trains zero steps. A warning line, or (``recallm.health.strict``) a one-line refusal. The
    training file's rows bound the data loader's length from above (verl's filters only remove rows), so
    this never says it of a run that would train."""
    from omegaconf import OmegaConf

    from recallm.grpo.checkpoints import TRACKER
    from recallm.grpo.settings import settings_of

    if settings_of(cfg).rollout != "sync":
        return  # verl's one-step-off trainer runs its own epoch loop: the trainer-side check covers it
    t = cfg.trainer
    if str(t.get("resume_mode", "auto")) != "auto":
        return
    tracker = os.path.join(str(t.default_local_dir), TRACKER)
    try:
        with open(tracker) as f:
            step = int(f.read().strip())
    except (OSError, ValueError):
        return
    rows = _rows(OmegaConf.select(cfg, "data.train_files", default=None))
    batch = int(cfg.data.train_batch_size)
    if rows is None or batch <= 0:
        return
    why = exhausted_resume(step, rows // batch, int(t.total_epochs))
    if why is None:
        return
    if settings_of(cfg).health.strict:
        raise RecallmError(f"{why} (recallm.health.strict=true refuses it)")
    print(f"warning: {why}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ liveness probe
class RolloutProbe:
    """A fixed greedy request to the rollout's first server (verl's token-in/token-out ``generate``, the
    one the agent loop uses): :meth:`change` is the largest change of the probe's log-probs since the
    previous call (``inf`` when the greedy tokens differ), None the first time."""

    def __init__(self, server: Any, prompt_ids: list[int], tokens: int) -> None:
        self.server = server
        self.prompt_ids = [int(t) for t in prompt_ids]
        self.tokens = tokens
        self.last: tuple[list[int], list[float]] | None = None
        self.calls = 0

    @classmethod
    def for_trainer(cls, trainer: Any, tokens: int) -> RolloutProbe | None:
        """The probe of a verl trainer: its first rollout server and its first training prompt (else a
        fixed text), or None when the trainer has no rollout server to ask."""
        manager = getattr(trainer, "llm_server_manager", None)
        replicas = manager.get_replicas() if manager is not None else []
        server = getattr(replicas[0], "server_handle", None) if replicas else None
        if server is None:
            return None
        return cls(server, probe_prompt(trainer), tokens)

    def change(self) -> float | None:
        import uuid

        import ray

        self.calls += 1
        params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_tokens": self.tokens, "logprobs": True}
        out = ray.get(self.server.generate.remote(self.prompt_ids, params, f"recallm-probe-{uuid.uuid4().hex}"))
        tokens = [int(t) for t in out.token_ids]
        log_probs = [float(x) for x in (out.log_probs or [])]
        previous, self.last = self.last, (tokens, log_probs)
        if previous is None:
            return None
        if previous[0] != tokens or len(previous[1]) != len(log_probs):
            return math.inf
        return max((abs(a - b) for a, b in zip(previous[1], log_probs, strict=True)), default=0.0)


def probe_prompt(trainer: Any) -> list[int]:
    """The token ids of the trainer's first training prompt (its chat template applied), else of a fixed text."""
    tokenizer = trainer.tokenizer
    try:
        row = trainer.train_dataset[0]
        messages = row.get("raw_prompt")
        ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        ids = list(ids)
        if ids:
            return ids[-512:]
    except Exception:  # noqa: BLE001 - any dataset or template the trainer took: fall back to plain text
        pass
    return list(tokenizer("The liveness probe of the rollout engine.", add_special_tokens=False)["input_ids"])
