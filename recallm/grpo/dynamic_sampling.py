"""DAPO's dynamic sampling on verl's synchronous trainer: groups whose rewards are all equal are dropped
and the batch is refilled from the data, up to a bound.

The setting is verl's own, ``algorithm.filter_groups`` (``enable``, ``metric``, ``max_num_gen_batches``),
which ``algorithm=dapo`` turns on. verl 0.9.1 implements it only in its v1 trainer (which needs
TransferQueue); the legacy trainer that RecaLLM runs (``trainer.use_v1=false``) reads no key of it, and
would train on unfiltered batches without a word. Here the legacy trainer does it, from outside
(``recallm.grpo.trainer_hooks``):

* every training step, once the batch has its rewards (verl's ``extract_reward``, which the trainer calls
  right after scoring), :func:`fill` groups the responses by prompt (``uid``), drops the groups whose
  ``metric`` is the same for every response (``reward``: the score the advantage is computed from;
  any other name: that component of the reward, e.g. ``answer``), and, while fewer than
  ``data.train_batch_size`` groups are left, takes the next prompt batch from the same data loader
  (:class:`RefillLoader`: the epoch's own iterator, so the prompts it takes are consumed, and a resume
  continues after them), generates it as the step did (same weights, same sampling, the recall processor
  on), scores it and filters it again;
* at most ``max_num_gen_batches`` generation rounds a step (the step's own included; 0: until the epoch's
  data run out). Surplus groups are discarded; a batch still short when the bound is reached is completed
  with dropped groups (their advantage is zero: they add nothing to the policy gradient), so every step
  trains on ``data.train_batch_size`` x ``rollout.n`` responses, the shape every other setting was
  checked against;
* the step's metrics: ``dynamic_sampling/generated_groups``, ``dropped_groups`` (zero variance, not trained
  on), ``padded_groups`` (zero variance, trained on to complete the batch), ``surplus_groups``,
  ``gen_batches``, ``refill_s`` (seconds spent generating the refills, inside verl's ``timing_s/step``).

Works with either rollout (``hf_cpu``, vLLM): the refills go through the trainer's own agent loop and
rollout servers. A rollout that frees its memory between steps (``free_cache_engine``: vLLM on GPUs) is
woken by a weight sync of the same weights before a refill and put back to sleep after it.
Not with ``rollout=one_step_off`` (verl's one-step-off trainer generates the next batch while this one
trains; refused at launch).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

__all__ = [
    "ZERO_VARIANCE_TOL",
    "Selection",
    "groups_of",
    "zero_variance",
    "plan_selection",
    "RefillLoader",
    "enabled",
    "fill",
    "check",
]

#: rewards of a group within this of each other count as equal (the reward is a float of a few terms)
ZERO_VARIANCE_TOL = 1e-6
#: advantage estimators that compare the responses of a prompt group (filtering groups means something)
GROUP_ESTIMATORS = (
    "grpo",
    "rloo",
    "grpo_passk",
    "grpo_vectorized",
    "rloo_vectorized",
    "opo",
    "gdpo",
    "gpg",
    "reinforce_plus_plus_baseline",
)


def groups_of(uids: Sequence[Any]) -> dict[Any, list[int]]:
    """Row indices of each prompt group, in the order the groups first appear."""
    groups: dict[Any, list[int]] = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    return groups


def zero_variance(values: Sequence[float]) -> bool:
    """Whether a group's values are all equal (within :data:`ZERO_VARIANCE_TOL`)."""
    values = [float(v) for v in values]
    return not values or max(values) - min(values) <= ZERO_VARIANCE_TOL


@dataclass
class Selection:
    """Which rows of each generated part make up the step's batch, and the counts the metrics report."""

    rows: list[list[int]] = field(default_factory=list)
    generated: int = 0
    zero_variance: int = 0
    kept: int = 0
    surplus: int = 0
    padded: int = 0

    @property
    def dropped(self) -> int:
        return self.zero_variance - self.padded

    def metrics(self) -> dict[str, float]:
        return {
            "dynamic_sampling/generated_groups": float(self.generated),
            "dynamic_sampling/dropped_groups": float(self.dropped),
            "dynamic_sampling/padded_groups": float(self.padded),
            "dynamic_sampling/surplus_groups": float(self.surplus),
        }


