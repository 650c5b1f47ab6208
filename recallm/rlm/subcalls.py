"""Plain sub-calls (``llm_query`` and its batched form) against the sub-model, on the host.

``SubCallExecutor`` is shared by every level of one task. Each prompt:

1. counts as one sub-call in the task's ``Budget`` (a batch is counted, and refused whole if it
   would pass ``max_subcalls``, before any of it starts);
2. is refused when longer than ``max_prompt_chars`` (the sub-model could not read it; model code
   gets an error asking it to split the prompt);
3. runs under a per-call timeout (cut to the task's remaining wall time), holding one of
   ``pool_size`` slots - a semaphore shared by the whole task, so nested batches never exceed it;
4. is retried ``retries`` times, with exponential backoff, after a timeout or any error other
   than a ``RecallmError`` (those - a prompt that does not fit, a refused key - fail every time);
5. is charged to the budget (prompt + completion tokens) and recorded (``on_record``).

A batch runs on a thread pool of ``min(pool_size, len(prompts))`` workers; its answers come
back in order, a prompt that failed for good as a string starting with ``[llm_query error``.
A single ``llm_query`` that fails raises instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from recallm.clients import dataclass_values
from recallm.errors import RecallmError
from recallm.rlm.budget import Budget, BudgetExhausted
from recallm.rlm.models import ChatModel
from recallm.rlm.prompts import visible_text

__all__ = ["SubCallSettings", "SubCallExecutor", "SubCallError", "call_with_timeout", "ERROR_PREFIX"]

ERROR_PREFIX = "[llm_query error"


class SubCallError(Exception):
    """A sub-call failed for good."""


@dataclass(frozen=True)
class SubCallSettings:
    """How sub-calls run."""

    pool_size: int = 16
    """concurrent model calls of a task (all batches and depths together)"""
    timeout_s: float = 300.0
    """seconds one attempt may take"""
    retries: int = 2
    """further attempts after a timeout or a transient error"""
    backoff_s: float = 0.5
    """first retry delay; doubles per retry"""
    max_new_tokens: int = 1024
    """tokens a sub-call may write (model code may ask for fewer)"""
    max_prompt_chars: int = 400_000
    """longest prompt a sub-call accepts (the sub-model's window, in characters)"""

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | None, where: str = "subcalls") -> SubCallSettings:
        settings = cls(**dataclass_values(cls, cfg, where))
        for name in ("pool_size", "timeout_s", "max_new_tokens", "max_prompt_chars"):
            if getattr(settings, name) <= 0:
                raise RecallmError(f"{where}.{name} must be > 0, got {getattr(settings, name)}")
        if settings.retries < 0 or settings.backoff_s < 0:
            raise RecallmError(f"{where}.retries and {where}.backoff_s must be >= 0")
        return settings


def call_with_timeout(fn: Callable[[], Any], timeout: float | None) -> Any:
    """``fn()`` on a daemon thread; ``TimeoutError`` if it has not returned after ``timeout``
    seconds (the thread is abandoned: a model call cannot be interrupted from outside)."""
    if timeout is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name="rlm-call", daemon=True)
    thread.start()
    thread.join(max(0.0, timeout))
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout:.3g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


#: ``on_record(record)``: one dict per finished sub-call (see ``recallm.rlm.trajectory``)
Recorder = Callable[[dict[str, Any]], None]


class SubCallExecutor:
    """Runs plain sub-calls for one task (see module doc)."""

    def __init__(
        self,
        model: ChatModel,
        settings: SubCallSettings,
        budget: Budget,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.model = model
        self.settings = settings
        self.budget = budget
        self.slots = threading.BoundedSemaphore(settings.pool_size)
        self._sleep = sleep

    def _attempt(self, prompt: str, max_new_tokens: int, seed: int):
        self.budget.check()
        timeout = self.budget.timeout(self.settings.timeout_s)
        if timeout is not None and timeout <= 0:
            self.budget.check()
            raise BudgetExhausted("no wall time left for a sub-call")
        new_tokens = self.budget.cap_new_tokens(max_new_tokens)
        messages = [{"role": "user", "content": prompt}]
        with self.slots:
            return call_with_timeout(
                lambda: self.model.complete(messages, max_new_tokens=new_tokens, seed=seed), timeout
            )

    def _run(self, prompt: str, max_tokens: int | None, seed: int, record: dict[str, Any]) -> str:
        """One counted prompt -> its answer, filling ``record``; raises ``SubCallError`` /
        ``BudgetExhausted`` / ``RecallmError``."""
        settings = self.settings
        record.update(prompt_chars=len(prompt), attempts=0, error=None)
        start = time.monotonic()
        wanted = (
            settings.max_new_tokens if max_tokens is None else max(1, min(int(max_tokens), settings.max_new_tokens))
        )
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
                    reply = self._attempt(prompt, wanted, seed + attempt)
                except (BudgetExhausted, RecallmError):
                    raise
                except Exception as exc:  # transient: a timeout, a dropped connection, a server error
                    last = exc
                    if attempt < settings.retries:
                        delay = settings.backoff_s * 2**attempt
                        left = self.budget.remaining_s()
                        if left is not None and delay >= left:
                            break
                        self._sleep(delay)
                    continue
                self.budget.charge(reply.prompt_tokens, reply.completion_tokens)
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
        except (SubCallError, BudgetExhausted, RecallmError) as exc:
            record["error"] = str(exc)
            raise
        finally:
            record["latency_s"] = round(time.monotonic() - start, 4)

    def query(self, prompt: str, max_tokens: int | None = None, *, seed: int = 0, on_record: Recorder | None = None):
        """One sub-call: the sub-model's answer; raises ``SubCallError`` or ``BudgetExhausted``."""
        self.budget.start_subcalls(1)
        record: dict[str, Any] = {}
        try:
            return self._run(prompt, max_tokens, seed, record)
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
    ) -> list[str]:
        """Many sub-calls at once (see module doc); answers in order."""
        prompts = list(prompts)
        if not prompts:
            return []
        self.budget.start_subcalls(len(prompts))

        def one(index: int) -> str:
            record: dict[str, Any] = {"index": index}
            try:
                return self._run(prompts[index], max_tokens, seed + 1000 * index, record)
            except (SubCallError, BudgetExhausted, RecallmError) as exc:
                return f"{ERROR_PREFIX}: {exc}]"
            finally:
                if on_record is not None:
                    on_record({"prompt": prompts[index], **record})

        workers = max(1, min(self.settings.pool_size, len(prompts)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlm-batch") as pool:
            return list(pool.map(one, range(len(prompts))))
