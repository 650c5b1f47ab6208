"""Generation backends: Hugging Face ``generate``, vLLM, and any OpenAI-compatible server.

Every backend takes ``TextRequest``s (the chat-templated prompt text, the chat messages, an
optional assistant ``prefix`` to continue from, a token budget and a seed) and returns one
``Generation`` per request, in order: the output text *with* the recall tokens, its length in
tokens, why it stopped (``stop`` / ``length``) and, when the backend saw the token ids, its
recall spans judged by the matcher (``recallm.recall.find_spans``: verbatim or not).

* ``HFBackend`` - ``recallm.generation.generate`` (the one batched constrained-generation
  function) on left-padded batches of ``batch_size`` requests, the recall constraint on for a
  RecaLLM model; ``recall_constrained=False`` turns it off (the "no logit masking" ablation). A
  ``length_extension`` hook (below) can wrap every ``generate`` call.
* ``VLLMBackend`` - ``vllm.LLM`` with the V1 recall processor
  (``recallm.recall.vllm.PROCESSOR_FQCN``) and ``hf_overrides`` from
  ``recallm.modeling.vllm_hf_overrides``; per-request opt-out when unconstrained. GPU nodes only;
  vLLM is imported when the backend is built. It drives ``LLM.llm_engine`` (vLLM's
  ``LLMEngine``: ``add_request`` / ``step`` / ``abort_request``) itself rather than calling
  ``LLM.generate``, so that a request cancelled while it runs is aborted in the engine
  (``cancelled``, as for HF; see ``drive_engine``).
* ``OpenAIBackend`` - a server through ``recallm.clients.ChatClient``: chat completions of the
  messages (``api=chat``) or text completions of the rendered prompt (``api=completions``).
  Continuations (a ``prefix``) always use text completions of ``prompt_text + prefix``. The
  server must keep the recall tokens in its output text (vLLM does: they are not special
  tokens); recall spans are then judged on text by the runner.

Length extension (HF)
---------------------
``length_extension="pkg.module:factory"`` (with ``length_extension_kwargs``) plugs an
inference-time context-extension method into the HF backend without touching it. The factory
is called once, ``factory(model=model, tokenizer=tokenizer, **kwargs)``, and returns a callable
``ext(*, input_ids, attention_mask, prompt_lengths, max_new_tokens)`` that returns a context
manager; every ``generate`` call runs inside it. The context manager may patch the model for the
duration of the call (rotary scaling, attention windows, position remapping) and may yield a
mapping of extra ``generate`` keyword arguments (or None). ``prompt_lengths`` are the unpadded
prompt lengths of the batch rows (the batch is left-padded to ``input_ids.shape[1]``). With an
extension the prompt may be longer than the model's ``max_position_embeddings``.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recallm.config import MAX_BATCH, MAX_RETRIES, MAX_SECONDS, MAX_SEED, MAX_TOKENS, MAX_WORKERS
from recallm.errors import RecallmError
from recallm.eval.types import Generation, GenerationSettings, SpanStats, TextRequest
from recallm.tokens import DEFAULT_SPAN_DRAFT_TOKENS

__all__ = [
    "BACKENDS",
    "EngineSettings",
    "BackendSettings",
    "Backend",
    "HFBackend",
    "VLLMBackend",
    "OpenAIBackend",
    "LengthExtension",
    "Progress",
    "load_object",
    "check_model_dir",
    "drive_engine",
    "make_backend",
]

log = logging.getLogger(__name__)

BACKENDS = ("hf", "vllm", "openai", "rlm")  # rlm: a Recursive Language Model (recallm.rlm.eval_backend)
#: backends built in a layer above eval (the RLM runs its models through eval's backends): named by
#: their factory's import path and imported only when chosen, so eval never imports them (ARCHITECTURE.md)
PLUGIN_BACKENDS = {"rlm": "recallm.rlm.eval_backend:make_rlm_backend"}


@dataclass(frozen=True)
class EngineSettings:
    """How a model is run, by engine: the keys ``recallm-eval``'s ``backend`` section and an RLM's
    model sections (``recallm.rlm.models.ModelSection``) share. The defaults live here."""

    recall_constrained: bool = True
    """false: recall spans are not constrained (the paper's "no logit masking" ablation)"""
    batch_size: int = field(default=4, metadata={"min": 1, "max": MAX_BATCH})
    """examples per generation batch; results are flushed once per batch"""
    # hf
    dtype: str = "auto"
    """auto | float32 | bfloat16 | float16 (hf; vllm takes its own names too)"""
    device: str = "auto"
    """auto (cuda if available) | cpu | cuda:N"""
    length_extension: str | None = None
    """``pkg.module:factory``: an inference-time length-extension hook (module doc)"""
    length_extension_kwargs: dict[str, Any] = field(default_factory=dict)
    prefill_dtype: str | None = field(default=None, metadata={"choices": (None, "float32", "bfloat16", "float16")})
    """hf: prefill every prompt alone in this dtype and decode in the model's (``recallm.eval.prefill``:
    bfloat16 is ~3x faster on CPUs with AVX512-BF16); null: HF's batched prefill in the model's dtype. When set,
    Hugging Face ``generate`` decodes (``recallm.generation`` speculates inside spans only without a ``wrap``), so
    ``span_draft_tokens`` has no effect"""
    force_recall_every: int | None = field(default=None, metadata={"min": 1, "max": MAX_TOKENS})
    """debugging aid: open a span every N tokens outside spans (untrained models rarely do)"""
    force_recall_length: int = field(default=8, metadata={"min": 1, "max": MAX_TOKENS})
    span_draft_tokens: int = field(default=DEFAULT_SPAN_DRAFT_TOKENS, metadata={"min": 0, "max": MAX_TOKENS})
    """most tokens drafted and verified in one forward pass inside a recall span (speculative in-span
    decoding: the same tokens as plain decoding; 0: off; ``docs/guide/generation.md``)"""
    # vllm
    tensor_parallel_size: int = field(default=1, metadata={"min": 1, "max": MAX_WORKERS})
    gpu_memory_utilization: float = field(default=0.9, metadata={"min": 0, "max": 1})
    max_model_len: int | None = field(default=None, metadata={"min": 1, "max": MAX_TOKENS})
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """more ``vllm.LLM(...)`` arguments"""
    # openai
    base_url: str = "http://127.0.0.1:8000/v1"
    served_model: str | None = None
    """the model name the server serves (required for openai)"""
    api: str = field(default="chat", metadata={"choices": ("chat", "completions")})
    """chat (chat completions of the messages) | completions (the rendered prompt)"""
    api_key_env: str | None = "OPENAI_API_KEY"
    """NAME of the environment variable holding the key (not needed for a local server)"""
    timeout: float = field(default=3600.0, metadata={"min": 0, "max": MAX_SECONDS})
    concurrency: int = field(default=16, metadata={"min": 1, "max": MAX_WORKERS})
    retries: int = field(default=4, metadata={"min": 0, "max": MAX_RETRIES})
    backoff: float = field(default=2.0, metadata={"min": 0, "max": MAX_SECONDS})
    extra_body: dict[str, Any] = field(default_factory=dict)
    """more request fields"""


@dataclass(frozen=True)
class BackendSettings(EngineSettings):
    """The ``backend`` section of ``configs/eval.yaml`` (``recallm.config.typed``: this class is its
    schema, and holds its defaults)."""

    name: str = "hf"
    """hf (transformers generate) | vllm (GPU nodes) | openai (any OpenAI-compatible server) | rlm"""
    seed: int = field(default=0, metadata={"min": 0, "max": MAX_SEED})
    """vllm: the engine's seed"""
    rlm: dict[str, Any] = field(default_factory=dict)
    """backend=rlm: the RLM's own sections (``recallm.rlm.eval_backend.RLMBackendSection``; set with
    ``+backend.rlm.<key>=...``)"""

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise RecallmError(f"backend.name: unknown backend {self.name!r}; expected one of {', '.join(BACKENDS)}")

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | BackendSettings | None, where: str = "backend") -> BackendSettings:
        if isinstance(cfg, BackendSettings):
            return cfg
        from recallm.config import typed

        return typed(cls, cfg, where)