def plan_selection(parts: Sequence[tuple[Sequence[Any], Sequence[float]]], want: int) -> Selection:
    """The step's groups from ``parts`` (``(uids, values)`` of each generated batch, in order): the first
    ``want`` groups whose values differ, completed with the first zero-variance groups if fewer differ."""
    varied: list[tuple[int, list[int]]] = []
    flat: list[tuple[int, list[int]]] = []
    generated = 0
    for p, (uids, values) in enumerate(parts):
        for rows in groups_of(uids).values():
            generated += 1
            (flat if zero_variance([values[i] for i in rows]) else varied).append((p, rows))
    chosen = varied[:want]
    padding = flat[: max(0, want - len(chosen))]
    selection = Selection(
        rows=[[] for _ in parts],
        generated=generated,
        zero_variance=len(flat),
        kept=len(chosen),
        surplus=max(0, len(varied) - want),
        padded=len(padding),
    )
    for p, rows in chosen + padding:
        selection.rows[p].extend(rows)
    return selection


class RefillLoader:
    """verl's training data loader, whose current epoch iterator the refills share (:meth:`take`):
    ``for batch in loader`` and ``loader.take()`` draw from the same iterator, so what a refill takes
    the epoch does not yield again, and the loader's ``state_dict`` (saved with each checkpoint) counts it."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._it: Iterator | None = None

    def __iter__(self) -> RefillLoader:
        self._it = iter(self._loader)
        return self

    def __next__(self) -> Any:
        if self._it is None:
            raise StopIteration
        return next(self._it)

    def take(self) -> Any | None:
        """The epoch's next batch, or None when the epoch's data are used up."""
        if self._it is None:
            return None
        try:
            return next(self._it)
        except StopIteration:
            return None

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:  # state_dict, load_state_dict, sampler, dataset, ...
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._loader, name)


def enabled(config: Any) -> bool:
    """Whether a (verl-side) config turns dynamic sampling on: ``algorithm.filter_groups.enable``."""
    return bool(OmegaConf.select(config, "algorithm.filter_groups.enable", default=False))


def _values(batch: Any, metric: str) -> list[float]:
    """Each response's value of ``metric``: ``reward`` the sequence score, else a reward component."""
    if metric == "reward":
        return [float(v) for v in batch.batch["rm_scores"].sum(dim=-1).tolist()]
    values = batch.non_tensor_batch.get(metric)
    if values is None:
        known = sorted(k for k in batch.meta_info.get("reward_extra_keys", []))
        raise RuntimeError(
            f"algorithm.filter_groups.metric={metric!r}: the reward returns no such value (it returns: "
            f"reward, {', '.join(known)})"
        )
    return [float(v) for v in values]


def scores(batch: Any) -> list[float]:
    """Each response's sequence reward (the score GRPO's advantage is computed from)."""
    return _values(batch, "reward")


def _generate(trainer: Any, batch_dict: dict) -> Any:
    """One more prompt batch generated and scored as verl's synchronous step does it (the same weights,
    sampling settings, agent loop and reward)."""
    import uuid

    import numpy as np
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_response_mask

    config = trainer.config
    n = int(config.actor_rollout_ref.rollout.n)
    batch = DataProto.from_single_dict(batch_dict)
    batch.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    gen_batch = trainer._get_gen_batch(batch)
    gen_batch.meta_info["global_steps"] = trainer.global_steps
    gen_batch = gen_batch.repeat(repeat_times=n, interleave=True)
    frees = bool(OmegaConf.select(config, "actor_rollout_ref.rollout.free_cache_engine", default=False))
    if frees:  # asleep since the step's generation: the same weights again wake it (verl's own path)
        trainer.checkpoint_manager.update_weights(trainer.global_steps)
    output = trainer.async_rollout_manager.generate_sequences(gen_batch)
    if frees:
        trainer.checkpoint_manager.sleep_replicas()
    output.meta_info.pop("timing", None)
    batch = batch.repeat(repeat_times=n, interleave=True).union(output)
    if "response_mask" not in batch.batch.keys():
        batch.batch["response_mask"] = compute_response_mask(batch)
    if trainer.use_rm and "rm_scores" not in batch.batch.keys():
        batch = batch.union(trainer._compute_reward_colocate(batch))
    return batch


