"""The models an RLM calls: the evaluation backends behind one small chat interface.

``ChatModel.complete(messages, max_new_tokens=..., seed=..., cancel=...)`` returns a ``Reply``
(text, prompt and completion tokens, finish reason). ``max_new_tokens=None`` means no per-call
limit: a server gets none (its own default), a local engine uses its section's
``max_new_tokens``. ``cancel`` (a ``recallm.cancel.CancelToken``) tells the model its caller
gave up: a request that has not started is dropped (``Cancelled``); one already running is
stopped (HF: its batch row ends at the next token; vLLM's in-process engine: the request is
aborted in the engine before its next step; a server: the HTTP request is aborted) and raises
``Cancelled`` carrying the tokens it spent (see ``recallm.cancel``). Implementations:

* ``BackendModel`` - an in-process engine of ``recallm.eval.backends`` (``hf``: transformers
  ``generate``, optionally a RecaLLM model with constrained recall; ``vllm``). Messages are
  rendered with the tokenizer's chat template. Requests that arrive together (within 5 ms of
  each other) or while the engine is busy queue up and go to the engine together, as one
  ``generate`` call (one batch for HF - the
  backend splits it by its ``batch_size`` - and one submission for vLLM, which schedules them
  together): concurrent sub-calls run as a batch, not one after another, and a cancelled request
  still in the queue never reaches the engine. When the chat template's generation prompt opens
  a think block (RecaLLM models), the reply text starts with that ``<think>``, so that every
  reply carries its own reasoning markers.
* ``OpenAIChatModel`` - any OpenAI-compatible server, called concurrently through
  ``recallm.clients.ChatClient`` (its key read from the environment variable named in
  ``api_key_env``). A request carries only what the section configures (``temperature``,
  ``top_p``, ``top_k``, ``seed``, ``extra_body``) and a token limit only when the caller has one,
  under ``max_tokens_key`` (``max_tokens``, or ``max_completion_tokens`` for OpenAI's reasoning
  models, which reject the former and any temperature); the section's ``max_new_tokens`` is the
  limit of calls that have none of their own. Token counts are the server's
  (``usage``) when it reports them, else counted with ``tokenizer_path``'s tokenizer (or 4
  characters per token).
* ``ScriptedModel`` - deterministic replies (a list indexed by the conversation's turn, or a
  function of the messages), an optional fixed latency (cut short by cancellation) and scripted
  failures: what tests and ``bench/rlm_subcalls.py`` drive the runner with. It records every call
  that completed (``calls``), how many started and how many were cancelled.

``make_model(cfg, role)`` builds one from a config section (``configs/rlm.yaml``: ``root`` and
``sub``); the keys of the ``hf`` / ``vllm`` / ``openai`` kinds are those of ``recallm-eval``'s
``backend`` section, plus ``model_path``, ``tokenizer_path``, ``max_tokens_key`` and the sampling
settings.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recallm.cancel import Cancelled, CancelToken
from recallm.errors import RecallmError
from recallm.eval.backends import EngineSettings
from recallm.tokens import THINK_START

__all__ = [
    "Reply",
    "ChatModel",
    "BackendModel",
    "OpenAIChatModel",
    "ScriptedModel",
    "CallRecord",
    "MODEL_KINDS",
    "ModelSection",
    "make_model",
    "approx_tokens",
]

log = logging.getLogger(__name__)

MODEL_KINDS = ("hf", "vllm", "openai", "scripted")
_MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens")


@dataclass(frozen=True)
class ModelSection(EngineSettings):
    """The schema of a model section (``configs/rlm.yaml``'s ``root`` and ``sub``, ``backend.rlm.root``
    of ``recallm-eval``; ``recallm.config.typed``): how the model is run (the fields of
    ``recallm.eval.backends.EngineSettings``, the keys of ``recallm-eval``'s ``backend`` section),
    plus the keys below. The defaults live here and in ``EngineSettings``."""

    name: str | None = field(default=None, metadata={"choices": MODEL_KINDS})
    """hf | vllm | openai | scripted (required)"""
    recall_constrained: bool = False
    """hf/vllm: constrained recall (a RecaLLM model)"""
    batch_size: int = field(default=16, metadata={"min": 1})
    """hf: concurrent requests generated together (at most this many per batch)"""
    timeout: float = field(default=600.0, metadata={"min": 0})
    model_path: str | None = None
    """hf/vllm: a model directory, or ``tiny`` (default: the caller's)"""
    tokenizer_path: str | None = None
    """openai: a local tokenizer for exact token counts (None: 4 characters per token)"""
    max_new_tokens: int | None = field(default=None, metadata={"min": 1})
    """the limit of calls that have none of their own (hf/vllm: None is 1024; a server: none sent)"""
    max_tokens_key: str = field(default="max_tokens", metadata={"choices": _MAX_TOKENS_KEYS})
    """openai: max_completion_tokens for OpenAI's reasoning models"""
    temperature: float | None = None
    """None: not sent to a server (its default); greedy for hf/vllm"""
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    # scripted
    replies: list[str] | None = None
    """scripted: the replies, by the conversation's turn"""
    latency_s: float = field(default=0.0, metadata={"min": 0})
    continuation: str = ""

    def engine_values(self) -> dict[str, Any]:
        """The ``backend`` section of this model (``recallm.eval.backends.make_backend``)."""
        import dataclasses

        engine = {f.name for f in dataclasses.fields(EngineSettings)}
        return {"name": self.name, **{k: v for k, v in dataclasses.asdict(self).items() if k in engine}}


def approx_tokens(text: str) -> int:
    """A token count without a tokenizer: one token per four characters (rounded up)."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True)
class Reply:
    """One completion: its text, the tokens of its prompt and of itself, why it stopped."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"


class ChatModel(ABC):
    """A model that completes chat messages (see module doc)."""

    name: str = "model"

    @abstractmethod
    def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_new_tokens: int | None,
        seed: int = 0,
        cancel: CancelToken | None = None,
    ) -> Reply:
        """The assistant's next message after ``messages``."""

    def continue_text(self, prompt_text: str, prefix: str, *, max_new_tokens: int, seed: int = 0) -> Reply:
        """Continue rendered ``prompt_text + prefix`` (the lost-in-thought follow-up)."""
        raise RecallmError(f"model {self.name} cannot continue a rendered prompt")

    def count_tokens(self, text: str) -> int:
        return approx_tokens(text)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def close(self) -> None:  # noqa: B027 - optional
        pass


@dataclass(frozen=True)
class CallRecord:
    start: float
    end: float
    messages: tuple[Mapping[str, str], ...]
    reply: str = ""


class ScriptedModel(ChatModel):
    """Deterministic replies (see module doc).

    ``replies``: a list (the reply to a conversation with ``k`` assistant messages so far is
    ``replies[k]``, the last one repeating), or ``fn(messages) -> str`` (it may raise, to script
    a failing backend). ``latency_s`` is slept in every call, unless the call is cancelled first
    (then ``Cancelled`` is raised and ``cancelled`` counts it).
    """

    name = "scripted"

    def __init__(
        self,
        replies: Sequence[str] | Callable[[list[dict[str, str]]], str],
        *,
        latency_s: float = 0.0,
        continuation: str = "",
    ) -> None:
        if not callable(replies):
            replies = [str(r) for r in replies]
            if not replies:
                raise RecallmError("a scripted model needs at least one reply")
        self.replies = replies
        self.latency_s = float(latency_s)
        self.continuation = continuation
        self.calls: list[CallRecord] = []
        self.started = 0
        self.cancelled = 0
        self._lock = threading.Lock()

    def complete(self, messages, *, max_new_tokens: int | None, seed: int = 0, cancel=None) -> Reply:
        start = time.monotonic()
        messages = [dict(m) for m in messages]
        with self._lock:
            self.started += 1
        if self.latency_s:
            if cancel is not None:
                if cancel.wait(self.latency_s):
                    with self._lock:
                        self.cancelled += 1
                    raise Cancelled(cancel.reason or "cancelled")
            else:
                time.sleep(self.latency_s)
        if callable(self.replies):
            text = str(self.replies(messages))
        else:
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            text = self.replies[min(turn, len(self.replies) - 1)]
        prompt = sum(approx_tokens(m.get("content", "")) for m in messages)
        reason = "stop"
        if max_new_tokens is not None and approx_tokens(text) > max_new_tokens:  # as a real model would
            text, reason = text[: 4 * max_new_tokens], "length"
        with self._lock:
            self.calls.append(CallRecord(start, time.monotonic(), tuple(messages), text))
        return Reply(text, prompt, approx_tokens(text), reason)

    def continue_text(self, prompt_text: str, prefix: str, *, max_new_tokens: int, seed: int = 0) -> Reply:
        text = self.continuation[: 4 * max_new_tokens]
        return Reply(text, approx_tokens(prompt_text + prefix), approx_tokens(text))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "latency_s": self.latency_s}


