"""HTTP clients of OpenAI-compatible model servers (the one home for them).

``EndpointConfig`` describes one endpoint (URL, served model name, sampling settings, retries,
concurrency, the *name* of the environment variable holding the API key) and is checked when
built. ``ChatClient`` calls it:

* ``complete(messages)`` - the assistant text of one chat completion, strictly (a cut-off or
  empty completion is a ``ChatError``): what the annotation pipeline (``data_gen.annotate``)
  wants of a teacher or annotator;
* ``chat(messages, ...)`` / ``complete_text(prompt, ...)`` - a ``Completion`` (text, finish
  reason, completion tokens) of ``POST {base_url}/chat/completions`` or ``POST
  {base_url}/completions``, cut-off and empty outputs included: what evaluation wants
  (``recallm.eval.backends.OpenAIBackend``);
* ``ping()`` - a one-line ``RecallmError`` naming the URL when nothing answers there.

Thread-safe: requests from many threads share one connection pool bounded by ``concurrency``.
``chat`` and ``complete_text`` take a ``cancel`` token (``recallm.cancel.CancelToken``): such
a request runs on httpx's async client, on one event-loop thread of the client, so that when the
token is set the request in flight is aborted - its task is cancelled and httpx closes the
connection, which an OpenAI-compatible server (vLLM) takes as an abort of the generation - and
``Cancelled`` is raised (``sent`` tells whether the request had left). A token set before the
request left, or during a retry's backoff, stops it there.
Transport errors, 429 and 5xx are retried with exponential backoff (``Retry-After`` honoured);
401/403/404 are ``RecallmError``s (a wrong key, URL or model fails every request); other
failures are ``ChatError``s. The API key is read from the environment and never logged.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from recallm.config import as_number, check_range
from recallm.errors import RecallmError

__all__ = [
    "EndpointConfig",
    "ChatClient",
    "ChatError",
    "Completion",
    "is_local_url",
]

log = logging.getLogger(__name__)

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0"}


def is_local_url(url: str) -> bool:
    """Whether ``url`` points at this machine (such a server needs no API key)."""
    import httpx

    host = httpx.URL(url).host
    return host in _LOCAL_HOSTS or host.endswith(".localhost")


@dataclass(frozen=True)
class EndpointConfig:
    """One OpenAI-compatible endpoint and how to call it."""

    base_url: str
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"
    temperature: float | None = 0.0
    """None: not sent (the server's default; reasoning models reject a temperature)"""
    top_p: float | None = None
    max_tokens: int | None = 4096
    """None: not sent (the server's default)"""
    timeout: float = 300.0
    concurrency: int = 8
    retries: int = 4
    backoff: float = 1.0
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any], role: str) -> EndpointConfig:
        """Build and check (``role`` names the config section in error messages); a key ``cfg``
        leaves out takes the field's default above. Callers pass the endpoint keys of a larger
        section, so other keys are theirs to check."""
        import httpx

        model = cfg.get("model")
        if not model or not isinstance(model, str):
            raise RecallmError(f"{role}.model is required (the model name the endpoint serves), got {model!r}")
        base_url = str(cfg.get("base_url") or "").rstrip("/")
        try:
            url = httpx.URL(base_url)
        except Exception:  # httpx raises InvalidURL and others for garbage
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise RecallmError(
                f"{role}.base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}"
            )
        env = cfg.get("api_key_env")
        if env is not None and (not isinstance(env, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env)):
            raise RecallmError(f"{role}.api_key_env must be the NAME of an environment variable or null, got {env!r}")
        extra = cfg.get("extra_body") or {}
        if not isinstance(extra, Mapping):
            raise RecallmError(f"{role}.extra_body must be a mapping, got {type(extra).__name__}")
        config = cls(
            base_url=base_url,
            model=model,
            api_key_env=env or None,
            temperature=_optional(cfg, "temperature", cls.temperature, f"{role}.temperature", float),
            top_p=None if cfg.get("top_p") is None else as_number(cfg.get("top_p"), f"{role}.top_p"),
            max_tokens=_optional(cfg, "max_tokens", cls.max_tokens, f"{role}.max_tokens", int),
            timeout=as_number(cfg.get("timeout", cls.timeout), f"{role}.timeout"),
            concurrency=as_number(cfg.get("concurrency", cls.concurrency), f"{role}.concurrency", int),
            retries=as_number(cfg.get("retries", cls.retries), f"{role}.retries", int),
            backoff=as_number(cfg.get("backoff", cls.backoff), f"{role}.backoff"),
            extra_body=dict(extra),
        )
        if config.temperature is not None:
            check_range(config.temperature, f"{role}.temperature", 0.0, 2.0)
        if config.top_p is not None:
            check_range(config.top_p, f"{role}.top_p", 0.0, 1.0)
        for name in ("max_tokens", "concurrency"):
            if getattr(config, name) is not None and getattr(config, name) < 1:
                raise RecallmError(f"{role}.{name} must be >= 1, got {getattr(config, name)}")
        if config.timeout <= 0:
            raise RecallmError(f"{role}.timeout must be > 0 seconds, got {config.timeout}")
        if config.retries < 0 or config.backoff < 0:
            raise RecallmError(
                f"{role}.retries and {role}.backoff must be >= 0, got {config.retries}, {config.backoff}"
            )
        if config.api_key_env and not os.environ.get(config.api_key_env) and not is_local_url(base_url):
            raise RecallmError(
                f"{role}: environment variable {config.api_key_env} is not set, and {base_url} is not local "
                f"(set it, or {role}.api_key_env=null for a server without a key)"
            )
        return config


