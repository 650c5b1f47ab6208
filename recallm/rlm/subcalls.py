"""Model calls of one task on the host: the shared pool (``CallPool``) and plain sub-calls
(``llm_query`` and its batched form, ``SubCallExecutor``).

``CallPool`` is the one gate every model call of a task goes through - the root's turns, the
root turns of recursive children and every sub-call, at every depth:

* at most ``pool_size`` calls run at once, besides the top-level root's own turn (one at a time,
  made while none of its cells runs: it takes no slot, so calls abandoned by its cells cannot
  starve it). A call holds its slot until the model has actually
  returned, even when its caller stopped waiting (a timeout, a cancelled cell): an abandoned
  call that keeps running keeps counting against the bound;
* every call is charged to the task's ``Budget`` when it returns, whether or not anyone still
  waits for it, so every token spent is counted (a call the model stopped part-way after a
  cancellation is charged what it spent: ``recallm.cancel``);
* a caller waits (for a slot, then for the answer) at most its ``timeout`` and no longer than its
  ``CancelToken`` is unset; when it gives up, the call's own token is cancelled, so the model can
  drop or stop it (``recallm.rlm.models``).

``drain()`` waits for the calls still running (the end of a task), so that the usage a task
reports is complete.

``SubCallExecutor`` (shared by every level of one task) runs the prompts of ``llm_query``. Each:

1. counts as one sub-call in the task's ``Budget`` (a batch is reserved whole, or refused whole
   if it would pass ``max_subcalls``, before any of it starts);
2. is refused when longer than ``max_prompt_chars`` (the sub-model could not read it; model code
   gets an error asking it to split the prompt);
3. runs through the pool under a per-attempt timeout (cut to the task's remaining wall time);
4. is retried ``retries`` times, with exponential backoff, after a timeout or any error other
   than a ``RecallmError`` (those - a prompt that does not fit, a refused key - fail every time)
   and other than a cancellation (the caller is gone);
5. is recorded (``on_record``).

A batch runs its prompts concurrently (they are all in the pool's queue at once, so an
in-process engine generates them as one batch); its answers come back in order, a prompt that
failed for good as a string starting with ``[llm_query error``. A single ``llm_query`` that fails
raises instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from recallm.cancel import Cancelled, CancelToken
from recallm.config import MAX_CHARS, MAX_RETRIES, MAX_SECONDS, MAX_TOKENS, MAX_WORKERS, typed
from recallm.errors import RecallmError
from recallm.rlm.budget import Budget, BudgetExhausted
from recallm.rlm.models import ChatModel, Reply
from recallm.rlm.prompts import visible_text

__all__ = ["SubCallSettings", "SubCallExecutor", "SubCallError", "CallPool", "ERROR_PREFIX"]

ERROR_PREFIX = "[llm_query error"


class SubCallError(Exception):
    """A sub-call failed for good."""


@dataclass(frozen=True)
class SubCallSettings:
    """How sub-calls run."""

    pool_size: int = field(default=16, metadata={"max": MAX_WORKERS})
    """model calls of a task at once (root turns and sub-calls, all depths together)"""
    timeout_s: float = field(default=300.0, metadata={"max": MAX_SECONDS})
    """seconds one attempt may take (waiting for a pool slot included)"""
    retries: int = field(default=2, metadata={"max": MAX_RETRIES})
    """further attempts after a timeout or a transient error"""
    backoff_s: float = field(default=0.5, metadata={"max": MAX_SECONDS})
    """first retry delay; doubles per retry"""
    max_new_tokens: int | None = field(default=1024, metadata={"max": MAX_TOKENS})
    """tokens a sub-call may write (model code may ask for fewer); null: no limit is sent"""
    max_prompt_chars: int = field(default=400_000, metadata={"max": MAX_CHARS})
    """longest prompt a sub-call accepts (the sub-model's window, in characters)"""
    max_repls: int = field(default=16, metadata={"max": MAX_WORKERS})
    """live REPL processes of a task (the root's included); a recursive call that finds none free
    while every live one waits on its own recursive calls is answered by a plain sub-call"""

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | None, where: str = "subcalls") -> SubCallSettings:
        settings = typed(cls, cfg, where)  # (the fields' metadata ranges too)
        for name in ("pool_size", "timeout_s", "max_new_tokens", "max_prompt_chars", "max_repls"):
            value = getattr(settings, name)
            if value is not None and value <= 0:
                raise RecallmError(f"{where}.{name} must be > 0, got {value}")
        if settings.retries < 0 or settings.backoff_s < 0:
            raise RecallmError(f"{where}.retries and {where}.backoff_s must be >= 0")
        return settings