#: ``ext(*, input_ids, attention_mask, prompt_lengths, max_new_tokens) -> ContextManager[Mapping | None]``
LengthExtension = Callable[..., contextlib.AbstractContextManager]


#: ``progress(tokens, finished)``: tokens generated since the last call, requests finished since then
Progress = Callable[[int, int], None]


class Backend(ABC):
    """Generates text for requests; ``close`` frees what it holds.

    A backend whose ``reports_progress`` is True takes ``progress=`` (a ``Progress``) in
    ``generate`` and calls it as tokens come and requests end, each request counted once as
    finished; the evaluation's bar then moves per example and shows tokens/s. Without it the bar
    moves once per batch."""

    name: str = "backend"
    reports_progress: bool = False

    @abstractmethod
    def generate(self, requests: Sequence[TextRequest], settings: GenerationSettings) -> list[Generation]: ...

    def close(self) -> None:  # noqa: B027  (optional)
        pass

    def describe(self) -> dict[str, Any]:
        """What identifies this backend's outputs (for the run's fingerprint)."""
        return {"backend": self.name}


def load_object(spec: str, what: str) -> Any:
    """``pkg.module:attr`` -> the object, or a one-line ``RecallmError``."""
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name or not attr:
        raise RecallmError(f"{what} must be 'package.module:name', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RecallmError(f"{what} {spec!r}: cannot import {module_name} ({exc})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise RecallmError(f"{what} {spec!r}: {module_name} has no {attr!r}") from None


def check_model_dir(path: str | Path, *, constrained: bool) -> dict[str, Any]:
    """Cheap checks of a model directory before anything is generated (no weights are loaded; a LoRA
    adapter's are read and checked, ``recallm.modeling.check_adapter``): it exists and holds a config;
    with ``constrained`` it must be a RecaLLM model whose config and tokenizer carry the recall tokens.
    Returns ``{"model_type", "max_position_embeddings", "recall": bool}``."""
    from recallm.modeling import read_model_config  # (registers recallm_<base>)
    from recallm.tokens import RecallTokenIds

    path = Path(path)
    if not path.is_dir():
        raise RecallmError(f"model directory {path} does not exist")
    config = read_model_config(path)
    from recallm.modeling import adapter_base, check_adapter

    if adapter_base(path) is not None:  # a LoRA adapter: whole, finite, its base's shapes (before anything is written)
        check_adapter(path)
    has_recall = getattr(config, "recall_start_token_id", None) is not None
    if constrained:
        if not has_recall:
            raise RecallmError(
                f"{path} ({config.model_type}) has no recall tokens, so constrained recall is impossible; convert it "
                "with `recallm-create-model --base PATH --out PATH`, or evaluate it with backend.recall_constrained=false"
            )
        from recallm.tokens import load_tokenizer

        RecallTokenIds.from_pretrained(config, load_tokenizer(path))
    return {
        "model_type": config.model_type,
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
        "recall": has_recall,
    }


def _eos_ids(model, tokenizer) -> list[int]:
    from recallm.tokens import eos_token_ids

    return eos_token_ids(
        tokenizer=tokenizer, config=model.config, generation_config=getattr(model, "generation_config", None)
    )


def _token_spans(prompt_ids: Sequence[int], generated: Sequence[int], recall) -> SpanStats | None:
    """Spans of the generated part judged by the matcher (searchable context: prompt + output)."""
    if recall is None:
        return None
    from recallm.generation import generated_spans

    start_id, end_id, max_recall_tokens = recall
    spans = generated_spans(prompt_ids, generated, start_id, end_id, max_recall_tokens=max_recall_tokens)
    flags = tuple(bool(s.verbatim) for s in spans)
    return SpanStats(count=len(spans), verbatim=sum(flags), source="tokens", flags=flags)


class HFBackend(Backend):
    """``model.generate`` on left-padded batches of ``batch_size`` requests (see module doc).

    Raises ``RecallmError`` when the model has no recall tokens but ``recall_constrained`` is
    asked for, and when a ``length_extension`` cannot be loaded.
    """

    name = "hf"

    def __init__(
        self,
        model_path: str | Path,
        tokenizer,
        *,
        recall_constrained: bool = True,
        batch_size: int = 4,
        dtype: str = "auto",
        device: str = "auto",
        length_extension: str | Callable[..., LengthExtension] | None = None,
        length_extension_kwargs: Mapping[str, Any] | None = None,
        force_recall_every: int | None = None,
        force_recall_length: int = 8,
        prefill_dtype: str | None = None,
        span_draft_tokens: int = DEFAULT_SPAN_DRAFT_TOKENS,
        model=None,
    ) -> None:
        import torch

        import recallm.modeling  # noqa: F401  (registers recallm_<base>)

        if batch_size < 1:
            raise RecallmError(f"backend.batch_size must be >= 1, got {batch_size}")
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self.recall_constrained = bool(recall_constrained)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if model is None:
            dtypes = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
            if dtype not in dtypes:
                raise RecallmError(f"backend.dtype must be one of {sorted(dtypes)}, got {dtype!r}")
            from recallm.modeling import load_recallm_model  # a model directory or a LoRA adapter (merged)

            model = load_recallm_model(model_path, dtype=dtypes[dtype])
        self.model = model.to(self.device).eval()
        config = self.model.config
        self.recall = None
        if getattr(config, "recall_start_token_id", None) is not None:
            from recallm.tokens import DEFAULT_MAX_RECALL_TOKENS, RecallTokenIds

            ids = RecallTokenIds.from_config(config)
            self.recall = (ids.start, ids.end, getattr(config, "max_recall_tokens", None) or DEFAULT_MAX_RECALL_TOKENS)
        elif self.recall_constrained:
            raise RecallmError(
                f"model {model_path} has no recall tokens: constrained recall is impossible "
                "(set backend.recall_constrained=false to evaluate it without)"
            )
        self.eos_ids = _eos_ids(self.model, tokenizer)
        self.max_positions = getattr(config, "max_position_embeddings", None)
        if isinstance(length_extension, str):
            length_extension = load_object(length_extension, "backend.length_extension")
        self.length_extension_name = getattr(length_extension, "__qualname__", None) if length_extension else None
        self.extension: LengthExtension | None = (
            length_extension(model=self.model, tokenizer=tokenizer, **dict(length_extension_kwargs or {}))
            if length_extension is not None
            else None
        )
        if force_recall_every is not None and self.recall is None:
            raise RecallmError("backend.force_recall_every needs a model with recall tokens")
        self.force = (int(force_recall_every), int(force_recall_length)) if force_recall_every is not None else None
        self.prefill_dtype = prefill_dtype
        self.prefill = None
        if prefill_dtype is not None:
            if self.extension is not None:
                raise RecallmError(
                    "backend.prefill_dtype and backend.length_extension exclude each other (the extension patches "
                    "the model that decodes, not the copy that prefills); set backend.prefill_dtype=null"
                )
            from recallm.eval.prefill import RowPrefill

            self.prefill = RowPrefill(self.model, prefill_dtype)
        self.span_draft_tokens = int(span_draft_tokens)
        self._warned_room = False

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "recall_constrained": self.recall_constrained,
            "length_extension": self.length_extension_name,
            "force_recall": list(self.force) if self.force else None,
            **({"prefill_dtype": self.prefill_dtype} if self.prefill_dtype else {}),
        }

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"])

    #: ``generate`` takes ``cancelled`` (used by ``recallm.rlm.models.BackendModel``)
    stops_cancelled = True
    reports_progress = True

    def generate(
        self,
        requests: Sequence[TextRequest],
        settings: GenerationSettings,
        *,
        cancelled: Sequence[Callable[[], bool]] | None = None,
        progress: Progress | None = None,
    ) -> list[Generation]:
        """``cancelled``: one predicate per request, polled after every generated token; a row
        whose predicate turns true stops there (a batch whose every row has stopped ends) and is
        returned as ``Generation("", n, "cancelled")`` with ``n`` the tokens it generated; a
        sub-batch cancelled before it starts is not generated (``n`` = 0). ``progress``: after
        every decoding step (``Backend``)."""
        out: list[Generation] = []
        for start in range(0, len(requests), self.batch_size):
            stops = None if cancelled is None else list(cancelled[start : start + self.batch_size])
            batch = list(requests[start : start + self.batch_size])
            out.extend(self._generate_batch(batch, settings, stops, progress))
        return out

    def _generate_batch(
        self,
        requests: list[TextRequest],
        settings: GenerationSettings,
        stops: list[Callable[[], bool]] | None = None,
        progress: Progress | None = None,
    ) -> list[Generation]:
        from recallm.generation import GenRequest, generate

        if stops is not None and all(stop() for stop in stops):
            if progress is not None:
                progress(0, len(requests))
            return [Generation("", 0, "cancelled") for _ in requests]
        prompts = [self._encode(r.prompt_text + r.prefix) for r in requests]
        width = max(len(p) for p in prompts)
        room = None
        max_new = max(r.max_new_tokens for r in requests)
        if self.max_positions and self.extension is None and width + max_new > self.max_positions:
            room = self.max_positions - width
            if room < 1:
                raise RecallmError(
                    f"a prompt of {width} tokens does not fit the model's {self.max_positions} positions "
                    "(use shorter lengths or a backend.length_extension)"
                )
            if not self._warned_room:
                log.warning("generation capped at %d tokens by the model's %d positions", room, self.max_positions)
                self._warned_room = True
        sampling = (
            {}
            if settings.greedy
            else {"temperature": settings.temperature, "top_p": settings.top_p, "top_k": settings.top_k}
        )
        token_requests = [
            GenRequest(
                tuple(ids),
                request.max_new_tokens if room is None else min(request.max_new_tokens, room),
                seed=request.seed,
                **sampling,
            )
            for ids, request in zip(prompts, requests, strict=True)
        ]
        outputs = generate(
            self.model,
            token_requests,
            tokenizer=self.tokenizer,
            eos_token_ids=self.eos_ids,
            recall=self.recall is not None and self.recall_constrained,
            force=self.force,
            cancelled=stops,
            wrap=self.extension if self.prefill is None else self.prefill,
            progress=progress,
            span_draft_tokens=self.span_draft_tokens,
        )
        results = []
        for ids, output in zip(prompts, outputs, strict=True):
            if output.finish_reason == "cancelled":
                results.append(Generation("", len(output.token_ids), "cancelled"))
                continue
            tokens = output.token_ids
            body = tokens[:-1] if output.finish_reason == "stop" else tokens
            text = self.tokenizer.decode(body, skip_special_tokens=False)
            results.append(Generation(text, len(tokens), output.finish_reason, _token_spans(ids, body, self.recall)))
        return results


