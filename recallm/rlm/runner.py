"""The RLM root loop (Zhang, Kraska & Khattab, 2025): the prompt lives in a REPL, not in the model.

``RLM.run(context, query)`` answers one task:

1. the context is loaded into a fresh sandboxed REPL (``recallm.rlm.sandbox``) as ``context``;
   the root model reads only its metadata (type, length, a short preview; ``prompts``);
2. each turn the root writes a message; its code blocks run in order in the REPL and what they
   print, cut to ``max_observation_chars`` per block, is the next user message. Syntax errors,
   exceptions and cell timeouts are observations, not crashes;
3. the run ends with, in this order of precedence: ``FINAL(x)`` / ``FINAL_VAR(name)`` called in
   code; ``FINAL(...)`` / ``FINAL_VAR(...)`` written on a line of its own outside code (read
   *after* the message's code ran, so an answer computed in the same message is found; it is
   refused, and the root told why, when a block of that message failed or the variable does
   not exist); a plain-text reply with neither code nor FINAL - nudged ``plain_text_retries``
   times, then taken as the answer (outcome ``plain_text``). An empty reply, or one cut off at the
   token limit before any code (a reasoning model that spent its output budget thinking), is
   never taken as an answer: the root is told so and goes on;
4. limits end it otherwise: ``max_iterations`` turns (the last turn is told it is the last;
   outcome ``max_iterations``), or the task's ``Budget`` (outcome ``budget_exhausted``); in
   both cases the answer is the REPL variable ``answer_var`` if the root stored one there
   (the reason says so), else None. A root model that fails (a server that is down, a prompt
   that no longer fits) ends it with outcome ``error`` and its message.

Depth (``max_depth`` 0-3): at depth 0 the REPL has no sub-calls; at depth 1 ``llm_query`` and
``llm_query_batched`` call the sub-model; with ``max_depth`` >= 2 ``rlm_query(context, query)``
starts a child RLM (its own REPL, the sub-model as its root, one level deeper, the same
budget), and at the last level it falls back to a plain sub-call of ``context`` + ``query``.
Sub-calls run on the host (``recallm.rlm.subcalls``): batched ones concurrently on a bounded
pool, each with a timeout and retries. Every event goes to the trajectory
(``recallm.rlm.trajectory``).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recallm.clients import dataclass_values
from recallm.errors import RecallmError
from recallm.rlm import prompts
from recallm.rlm.budget import Budget, BudgetExhausted, BudgetLimits
from recallm.rlm.models import ChatModel
from recallm.rlm.sandbox import ISOLATION_MODES, Isolation, Sandbox, SandboxLimits, resolve_isolation
from recallm.rlm.subcalls import ERROR_PREFIX, SubCallError, SubCallExecutor, SubCallSettings, call_with_timeout
from recallm.rlm.trajectory import TrajectoryWriter, preview

__all__ = ["RLMSettings", "RLMResult", "RLM", "OUTCOMES", "MAX_DEPTH"]

log = logging.getLogger(__name__)

OUTCOMES = ("final", "plain_text", "max_iterations", "budget_exhausted", "error")
MAX_DEPTH = 3


@dataclass(frozen=True)
class RLMSettings:
    """The root loop's settings (see module doc)."""

    max_depth: int = 1
    """0: REPL only; 1: llm_query sub-calls; 2-3: rlm_query recursion"""
    max_iterations: int = 20
    """root turns per RLM instance"""
    max_observation_chars: int = 4000
    """characters of each block's output the root reads"""
    preview_chars: int = 400
    """characters of the context shown to the root"""
    root_max_new_tokens: int = 2048
    """tokens per root turn"""
    root_timeout_s: float | None = None
    """seconds one root turn may take (None: only the task's wall budget)"""
    plain_text_retries: int = 1
    """plain-text replies (no code, no FINAL) nudged before one is taken as the answer"""
    answer_var: str = "answer"
    """the REPL variable returned when a limit ends the run"""
    child_model: str = "sub"
    """model of recursive rlm_query children: sub | root"""
    isolation: str = "bwrap"
    """bwrap (required) | auto | namespaces | none (see recallm.rlm.sandbox)"""
    site_packages: bool = True
    """let REPL code import the host's installed packages (read-only)"""
    trajectory_text_chars: int = 4000
    """longest sub-call prompt / answer kept in a trajectory"""

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | None, where: str = "rlm") -> RLMSettings:
        settings = cls(**dataclass_values(cls, cfg, where))
        settings.check(where)
        return settings

    def check(self, where: str = "rlm") -> None:
        if not 0 <= self.max_depth <= MAX_DEPTH:
            raise RecallmError(f"{where}.max_depth must be in [0, {MAX_DEPTH}], got {self.max_depth}")
        for name in ("max_iterations", "max_observation_chars", "preview_chars", "root_max_new_tokens"):
            if getattr(self, name) < 1:
                raise RecallmError(f"{where}.{name} must be >= 1, got {getattr(self, name)}")
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