class CallPool:
    """The model calls of one task (see module doc). Thread-safe."""

    def __init__(self, size: int, budget: Budget) -> None:
        if size < 1:
            raise RecallmError(f"pool size must be >= 1, got {size}")
        self.size = int(size)
        self.budget = budget
        self._cond = threading.Condition()
        self.active = 0  # calls holding a slot (running, or abandoned but still running)
        self.peak = 0
        self.abandoned = 0  # calls whose caller gave up before they returned
        self.unslotted = 0  # running calls that take no slot

    def call(
        self,
        model: ChatModel,
        messages: Sequence[Mapping[str, str]],
        *,
        max_new_tokens: int | None,
        seed: int = 0,
        timeout: float | None = None,
        cancel: CancelToken | None = None,
        slot: bool = True,
    ) -> Reply:
        """One model call: ``TimeoutError`` when no slot or no answer came within ``timeout``,
        ``Cancelled`` when ``cancel`` was set first, or what the model raised. ``slot=False``:
        the call does not take a slot (the top-level root's own turn: see module doc)."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        if slot:
            self._acquire(deadline, timeout, cancel)
        else:
            with self._cond:
                self.unslotted += 1
        own = CancelToken([cancel])
        done, wake = threading.Event(), threading.Event()  # wake: done, or the caller gave up
        box: dict[str, Any] = {}
        messages = [dict(m) for m in messages]

        def run() -> None:
            try:
                reply = model.complete(messages, max_new_tokens=max_new_tokens, seed=seed, cancel=own)
                self.budget.charge(reply.prompt_tokens, reply.completion_tokens)
                box["reply"] = reply
            except BaseException as exc:  # handed to the caller, if it still waits
                if isinstance(exc, Cancelled):  # stopped part-way: what it spent is charged all the same
                    self.budget.charge(exc.prompt_tokens, exc.completion_tokens)
                box["error"] = exc
            finally:
                own.detach()
                with self._cond:
                    if slot:
                        self.active -= 1
                    else:
                        self.unslotted -= 1
                    self._cond.notify_all()
                done.set()
                wake.set()

        remove = cancel.add_callback(wake.set) if cancel is not None else None
        threading.Thread(target=run, name="rlm-model-call", daemon=True).start()
        try:
            wake.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        finally:
            if remove is not None:
                remove()
        if done.is_set():
            if "error" in box:
                raise box["error"]
            return box["reply"]
        with self._cond:
            self.abandoned += 1
        if cancel is not None and cancel.cancelled:
            reason = cancel.reason or "cancelled"
            own.cancel(reason)
            raise Cancelled(reason)
        own.cancel(f"no answer within {timeout:.3g}s")
        raise TimeoutError(f"no answer within {timeout:.3g}s")

    def _acquire(self, deadline: float | None, timeout: float | None, cancel: CancelToken | None) -> None:
        remove = cancel.add_callback(self._wake) if cancel is not None else None
        try:
            with self._cond:
                while self.active >= self.size:
                    if cancel is not None and cancel.cancelled:
                        raise Cancelled(cancel.reason or "cancelled")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"no free model slot within {timeout:.3g}s (pool of {self.size})")
                    self._cond.wait(left)
                if cancel is not None and cancel.cancelled:
                    raise Cancelled(cancel.reason or "cancelled")
                self.active += 1
                self.peak = max(self.peak, self.active)
        finally:
            if remove is not None:
                remove()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def drain(self, timeout: float | None) -> int:
        """Wait until no call is running (at most ``timeout`` seconds); the calls still running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.active or self.unslotted:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return self.active + self.unslotted


#: ``on_record(record)``: one dict per finished sub-call (see ``recallm.rlm.trajectory``)
Recorder = Callable[[dict[str, Any]], None]