class _ApproxTokenizer:
    """Stands in for a tokenizer where only counts are needed and none is at hand (a server)."""

    def __call__(self, text: str, add_special_tokens: bool = False, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": [0] * approx_tokens(text)}


class _Pending:
    __slots__ = ("request", "cancel", "done", "result", "error", "state")

    def __init__(self, request, cancel: CancelToken | None) -> None:
        self.request = request
        self.cancel = cancel
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None
        self.state = "queued"  # queued | running | dropped


def _stop_check(cancel: CancelToken | None) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    return lambda: cancel.cancelled


_CLOSE_TIMEOUT_S = 60.0  # how long close() waits for a running batch to stop


class _Batcher:
    """One engine user at a time; what queued up meanwhile goes to the engine as one call."""

    def __init__(
        self, generate: Callable[[list, list], list], max_batch: int, name: str, wait_s: float = 0.005
    ) -> None:
        self._generate = generate
        self._max_batch = max_batch
        self._wait_s = wait_s
        self._queue: list[_Pending] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._name = name
        self._closed = False

    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def submit(self, request, cancel: CancelToken | None):
        pending = _Pending(request, cancel)
        with self._cond:
            if self._closed:
                raise RecallmError(f"model {self._name} is closed")
            if cancel is not None and cancel.cancelled:
                raise Cancelled(cancel.reason or "cancelled")
            self._queue.append(pending)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name=f"rlm-engine-{self._name}", daemon=True)
                self._thread.start()
            self._cond.notify_all()

        def drop() -> None:
            with self._cond:
                if pending.state == "queued":
                    pending.state = "dropped"
                    self._queue.remove(pending)
                    pending.error = Cancelled(cancel.reason or "cancelled")
                    pending.done.set()

        remove = cancel.add_callback(drop) if cancel is not None else None
        try:
            pending.done.wait()  # a running request is waited for: the engine stops it, and what it spent is charged
        finally:
            if remove is not None:
                remove()
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed and not self._queue:
                    return
                while len(self._queue) < self._max_batch:  # requests that arrive together go together
                    seen = len(self._queue)
                    self._cond.wait(self._wait_s)
                    if len(self._queue) == seen:
                        break
                if not self._queue:  # all dropped meanwhile
                    continue
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                for pending in batch:
                    pending.state = "running"
            stops = [self._stop_check(p.cancel) for p in batch]
            try:
                results = self._generate([p.request for p in batch], stops)
            except BaseException as exc:  # every request of the batch fails with it; the engine stays up
                for pending in batch:
                    pending.error = exc
                    pending.done.set()
                continue
            for pending, result in zip(batch, results, strict=True):
                if getattr(result, "finish_reason", None) == "cancelled":  # stopped part-way: it spent n_tokens
                    reason = pending.cancel.reason if pending.cancel is not None else None
                    reason = reason or ("the model was closed" if self._closed else "cancelled")
                    error = Cancelled(reason, completion_tokens=result.n_tokens)
                    error.sent = True
                    pending.error = error
                else:
                    pending.result = result
                pending.done.set()

    def _stop_check(self, cancel: CancelToken | None) -> Callable[[], bool]:
        """A running request stops when it is cancelled or the model is closed."""
        cancelled = _stop_check(cancel)
        return lambda: self._closed or cancelled()

    def close(self, timeout: float = _CLOSE_TIMEOUT_S) -> None:
        """Drop what is queued, stop the running batch (at its next token, where the engine
        can stop one) and wait for the engine thread to end: a thread left inside a native
        library (torch) while the interpreter exits aborts the process ("terminate called
        without an active exception", exit 134) after the results were written."""
        with self._cond:
            self._closed = True
            for pending in self._queue:
                pending.state = "dropped"
                pending.error = Cancelled("the model was closed")
                pending.done.set()
            self._queue.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("model %s: its engine thread did not stop within %gs of close()", self._name, timeout)


