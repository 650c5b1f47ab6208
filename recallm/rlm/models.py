"""The models an RLM calls: the evaluation backends behind one small chat interface.

``ChatModel.complete(messages, max_new_tokens=..., seed=...)`` returns a ``Reply`` (text,
prompt and completion tokens, finish reason). Implementations:

* ``BackendModel`` - any ``recallm.eval.backends.Backend`` (``hf``: transformers ``generate``,
  optionally a RecaLLM model with constrained recall; ``vllm``; ``openai``: any
  OpenAI-compatible server, its key read from the environment variable named in
  ``api_key_env``). Messages are rendered with the tokenizer's chat template for the local
  engines; a server gets the messages. When the chat template's generation prompt opens a think
  block (RecaLLM models), the reply text starts with that ``<think>``, so that every reply
  carries its own reasoning markers. In-process engines (``hf``, ``vllm``) are called one
  request at a time (a lock); a server is called concurrently.
* ``ScriptedModel`` - deterministic replies (a list indexed by the conversation's turn, or a
  function of the messages), an optional fixed latency and scripted failures: what tests and
  ``bench/rlm_subcalls.py`` drive the runner with. It records the start and end of every call.

``make_model(cfg, role)`` builds one from a config section (``configs/rlm.yaml``: ``root`` and
``sub``); the keys of the ``hf`` / ``vllm`` / ``openai`` kinds are those of ``recallm-eval``'s
``backend`` section, plus ``model_path``, ``tokenizer_path`` and the sampling settings.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError
from recallm.tokens import THINK_START

__all__ = [
    "Reply",
    "ChatModel",
    "BackendModel",
    "ScriptedModel",
    "CallRecord",
    "MODEL_KINDS",
    "make_model",
    "approx_tokens",
]

MODEL_KINDS = ("hf", "vllm", "openai", "scripted")
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "seed")
_OWN_KEYS = {"name", "model_path", "tokenizer_path", "max_new_tokens", *_SAMPLING_KEYS}
_SCRIPTED_KEYS = {"replies", "latency_s", "continuation"}
#: the keys of recallm-eval's `backend` section that a model section may carry (configs/eval.yaml)
_BACKEND_KEYS = {
    "recall_constrained",
    "batch_size",
    "dtype",
    "device",
    "length_extension",
    "length_extension_kwargs",
    "force_recall_every",
    "force_recall_length",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "engine_kwargs",
    "base_url",
    "served_model",
    "api",
    "api_key_env",
    "timeout",
    "concurrency",
    "retries",
    "backoff",
    "extra_body",
}


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
    def complete(self, messages: Sequence[Mapping[str, str]], *, max_new_tokens: int, seed: int = 0) -> Reply:
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


class ScriptedModel(ChatModel):
    """Deterministic replies (see module doc).

    ``replies``: a list (the reply to a conversation with ``k`` assistant messages so far is
    ``replies[k]``, the last one repeating), or ``fn(messages) -> str`` (it may raise, to script
    a failing backend). ``latency_s`` is slept in every call.
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
        self._lock = threading.Lock()

    def complete(self, messages, *, max_new_tokens: int, seed: int = 0) -> Reply:
        start = time.monotonic()
        messages = [dict(m) for m in messages]
        if self.latency_s:
            time.sleep(self.latency_s)
        if callable(self.replies):
            text = str(self.replies(messages))
        else:
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            text = self.replies[min(turn, len(self.replies) - 1)]
        with self._lock:
            self.calls.append(CallRecord(start, time.monotonic(), tuple(messages)))
        prompt = sum(approx_tokens(m.get("content", "")) for m in messages)
        reason = "stop"
        if approx_tokens(text) > max_new_tokens:  # honour the token cap as a real model would
            text, reason = text[: 4 * max_new_tokens], "length"
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