class ChatError(Exception):
    """One request failed for good (after retries, or with a non-retryable status)."""


class Completion(NamedTuple):
    """One completion: its text, why it stopped (``stop``, ``length``, ... or None when the
    server does not say), how many tokens it has and how many its prompt had (each None when
    the server does not say)."""

    text: str
    finish_reason: str | None
    completion_tokens: int | None
    prompt_tokens: int | None = None


class ChatClient:
    """A thread-safe client of one OpenAI-compatible endpoint: bounded concurrency (a semaphore
    of ``concurrency`` slots), retries with exponential backoff (and ``Retry-After``) on transport
    errors, 429 and 5xx. 401/403/404 are ``RecallmError``s (they would fail every request); other
    failures are ``ChatError``s."""

    def __init__(self, config: EndpointConfig, role: str = "teacher", *, sleep: Callable[[float], None] = time.sleep):
        import httpx

        self.config, self.role, self._sleep = config, role, sleep
        self._key = os.environ.get(config.api_key_env) if config.api_key_env else None
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        self._http = httpx.Client(
            base_url=config.base_url + "/",
            headers=headers,
            timeout=httpx.Timeout(config.timeout, connect=min(config.timeout, 10.0)),
            limits=httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency),
        )
        self._slots = threading.BoundedSemaphore(config.concurrency)
        self._bridge: _AsyncBridge | None = None  # the cancellable requests' async client (made on first use)
        self._bridge_lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"{self.config.base_url}/chat/completions"

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    def close(self) -> None:
        self._http.close()
        with self._bridge_lock:
            bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.close()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ping(self) -> None:
        """Fail with the endpoint's name if nothing answers at ``base_url`` (any HTTP status
        counts as up, except 401/403: a key the server refuses)."""
        import httpx

        try:
            resp = self._http.get("models", timeout=min(self.config.timeout, 10.0))
        except httpx.TransportError as exc:
            raise RecallmError(
                f"{self.role} endpoint {self.config.base_url} is not reachable "
                f"({type(exc).__name__}: {self._redact(str(exc)) or 'no detail'}); is the server running?"
            ) from None
        if resp.status_code in (401, 403):
            raise RecallmError(self._refused(resp.status_code))

    def _refused(self, status: int) -> str:
        key = f"the key in ${self.config.api_key_env}" if self.config.api_key_env else "an API key (set api_key_env)"
        return f"{self.role} endpoint {self.config.base_url} refused the request (HTTP {status}): check {key}"

    def _payload(self, options: Mapping[str, Any]) -> dict[str, Any]:
        cfg = self.config
        payload: dict[str, Any] = {"model": cfg.model}
        if cfg.temperature is not None:
            payload["temperature"] = cfg.temperature
        if cfg.max_tokens is not None:
            payload["max_tokens"] = cfg.max_tokens
        if cfg.top_p is not None:
            payload["top_p"] = cfg.top_p
        payload.update(cfg.extra_body)
        payload.update({k: v for k, v in options.items() if v is not None})
        return payload

    def _send(self, path: str, payload: Mapping[str, Any], cancel):
        """One POST: on the sync client, or (with a ``cancel`` token) on the async one, aborted
        when the token is set (module doc)."""
        if cancel is None:
            with self._slots:
                return self._http.post(path, json=payload)
        from recallm.cancel import Cancelled

        while not self._slots.acquire(timeout=0.05):  # a full pool: wait, but not past a cancellation
            if cancel.cancelled:
                raise Cancelled(cancel.reason or "cancelled")
        try:
            cancel.check()
            with self._bridge_lock:
                if self._bridge is None:
                    self._bridge = _AsyncBridge(self._http, self.role)
                bridge = self._bridge
            return bridge.post(path, payload, cancel)
        finally:
            self._slots.release()

    def _post(self, path: str, payload: Mapping[str, Any], cancel=None):
        """POST with retries; the response of the first attempt that is neither a transport
        error, a 429 nor a 5xx."""
        import httpx

        cfg = self.config
        last = "no attempt"
        for attempt in range(cfg.retries + 1):
            delay = min(60.0, cfg.backoff * 2**attempt * random.uniform(0.75, 1.0))
            try:
                resp = self._send(path, payload, cancel)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {self._redact(str(exc)) or 'no detail'}"
            else:
                status = resp.status_code
                if status == 429 or status >= 500:
                    last = f"HTTP {status}"
                    retry_after = resp.headers.get("retry-after", "")
                    if retry_after.replace(".", "", 1).isdigit():
                        delay = min(60.0, float(retry_after))
                elif status in (401, 403):
                    raise RecallmError(self._refused(status))
                elif status == 404:
                    raise RecallmError(
                        f"{self.role} endpoint {cfg.base_url}/{path} answered HTTP 404 ({self._body(resp)}): check "
                        f"{self.role}.base_url (it usually ends in /v1) and {self.role}.model={cfg.model!r}"
                    )
                elif status >= 400:
                    raise ChatError(f"HTTP {status}: {self._body(resp)}")
                else:
                    return resp
            if attempt < cfg.retries:
                log.debug(
                    "%s request failed (%s); retry %d/%d in %.2fs", self.role, last, attempt + 1, cfg.retries, delay
                )
                if cancel is None:
                    self._sleep(delay)
                elif cancel.wait(delay):
                    from recallm.cancel import Cancelled

                    raise Cancelled(cancel.reason or "cancelled")
        raise ChatError(f"gave up after {cfg.retries + 1} attempt(s): {last}")

    def chat(
        self, messages: list[dict[str, str]], *, with_reasoning: bool = False, cancel=None, **options: Any
    ) -> Completion:
        """One chat completion, whatever its length (empty and cut-off outputs included). With
        ``with_reasoning``, reasoning the server returned apart (``reasoning_content``, vLLM's
        reasoning parser) is put back in front of the content, closed by ``</think>``.
        ``options`` (``max_tokens``, ``temperature``, ``top_p``, ``seed``, ...) override the
        endpoint's settings for this request; None values are left out. ``cancel``: a token that
        aborts the request (module doc)."""
        payload = self._payload(options)
        payload["messages"] = messages
        resp = self._post("chat/completions", payload, cancel)
        try:
            data = resp.json()
            choice = data["choices"][0]
            message = choice["message"]
            content = message.get("content") or ""
            if isinstance(content, list):  # content parts
                content = "".join(part.get("text") or "" for part in content if isinstance(part, dict))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise ChatError(f"not a chat completion: {self._body(resp)}") from None
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        if with_reasoning and reasoning and "</think>" not in content:
            content = f"{reasoning.strip()}\n</think>\n\n{content.strip()}"
        return Completion(content, choice.get("finish_reason"), *_usage_tokens(data))

    def complete_text(self, prompt: str, *, cancel=None, **options: Any) -> Completion:
        """One text completion of a raw prompt (``POST {base_url}/completions``); ``options`` and
        ``cancel`` as for ``chat``."""
        payload = self._payload(options)
        payload["prompt"] = prompt
        resp = self._post("completions", payload, cancel)
        try:
            data = resp.json()
            choice = data["choices"][0]
            text = choice.get("text") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise ChatError(f"not a text completion: {self._body(resp)}") from None
        return Completion(str(text), choice.get("finish_reason"), *_usage_tokens(data))

    def complete(self, messages: list[dict[str, str]], *, with_reasoning: bool = False) -> str:
        """The assistant message of one chat completion, strictly: a completion cut off at
        ``max_tokens`` or an empty one is a ``ChatError``."""
        completion = self.chat(messages, with_reasoning=with_reasoning)
        if completion.finish_reason == "length":
            raise ChatError(f"the completion was cut off at max_tokens={self.config.max_tokens}")
        if not completion.text.strip():
            raise ChatError("empty completion")
        return completion.text

    def _body(self, resp) -> str:
        text = " ".join(resp.text.split())
        return self._redact(text[:200]) or "empty body"