def fill(trainer: Any, batch: Any) -> tuple[dict[str, float], list[tuple[list[Any], list[float]]]]:
    """Filter ``batch`` (a step's scored batch, changed in place) and refill it (module doc). Returns the
    step's metrics and ``(uids, scores)`` of every generated part (for the health check's zero-variance
    share)."""
    import numpy as np
    from verl import DataProto

    config = trainer.config
    metric = str(OmegaConf.select(config, "algorithm.filter_groups.metric", default="reward") or "reward")
    bound = int(OmegaConf.select(config, "algorithm.filter_groups.max_num_gen_batches", default=0) or 0)
    n = int(config.actor_rollout_ref.rollout.n)
    want = len(batch) // n
    loader = trainer.train_dataloader
    parts = [batch]
    uids = [list(batch.non_tensor_batch["uid"])]
    values = [_values(batch, metric)]

    def varied() -> int:
        return sum(
            not zero_variance([v[i] for i in rows]) for u, v in zip(uids, values, strict=True) for rows in groups_of(u).values()
        )

    started = time.perf_counter()
    refilled = False
    while varied() < want and (bound <= 0 or len(parts) < bound) and isinstance(loader, RefillLoader):
        batch_dict = loader.take()
        if batch_dict is None:
            break
        part = _generate(trainer, batch_dict)
        parts.append(part)
        uids.append(list(part.non_tensor_batch["uid"]))
        values.append(_values(part, metric))
        refilled = True
    refill_s = time.perf_counter() - started if refilled else 0.0
    selection = plan_selection(list(zip(uids, values, strict=True)), want)
    generated = [(u, scores(p)) for u, p in zip(uids, parts, strict=True)]

    if selection.rows[0] != list(range(len(batch))) or len(parts) > 1:
        keys = list(batch.non_tensor_batch.keys())
        pieces = []
        for part, rows in zip(parts, selection.rows, strict=True):
            if not rows:
                continue
            piece = part.select_idxs(np.asarray(rows, dtype=np.int64))
            missing = [k for k in keys if k not in piece.non_tensor_batch]
            if missing:
                raise RuntimeError(f"dynamic sampling: a refill batch lacks {missing}")
            pieces.append(
                DataProto(
                    batch=piece.batch, non_tensor_batch={k: piece.non_tensor_batch[k] for k in keys}, meta_info={}
                )
            )
        combined = DataProto.concat(pieces)
        batch.batch = combined.batch
        batch.non_tensor_batch = combined.non_tensor_batch
        import torch

        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        if config.trainer.get("balance_batch", True):
            trainer._balance_batch(batch, metrics={})
    metrics = selection.metrics()
    metrics["dynamic_sampling/gen_batches"] = float(len(parts))
    metrics["dynamic_sampling/refill_s"] = refill_s
    return metrics, generated


# ------------------------------------------------------------------------------------------- launch
def check(cfg: Any) -> Iterator[str]:
    """``algorithm.filter_groups`` against the rest of a launch (one line each)."""
    from recallm.grpo.settings import settings_of

    if not enabled(cfg):
        return
    fg = cfg.algorithm.filter_groups
    rm = settings_of(cfg)
    if rm.rollout != "sync":
        yield (
            f"algorithm.filter_groups.enable=true with rollout={rm.rollout}: verl's one-step-off trainer generates "
            "the next batch while this one trains, so it cannot refill a batch; use rollout=sync (or algorithm=grpo)"
        )
    estimator = str(cfg.algorithm.adv_estimator)
    if estimator not in GROUP_ESTIMATORS:
        yield (
            f"algorithm.filter_groups.enable=true with algorithm.adv_estimator={estimator}: dynamic sampling drops "
            f"prompt groups whose rewards are all equal, which only a group estimator learns nothing from; use one "
            f"of {', '.join(GROUP_ESTIMATORS[:3])}"
        )
    inflight = fg.get("max_inflight_gen_batches", 1)
    if inflight not in (None, 1):
        yield (
            f"algorithm.filter_groups.max_inflight_gen_batches={inflight}: verl's v1 trainer's setting; the "
            "synchronous trainer refills one batch at a time (use 1)"
        )
    bound = fg.get("max_num_gen_batches", 0)
    if bound is not None and int(bound) == 1:
        yield (
            "algorithm.filter_groups.max_num_gen_batches=1 allows no refill: every dropped group would be put back; "
            "use 2 or more (0: until the epoch's data run out)"
        )
    metric = str(fg.get("metric") or "reward")
    if metric != "reward" and rm.reward_manager:
        from rewards.score import RewardBreakdown

        if metric not in RewardBreakdown._fields:
            yield (
                f"algorithm.filter_groups.metric={metric}: the RecaLLM reward returns no such value; use reward (the "
                f"score) or one of {', '.join(RewardBreakdown._fields)}"
            )