class _Task:
    """What the levels of one task share: budget, sub-call executor, trajectory, id counters."""

    def __init__(self, rlm: RLM, writer: TrajectoryWriter, budget: Budget, task_id: str | None) -> None:
        self.rlm = rlm
        self.writer = writer
        self.budget = budget
        self.task_id = task_id
        self.executor = SubCallExecutor(rlm.sub_model, rlm.subcall_settings, budget)
        self._children: dict[str, itertools.count] = {}
        self._lock = threading.Lock()

    def child_id(self, parent: str) -> str:
        with self._lock:
            counter = self._children.setdefault(parent, itertools.count(1))
            return f"{parent}.{next(counter)}"


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
        try:
            result = _Level(task, context, query, depth=0, rlm_id="0", model=self.root_model, parent=None).run()
        finally:
            writer.close()
        result.trajectory = str(trajectory) if trajectory is not None else None
        result.events = writer.events
        return result


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
        self.turn = 0
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
        executor = self.task.executor
        max_tokens = args.get("max_tokens")
        if kind in ("llm_query", "llm_query_batched") and not self.llm:
            raise SubCallError(f"{kind} is not available at max_depth={self.settings.max_depth}")
        if kind == "llm_query":
            return executor.query(str(args["prompt"]), max_tokens, on_record=self._record(kind))
        if kind == "llm_query_batched":
            return executor.query_batch([str(p) for p in args["prompts"]], max_tokens, on_record=self._record(kind))
        if kind in ("rlm_query", "rlm_query_batched") and not self.llm:
            raise SubCallError(f"{kind} is not available at max_depth={self.settings.max_depth}")
        if kind == "rlm_query":
            if not self.recursive:
                return executor.query(_fallback_prompt(args["context"], args["query"]), on_record=self._record(kind))
            return self._child(args["context"], str(args["query"]), strict=True)
        if kind == "rlm_query_batched":
            contexts, queries = list(args["contexts"]), [str(q) for q in args["queries"]]
            if not self.recursive:
                return executor.query_batch(
                    [_fallback_prompt(c, q) for c, q in zip(contexts, queries, strict=True)],
                    on_record=self._record(kind),
                )
            self.task.budget.start_subcalls(0)  # refuse at once when already spent
            workers = max(1, min(self.rlm.subcall_settings.pool_size, len(contexts)))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlm-child") as pool:
                return list(pool.map(lambda cq: self._child(*cq, strict=False), zip(contexts, queries, strict=True)))
        raise SubCallError(f"unknown sub-call {kind!r}")

    def _child(self, context: Any, query: str, *, strict: bool) -> str:
        task = self.task
        task.budget.start_subcalls(1)
        child_id = task.child_id(self.rlm_id)
        model = self.rlm.sub_model if self.settings.child_model == "sub" else self.rlm.root_model
        start = time.monotonic()
        result = _Level(task, context, query, depth=self.depth + 1, rlm_id=child_id, model=model, parent=self.rlm_id)
        result = result.run()
        self._event(
            "subcall",
            turn=self.turn,
            kind="rlm_query",
            child=child_id,
            prompt=preview(query, task.writer.max_text_chars),
            prompt_chars=len(context) if isinstance(context, str) else len(json.dumps(context)),
            response=preview(result.answer, task.writer.max_text_chars),
            outcome=result.outcome,
            latency_s=round(time.monotonic() - start, 4),
            error=None if result.answer is not None else result.reason,
        )
        if result.outcome == "budget_exhausted" and result.answer is None:
            raise BudgetExhausted(result.reason.removeprefix("budget exhausted: "))
        if result.answer is None:
            message = f"the recursive RLM {child_id} ended without an answer ({result.outcome}: {result.reason})"
            if strict:
                raise SubCallError(message)
            return f"{ERROR_PREFIX}: {message}]"
        return result.answer

    # --- the loop --------------------------------------------------------------------------------

    def _functions(self) -> list[str]:
        if not self.llm:
            return []
        return ["llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched"]

    def run(self) -> RLMResult:
        settings = self.settings
        rlm = self.rlm
        system = prompts.system_prompt(
            llm_query=self.llm,
            rlm_query=self.rlm_mode,
            max_observation_chars=settings.max_observation_chars,
            cell_wall_s=rlm.sandbox_limits.wall_s,
            max_iterations=settings.max_iterations,
            sub_context_chars=rlm.subcall_settings.max_prompt_chars,
            answer_var=settings.answer_var,
        )
        first = prompts.context_message(self.context, self.query, settings.preview_chars)
        if settings.max_iterations == 1:
            first += "\n\n" + prompts.LAST_TURN
        messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
        self._event(
            "start",
            task_id=self.task.task_id,
            parent=self.parent,
            query=self.query,
            context={k: v for k, v in prompts.context_metadata(self.context, settings.preview_chars).items()},
            isolation=rlm.isolation.describe(),
            models={"root": self.model.describe(), "sub": rlm.sub_model.describe()},
            settings=rlm.describe() if self.depth == 0 else None,
            messages=messages,
        )
        try:
            sandbox = Sandbox(
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
            return self._end(None, "error", str(exc), None)
        try:
            return self._loop(sandbox, messages)
        finally:
            sandbox.close()

    def _loop(self, sandbox: Sandbox, messages: list[dict[str, str]]) -> RLMResult:
        settings = self.settings
        budget = self.task.budget
        plain_strikes = 0
        for turn in range(1, settings.max_iterations + 1):
            self.turn = turn
            last = turn == settings.max_iterations
            try:
                budget.check()
                reply = self._root_turn(messages)
            except BudgetExhausted as exc:
                return self._end(None, "budget_exhausted", str(exc), sandbox, turns=turn - 1)
            except TimeoutError as exc:
                if budget.exhausted:
                    return self._end(None, "budget_exhausted", f"budget exhausted: {budget.reason}", sandbox, turn - 1)
                return self._end(None, "error", f"the root model did not answer: {exc}", sandbox, turns=turn - 1)
            except Exception as exc:  # a backend that is down, a prompt that no longer fits, ...
                message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                if not isinstance(exc, RecallmError):
                    message = f"{type(exc).__name__}: {message}"
                return self._end(None, "error", f"root model failed: {message}", sandbox, turns=turn - 1)
            visible = prompts.visible_text(reply.text)
            blocks, outside = prompts.extract_code(visible)
            written = prompts.find_final(outside)
            cells: list[dict[str, Any]] = []
            code_final = None
            for code in blocks:  # cells cost no tokens: they run unless the wall time is spent
                left = budget.remaining_s()
                if left is not None and left <= 0:
                    break
                result = sandbox.execute(code, wall_s=budget.timeout(self.rlm.sandbox_limits.wall_s))
                cells.append({"code": code, **result.as_dict()})
                if result.final is not None:
                    code_final = result.final
                    break
            notes: list[str] = []
            answer = outcome = how = None
            if code_final is not None:
                answer, outcome, how = code_final, "final", "FINAL called in code"
            elif written is not None:
                if any(c["error"] for c in cells):
                    notes.append(f"{written.kind}(...) was not accepted: a code block of the same message failed.")
                elif written.kind == "FINAL":
                    answer, outcome, how = written.value, "final", "FINAL"
                else:
                    ok, value = sandbox.get(written.value)
                    if ok:
                        answer, outcome, how = value, "final", f"FINAL_VAR({written.value})"
                    else:
                        notes.append(f"FINAL_VAR({written.value}) was not accepted: {value}.")
            elif not blocks:
                if reply.finish_reason == "length" or not visible:  # cut off (or nothing) before any action
                    notes.append(prompts.CUT_OFF_NUDGE if reply.finish_reason == "length" else prompts.NO_CODE_NUDGE)
                elif last or plain_strikes >= settings.plain_text_retries:
                    answer, outcome, how = visible, "plain_text", "a reply without code or FINAL taken as the answer"
                else:
                    plain_strikes += 1
                    notes.append(prompts.NO_CODE_NUDGE)
            done = outcome is not None
            observation = None
            if not done and not last:
                observation = prompts.observation(cells, settings.max_observation_chars) if cells else ""
                if notes:
                    observation = (observation + "\n\n" if observation else "") + "\n".join(notes)
                if turn + 1 == settings.max_iterations:
                    observation += "\n\n" + prompts.LAST_TURN
                observation = observation.strip()
            self._event(
                "turn",
                turn=turn,
                reply=reply.text,
                visible=visible,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                latency_s=round(self._latency, 4),
                finish_reason=reply.finish_reason,
                cells=cells,
                final=how,
                notes=notes,
                observation=observation,
            )
            if done:
                return self._end(answer, outcome, how, sandbox=None, turns=turn)
            if budget.exhausted:
                return self._end(None, "budget_exhausted", f"budget exhausted: {budget.reason}", sandbox, turns=turn)
            messages.append({"role": "assistant", "content": visible})
            messages.append({"role": "user", "content": observation})
        return self._end(
            None,
            "max_iterations",
            f"no final answer after {settings.max_iterations} turns",
            sandbox,
            settings.max_iterations,
        )

    def _root_turn(self, messages: list[dict[str, str]]):
        budget = self.task.budget
        settings = self.settings
        timeout = budget.timeout(settings.root_timeout_s)
        if timeout is not None and timeout <= 0:
            budget.check()
        max_new = budget.cap_new_tokens(settings.root_max_new_tokens)
        seed = self.turn
        start = time.monotonic()
        reply = call_with_timeout(
            lambda: self.model.complete([dict(m) for m in messages], max_new_tokens=max_new, seed=seed), timeout
        )
        self._latency = time.monotonic() - start
        budget.charge(reply.prompt_tokens, reply.completion_tokens)
        return reply

    def _end(self, answer: str | None, outcome: str, reason: str, sandbox: Sandbox | None, turns: int = 0) -> RLMResult:
        if answer is None and sandbox is not None and sandbox.alive:
            ok, value = sandbox.get(self.settings.answer_var, timeout=5.0)
            if ok:
                answer = value
                reason += f"; returning the stored answer (variable {self.settings.answer_var!r})"
        if answer is None and outcome in ("max_iterations", "budget_exhausted"):
            reason += f"; no stored answer (variable {self.settings.answer_var!r} unset)"
        usage = self.task.budget.usage()
        self._event("end", outcome=outcome, reason=reason, answer=answer, turns=turns, usage=usage)
        return RLMResult(answer=answer, outcome=outcome, reason=reason, turns=turns, usage=usage)


def _fallback_prompt(context: Any, query: str) -> str:
    text = context if isinstance(context, str) else json.dumps(context, ensure_ascii=False)
    return f"{text}\n\n{query}"