class VLLMBackend(Backend):
    """``vllm.LLM`` with the recall processor (GPU nodes; see module doc).

    Raises ``RecallmError`` when vLLM is not installed or when ``recall_constrained`` is asked
    of a model without recall tokens.
    """

    name = "vllm"
    reports_progress = True
    lora_request: Any = None  # a LoRA adapter directory's vllm.lora.request.LoRARequest (set by __init__)

    def __init__(
        self,
        model_path: str | Path,
        tokenizer,
        *,
        recall_constrained: bool = True,
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        seed: int = 0,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError:
            raise RecallmError(
                "backend=vllm needs vLLM, which is not installed here; on a GPU node `pip install -e '.[gpu]'`, "
                "elsewhere use backend=hf or backend=openai"
            ) from None
        from recallm.modeling import adapter_base, read_model_config, vllm_hf_overrides, vllm_lora_rank
        from recallm.recall.vllm import PROCESSOR_FQCN
        from recallm.tokens import DEFAULT_MAX_RECALL_TOKENS, RecallTokenIds

        config = read_model_config(model_path)  # (a LoRA adapter directory: its base's)
        base = adapter_base(model_path)
        self.tokenizer = tokenizer
        self.recall_constrained = bool(recall_constrained)
        self.recall = None
        self.lora_request = None
        kwargs: dict[str, Any] = {
            "model": str(base or model_path),
            "tokenizer": str(model_path if (Path(model_path) / "tokenizer_config.json").is_file() else base),
            "dtype": dtype,
            "tensor_parallel_size": int(tensor_parallel_size),
            "gpu_memory_utilization": float(gpu_memory_utilization),
            "seed": int(seed),
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = int(max_model_len)
        if getattr(config, "recall_start_token_id", None) is not None:
            ids = RecallTokenIds.from_config(config)
            self.recall = (ids.start, ids.end, getattr(config, "max_recall_tokens", None) or DEFAULT_MAX_RECALL_TOKENS)
            kwargs["hf_overrides"] = vllm_hf_overrides(config)
            kwargs["logits_processors"] = [PROCESSOR_FQCN]
        elif self.recall_constrained:
            raise RecallmError(
                f"model {model_path} has no recall tokens: constrained recall is impossible "
                "(set backend.recall_constrained=false to evaluate it without)"
            )
        if base is not None:  # a LoRA adapter: vLLM serves the base with the adapter on every request
            from vllm.lora.request import LoRARequest

            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(model_path))
            self.lora_request = LoRARequest("recallm-adapter", 1, str(Path(model_path).resolve()))
            model_path = base  # (its generation config below)
        kwargs.update(dict(engine_kwargs or {}))
        self.llm = LLM(**kwargs)
        self._request_ids = itertools.count()
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.eos_ids: set[int] = set()
        for value in (tokenizer.eos_token_id, getattr(config, "eos_token_id", None), _generation_eos(model_path)):
            if isinstance(value, int):
                self.eos_ids.add(value)
            elif isinstance(value, (list, tuple)):
                self.eos_ids.update(int(v) for v in value)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "recall_constrained": self.recall_constrained}

    #: ``generate`` takes ``cancelled`` (used by ``recallm.rlm.models.BackendModel``)
    stops_cancelled = True

    def _engine_inputs(self, requests: Sequence[TextRequest], settings: GenerationSettings) -> tuple[list, list]:
        """vLLM's engine inputs (prompt token ids) and sampling parameters, one of each per request."""
        from vllm import SamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        from recallm.recall.vllm import EXTRA_ARG

        prompts, params = [], []
        for request in requests:
            ids = list(self.tokenizer(request.prompt_text + request.prefix, add_special_tokens=False)["input_ids"])
            room = self.max_model_len - len(ids)
            if room < 1:
                raise RecallmError(
                    f"a prompt of {len(ids)} tokens does not fit vLLM's max_model_len={self.max_model_len}"
                )
            prompts.append(tokens_input(ids))
            sampling: dict[str, Any] = {
                "max_tokens": min(request.max_new_tokens, room),
                "temperature": settings.temperature,
                "top_p": settings.top_p,
                "skip_special_tokens": False,
                "output_kind": RequestOutputKind.DELTA,  # every step's new tokens: a stopped request's count
            }
            if settings.top_k:
                sampling["top_k"] = settings.top_k
            if not settings.greedy:
                sampling["seed"] = request.seed
            if self.recall is not None and not self.recall_constrained:
                sampling["extra_args"] = {EXTRA_ARG: False}
            params.append(SamplingParams(**sampling))
        return prompts, params

    def generate(
        self,
        requests: Sequence[TextRequest],
        settings: GenerationSettings,
        *,
        cancelled: Sequence[Callable[[], bool]] | None = None,
        progress: Progress | None = None,
    ) -> list[Generation]:
        """All requests go to the engine together. ``cancelled``: one predicate per request,
        polled before every engine step; a request whose predicate turns true is aborted in the
        engine (``LLMEngine.abort_request``) and returned as ``Generation("", n, "cancelled")``
        with ``n`` the tokens it had generated (one cancelled before it was added: ``n`` = 0).
        ``progress``: after every engine step (``Backend``)."""
        prompts, params = self._engine_inputs(requests, settings)
        ids = [f"recallm-{next(self._request_ids)}" for _ in requests]
        done = drive_engine(self.llm.llm_engine, ids, prompts, params, cancelled, progress, self.lora_request)
        results = []
        for request_id, prompt in zip(ids, prompts, strict=True):
            tokens, finish_reason = done[request_id]
            if finish_reason == "cancelled":
                results.append(Generation("", len(tokens), "cancelled"))
                continue
            body = tokens[:-1] if tokens and tokens[-1] in self.eos_ids else tokens
            reason = "length" if finish_reason == "length" else "stop"
            text = self.tokenizer.decode(body, skip_special_tokens=False)
            results.append(
                Generation(text, len(tokens), reason, _token_spans(prompt["prompt_token_ids"], body, self.recall))
            )
        return results