class BackendModel(ChatModel):
    """An in-process evaluation backend (``hf``, ``vllm``) as a chat model (see module doc)."""

    def __init__(self, backend, tokenizer, settings, *, label: str = "", max_batch: int = 256) -> None:
        self.backend = backend
        self.tokenizer = tokenizer if tokenizer is not None and hasattr(tokenizer, "apply_chat_template") else None
        self.settings = settings
        self.name = label or backend.name
        if getattr(backend, "stops_cancelled", False):  # hf, vllm: a running request stops at its next token/step

            def generate(requests: list, stops: list) -> list:
                return backend.generate(requests, settings, cancelled=stops)

        else:  # a backend that cannot stop a running request: a started batch runs to its end (charged)

            def generate(requests: list, stops: list) -> list:
                return backend.generate(requests, settings)

        self._batcher = _Batcher(generate, max_batch, self.name)

    def queued(self) -> int:
        """Requests waiting for the engine (not yet in a ``generate`` call)."""
        return self._batcher.queued()

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "

    def count_tokens(self, text: str) -> int:
        if self.tokenizer is None:
            return approx_tokens(text)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def complete(self, messages, *, max_new_tokens: int | None, seed: int = 0, cancel=None) -> Reply:
        from recallm.eval.types import TextRequest

        prompt_text = self.render(messages)
        limit = self.settings.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        request = TextRequest(prompt_text, tuple(dict(m) for m in messages), limit, int(seed))
        try:
            generation = self._batcher.submit(request, cancel)
        except Cancelled as exc:
            if getattr(exc, "sent", False):  # stopped part-way: its prompt was read too
                exc.prompt_tokens = self.count_tokens(prompt_text)
            raise
        text = generation.text
        if self.tokenizer is not None and prompt_text.endswith(THINK_START + "\n"):
            text = f"{THINK_START}\n{text}"  # the template opened the think block: the reply carries it
        return Reply(text, self.count_tokens(prompt_text), generation.n_tokens, generation.finish_reason)

    def continue_text(self, prompt_text: str, prefix: str, *, max_new_tokens: int, seed: int = 0) -> Reply:
        from recallm.eval.types import TextRequest

        request = TextRequest(prompt_text, None, int(max_new_tokens), int(seed), prefix=prefix)
        generation = self._batcher.submit(request, None)
        return Reply(
            generation.text, self.count_tokens(prompt_text + prefix), generation.n_tokens, generation.finish_reason
        )

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **self.backend.describe()}

    def close(self) -> None:
        self._batcher.close()
        self.backend.close()


