"""The algorithm and rollout groups of a GRPO launch, on the launcher's side: ``algorithm=grpo|dapo|gspo``
(``configs/algorithm/``) and ``rollout=sync|one_step_off`` (``configs/rollout/``).

An algorithm group sets verl's own keys and nothing else: ``grpo`` verl's vanilla PPO-clip loss on GRPO's
group-relative advantages; ``dapo`` also drops prompt groups whose rewards are all equal and refills the
batch (``algorithm.filter_groups``, run by ``recallm.grpo.dynamic_sampling``) and clips higher
(``clip_ratio_high=0.28``) with a token-mean loss; ``gspo`` the sequence-level importance ratio
(``policy_loss.loss_mode=gspo``) with its narrow clip range and ``seq-mean-token-mean``. The rollout group
sets ``recallm.rollout`` (``recallm.grpo.off_policy`` derives verl's keys from it) and its choices.

With the recall constraint, the sequence ratio of GSPO (and every token ratio) is computed from the masked
log-probs on both sides: ``old_log_probs`` is the masked actor's (or, in bypass mode, the rollout's processed
log-probs, masked by the recall processor) and the current log-probs are the masked actor's
(``recallm.modeling.RecallMaskMixin``); ``tests/unit/test_grpo_algorithms.py`` checks verl's loss on a
hand-computed case.

:data:`PREPARE_STEPS` and :data:`CHECKS` join the launch's own (``recallm.grpo.app``); :func:`describe`
is the launch's ``algorithm:`` line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from omegaconf import OmegaConf

from recallm.errors import RecallmError
from recallm.grpo import dynamic_sampling, off_policy

__all__ = ["constraint_not_split", "PREPARE_STEPS", "CHECKS", "describe", "LOSS_AGG_MODES"]

#: verl 0.9.1's ``agg_loss`` modes (``seq-mean-token-sum-norm`` with ``norm_adv_by_std_in_grpo=false`` is Dr. GRPO)
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_OVERRIDE = "actor_rollout_ref.model.override_config.recall_constrained"


def constraint_not_split(cfg: Any, run: Any) -> None:
    """A prepare step, before ``recall_constraint`` derives the engine keys: a user's own
    ``override_config.recall_constrained`` that contradicts ``recallm.recall_constrained`` would have the
    trainer and the rollout follow one constraint each; refused in one line."""
    from recallm.grpo.settings import settings_of

    value = OmegaConf.select(cfg, _OVERRIDE, default=None)
    constrained = settings_of(cfg).recall_constrained
    if value is not None and bool(value) != constrained:
        raise RecallmError(
            f"{_OVERRIDE}={value} with recallm.recall_constrained={str(constrained).lower()}: the trainer's log-probs "
            "and the rollout would follow different recall constraints; set recallm.recall_constrained alone (every "
            "engine's key is derived from it)"
        )


def _check_processor(cfg: Any) -> Iterator[str]:
    """The recall processor added by hand to a vLLM rollout whose constraint is off: the rollout would
    sample from the masked distribution while the actor's log-probs are unmasked."""
    from recallm.grpo.settings import settings_of
    from recallm.recall.vllm import V1_PROCESSOR_FQCN as VLLM_PROCESSOR

    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors"
    processors = [str(p) for p in (OmegaConf.select(cfg, key, default=None) or [])]
    if not settings_of(cfg).recall_constrained and VLLM_PROCESSOR in processors:
        yield (
            f"{key} has {VLLM_PROCESSOR} with recallm.recall_constrained=false: the rollout would sample masked spans "
            "while the actor computes unmasked log-probs; remove it, or set recallm.recall_constrained=true"
        )


def _check_policy_loss(cfg: Any) -> Iterator[str]:
    """``loss_agg_mode`` and ``policy_loss.loss_mode`` that verl's actor knows (it would fail inside a worker)."""
    actor = cfg.actor_rollout_ref.actor
    mode = actor.get("loss_agg_mode")
    if mode not in LOSS_AGG_MODES:
        yield f"actor_rollout_ref.actor.loss_agg_mode={mode}: verl aggregates with one of {', '.join(LOSS_AGG_MODES)}"
    loss_mode = OmegaConf.select(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode", default="vanilla")
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    if loss_mode not in POLICY_LOSS_REGISTRY:
        yield (
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}: verl has no such policy loss (one of "
            f"{', '.join(sorted(POLICY_LOSS_REGISTRY))})"
        )


#: the prepare steps of this family, in ``recallm.grpo.app.PREPARE_STEPS``
PREPARE_STEPS = (constraint_not_split, off_policy.prepare)
#: the checks of this family, in ``recallm.grpo.app.CHECKS``
CHECKS = (dynamic_sampling.check, off_policy.check, _check_processor, _check_policy_loss)


def describe(cfg: Any) -> str:
    """The launch's ``algorithm:`` line: the loss, the group filter, the rollout mode."""
    from recallm.grpo.settings import settings_of

    actor = cfg.actor_rollout_ref.actor
    loss = OmegaConf.select(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode", default="vanilla")
    low = actor.get("clip_ratio_low") or actor.get("clip_ratio")
    high = actor.get("clip_ratio_high") or actor.get("clip_ratio")
    parts = [
        f"{cfg.algorithm.adv_estimator} advantages, {'sequence' if loss == 'gspo' else 'token'}-level ratio "
        f"(policy_loss.loss_mode={loss}, clip {low}/{high}), loss_agg_mode={actor.get('loss_agg_mode')}"
    ]
    if dynamic_sampling.enabled(cfg):
        fg = cfg.algorithm.filter_groups
        bound = int(fg.get("max_num_gen_batches") or 0)
        parts.append(
            f"dynamic sampling on {fg.get('metric') or 'reward'} (up to {bound if bound > 0 else 'an epoch of'} "
            "generation rounds a step)"
        )
    rm = settings_of(cfg)
    rc = cfg.algorithm.get("rollout_correction") or {}
    if rm.rollout == "one_step_off":
        parts.append(
            "one-step-off rollouts (one update behind; importance weights "
            f"{rc.get('rollout_is') or 'off'}{' <= ' + str(rc.get('rollout_is_threshold')) if rc.get('rollout_is') else ''}"
            f"{', bypass mode' if rc.get('bypass_mode') else ''})"
        )
    return "; ".join(parts)