def drive_engine(
    engine,
    request_ids: Sequence[str],
    prompts: Sequence[Any],
    params: Sequence[Any],
    cancelled: Sequence[Callable[[], bool]] | None = None,
    progress: Progress | None = None,
    lora_request: Any = None,
) -> dict[str, tuple[list[int], str]]:
    """Run requests to their end on a vLLM ``LLMEngine`` (``add_request``, ``step``,
    ``abort_request``), aborting the cancelled ones. Returns ``{request_id: (token_ids,
    finish_reason)}``; the reason is vLLM's (``stop``, ``length``, ...) or ``cancelled``.

    ``params`` must ask for ``RequestOutputKind.DELTA`` outputs: each step's new tokens are
    added up, so a request aborted part-way knows how many it generated (those of the steps
    seen; a token the engine computed in the step under way when it was aborted is not
    counted). Before every step each running request's ``cancelled`` predicate is polled;
    those that turned true are aborted together, and the engine stops working on them. The
    engine must have no other user meanwhile. Whatever ends the loop early (an exception, a
    ``KeyboardInterrupt``) aborts what is still running, so no request is left in the engine.
    ``progress(tokens, finished)`` is called after every step (and for requests cancelled).
    """
    stops = list(cancelled) if cancelled is not None else [lambda: False] * len(request_ids)
    if not len(request_ids) == len(prompts) == len(params) == len(stops):
        raise ValueError("drive_engine needs one prompt, one parameter set and one predicate per request")
    tokens: dict[str, list[int]] = {rid: [] for rid in request_ids}
    done: dict[str, tuple[list[int], str]] = {}
    stop_of = dict(zip(request_ids, stops, strict=True))
    live: set[str] = set()
    try:
        for rid, prompt, param in zip(request_ids, prompts, params, strict=True):
            if stop_of[rid]():  # cancelled before it reached the engine
                done[rid] = (tokens[rid], "cancelled")
                if progress is not None:
                    progress(0, 1)
                continue
            engine.add_request(rid, prompt, param, **({} if lora_request is None else {"lora_request": lora_request}))
            live.add(rid)
        while live:
            stopped = [rid for rid in request_ids if rid in live and stop_of[rid]()]
            if stopped:
                engine.abort_request(stopped)
                for rid in stopped:
                    live.discard(rid)
                    done[rid] = (tokens[rid], "cancelled")
                if progress is not None:
                    progress(0, len(stopped))
                if not live:
                    break
            new = finished = 0
            for output in engine.step():
                rid = output.request_id
                if rid not in live:
                    continue
                completion = output.outputs[0]
                tokens[rid].extend(completion.token_ids)
                new += len(completion.token_ids)
                if output.finished:
                    live.discard(rid)
                    done[rid] = (tokens[rid], str(completion.finish_reason))
                    finished += 1
            if progress is not None and (new or finished):
                progress(new, finished)
    finally:
        if live:  # ended early: leave nothing running in the engine
            try:
                engine.abort_request(sorted(live))
            except Exception:  # the engine itself failed; what ended the loop is the error to report
                log.exception("could not abort %d vLLM requests", len(live))
    return done


