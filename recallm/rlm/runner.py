"""The RLM root loop (Zhang, Kraska & Khattab, 2025): the prompt lives in a REPL, not in the model.

``RLM.run(context, query)`` answers one task:

1. the context is loaded into a fresh sandboxed REPL (``recallm.rlm.sandbox``) as ``context``;
   the root model reads only its metadata (type, length, a short preview) and the query, with the
   first-turn safeguard (``prompts``);
2. each turn the root writes a message; its code blocks run in order in the REPL and what they
   print, cut to ``max_observation_chars`` per block, followed by a reminder of the query, is the
   next user message. Syntax errors, exceptions and cell timeouts are observations, not crashes;
3. the run ends with a final answer: ``FINAL(x)`` / ``FINAL_VAR(name)`` written on a line of its
   own outside code (read *after* the message's code ran, so an answer computed in the same
   message is found), or called in code. One rule for both: a FINAL is refused, and the root told
   why, when a code block of that message failed, when it was cut off before its closing
   parenthesis, or when ``FINAL_VAR`` names no variable. A plain-text reply with neither code
   nor FINAL is nudged ``plain_text_retries`` times, then taken as the answer (outcome
   ``plain_text``). An empty reply, or one cut off at the token limit before any code (a reasoning
   model that spent its output budget thinking), is never taken as an answer;
4. after ``max_iterations`` turns without an answer, one last call shows the last turn's output
   and asks for the final answer (``FINAL``, ``FINAL_VAR``, or its plain text): outcome
   ``max_iterations``. When the task's ``Budget`` (tokens or wall time) is spent, the run ends
   (outcome ``budget_exhausted``). In both cases the REPL variable ``answer_var`` is the answer
   if nothing else is. A root model that fails (a server that is down, a prompt that no longer
   fits) ends it with outcome ``error`` and its message.

Depth (``max_depth`` 0-3): at depth 0 the REPL has no sub-calls; at depth 1 ``llm_query`` and
``llm_query_batched`` call the sub-model; with ``max_depth`` >= 2 ``rlm_query(context, query)``
starts a child RLM (its own REPL, the sub-model as its root, one level deeper, the same
budget), and at the last level it falls back to a plain sub-call of ``context`` + ``query``.

What the levels of one task share (``_Task``): the budget, one ``CallPool`` that every model call
goes through (children's turns and sub-calls: at most ``pool_size`` at once; the top-level
root's own turn is charged and cancelled there too, but takes no slot), the
count of live REPLs (at most ``max_repls``: a recursive call waits for one, and when every live
REPL belongs to a level that is itself waiting on recursive calls - no REPL can come free - it is
answered by a plain sub-call instead, recorded as a ``fallback``), and a cancel token: when the
run ends, every call still in flight is cancelled and waited for (``CallPool.drain``), so the
usage it reports is complete. A batch of recursive calls is reserved in the budget whole (or
refused whole) and keeps the answers of the children that finished when others fail.

``RootSession`` drives the same loop from outside, turn by turn (verl's agent loop generates the
root's turns itself: ``recallm.rlm.train``). Every event goes to the trajectory
(``recallm.rlm.trajectory``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recallm import cancel as _cancel
from recallm.cancel import Cancelled, CancelToken
from recallm.config import MAX_CHARS, MAX_COUNT, MAX_RETRIES, MAX_SECONDS, MAX_TOKENS, typed
from recallm.errors import RecallmError
from recallm.rlm import prompts
from recallm.rlm.budget import Budget, BudgetExhausted, BudgetLimits
from recallm.rlm.models import ChatModel, Reply
from recallm.rlm.sandbox import ISOLATION_MODES, Isolation, Sandbox, SandboxLimits, resolve_isolation
from recallm.rlm.subcalls import ERROR_PREFIX, CallPool, SubCallError, SubCallExecutor, SubCallSettings
from recallm.rlm.trajectory import TrajectoryWriter, preview

__all__ = ["RLMSettings", "RLMResult", "RLM", "RootSession", "Step", "OUTCOMES", "MAX_DEPTH", "initial_messages"]

log = logging.getLogger(__name__)

OUTCOMES = ("final", "plain_text", "max_iterations", "budget_exhausted", "error")
MAX_DEPTH = 3


@dataclass(frozen=True)
class RLMSettings:
    """The root loop's settings (see module doc)."""

    max_depth: int = 1
    """0: REPL only; 1: llm_query sub-calls; 2-3: rlm_query recursion"""
    max_iterations: int = field(default=20, metadata={"max": MAX_COUNT})
    """root turns per RLM instance (the paper's runs: 20)"""
    max_observation_chars: int = field(default=20_000, metadata={"max": MAX_CHARS})
    """characters of each block's output the root reads (the paper's implementation: 20,000)"""
    preview_chars: int = field(default=400, metadata={"max": MAX_CHARS})
    """characters of the context shown to the root"""
    root_max_new_tokens: int | None = field(default=2048, metadata={"max": MAX_TOKENS})
    """tokens per root turn (null: no limit sent to a server; a local engine's max_new_tokens)"""
    root_timeout_s: float | None = field(default=None, metadata={"max": MAX_SECONDS})
    """seconds one root turn may take (None: only the task's wall budget)"""
    plain_text_retries: int = field(default=1, metadata={"max": MAX_RETRIES})
    """plain-text replies (no code, no FINAL) nudged before one is taken as the answer"""
    answer_var: str = "answer"
    """the REPL variable returned when nothing else answers"""
    child_model: str = "sub"
    """model of recursive rlm_query children: sub | root"""
    isolation: str = "bwrap"
    """bwrap (required) | auto | namespaces | none (see recallm.rlm.sandbox)"""
    site_packages: bool = True
    """let REPL code import the host's installed packages (read-only)"""
    trajectory_text_chars: int = field(default=4000, metadata={"min": 0, "max": MAX_CHARS})
    """longest sub-call prompt / answer kept in a trajectory"""

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | None, where: str = "rlm") -> RLMSettings:
        settings = typed(cls, cfg, where)  # (the fields' metadata ranges too)
        settings.check(where)
        return settings

    def check(self, where: str = "rlm") -> None:
        if not 0 <= self.max_depth <= MAX_DEPTH:
            raise RecallmError(f"{where}.max_depth must be in [0, {MAX_DEPTH}], got {self.max_depth}")
        for name in ("max_iterations", "max_observation_chars", "preview_chars", "root_max_new_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise RecallmError(f"{where}.{name} must be >= 1, got {value}")
        if self.plain_text_retries < 0:
            raise RecallmError(f"{where}.plain_text_retries must be >= 0, got {self.plain_text_retries}")
        if self.root_timeout_s is not None and self.root_timeout_s <= 0:
            raise RecallmError(f"{where}.root_timeout_s must be > 0 or null, got {self.root_timeout_s}")
        if not self.answer_var.isidentifier():
            raise RecallmError(f"{where}.answer_var must be a Python identifier, got {self.answer_var!r}")
        if self.child_model not in ("sub", "root"):
            raise RecallmError(f"{where}.child_model must be sub or root, got {self.child_model!r}")
        if self.isolation not in ISOLATION_MODES:
            raise RecallmError(f"{where}.isolation must be one of {', '.join(ISOLATION_MODES)}, got {self.isolation!r}")


@dataclass
class RLMResult:
    """How one RLM instance ended (see module doc for ``outcome``)."""

    answer: str | None
    outcome: str
    reason: str
    turns: int
    usage: dict[str, Any] = field(default_factory=dict)
    trajectory: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)


