"""The budget of one task: total tokens, sub-calls and wall time, shared by every level of an RLM.

One ``Budget`` is made per task and handed to the root RLM, its sub-calls and every recursive
RLM below it (threads included). It is checked *before* each model call and charged after it:

* ``max_tokens`` - prompt + completion tokens of every model call (root turns and sub-calls,
  charged when the call ends - also when its caller had stopped waiting for it); a call is
  refused once the total reaches the cap, and a call's ``max_new_tokens`` (when it has one) is
  cut to what is left, so calls already in flight can overshoot by at most their prompt tokens;
* ``max_subcalls`` - sub-calls (each prompt of a batch counts once, and a batch is reserved whole
  or refused whole; a recursive ``rlm_query`` counts once, and its own model calls count as
  well). Reaching it refuses further sub-calls (model code gets ``BudgetExhausted``) but does
  not end the task: the root still gets its turns to answer with what it has;
* ``max_wall_s`` - seconds since the task started; every wait (a cell, a sub-call, a root
  turn) is bounded by what is left, so a spent budget ends the task instead of hanging it.

Once the tokens or the wall time are spent the budget stays spent (``reason`` says which cap),
and every later check raises ``BudgetExhausted``. ``None`` turns a cap off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recallm.config import MAX_COUNT, MAX_SECONDS, typed
from recallm.errors import RecallmError
from recallm.rlm.sandbox import BudgetSpent

__all__ = ["BudgetLimits", "Budget", "BudgetExhausted"]


class BudgetExhausted(BudgetSpent):
    """The task's budget is spent; ``reason`` names the cap (raised from a sub-call, model code
    gets its own ``BudgetExhausted``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"budget exhausted: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class BudgetLimits:
    """Caps per task (``None``: no cap)."""

    max_tokens: int | None = field(default=2_000_000, metadata={"max": MAX_COUNT})
    """prompt + completion tokens of every model call of the task (root and sub-calls)"""
    max_subcalls: int | None = field(default=1000, metadata={"max": MAX_COUNT})
    """sub-calls of the task, all depths together"""
    max_wall_s: float | None = field(default=3600.0, metadata={"max": MAX_SECONDS})
    """wall-clock seconds of the task"""

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | None, where: str = "budget") -> BudgetLimits:
        limits = typed(cls, cfg, where)  # (the fields' metadata ranges too)
        for name in ("max_tokens", "max_subcalls", "max_wall_s"):
            value = getattr(limits, name)
            if value is not None and (value <= 0 if name != "max_subcalls" else value < 0):
                raise RecallmError(f"{where}.{name} must be positive (or null for no cap), got {value}")
        return limits


class Budget:
    """A task's running totals against its ``BudgetLimits`` (thread-safe; see module doc)."""

    def __init__(self, limits: BudgetLimits | None = None, *, clock=time.monotonic) -> None:
        self.limits = limits or BudgetLimits()
        self._clock = clock
        self.started = clock()
        self._lock = threading.Lock()
        self.tokens = 0
        self.subcalls = 0
        self.reason: str | None = None

    # --- checks --------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return self._clock() - self.started

    def remaining_s(self) -> float | None:
        if self.limits.max_wall_s is None:
            return None
        return max(0.0, self.limits.max_wall_s - self.elapsed())

    def remaining_tokens(self) -> int | None:
        if self.limits.max_tokens is None:
            return None
        return max(0, self.limits.max_tokens - self.tokens)

    def _spent(self) -> str | None:
        limits = self.limits
        if self.reason is None:
            if limits.max_wall_s is not None and self.elapsed() >= limits.max_wall_s:
                self.reason = f"wall time reached max_wall_s={limits.max_wall_s:g}s"
            elif limits.max_tokens is not None and self.tokens >= limits.max_tokens:
                self.reason = f"{self.tokens} tokens reached max_tokens={limits.max_tokens}"
        return self.reason

    @property
    def exhausted(self) -> bool:
        with self._lock:
            return self._spent() is not None

    def check(self) -> None:
        """Raise ``BudgetExhausted`` if a cap is reached."""
        with self._lock:
            reason = self._spent()
        if reason is not None:
            raise BudgetExhausted(reason)

    def start_subcalls(self, n: int = 1) -> None:
        """Reserve ``n`` sub-calls about to start, all or none: raises (reserving none) when the
        budget is spent or the ``n`` would pass ``max_subcalls`` (which refuses, but does not
        spend the budget: see module doc)."""
        with self._lock:
            reason = self._spent()
            cap = self.limits.max_subcalls
            if reason is None and cap is not None and self.subcalls + n > cap:
                reason = f"{self.subcalls} sub-calls made, {n} more asked, max_subcalls={cap}"
            if reason is not None:
                raise BudgetExhausted(reason)
            self.subcalls += n

    def charge(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            self.tokens += max(0, int(prompt_tokens)) + max(0, int(completion_tokens))

    def cap_new_tokens(self, wanted: int | None) -> int | None:
        """``wanted`` cut to the tokens left (at least 1; ``check`` refuses a spent budget);
        ``None`` (no per-call limit: a server's own default) stays ``None``."""
        left = self.remaining_tokens()
        if wanted is None or left is None:
            return wanted
        return max(1, min(wanted, left))

    def timeout(self, wanted: float | None) -> float | None:
        """``wanted`` seconds cut to the wall time left."""
        left = self.remaining_s()
        if left is None:
            return wanted
        return left if wanted is None else min(wanted, left)

    def usage(self) -> dict[str, Any]:
        with self._lock:
            return {
                "tokens": self.tokens,
                "subcalls": self.subcalls,
                "wall_s": round(self.elapsed(), 3),
                "exhausted": self.reason,
            }
