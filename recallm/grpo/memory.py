"""A GRPO run that ran out of memory ends in one line naming the settings to lower.

When a worker's memory outgrows the machine, Ray's memory monitor kills it (``ray.exceptions.OutOfMemoryError``)
or the kernel's OOM killer does (the actor dies by SIGKILL: ``ActorDiedError``, "killed by the OOM killer";
torch raises ``OutOfMemoryError`` on a GPU). verl then fails with a traceback through Ray's task runner and
a hundred lines of Ray's output, none of which says what to change. :func:`out_of_memory_line` recognises
such a failure in the exception's chain and words it as one line: the micro batches that set the peak of
the actor's update and of the log-prob passes (``*_micro_batch_size_per_gpu``; with dynamic batching the
token caps), with their values, then what else sizes it. ``recallm.grpo.app.run`` raises it as the run's
``error:`` line (the log keeps Ray's whole story).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from omegaconf import OmegaConf

from recallm.grpo.console import LOG_FILE

__all__ = ["is_out_of_memory", "out_of_memory_line", "raise_if_out_of_memory"]

#: what the exceptions of an out-of-memory kill say (Ray's memory monitor, Ray's message for a worker killed by
#: SIGKILL, torch's and CUDA's)
_MARKERS = (
    "running low on memory",
    "out of memory",
    "outofmemoryerror",
    "oom killer",
    "killed by sigkill",
    "memory monitor",
)
_NAMES = ("OutOfMemoryError", "MemoryError")

#: the micro batches that set the memory peak (plain, and with dynamic batching the token caps)
_MICRO = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
)
_TOKEN_CAPS = (
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__, getattr(current, "cause", None)]  # (Ray's RayTaskError)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in its chain) is an out-of-memory kill (module doc)."""
    for e in _chain(exc):
        if any(cls.__name__ in _NAMES for cls in type(e).__mro__):
            return True
        text = str(e).lower()
        if any(marker in text for marker in _MARKERS):
            return True
    return False


def out_of_memory_line(cfg: Any) -> str:
    """The one line of an out-of-memory failure of the run ``cfg`` (module doc)."""
    dynamic = bool(OmegaConf.select(cfg, "actor_rollout_ref.actor.use_dynamic_bsz", default=False))
    keys = _TOKEN_CAPS if dynamic else _MICRO
    values = {key: OmegaConf.select(cfg, key, default=None) for key in keys}
    named = ", ".join(f"{key}={value}" for key, value in values.items() if value is not None) or ", ".join(keys)
    target = "half of them" if dynamic else "2"
    log = OmegaConf.select(cfg, "recallm.console", default=None) == "summary"
    return (
        f"GRPO ran out of memory (a worker was killed): lower {named} (to {target}; a smaller micro batch costs "
        "little time on a CPU); data.max_response_length and actor_rollout_ref.rollout.n also size the peak "
        "(recallm-grpo --plan estimates it)"
        + (f"; Ray's own account: {cfg.trainer.default_local_dir}/{LOG_FILE}" if log else "")
    )


def raise_if_out_of_memory(exc: BaseException, cfg: Any) -> None:
    """Raise the one-line ``RecallmError`` of :func:`out_of_memory_line` if ``exc`` is an out-of-memory kill."""
    from recallm.errors import RecallmError

    if is_out_of_memory(exc):
        raise RecallmError(out_of_memory_line(cfg)) from None