@dataclass
class Step:
    """What one root turn led to: ``result`` when the instance ended, else ``observation`` (the
    next user message; at the iteration limit, the request for the final answer, with
    ``final_call`` set)."""

    result: RLMResult | None = None
    observation: str | None = None
    final_call: bool = False


class _ReplSlots:
    """Live REPLs of a task (see module doc): a level holds one from start to close."""

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self._cond = threading.Condition()
        self._held: set[str] = set()
        self._waiting: dict[str, int] = {}  # holder -> recursive calls it is blocked on
        self.peak = 0

    def acquire(self, owner: str, cancel: CancelToken | None = None) -> bool:
        """Take a slot for ``owner`` (True), or False when none can come free: every holder is
        blocked on its own recursive calls."""
        remove = cancel.add_callback(self._wake) if cancel is not None else None
        try:
            with self._cond:
                while len(self._held) >= self.size:
                    if all(self._waiting.get(h, 0) > 0 for h in self._held):
                        return False
                    if cancel is not None and cancel.cancelled:
                        raise Cancelled(cancel.reason or "cancelled")
                    self._cond.wait()
                self._held.add(owner)
                self.peak = max(self.peak, len(self._held))
                return True
        finally:
            if remove is not None:
                remove()

    def release(self, owner: str) -> None:
        with self._cond:
            self._held.discard(owner)
            self._waiting.pop(owner, None)
            self._cond.notify_all()

    @contextlib.contextmanager
    def waiting(self, owner: str) -> Iterator[None]:
        """``owner`` is blocked on recursive calls meanwhile."""
        with self._cond:
            self._waiting[owner] = self._waiting.get(owner, 0) + 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._waiting[owner] -= 1
                self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