class BackendModel(ChatModel):
    """An evaluation backend as a chat model (see module doc)."""

    def __init__(self, backend, tokenizer, settings, *, label: str = "") -> None:
        self.backend = backend
        self.tokenizer = tokenizer if tokenizer is not None and hasattr(tokenizer, "apply_chat_template") else None
        self.settings = settings
        self.name = label or backend.name
        self._lock = None if backend.name == "openai" else threading.Lock()

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

    def _generate(self, request):
        if self._lock is None:
            return self.backend.generate([request], self.settings)[0]
        with self._lock:
            return self.backend.generate([request], self.settings)[0]

    def complete(self, messages, *, max_new_tokens: int, seed: int = 0) -> Reply:
        from recallm.eval.types import GenRequest

        prompt_text = self.render(messages)
        request = GenRequest(prompt_text, tuple(dict(m) for m in messages), int(max_new_tokens), int(seed))
        generation = self._generate(request)
        text = generation.text
        if self.tokenizer is not None and prompt_text.endswith(THINK_START + "\n"):
            text = f"{THINK_START}\n{text}"  # the template opened the think block: the reply carries it
        return Reply(text, self.count_tokens(prompt_text), generation.n_tokens, generation.finish_reason)

    def continue_text(self, prompt_text: str, prefix: str, *, max_new_tokens: int, seed: int = 0) -> Reply:
        from recallm.eval.types import GenRequest

        generation = self._generate(GenRequest(prompt_text, None, int(max_new_tokens), int(seed), prefix=prefix))
        return Reply(
            generation.text, self.count_tokens(prompt_text + prefix), generation.n_tokens, generation.finish_reason
        )

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **self.backend.describe()}

    def close(self) -> None:
        self.backend.close()


def _settings(cfg: Mapping[str, Any], role: str):
    from recallm.eval.types import GenerationSettings

    values = {k: cfg[k] for k in _SAMPLING_KEYS if cfg.get(k) is not None}
    values["max_new_tokens"] = cfg.get("max_new_tokens", 1024)
    return GenerationSettings.from_mapping(values, role)


def make_model(
    cfg: Mapping[str, Any],
    role: str,
    *,
    models_dir: str | Path = "outputs/models",
    tokenizer=None,
    model_path: str | Path | None = None,
) -> ChatModel:
    """The model a config section names (module doc). ``role`` names the section in errors;
    ``tokenizer`` / ``model_path`` are used when the section gives none (``recallm-eval``)."""
    cfg = dict(cfg or {})
    name = cfg.get("name")
    if name not in MODEL_KINDS:
        raise RecallmError(f"{role}.name must be one of {', '.join(MODEL_KINDS)}, got {name!r}")
    known = _OWN_KEYS | _BACKEND_KEYS | _SCRIPTED_KEYS
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise RecallmError(f"{role} has unknown keys {unknown}; known: {sorted(known)}")
    if name == "scripted":
        replies = cfg.get("replies")
        if not isinstance(replies, Sequence) or isinstance(replies, str) or not replies:
            raise RecallmError(f"{role}.replies must be a non-empty list of reply strings for a scripted model")
        return ScriptedModel(
            replies, latency_s=float(cfg.get("latency_s") or 0.0), continuation=str(cfg.get("continuation") or "")
        )
    from recallm.eval.backends import make_backend

    settings = _settings(cfg, role)
    path = cfg.get("model_path") or model_path
    if name in ("hf", "vllm"):
        if not path:
            raise RecallmError(f"{role}.model_path is required for {name} (a model directory, or `tiny`)")
        from recallm.cli.eval import resolve_model

        path = resolve_model(str(path), Path(models_dir))
    tokenizer_path = cfg.get("tokenizer_path") or (path if name in ("hf", "vllm") else None)
    if tokenizer_path:
        from recallm.tokens import load_tokenizer

        tokenizer = load_tokenizer(Path(tokenizer_path))
    if name == "openai" and not cfg.get("served_model"):
        raise RecallmError(f"{role}.served_model is required for openai (the model name the server serves)")
    backend_cfg = {k: v for k, v in cfg.items() if k in _BACKEND_KEYS}
    backend_cfg["name"] = name
    if name in ("hf", "vllm"):
        backend_cfg.setdefault("recall_constrained", False)
        check_path = Path(str(path))
        from recallm.eval.backends import check_model_dir

        check_model_dir(check_path, constrained=bool(backend_cfg["recall_constrained"]))
    backend = make_backend(backend_cfg, str(path or ""), tokenizer if tokenizer is not None else _ApproxTokenizer())
    return BackendModel(backend, tokenizer, settings, label=f"{role}:{name}")