class OpenAIChatModel(ChatModel):
    """A model behind an OpenAI-compatible server (see module doc). The server is pinged when the
    model is built: one that is down is a ``RecallmError`` naming its URL."""

    def __init__(
        self,
        client,
        *,
        options: Mapping[str, Any],
        max_tokens_key: str = "max_tokens",
        api: str = "chat",
        tokenizer=None,
        label: str = "openai",
        max_new_tokens: int | None = None,
    ) -> None:
        if api not in ("chat", "completions"):
            raise RecallmError(f"{label}.api must be chat or completions, got {api!r}")
        self.client = client
        self.options = {k: v for k, v in options.items() if v is not None}
        self.max_tokens_key = max_tokens_key
        self.api = api
        self.tokenizer = tokenizer
        self.name = label
        self.max_new_tokens = max_new_tokens
        self.client.ping()

    def count_tokens(self, text: str) -> int:
        if self.tokenizer is None:
            return approx_tokens(text)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _render(self, messages) -> str:
        if self.tokenizer is not None and hasattr(self.tokenizer, "apply_chat_template"):
            return self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "

    def _call(self, fn, *, max_new_tokens: int | None, cancel, prompt_text: Callable[[], str]) -> Any:
        from recallm.clients import ChatError

        if cancel is not None:
            cancel.check()  # a request that has not left is not sent
        options = dict(self.options)
        if max_new_tokens is None:
            max_new_tokens = self.max_new_tokens
        if max_new_tokens is not None:
            options[self.max_tokens_key] = int(max_new_tokens)
        try:
            return fn(options)
        except Cancelled as exc:
            if getattr(exc, "sent", False):  # aborted in flight: the server read the prompt (module doc)
                exc.prompt_tokens = self.count_tokens(prompt_text())
            raise
        except ChatError as exc:
            raise RecallmError(f"{self.name} endpoint {self.client.config.base_url}: {exc}") from None

    def complete(self, messages, *, max_new_tokens: int | None, seed: int = 0, cancel=None) -> Reply:
        messages = [dict(m) for m in messages]

        def text() -> str:
            return "".join(str(m.get("content", "")) for m in messages)

        if self.api == "chat":
            completion = self._call(
                lambda o: self.client.chat(messages, with_reasoning=True, cancel=cancel, **o),
                max_new_tokens=max_new_tokens, cancel=cancel, prompt_text=text,
            )  # fmt: skip
        else:
            prompt = self._render(messages)
            completion = self._call(
                lambda o: self.client.complete_text(prompt, cancel=cancel, **o), max_new_tokens=max_new_tokens,
                cancel=cancel, prompt_text=lambda: prompt,
            )  # fmt: skip
        prompt_tokens = completion.prompt_tokens
        if prompt_tokens is None:
            prompt_tokens = self.count_tokens(text())
        completion_tokens = completion.completion_tokens
        if completion_tokens is None:
            completion_tokens = self.count_tokens(completion.text)
        reason = "length" if completion.finish_reason == "length" else "stop"
        return Reply(completion.text, int(prompt_tokens), int(completion_tokens), reason)

    def continue_text(self, prompt_text: str, prefix: str, *, max_new_tokens: int, seed: int = 0) -> Reply:
        completion = self._call(
            lambda o: self.client.complete_text(prompt_text + prefix, **o), max_new_tokens=max_new_tokens,
            cancel=None, prompt_text=lambda: prompt_text + prefix,
        )  # fmt: skip
        completion_tokens = completion.completion_tokens
        if completion_tokens is None:
            completion_tokens = self.count_tokens(completion.text)
        prompt_tokens = completion.prompt_tokens or self.count_tokens(prompt_text + prefix)
        reason = "length" if completion.finish_reason == "length" else "stop"
        return Reply(completion.text, int(prompt_tokens), int(completion_tokens), reason)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "backend": "openai", "api": self.api, "served_model": self.client.config.model,
                "options": dict(self.options), "max_tokens_key": self.max_tokens_key}  # fmt: skip

    def close(self) -> None:
        self.client.close()