class _Task:
    """What the levels of one task share (see module doc)."""

    def __init__(self, rlm: RLM, writer: TrajectoryWriter, budget: Budget, task_id: str | None) -> None:
        self.rlm = rlm
        self.writer = writer
        self.budget = budget
        self.task_id = task_id
        self.token = CancelToken()
        self.pool = CallPool(rlm.subcall_settings.pool_size, budget)
        self.executor = SubCallExecutor(rlm.sub_model, rlm.subcall_settings, budget, self.pool)
        self.repls = _ReplSlots(rlm.subcall_settings.max_repls)
        self._children: dict[str, itertools.count] = {}
        self._lock = threading.Lock()

    def child_id(self, parent: str) -> str:
        with self._lock:
            counter = self._children.setdefault(parent, itertools.count(1))
            return f"{parent}.{next(counter)}"

    def finish(self) -> None:
        """Cancel what is still in flight and wait for it (its tokens are charged)."""
        self.token.cancel("the task has ended")
        left = self.pool.drain(self.rlm.subcall_settings.timeout_s)
        if left:
            log.warning("%d model call(s) still running after the task ended; their tokens are not counted", left)


class RLM:
    """A recursive language model (see module doc).

    ``root_model`` writes the root's turns; ``sub_model`` (default: the root model) answers
    sub-calls and, with ``child_model=sub``, is the root of recursive children. Raises
    ``RecallmError`` for bad settings and when ``isolation=bwrap`` is asked where bubblewrap is
    unavailable; failures while running are outcomes, not exceptions.
    """

    def __init__(
        self,
        root_model: ChatModel,
        sub_model: ChatModel | None = None,
        *,
        settings: RLMSettings | None = None,
        subcalls: SubCallSettings | None = None,
        sandbox: SandboxLimits | None = None,
        budget: BudgetLimits | None = None,
    ) -> None:
        self.root_model = root_model
        self.sub_model = sub_model or root_model
        self.settings = settings or RLMSettings()
        self.settings.check()
        self.subcall_settings = subcalls or SubCallSettings()
        self.sandbox_limits = sandbox or SandboxLimits()
        self.budget_limits = budget or BudgetLimits()
        self.isolation: Isolation = resolve_isolation(self.settings.isolation)

    def describe(self) -> dict[str, Any]:
        return {
            "rlm": asdict(self.settings),
            "subcalls": asdict(self.subcall_settings),
            "sandbox": asdict(self.sandbox_limits),
            "budget": asdict(self.budget_limits),
            "root_model": self.root_model.describe(),
            "sub_model": self.sub_model.describe(),
        }

    def run(
        self,
        context: Any,
        query: str | None = None,
        *,
        task_id: str | None = None,
        trajectory: str | Path | None = None,
    ) -> RLMResult:
        """Answer one task (see module doc); writes the trajectory to ``trajectory`` if given."""
        writer = TrajectoryWriter(trajectory, max_text_chars=self.settings.trajectory_text_chars)
        task = _Task(self, writer, Budget(self.budget_limits), task_id)
        level = _Level(task, context, query, depth=0, rlm_id="0", model=self.root_model, parent=None)
        try:
            result = level.run()
        finally:
            writer.close()
        result.trajectory = str(trajectory) if trajectory is not None else None
        result.events = writer.events
        return result

    def session(
        self,
        context: Any,
        query: str | None = None,
        *,
        task_id: str | None = None,
        trajectory: str | Path | None = None,
    ) -> RootSession:
        """A task whose root turns are generated by the caller (``RootSession``)."""
        return RootSession(self, context, query, task_id=task_id, trajectory=trajectory)