def _generation_eos(model_path) -> Any:
    """``eos_token_id`` of a model directory's ``generation_config.json`` (None without one)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(model_path)).eos_token_id
    except OSError:
        return None


class OpenAIBackend(Backend):
    """A model behind an OpenAI-compatible server (see module doc). The server is pinged when
    the backend is built: one that is down is a ``RecallmError`` naming its URL."""

    name = "openai"

    def __init__(self, endpoint, tokenizer, *, api: str = "chat", client=None) -> None:
        from recallm.clients import ChatClient

        if api not in ("chat", "completions"):
            raise RecallmError(f"backend.api must be chat or completions, got {api!r}")
        self.api = api
        self.tokenizer = tokenizer
        self.client = client or ChatClient(endpoint, "backend")
        self.client.ping()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "api": self.api, "served_model": self.client.config.model}

    def close(self) -> None:
        self.client.close()

    def _one(self, request: TextRequest, settings: GenerationSettings) -> Generation:
        from recallm.clients import ChatError

        options: dict[str, Any] = {
            "max_tokens": request.max_new_tokens,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "top_k": settings.top_k or None,
            "seed": None if settings.greedy else request.seed,
        }
        try:
            if self.api == "chat" and not request.prefix and request.messages is not None:
                completion = self.client.chat([dict(m) for m in request.messages], with_reasoning=True, **options)
            else:
                completion = self.client.complete_text(request.prompt_text + request.prefix, **options)
        except ChatError as exc:
            raise RecallmError(
                f"backend endpoint {self.client.config.base_url}: a request failed for good ({exc}); "
                "finished examples are saved, rerun to resume"
            ) from None
        n_tokens = completion.completion_tokens
        if n_tokens is None:
            n_tokens = len(self.tokenizer(completion.text, add_special_tokens=False)["input_ids"])
        reason = "length" if completion.finish_reason == "length" else "stop"
        return Generation(completion.text, int(n_tokens), reason, None)

    reports_progress = True

    def generate(
        self, requests: Sequence[TextRequest], settings: GenerationSettings, *, progress: Progress | None = None
    ) -> list[Generation]:
        """``progress``: once per request, as it comes back (from the pool's threads)."""

        def one(request: TextRequest) -> Generation:
            generation = self._one(request, settings)
            if progress is not None:
                progress(generation.n_tokens, 1)
            return generation

        workers = max(1, min(self.client.config.concurrency, len(requests)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, requests))


def make_backend(cfg: Mapping[str, Any] | BackendSettings, model_path: str | Path, tokenizer) -> Backend:
    """Build the backend that ``cfg`` (the ``backend`` section of ``configs/eval.yaml``, read as
    ``BackendSettings``) names."""
    settings = BackendSettings.from_mapping(cfg)
    name = settings.name
    if name in PLUGIN_BACKENDS:
        module, _, factory = PLUGIN_BACKENDS[name].partition(":")
        return getattr(importlib.import_module(module), factory)(settings, model_path, tokenizer)
    if name == "hf":
        return HFBackend(
            model_path,
            tokenizer,
            recall_constrained=settings.recall_constrained,
            batch_size=settings.batch_size,
            dtype=settings.dtype,
            device=settings.device,
            length_extension=settings.length_extension,
            length_extension_kwargs=settings.length_extension_kwargs,
            force_recall_every=settings.force_recall_every,
            force_recall_length=settings.force_recall_length,
            prefill_dtype=settings.prefill_dtype,
            span_draft_tokens=settings.span_draft_tokens,
        )
    if name == "vllm":
        return VLLMBackend(
            model_path,
            tokenizer,
            recall_constrained=settings.recall_constrained,
            dtype=settings.dtype,
            tensor_parallel_size=settings.tensor_parallel_size,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            max_model_len=settings.max_model_len,
            seed=settings.seed,
            engine_kwargs=settings.engine_kwargs,
        )
    from recallm.clients import EndpointConfig

    if not settings.served_model:
        raise RecallmError("backend=openai needs backend.served_model (the model name the server serves)")
    endpoint = EndpointConfig.from_mapping(
        {
            "base_url": settings.base_url,
            "model": settings.served_model,
            "api_key_env": settings.api_key_env,
            "timeout": settings.timeout,
            "concurrency": settings.concurrency,
            "retries": settings.retries,
            "backoff": settings.backoff,
            "extra_body": settings.extra_body,
        },
        "backend",
    )
    return OpenAIBackend(endpoint, tokenizer, api=settings.api)