class _AsyncBridge:
    """httpx's async client on an event loop of its own thread: a request submitted from any
    thread can be aborted from any other (its task is cancelled; httpx closes its connection)."""

    def __init__(self, sync_client, role: str) -> None:
        import asyncio

        import httpx

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"http-{role}", daemon=True)
        self._thread.start()

        async def make() -> httpx.AsyncClient:  # made on the loop that uses it
            return httpx.AsyncClient(
                base_url=sync_client.base_url, headers=sync_client.headers, timeout=sync_client.timeout
            )

        self._client = asyncio.run_coroutine_threadsafe(make(), self._loop).result()

    def post(self, path: str, payload: Mapping[str, Any], cancel):
        import asyncio
        import concurrent.futures

        from recallm.cancel import Cancelled

        future = asyncio.run_coroutine_threadsafe(self._client.post(path, json=payload), self._loop)
        remove = cancel.add_callback(future.cancel)  # cancels the task on the loop: the connection closes
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            exc = Cancelled(cancel.reason or "cancelled")
            exc.sent = True  # the request had left: the server may have spent tokens on it
            raise exc from None
        finally:
            remove()

    def close(self) -> None:
        import asyncio

        try:
            asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(timeout=10)
        except Exception as exc:  # closing is best effort; the loop stops either way
            log.debug("closing the async HTTP client: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()


def _usage_tokens(data: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(completion tokens, prompt tokens) the server reported (None for what it did not)."""
    usage = data.get("usage") if isinstance(data, Mapping) else None

    def count(key: str) -> int | None:
        value = usage.get(key) if isinstance(usage, Mapping) else None
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    return count("completion_tokens"), count("prompt_tokens")


def _optional(cfg: Mapping[str, Any], key: str, default: Any, name: str, kind: type) -> Any:
    """``cfg[key]`` as a number; ``default`` when the key is absent; None (not sent) when null."""
    if key not in cfg:
        return default
    return None if cfg[key] is None else as_number(cfg[key], name, kind)