class RootSession:
    """One task, its root turns written by the caller: ``begin()`` gives the first messages,
    ``step(reply)`` runs a reply's code and says what comes next (``Step``), ``finish(reply)``
    reads the answer of the final call; ``close()`` ends it (cancelling what is in flight) and
    returns the ``RLMResult``. The caller's generations are charged to the task's budget as
    given in each ``Reply``. Sub-calls and recursion are the RLM's own (its sub-model)."""

    def __init__(
        self, rlm: RLM, context: Any, query: str | None, *, task_id: str | None, trajectory: str | Path | None
    ) -> None:
        self._writer = TrajectoryWriter(trajectory, max_text_chars=rlm.settings.trajectory_text_chars)
        self.task = _Task(rlm, self._writer, Budget(rlm.budget_limits), task_id)
        self.level = _Level(self.task, context, query, depth=0, rlm_id="0", model=rlm.root_model, parent=None)
        self.trajectory = trajectory
        self.result: RLMResult | None = None

    def begin(self) -> list[dict[str, str]]:
        """The system and first user messages; a ``RecallmError`` when the REPL cannot start."""
        started = self.level.begin()
        if isinstance(started, RLMResult):
            self.result = started
            raise RecallmError(started.reason)
        return [dict(m) for m in self.level.messages]

    def step(self, reply: Reply, latency_s: float = 0.0) -> Step:
        """Run the code of the root's next turn, ``reply``."""
        if self.result is not None:
            raise RecallmError("this RLM session has ended")
        self.task.budget.charge(reply.prompt_tokens, reply.completion_tokens)
        self.level.turn += 1
        step = self.level.step(reply, latency_s)
        if step.result is not None:
            self.result = step.result
        elif not step.final_call and self.task.budget.exhausted:
            self.result = self.level.end(
                None, "budget_exhausted", f"budget exhausted: {self.task.budget.reason}", self.level.turn
            )
            step = Step(result=self.result)
        return step

    def finish(self, reply: Reply | None) -> RLMResult:
        """The answer of the final call (``reply``; None when it could not be made)."""
        if self.result is None:
            if reply is not None:
                self.task.budget.charge(reply.prompt_tokens, reply.completion_tokens)
            self.result = self.level.finish_at_limit(reply)
        return self.result

    def stop(self, reason: str) -> RLMResult:
        """End the run early (the caller's own limit, such as a rollout's response length): the
        stored answer (``answer_var``), if any, is the answer; outcome ``budget_exhausted``."""
        if self.result is None:
            self.result = self.level.end(None, "budget_exhausted", reason, self.level.turn)
        return self.result

    def close(self) -> RLMResult:
        try:
            if self.result is None:
                self.result = self.level.end(None, "error", "the session was closed before the run ended", 0)
            self.level.close()
            self.task.finish()
        finally:
            self._writer.close()
        self.result.usage = self.task.budget.usage()
        self.result.trajectory = str(self.trajectory) if self.trajectory is not None else None
        self.result.events = self._writer.events
        return self.result


