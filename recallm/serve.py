"""Serving a RecaLLM model with vLLM: the ``hf_overrides`` and the ``vllm serve`` command.

A RecaLLM checkpoint names its own architecture (``Recall<Base>ForCausalLM``, ``recallm_<base>``),
which vLLM does not know: vLLM serves it as its base architecture (``hf_overrides`` from
:func:`recallm.modeling.vllm_hf_overrides`) and the recall logits processor
(``recallm.recall.vllm:RecallLogitsProcessor``, for either of vLLM's model runners) keeps every recall
span a verbatim copy of its context, reading the recall token ids from the same config (``recallm.modeling.served_hf_overrides``
merges a user's own overrides with those: one place, used by ``recallm-serve`` and ``recallm-grpo``);
:func:`serve_command` builds the ``vllm serve`` command line ``recallm-serve`` runs: vLLM's
OpenAI-compatible server, which ``recallm-eval backend.name=openai`` and the RLM scaffold point
at (``base_url=http://HOST:PORT/v1``, ``served_model=<name>``). A LoRA adapter directory
(``recallm-sft``'s ``final/adapter``, ``recallm-export --keep-adapter``'s ``<out>/adapter``) is served
with vLLM's LoRA support: its base model plus the adapter under the served name (``_lora_args``).

In front of vLLM's routes, :class:`RequestGuard` (vLLM's ``--middleware``, an ASGI middleware) answers a
completion or chat request that vLLM would fail on or that would run for hours with a 400 and one line,
in OpenAI's error format: a body that is not a JSON object (vLLM's server answered a JSON array or
string with a 500), ``n`` or ``best_of`` above the server's limit (``recallm-serve --max-n``, default
:data:`DEFAULT_MAX_N`: ``n=10000`` queued ten thousand generations), a body over :data:`MAX_BODY_BYTES`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from recallm.errors import RecallmError

__all__ = ["serve_command", "serve_env", "ServeSettings", "RequestGuard", "request_problem", "DEFAULT_MAX_N", "MAX_N_ENV"]

#: ``recallm.recall.vllm.PROCESSOR_FQCN`` (named here: importing that module loads torch)
PROCESSOR = "recallm.recall.vllm:RecallLogitsProcessor"
#: every name of the recall processor (one interface each, or both): a user's own is kept, not doubled
RECALL_PROCESSORS = (
    PROCESSOR,
    "recallm.recall.vllm:RecallLogitsProcessorV1",
    "recallm.recall.vllm:RecallLogitsProcessorV2",
)
GUARD = "recallm.serve.RequestGuard"  # (vLLM imports a middleware by its dotted path)
#: completions per request (``n``, ``best_of``) a server answers by default; ``recallm-serve --max-n`` sets it
DEFAULT_MAX_N = 16
#: the most ``--max-n`` may be
MAX_N_LIMIT = 1024
#: the environment variable that carries ``--max-n`` into the server's process (vLLM imports the guard by name)
MAX_N_ENV = "RECALLM_SERVE_MAX_N"
#: the largest request body the guard reads (a 1M-token prompt is ~4 MB of text)
MAX_BODY_BYTES = 64 << 20
#: the routes the guard checks (vLLM's OpenAI-compatible generation endpoints)
GUARDED_PATHS = ("/v1/completions", "/v1/chat/completions")


class ServeSettings:
    """``recallm-serve``'s own options (everything else goes to ``vllm serve`` unchanged);
    ``recall_constrained=False`` (``--no-recall``) serves without the recall processor."""

    def __init__(
        self,
        model: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        served_model_name: str | None = None,
        recall_constrained: bool = True,
        max_n: int = DEFAULT_MAX_N,
    ) -> None:
        if not 0 < int(port) < 65536:
            raise RecallmError(f"--port must be in 1..65535, got {port}")
        if not 1 <= int(max_n) <= MAX_N_LIMIT:
            raise RecallmError(f"--max-n must be in 1..{MAX_N_LIMIT}, got {max_n}")
        self.max_n = int(max_n)
        self.model = Path(model)
        self.host = host
        self.port = int(port)
        self.served_model_name = served_model_name or self.model.resolve().name
        self.recall_constrained = bool(recall_constrained)


def _pop_option(args: list[str], name: str) -> tuple[list[str], list[str]]:
    """Remove ``--name V`` / ``--name=V`` (and ``--name`` with several values up to the next
    option) from ``args``; return (remaining args, the values)."""
    rest, values, i = [], [], 0
    alias = {name, name.replace("-", "_")}
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        if key in alias:
            if eq:
                values.append(value)
                i += 1
            else:
                i += 1
                while i < len(args) and not args[i].startswith("--"):
                    values.append(args[i])
                    i += 1
            continue
        rest.append(arg)
        i += 1
    return rest, values


def serve_command(settings: ServeSettings, extra: Sequence[str] = (), python: str | None = None) -> list[str]:
    """The ``vllm serve`` command for ``settings`` (checks the model first; ``extra``: more
    ``vllm serve`` arguments, whose ``--hf-overrides`` are merged and ``--logits-processors`` kept)."""
    from recallm.modeling import (
        adapter_base,
        check_recallm_model,
        read_model_config,
        served_hf_overrides,
        vllm_hf_overrides,
    )

    check_recallm_model(settings.model, weights=True)  # one line: no RecaLLM model, damaged or NaN weights
    config = read_model_config(settings.model)  # (a LoRA adapter: its base's)
    base = adapter_base(settings.model)
    extra = list(extra)
    for own in ("--host", "--port", "--served-model-name", "--model"):
        if any(a == own or a.startswith(own + "=") for a in extra):
            raise RecallmError(
                f"{own} is an option of recallm-serve itself: pass it before the model's extra arguments"
            )
    extra, user_overrides = _pop_option(extra, "--hf-overrides")
    if len(user_overrides) > 1:
        raise RecallmError("--hf-overrides was given more than once")
    overrides = served_hf_overrides(
        user_overrides[0] if user_overrides else None, vllm_hf_overrides(config), "--hf-overrides"
    )
    extra, processors = _pop_option(extra, "--logits-processors")
    if settings.recall_constrained:
        processors = processors if any(p in RECALL_PROCESSORS for p in processors) else [*processors, PROCESSOR]
    else:
        processors = [p for p in processors if p not in RECALL_PROCESSORS]
    command = [
        python or sys.executable,
        "-m",
        "recallm.serve",  # vLLM's own CLI, in a process that knows the recallm_<base> configs (below)
        "serve",
        str(base or settings.model),
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--served-model-name",
        settings.served_model_name if base is None else f"{settings.served_model_name}-base",
        "--hf-overrides",
        json.dumps(overrides, sort_keys=True),
    ]
    if base is not None:
        command += _lora_args(settings)
    if processors:
        command += ["--logits-processors", *processors]
    command += ["--middleware", GUARD]  # (RequestGuard: 400 for a body vLLM fails on, n above --max-n)
    command += extra
    return command


def serve_env(settings: ServeSettings) -> dict[str, str]:
    """The environment the server's process needs besides the caller's: ``--max-n`` for :class:`RequestGuard`."""
    return {MAX_N_ENV: str(settings.max_n)}


def request_problem(body: bytes, max_n: int) -> str | None:
    """What makes a completion request's body one vLLM fails on or should not run, or None (module doc)."""
    if len(body) > MAX_BODY_BYTES:
        return f"the request body has {len(body):,} bytes; this server reads at most {MAX_BODY_BYTES:,}"
    try:
        request = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "the request body is not JSON (a JSON object of the OpenAI API is expected)"
    if not isinstance(request, dict):
        return f"the request body must be a JSON object of the OpenAI API, got a JSON {type(request).__name__}"
    for key in ("n", "best_of"):
        value = request.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= max_n:
            return f"{key}={value!r}: this server answers 1 to {max_n} completions per request (recallm-serve --max-n)"
    return None