class SubCallExecutor:
    """Runs plain sub-calls for one task (see module doc)."""

    def __init__(
        self,
        model: ChatModel,
        settings: SubCallSettings,
        budget: Budget,
        pool: CallPool | None = None,
    ) -> None:
        self.model = model
        self.settings = settings
        self.budget = budget
        self.pool = pool or CallPool(settings.pool_size, budget)

    def _attempt(self, prompt: str, max_new_tokens: int | None, seed: int, cancel: CancelToken | None) -> Reply:
        self.budget.check()
        timeout = self.budget.timeout(self.settings.timeout_s)
        if timeout is not None and timeout <= 0:
            self.budget.check()
            raise BudgetExhausted("no wall time left for a sub-call")
        messages = [{"role": "user", "content": prompt}]
        return self.pool.call(
            self.model,
            messages,
            max_new_tokens=self.budget.cap_new_tokens(max_new_tokens),
            seed=seed,
            timeout=timeout,
            cancel=cancel,
        )

    def _run(
        self, prompt: str, max_tokens: int | None, seed: int, record: dict[str, Any], cancel: CancelToken | None
    ) -> str:
        """One counted prompt -> its answer, filling ``record``; raises ``SubCallError`` /
        ``BudgetExhausted`` / ``RecallmError`` / ``Cancelled``."""
        settings = self.settings
        record.update(prompt_chars=len(prompt), attempts=0, error=None)
        start = time.monotonic()
        wanted = settings.max_new_tokens
        if max_tokens is not None:
            wanted = max(1, int(max_tokens)) if wanted is None else max(1, min(int(max_tokens), wanted))
        try:
            if len(prompt) > settings.max_prompt_chars:
                raise SubCallError(
                    f"the prompt has {len(prompt):,} characters, more than the sub-model reads "
                    f"({settings.max_prompt_chars:,}); split it into smaller chunks"
                )
            last: Exception | None = None
            for attempt in range(settings.retries + 1):
                record["attempts"] = attempt + 1
                try:
                    reply = self._attempt(prompt, wanted, seed + attempt, cancel)
                except (BudgetExhausted, RecallmError, Cancelled):
                    raise
                except Exception as exc:  # transient: a timeout, a dropped connection, a server error
                    last = exc
                    if attempt < settings.retries:
                        delay = settings.backoff_s * 2**attempt
                        left = self.budget.remaining_s()
                        if left is not None and delay >= left:
                            break
                        if cancel is not None and cancel.wait(delay):
                            raise Cancelled(cancel.reason or "cancelled") from None
                        if cancel is None and delay:
                            time.sleep(delay)
                    continue
                record.update(
                    prompt_tokens=reply.prompt_tokens,
                    completion_tokens=reply.completion_tokens,
                    finish_reason=reply.finish_reason,
                )
                text = visible_text(reply.text)
                record["response"] = text
                return text
            detail = f"{type(last).__name__}: {last}" if last is not None else "no attempt"
            raise SubCallError(f"failed after {record['attempts']} attempt(s): {detail}")
        except (SubCallError, BudgetExhausted, RecallmError, Cancelled) as exc:
            record["error"] = f"cancelled: {exc}" if isinstance(exc, Cancelled) else str(exc)
            raise
        finally:
            record["latency_s"] = round(time.monotonic() - start, 4)

    def query(
        self,
        prompt: str,
        max_tokens: int | None = None,
        *,
        seed: int = 0,
        on_record: Recorder | None = None,
        cancel: CancelToken | None = None,
        reserved: bool = False,
    ) -> str:
        """One sub-call: the sub-model's answer; raises ``SubCallError``, ``BudgetExhausted`` or
        ``Cancelled``. ``reserved``: the caller has already counted it in the budget."""
        if not reserved:
            self.budget.start_subcalls(1)
        record: dict[str, Any] = {}
        try:
            return self._run(prompt, max_tokens, seed, record, cancel)
        finally:
            if on_record is not None:
                on_record({"prompt": prompt, **record})

    def query_batch(
        self,
        prompts: Sequence[str],
        max_tokens: int | None = None,
        *,
        seed: int = 0,
        on_record: Recorder | None = None,
        cancel: CancelToken | None = None,
        reserved: bool = False,
    ) -> list[str]:
        """Many sub-calls at once (see module doc); answers in order. ``reserved``: the caller has
        already counted them in the budget."""
        prompts = list(prompts)
        if not prompts:
            return []
        if not reserved:
            self.budget.start_subcalls(len(prompts))

        def one(index: int) -> str:
            record: dict[str, Any] = {"index": index}
            try:
                return self._run(prompts[index], max_tokens, seed + 1000 * index, record, cancel)
            except (SubCallError, BudgetExhausted, RecallmError, Cancelled) as exc:
                return f"{ERROR_PREFIX}: {exc}]"
            finally:
                if on_record is not None:
                    on_record({"prompt": prompts[index], **record})

        if len(prompts) == 1:
            return [one(0)]
        # one thread per prompt (bounded by the pool's size): all of them wait in the pool at once
        workers = max(1, min(self.pool.size, len(prompts)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlm-batch") as pool:
            return list(pool.map(one, range(len(prompts))))