class _Level:
    """One RLM instance: its REPL, its conversation, its turns."""

    def __init__(
        self,
        task: _Task,
        context: Any,
        query: str | None,
        *,
        depth: int,
        rlm_id: str,
        model: ChatModel,
        parent: str | None,
        cancel: CancelToken | None = None,
        repl_held: bool = False,
    ) -> None:
        self.task = task
        self.rlm = task.rlm
        self.settings = task.rlm.settings
        self.context = context
        self.query = query
        self.depth = depth
        self.rlm_id = rlm_id
        self.model = model
        self.parent = parent
        self.cancel = cancel or task.token
        self._repl_held = repl_held
        self.turn = 0
        self.messages: list[dict[str, str]] = []
        self.sandbox: Sandbox | None = None
        self._plain_strikes = 0
        self._latency = 0.0
        max_depth = self.settings.max_depth
        self.llm = depth < max_depth
        self.recursive = depth + 1 < max_depth
        self.rlm_mode = "recursive" if self.recursive else ("fallback" if self.llm else "off")

    # --- trajectory ----------------------------------------------------------------------------

    def _event(self, name: str, /, **fields: Any) -> None:
        self.task.writer.write({"event": name, "rlm": self.rlm_id, "depth": self.depth, **fields})

    def _record(self, kind: str) -> Any:
        limit = self.task.writer.max_text_chars
        turn = self.turn

        def record(item: dict[str, Any]) -> None:
            item = dict(item)
            item["prompt"] = preview(item.get("prompt"), limit)
            item["response"] = preview(item.get("response"), limit)
            self._event("subcall", turn=turn, kind=kind, **item)

        return record

    # --- sub-calls from the REPL -----------------------------------------------------------------

    def on_call(self, kind: str, args: Mapping[str, Any]) -> Any:
        token = CancelToken([_cancel.current(), self.cancel])
        try:
            return self._route(kind, args, token)
        except Cancelled as exc:
            if self.task.budget.exhausted:
                raise BudgetExhausted(self.task.budget.reason or "spent") from None
            raise SubCallError(f"cancelled: {exc.reason}") from None
        finally:
            token.detach()

    def _route(self, kind: str, args: Mapping[str, Any], token: CancelToken) -> Any:
        executor = self.task.executor
        max_tokens = args.get("max_tokens")
        if kind in ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched") and not self.llm:
            raise SubCallError(f"{kind} is not available at max_depth={self.settings.max_depth}")
        if kind == "llm_query":
            return executor.query(str(args["prompt"]), max_tokens, on_record=self._record(kind), cancel=token)
        if kind == "llm_query_batched":
            return executor.query_batch(
                [str(p) for p in args["prompts"]], max_tokens, on_record=self._record(kind), cancel=token
            )
        if kind == "rlm_query":
            context, query = args["context"], str(args["query"])
            if not self.recursive:
                return executor.query(_fallback_prompt(context, query), on_record=self._record(kind), cancel=token)
            self.task.budget.start_subcalls(1)
            owner = self.task.child_id(self.rlm_id)
            with self.task.repls.waiting(self.rlm_id):
                if self.task.repls.acquire(owner, token):
                    return self._child(context, query, strict=True, cancel=token, owner=owner)
            return self._fallback([(context, query)], token, strict=True)[0]
        if kind == "rlm_query_batched":
            contexts, queries = list(args["contexts"]), [str(q) for q in args["queries"]]
            pairs = list(zip(contexts, queries, strict=True))
            if not self.recursive:
                return executor.query_batch(
                    [_fallback_prompt(c, q) for c, q in pairs], on_record=self._record(kind), cancel=token
                )
            return self._children(pairs, token)
        raise SubCallError(f"unknown sub-call {kind!r}")

    def _children(self, pairs: list[tuple[Any, str]], token: CancelToken) -> list[str]:
        """A batch of recursive calls: reserved whole; each child gets a REPL when one is free
        (one thread per running child), or falls back to a plain sub-call (module doc)."""
        if not pairs:
            return []
        self.task.budget.start_subcalls(len(pairs))
        answers: list[str | None] = [None] * len(pairs)
        fallbacks: list[int] = []
        with self.task.repls.waiting(self.rlm_id), ThreadPoolExecutor(
            max_workers=max(1, min(len(pairs), self.task.repls.size)), thread_name_prefix="rlm-child"
        ) as pool:
            futures = {}
            for index, (context, query) in enumerate(pairs):
                owner = self.task.child_id(self.rlm_id)
                try:
                    granted = self.task.repls.acquire(owner, token)
                except Cancelled as exc:
                    answers[index] = f"{ERROR_PREFIX}: cancelled: {exc.reason}]"
                    continue
                if not granted:
                    fallbacks.append(index)
                    continue
                futures[index] = pool.submit(self._child, context, query, strict=False, cancel=token, owner=owner)
            if fallbacks:
                done = self._fallback([pairs[i] for i in fallbacks], token, strict=False)
                for index, answer in zip(fallbacks, done, strict=True):
                    answers[index] = answer
            for index, future in futures.items():
                try:
                    answers[index] = future.result()
                except (BudgetExhausted, SubCallError, Cancelled, RecallmError) as exc:  # keep the siblings
                    answers[index] = f"{ERROR_PREFIX}: {exc}]"
        return [str(a) for a in answers]

    def _fallback(self, pairs: list[tuple[Any, str]], token: CancelToken, *, strict: bool) -> list[str]:
        """Recursive calls answered by plain sub-calls: no REPL can come free (module doc)."""
        reason = (
            f"no REPL free: all {self.task.repls.size} live REPLs (subcalls.max_repls) belong to levels waiting on "
            "their own recursive calls"
        )
        record = self._record("rlm_query")

        def note(item: dict[str, Any]) -> None:
            record({**item, "fallback": reason})

        prompts_ = [_fallback_prompt(c, q) for c, q in pairs]
        if strict:
            return [self.task.executor.query(prompts_[0], on_record=note, cancel=token, reserved=True)]
        return self.task.executor.query_batch(prompts_, on_record=note, cancel=token, reserved=True)

    def _child(
        self,
        context: Any,
        query: str,
        *,
        strict: bool,
        cancel: CancelToken,
        owner: str,
    ) -> str:
        task = self.task
        model = self.rlm.sub_model if self.settings.child_model == "sub" else self.rlm.root_model
        start = time.monotonic()
        level = _Level(
            task, context, query, depth=self.depth + 1, rlm_id=owner, model=model, parent=self.rlm_id,
            cancel=CancelToken([cancel, task.token]), repl_held=True,
        )  # fmt: skip
        result = level.run()
        self._event(
            "subcall",
            turn=self.turn,
            kind="rlm_query",
            child=owner,
            prompt=preview(query, task.writer.max_text_chars),
            prompt_chars=len(context) if isinstance(context, str) else len(json.dumps(context)),
            response=preview(result.answer, task.writer.max_text_chars),
            outcome=result.outcome,
            latency_s=round(time.monotonic() - start, 4),
            error=None if result.answer is not None else result.reason,
        )
        if result.answer is None:
            message = f"the recursive RLM {owner} ended without an answer ({result.outcome}: {result.reason})"
            if strict:
                if result.outcome == "budget_exhausted":
                    raise BudgetExhausted(result.reason.removeprefix("budget exhausted: "))
                raise SubCallError(message)
            return f"{ERROR_PREFIX}: {message}]"
        return result.answer

    # --- the loop --------------------------------------------------------------------------------

    def _functions(self) -> list[str]:
        if not self.llm:
            return []
        return ["llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched"]

    def begin(self) -> RLMResult | None:
        """Open the REPL and write the first messages; an ``RLMResult`` when the REPL cannot start."""
        settings = self.settings
        rlm = self.rlm
        if not self._repl_held:
            self._repl_held = self.task.repls.acquire(self.rlm_id)  # the root: the first, always granted
        self.messages = initial_messages(rlm, self.context, self.query, depth=self.depth)
        self._event(
            "start",
            task_id=self.task.task_id,
            parent=self.parent,
            query=self.query,
            context=dict(prompts.context_metadata(self.context, settings.preview_chars)),
            isolation=rlm.isolation.describe(),
            models={"root": self.model.describe(), "sub": rlm.sub_model.describe()},
            settings=rlm.describe() if self.depth == 0 else None,
            messages=self.messages,
        )
        try:
            self.sandbox = Sandbox(
                self.context,
                query=self.query,
                limits=rlm.sandbox_limits,
                isolation=rlm.isolation,
                functions=self._functions(),
                disabled_reason=f"sub-calls are off at max_depth={settings.max_depth}",
                on_call=self.on_call,
                site_packages=settings.site_packages,
            )
        except RecallmError as exc:
            self.close()
            return self.end(None, "error", str(exc), 0)
        return None

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        if self._repl_held:
            self.task.repls.release(self.rlm_id)
            self._repl_held = False

    def run(self) -> RLMResult:
        try:
            started = self.begin()
            if started is not None:
                return started
            return self._loop()
        finally:
            self.close()
            if self.depth == 0:
                self.task.finish()

    def _loop(self) -> RLMResult:
        budget = self.task.budget
        for turn in range(1, self.settings.max_iterations + 1):
            self.turn = turn
            if self.cancel.cancelled:
                return self.end(None, "error", f"cancelled: {self.cancel.reason}", turn - 1)
            reply = self._root_turn(self.messages)
            if isinstance(reply, RLMResult):
                return reply
            step = self.step(reply, self._latency)
            if step.result is not None:
                return step.result
            if step.final_call:
                return self.finish_at_limit(self._final_call())
            if budget.exhausted:
                return self.end(None, "budget_exhausted", f"budget exhausted: {budget.reason}", turn)
        raise AssertionError("unreachable: the last turn asks for the final answer")  # pragma: no cover

    def _root_turn(self, messages: list[dict[str, str]]) -> Reply | RLMResult:
        """One call of the root model; an ``RLMResult`` when the call ended the run."""
        budget = self.task.budget
        turn = self.turn
        try:
            budget.check()
            timeout = budget.timeout(self.settings.root_timeout_s)
            if timeout is not None and timeout <= 0:
                budget.check()
            start = time.monotonic()
            reply = self.task.pool.call(
                self.model,
                messages,
                max_new_tokens=budget.cap_new_tokens(self.settings.root_max_new_tokens),
                seed=turn,
                timeout=timeout,
                cancel=self.cancel,
                slot=self.depth > 0,
            )
            self._latency = time.monotonic() - start
            return reply
        except BudgetExhausted as exc:
            return self.end(None, "budget_exhausted", str(exc), turn - 1)
        except TimeoutError as exc:
            if budget.exhausted:
                return self.end(None, "budget_exhausted", f"budget exhausted: {budget.reason}", turn - 1)
            return self.end(None, "error", f"the root model did not answer: {exc}", turn - 1)
        except Cancelled as exc:
            return self.end(None, "error", f"cancelled: {exc.reason}", turn - 1)
        except Exception as exc:  # a backend that is down, a prompt that no longer fits, ...
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if not isinstance(exc, RecallmError):
                message = f"{type(exc).__name__}: {message}"
            return self.end(None, "error", f"root model failed: {message}", turn - 1)

    def step(self, reply: Reply, latency_s: float = 0.0) -> Step:
        """Run the code of the root's reply for turn ``self.turn`` (set by the caller) and read
        its FINAL (module doc)."""
        settings = self.settings
        budget = self.task.budget
        turn = self.turn
        last = turn >= settings.max_iterations
        visible = prompts.visible_text(reply.text)
        code = prompts.extract_code(visible)
        written = prompts.find_final(code.outside)
        cells: list[dict[str, Any]] = []
        code_final = None
        for block in code.blocks:  # cells cost no tokens: they run unless the wall time is spent
            left = budget.remaining_s()
            if left is not None and left <= 0:
                break
            result = self.sandbox.execute(
                prompts.name_final_var(block),
                wall_s=budget.timeout(self.rlm.sandbox_limits.wall_s),
                max_s=budget.remaining_s(),
            )
            cells.append({"code": block, **result.as_dict()})
            if result.final is not None:
                code_final = result.final
                break
        failed = any(c["error"] for c in cells)
        notes: list[str] = []
        if code.unclosed:
            notes.append(prompts.UNCLOSED_BLOCK)
        answer = outcome = how = None
        if code_final is not None or written is not None:
            kind = written.kind if (written is not None and code_final is None) else "FINAL"
            if failed:
                notes.append(f"{kind}(...) was not accepted: a code block of the same message failed.")
            elif code_final is not None:
                answer, outcome, how = code_final, "final", "FINAL called in code"
            elif not written.closed:
                notes.append(prompts.FINAL_CUT_OFF)
            elif written.kind == "FINAL":
                answer, outcome, how = written.value, "final", "FINAL"
            else:
                ok, value = self.sandbox.get(written.value)
                if ok:
                    answer, outcome, how = value, "final", f"FINAL_VAR({written.value})"
                else:
                    notes.append(f"FINAL_VAR({written.value}) was not accepted: {value}.")
        elif not code.blocks and not code.unclosed:
            if reply.finish_reason == "length" or not visible:  # cut off (or nothing) before any action
                notes.append(prompts.CUT_OFF_NUDGE if reply.finish_reason == "length" else prompts.NO_CODE_NUDGE)
            elif last or self._plain_strikes >= settings.plain_text_retries:
                answer, outcome, how = visible, "plain_text", "a reply without code or FINAL taken as the answer"
            else:
                self._plain_strikes += 1
                notes.append(prompts.NO_CODE_NUDGE)
        done = outcome is not None
        observation = None
        if not done:
            observation = prompts.observation(cells, settings.max_observation_chars) if cells else ""
            if notes:
                observation = (observation + "\n\n" if observation else "") + "\n".join(notes)
            tail = prompts.FINAL_ANSWER_REQUEST if last else prompts.turn_reminder(self.query)
            observation = ((observation + "\n\n") if observation else "") + tail
        self._event(
            "turn",
            turn=turn,
            reply=reply.text,
            visible=visible,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            latency_s=round(latency_s, 4),
            finish_reason=reply.finish_reason,
            cells=cells,
            final=how,
            notes=notes,
            observation=observation,
        )
        if done:
            return Step(result=self.end(answer, outcome, how, turn))
        self.messages.append({"role": "assistant", "content": visible})
        self.messages.append({"role": "user", "content": observation})
        return Step(observation=observation, final_call=last)

    def _final_call(self) -> Reply | None:
        """The one last call at the iteration limit (None when it cannot be made)."""
        if self.task.budget.exhausted or self.cancel.cancelled:
            return None
        self.turn = self.settings.max_iterations + 1
        reply = self._root_turn(self.messages)
        self.turn = self.settings.max_iterations
        return reply if isinstance(reply, Reply) else None

    def finish_at_limit(self, reply: Reply | None) -> RLMResult:
        """End at the iteration limit with the final call's answer (``reply``) if it has one."""
        n = self.settings.max_iterations
        reason = f"no final answer after {n} turns"
        answer = how = None
        if reply is not None:
            visible = prompts.visible_text(reply.text)
            code = prompts.extract_code(visible)
            written = prompts.find_final(code.outside, anywhere=True)
            if written is not None and written.closed and written.kind == "FINAL":
                answer, how = written.value, "FINAL"
            elif written is not None and written.closed and self.sandbox is not None:
                ok, value = self.sandbox.get(written.value)
                answer, how = (value, f"FINAL_VAR({written.value})") if ok else (None, None)
            elif written is None and not code.blocks and visible and reply.finish_reason != "length":
                answer, how = visible, "its plain text"
            self._event(
                "turn",
                turn=n + 1,
                final_call=True,
                reply=reply.text,
                visible=visible,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                latency_s=round(self._latency, 4),
                finish_reason=reply.finish_reason,
                cells=[],
                final=how,
                notes=[],
                observation=None,
            )
            reason += f"; the final call answered with {how}" if how else "; the final call gave no answer"
        return self.end(answer, "max_iterations", reason, n)

    def end(self, answer: str | None, outcome: str, reason: str, turns: int = 0) -> RLMResult:
        sandbox = self.sandbox
        if answer is None and sandbox is not None and sandbox.alive:
            ok, value = sandbox.get(self.settings.answer_var, timeout=5.0)
            if ok:
                answer = value
                reason += f"; returning the stored answer (variable {self.settings.answer_var!r})"
        if answer is None and outcome in ("max_iterations", "budget_exhausted"):
            reason += f"; no stored answer (variable {self.settings.answer_var!r} unset)"
        if self.depth == 0:
            self.task.finish()  # what is still in flight is cancelled and waited for: the usage is complete
        usage = self.task.budget.usage()
        self._event("end", outcome=outcome, reason=reason, answer=answer, turns=turns, usage=usage)
        return RLMResult(answer=answer, outcome=outcome, reason=reason, turns=turns, usage=usage)


def initial_messages(rlm: RLM, context: Any, query: str | None, *, depth: int = 0) -> list[dict[str, str]]:
    """The system and first user messages of an RLM instance at ``depth`` (see ``prompts``)."""
    settings = rlm.settings
    max_depth = settings.max_depth
    mode = "recursive" if depth + 1 < max_depth else ("fallback" if depth < max_depth else "off")
    system = prompts.system_prompt(
        llm_query=depth < max_depth,
        rlm_query=mode,
        max_observation_chars=settings.max_observation_chars,
        cell_wall_s=rlm.sandbox_limits.wall_s,
        max_iterations=settings.max_iterations,
        sub_context_chars=rlm.subcall_settings.max_prompt_chars,
        answer_var=settings.answer_var,
    )
    first = prompts.context_message(context, query, settings.preview_chars)
    return [{"role": "system", "content": system}, {"role": "user", "content": first}]


def _fallback_prompt(context: Any, query: str) -> str:
    text = context if isinstance(context, str) else json.dumps(context, ensure_ascii=False)
    return f"{text}\n\n{query}"