def _settings(section: ModelSection, role: str):
    from recallm.eval.types import GenerationSettings

    values = {k: getattr(section, k) for k in ("temperature", "top_p", "top_k", "seed")}
    values = {k: v for k, v in values.items() if v is not None}
    values["max_new_tokens"] = section.max_new_tokens or 1024
    return GenerationSettings.from_mapping(values, role)


def _openai_model(section: ModelSection, role: str, tokenizer) -> OpenAIChatModel:
    from recallm.clients import ChatClient, EndpointConfig

    if not section.served_model:
        raise RecallmError(f"{role}.served_model is required for openai (the model name the server serves)")
    endpoint = EndpointConfig.from_mapping(
        {
            "base_url": section.base_url,
            "model": section.served_model,
            "api_key_env": section.api_key_env,
            "temperature": None,  # sent per request, and only when configured (below)
            "max_tokens": None,
            "timeout": section.timeout,
            "concurrency": section.concurrency,
            "retries": section.retries,
            "backoff": section.backoff,
            "extra_body": section.extra_body,
        },
        role,
    )
    options = {
        name: getattr(section, name)
        for name in ("temperature", "top_p", "top_k", "seed")
        if getattr(section, name) is not None
    }
    return OpenAIChatModel(
        ChatClient(endpoint, role),
        options=options,
        max_tokens_key=section.max_tokens_key,
        api=section.api,
        tokenizer=tokenizer,
        label=f"{role}:openai",
        max_new_tokens=section.max_new_tokens,
    )


def make_model(
    cfg: Mapping[str, Any],
    role: str,
    *,
    models_dir: str | Path = "outputs/models",
    tokenizer=None,
    model_path: str | Path | None = None,
) -> ChatModel:
    """The model a config section names (module doc; ``ModelSection`` is its schema). ``role`` names
    the section in errors; ``tokenizer`` / ``model_path`` are used when the section gives none
    (``recallm-eval``)."""
    from recallm.config import typed

    section = typed(ModelSection, cfg, role)
    name = section.name
    if name is None:
        raise RecallmError(f"{role}.name must be one of {', '.join(MODEL_KINDS)}, got None")
    if name == "scripted":
        if not section.replies:
            raise RecallmError(f"{role}.replies must be a non-empty list of reply strings for a scripted model")
        return ScriptedModel(section.replies, latency_s=section.latency_s, continuation=section.continuation)
    path = section.model_path or model_path
    if name in ("hf", "vllm"):
        if not path:
            raise RecallmError(f"{role}.model_path is required for {name} (a model directory, or `tiny`)")
        from recallm.tiny import resolve_model

        path = resolve_model(str(path), Path(models_dir))
    tokenizer_path = section.tokenizer_path or (path if name in ("hf", "vllm") else None)
    if tokenizer_path:
        from recallm.tokens import load_tokenizer

        tokenizer = load_tokenizer(Path(tokenizer_path))
    if name == "openai":
        return _openai_model(section, role, tokenizer)
    from recallm.eval.backends import check_model_dir, make_backend

    settings = _settings(section, role)
    check_model_dir(Path(str(path)), constrained=section.recall_constrained)
    backend = make_backend(
        section.engine_values(), str(path), tokenizer if tokenizer is not None else _ApproxTokenizer()
    )
    return BackendModel(backend, tokenizer, settings, label=f"{role}:{name}")