class RequestGuard:
    """ASGI middleware in front of vLLM's OpenAI server (module doc): reads a generation request's body,
    answers a bad one with a 400 (OpenAI's error format), and hands a good one on unchanged."""

    def __init__(self, app, max_n: int | None = None) -> None:
        self.app = app
        try:
            self.max_n = int(max_n if max_n is not None else os.environ.get(MAX_N_ENV, DEFAULT_MAX_N))
        except ValueError:
            self.max_n = DEFAULT_MAX_N

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") not in GUARDED_PATHS:
            await self.app(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:  # (stop reading: the size is the problem)
                await _reply(send, 400, request_problem(b" " * size, self.max_n))
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        problem = request_problem(body, self.max_n)
        if problem:
            await _reply(send, 400, problem)
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _reply(send, status: int, message: str | None) -> None:
    payload = json.dumps(
        {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _lora_args(settings: ServeSettings) -> list[str]:
    """A LoRA adapter directory is served as vLLM serves adapters: its base model (as ``<name>-base``) with
    the adapter as the model ``<name>`` (``--enable-lora --lora-modules``), the adapter's tokenizer
    (``recallm.modeling.vllm_lora_rank``: the rank vLLM needs; an adapter with trained token rows is refused)."""
    from recallm.modeling import vllm_lora_rank

    adapter = settings.model
    max_rank = vllm_lora_rank(adapter)
    tokenizer = adapter if (adapter / "tokenizer_config.json").is_file() else None
    return [
        "--enable-lora",
        "--max-lora-rank",
        str(max_rank),
        "--lora-modules",
        f"{settings.served_model_name}={adapter.resolve()}",
        *(["--tokenizer", str(tokenizer.resolve())] if tokenizer else []),
    ]


def _vllm_cli() -> int | None:
    """``python -m recallm.serve serve <model> ...``: vLLM's CLI (``vllm serve``) after registering
    the ``recallm_<base>`` configs with transformers. vLLM reads the checkpoint's config with
    ``AutoConfig`` before ``--hf-overrides`` apply, and ``import recallm`` no longer registers them
    (it loads no torch), so the plain ``vllm serve`` process refused ``model type recallm_qwen2``."""
    from vllm.entrypoints.cli.main import main as vllm_main

    import recallm.modeling  # noqa: F401  (registers the recallm_<base> configs)

    return vllm_main()


if __name__ == "__main__":
    sys.exit(_vllm_cli())
