"""A GRPO run that ran out of memory ends in one line naming the settings to lower.

When a worker's memory outgrows the machine, Ray's memory monitor kills it (``ray.exceptions.OutOfMemoryError``,
"killed due to the node running low on memory"), or the kernel's OOM killer does: then Ray only knows that the
actor died (``ActorDiedError``, whose message lists the OOM killer among possible causes, with a crash), so
the kernel's own count of OOM kills (``oom_kill`` in ``/proc/vmstat``) is read before and after the run; torch
raises ``OutOfMemoryError`` on a GPU. verl then fails with a traceback through Ray's task runner and a hundred
lines of Ray's output, none of which says what to change. :func:`memory_guard`, around the launch, turns such
a failure into one ``RecallmError`` line (:func:`out_of_memory_line`): the micro batches that set the peak of
the actor's update and of the log-prob passes (``*_micro_batch_size_per_gpu``; with dynamic batching the
token caps), with their values, then what else sizes the peak. The run's log keeps Ray's whole account.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from omegaconf import OmegaConf

from recallm.paths import GRPO_LOG

__all__ = ["oom_kills", "is_out_of_memory", "out_of_memory_line", "memory_guard"]

#: what the exceptions of a memory kill say (Ray's memory monitor; torch's and CUDA's)
_MEMORY = ("running low on memory", "out of memory", "outofmemoryerror")
_NAMES = ("OutOfMemoryError", "MemoryError")
#: what Ray says of a worker that died without a Python exception (SIGKILL: the OOM killer, or a crash)
_DIED = ("died unexpectedly", "actordiederror", "sigkill", "worker unexpectedly exits", "worker crashed")

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


def oom_kills(vmstat: str = "/proc/vmstat") -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (None where the kernel does not say)."""
    try:
        with open(vmstat, encoding="ascii") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


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


def is_out_of_memory(exc: BaseException, *, killed: bool = False) -> bool:
    """Whether ``exc`` (or an exception in its chain) is a memory kill: a memory error by name or message, or
    (``killed``: the kernel's OOM killer killed something during the run) a worker that died by a signal."""
    for e in _chain(exc):
        text = f"{type(e).__name__} {e}".lower()
        if any(cls.__name__ in _NAMES for cls in type(e).__mro__) or any(m in text for m in _MEMORY):
            return True
        if killed and any(m in text for m in _DIED):
            return True
    return False


def out_of_memory_line(cfg: Any) -> str:
    """The one line of an out-of-memory failure of the run ``cfg`` (module doc)."""
    dynamic = bool(OmegaConf.select(cfg, "actor_rollout_ref.actor.use_dynamic_bsz", default=False))
    keys = _TOKEN_CAPS if dynamic else _MICRO
    values = {key: OmegaConf.select(cfg, key, default=None) for key in keys}
    named = ", ".join(f"{key}={value}" for key, value in values.items() if value is not None) or ", ".join(keys)
    log = OmegaConf.select(cfg, "recallm.console", default=None) == "summary"
    return (
        f"GRPO ran out of memory (a worker was killed): lower {named} (to {'half' if dynamic else '2'}; a smaller "
        "micro batch costs little time on a CPU); data.max_response_length and actor_rollout_ref.rollout.n also "
        "size the peak (recallm-grpo --plan estimates it)"
        + (f"; Ray's account: {cfg.trainer.default_local_dir}/{GRPO_LOG}" if log else "")
    )


@contextlib.contextmanager
def memory_guard(cfg: Any) -> Iterator[None]:
    """Around a launch: a failure that is a memory kill (:func:`is_out_of_memory`) becomes the one-line
    ``RecallmError`` of :func:`out_of_memory_line`; any other failure passes unchanged."""
    from recallm.errors import RecallmError

    before = oom_kills()
    try:
        yield
    except Exception as exc:
        after = oom_kills()
        killed = before is not None and after is not None and after > before
        if is_out_of_memory(exc, killed=killed):
            raise RecallmError(out_of_memory_line(cfg)) from exc
        raise
