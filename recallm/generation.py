"""Batched, constrained generation with Hugging Face ``generate`` — the one implementation.

Evaluation's HF backend (``recallm.eval.backends.HFBackend``), the ``hf_cpu`` GRPO rollout
(``recallm.grpo.cpu.hf_generate.HFGenerator``), SFT's recall metrics (``recallm.sft.train``) and
``recallm-decoding-demo`` all call :func:`generate`: token ids in (one :class:`GenRequest` per prompt),
token ids out (one :class:`GenResult` per request, in request order), optionally with the
log-probability of every generated token.

What it does, once for every caller:

* **Batches.** Requests with the same sampling parameters (:meth:`GenRequest.sampling_key`) go
  into one ``generate`` call, at most ``batch_size`` at a time, left-padded. A request with a
  repetition penalty goes alone (HF's penalty would also count the padding).
* **Pads** with the model's pad id by the one pad-token rule, ``recallm.tokens.pad_token_id``
  (the tokenizer's pad token, else the generation config's or the model config's, else the
  first end-of-sequence id); the attention mask keeps the padding out of the model and out of
  the recall matcher's searchable context, so the pad id never changes an output.
* **Constrains recall spans** with ``recallm.recall.hf.RecallLogitsProcessor`` (``recall``;
  default: the model config's ``recall_constrained``), optionally forcing spans open
  (``force=(every, length)``, ``recallm.recall.hf.ForceRecallSpans``, a test and demo aid).
* **Decodes** greedily (``temperature <= 1e-5``) or samples. The logits processors are ours in
  full, in vLLM's order — recall mask, repetition penalty, temperature, top-k, top-p (then the
  forced spans), then the choice (``recallm.decoding.Chain``) — and ``generate`` adds none of its
  own: for the duration of the call the model's ``generation_config`` is reduced to its token ids,
  so a model's shipped defaults (``top_k=20``, ``temperature=0.7``, ``repetition_penalty``, ...)
  cannot change the request.
* **Seeds, one stream per request**: a sampled request with a ``seed`` draws one uniform number per
  generated token from a ``torch.Generator`` of its own seeded with it, and takes the token at that
  point of the processed distribution's cumulative sum (``recallm.decoding.RowStreams``,
  ``inverse_cdf``); ``seed=None`` draws from the caller's RNG (torch's default generator: seeding it
  with ``s`` gives a lone request what ``seed=s`` gives), which a seeded request leaves alone. A seeded
  request's tokens therefore do not depend on the requests batched with it, their order or the batch
  size (rows differ only by the floating-point noise of left padding), at batched speed: the draws
  are one ``softmax``/``cumsum`` over the batch and one number per row.
* **Speculative decoding inside recall spans** (``span_draft_tokens``, default
  ``recallm.tokens.DEFAULT_SPAN_DRAFT_TOKENS``; 0: off): inside a span the matcher's continuation of
  the span (``RecallMatcher.continuation``) is drafted and verified in one forward pass, the recall
  mask applied at every verified position; a step keeps the draft while it chose it, so the output
  is the tokens plain decoding gives (greedy: the same argmax; sampled: the same draw from the same
  uniform number), up to the floating-point noise of a forward pass over several tokens at once
  (``recallm.decoding.decode``). Used when the recall constraint is on, no ``wrap`` is given and the
  model's cache is full attention; otherwise, and with ``span_draft_tokens=0``, Hugging Face
  ``generate`` decodes.
* **Log-probs** (``log_probs=True``): of every generated token under the *processed*
  distribution — the recall mask, repetition penalty, temperature, top-k and top-p applied, then
  a log-softmax — which is vLLM's ``logprobs_mode=processed_logprobs`` and the log-prob the
  masked model's forward gives the token (verl's ``rollout_log_probs``). Greedy log-probs are
  those of the masked logits (no temperature). Forced tokens get the log-prob the policy gives
  them, not the 0 of a forced choice; a forced token that top-k/top-p excluded gets its log-prob
  before top-k/top-p (finite, as the trainer's).
* **Stops** each row at its first end-of-sequence token (kept in ``token_ids``,
  ``finish_reason="stop"``) or at its own ``max_new_tokens`` (``"length"``); ``cancelled`` (one
  predicate per request, polled after every decoding step) stops a row early (``"cancelled"``, with the
  tokens generated until then); a batch whose every request is cancelled is not generated.
* ``progress`` (optional) is called after every decoding step with ``(tokens, finished)``: the
  tokens the batch's running rows generated in that step and how many of its rows ended there (at
  an end-of-sequence token or their own ``max_new_tokens``); rows that end with their batch (a
  cancelled one, or the last) are counted after it, so every request is counted as finished once.
  Progress bars move per token and per request, not per batch.
* **Attention without copying the cache**: a model on ``sdpa`` attention with grouped query heads is
  switched to ``recallm.attention.GQA_SDPA`` (the same numbers; on a CPU a masked decoding step no longer
  repeats every key-value head of the cache: SmolLM2-135M's evaluation at 2,048 tokens spent 44% of its
  time in that copy).
* ``wrap`` (optional) is called once per batch,
  ``wrap(input_ids=, attention_mask=, prompt_lengths=, max_new_tokens=)``, and returns a context
  manager the ``generate`` call runs inside; it may yield a mapping of extra ``generate`` keyword
  arguments (eval's length-extension hook).

Beam search is not offered (the recall processor refuses reordered rows).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import (
    GenerationConfig,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from recallm.attention import use_gqa_sdpa
from recallm.decoding import Chain, RowStreams, decode, supports_speculation
from recallm.errors import RecallmError
from recallm.tokens import DEFAULT_SPAN_DRAFT_TOKENS

__all__ = ["GREEDY_TEMPERATURE", "GenRequest", "GenResult", "generate", "generated_spans"]

#: temperatures at or below this decode greedily (vLLM's threshold)
GREEDY_TEMPERATURE = 1e-5

FINISH_REASONS = ("stop", "length", "cancelled")

# generate() reads the model's generation_config; the swap in _plain_generation_config is one at a time
_CONFIG_LOCK = threading.RLock()


@dataclass(frozen=True)
class GenRequest:
    """One prompt to continue: its token ids (no padding), the most tokens to generate, and its
    sampling parameters (``temperature <= 1e-5``: greedy; ``top_k <= 0``: no top-k; ``top_p = 1``:
    no top-p; ``repetition_penalty = 1``: none). ``seed``: see the module doc (``None``: the
    caller's RNG)."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise RecallmError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise RecallmError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise RecallmError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise RecallmError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE

    def sampling_key(self) -> tuple:
        """Requests with equal keys are generated together (greedy ignores the sampling values)."""
        if self.greedy:
            return (True, 1.0, 1.0, 0, self.repetition_penalty)
        return (False, self.temperature, self.top_p, max(self.top_k, 0), self.repetition_penalty)


@dataclass
class GenResult:
    """The generated ids of one request (up to and including the first end-of-sequence token, at
    most ``max_new_tokens``), why it stopped (``stop``, ``length`` or ``cancelled``: then the
    tokens generated until it was cancelled), and with ``log_probs=True`` one log-prob per token."""

    token_ids: list[int]
    finish_reason: str
    log_probs: list[float] | None = None


def generated_spans(prompt_ids: Sequence[int], token_ids: Sequence[int], start_id: int, end_id: int, **kwargs):
    """The recall spans that open in the generated part, judged by the matcher against their
    searchable context (prompt + output); ``kwargs`` go to ``recallm.recall.find_spans``."""
    from recallm.recall import find_spans

    n = len(prompt_ids)
    return [s for s in find_spans(list(prompt_ids) + list(token_ids), start_id, end_id, **kwargs) if s.start >= n]


class _Progress(StoppingCriteria):
    """Stops nothing: after every step, reports the running rows' new tokens and the rows that ended
    (an end-of-sequence token, or their own budget) to ``report(tokens, finished)``."""

    def __init__(self, report: Callable[[int, int], None], budgets: list[int], eos: set[int], width: int) -> None:
        self.report, self.budgets, self.eos, self.width = report, budgets, eos, width
        self.running = [budget > 0 for budget in budgets]

    def __call__(self, input_ids, scores, **kwargs):
        step = input_ids.shape[1] - self.width
        last = input_ids[:, -1].tolist()
        tokens = finished = 0
        for row, running in enumerate(self.running):
            if running:
                tokens += 1
                if last[row] in self.eos or step >= self.budgets[row]:
                    self.running[row] = False
                    finished += 1
        self.report(tokens, finished)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def close(self) -> None:
        """Count the rows that ended with the batch."""
        left = sum(self.running)
        self.running = [False] * len(self.running)
        if left:
            self.report(0, left)


class _CancelledRows(StoppingCriteria):
    """A row is done once its request is cancelled (``stops[row]()``); records how many tokens
    each stopped row had generated by then."""

    def __init__(self, stops: list[Callable[[], bool]], prompt_width: int) -> None:
        self.stops = stops
        self.width = prompt_width
        self.stopped_at: list[int | None] = [None] * len(stops)

    def __call__(self, input_ids, scores, **kwargs):
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row, stop in enumerate(self.stops):
            if self.stopped_at[row] is None and stop():
                self.stopped_at[row] = input_ids.shape[1] - self.width
            done[row] = self.stopped_at[row] is not None
        return done


def _ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int | np.integer):
        return [int(value)]
    return [int(v) for v in value]


@contextlib.contextmanager
def _plain_generation_config(model, eos: list[int], pad: int):
    """Reduce ``model.generation_config`` to its token ids for one call: ``generate`` fills every
    option left unset from it (a model's shipped sampling defaults, repetition penalty, ...)."""
    with _CONFIG_LOCK:
        saved = getattr(model, "generation_config", None)
        model.generation_config = GenerationConfig(
            eos_token_id=eos or None, pad_token_id=pad, bos_token_id=getattr(saved, "bos_token_id", None)
        )
        try:
            yield
        finally:
            model.generation_config = saved


def _recall_default(model) -> bool:
    config = model.config
    return (
        bool(getattr(config, "recall_constrained", False))
        and getattr(config, "recall_start_token_id", None) is not None
    )


def generate(
    model,
    requests: Sequence[GenRequest],
    *,
    tokenizer=None,
    eos_token_ids: Iterable[int] | int | None = None,
    recall: bool | None = None,
    force: tuple[int, int] | None = None,
    log_probs: bool = False,
    batch_size: int | None = None,
    cancelled: Sequence[Callable[[], bool]] | None = None,
    wrap: Callable[..., contextlib.AbstractContextManager] | None = None,
    progress: Callable[[int, int], None] | None = None,
    span_draft_tokens: int = DEFAULT_SPAN_DRAFT_TOKENS,
) -> list[GenResult]:
    """Generate every request with ``model`` (see the module doc); results in request order.

    Args:
        model: a causal LM (a ``Recall*ForCausalLM`` for ``recall``/``force``), on any device.
        tokenizer: consulted for the pad and end-of-sequence ids (optional).
        eos_token_ids: the ids that end a row; default ``recallm.tokens.eos_token_ids`` of the
            tokenizer, model config and generation config.
        recall: constrain recall spans; ``None``: the model config's ``recall_constrained``.
        force: ``(every, length)``: open a span every ``every`` tokens generated outside spans,
            close it after ``length`` (``ForceRecallSpans``).
        log_probs: also return the processed log-prob of every generated token.
        batch_size: most requests per ``generate`` call (``None``: a sampling group at once).
        cancelled: one predicate per request (see the module doc).
        wrap: a context-manager factory around every ``generate`` call (see the module doc).
        progress: ``progress(tokens, finished)`` after every decoding step (see the module doc).
        span_draft_tokens: most tokens drafted and verified in one forward pass inside a recall span
            (speculative in-span decoding, see the module doc); 0 decodes one token per step.
    """
    from recallm import tokens

    if batch_size is not None and batch_size < 1:
        raise RecallmError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(span_draft_tokens, bool) or not isinstance(span_draft_tokens, int) or span_draft_tokens < 0:
        raise RecallmError(f"span_draft_tokens must be an integer >= 0, got {span_draft_tokens!r}")
    if cancelled is not None and len(cancelled) != len(requests):
        raise RecallmError(f"cancelled has {len(cancelled)} predicates for {len(requests)} requests")
    use_gqa_sdpa(model)
    config = model.config
    gen_config = getattr(model, "generation_config", None)
    if eos_token_ids is None:
        eos_token_ids = tokens.eos_token_ids(tokenizer=tokenizer, config=config, generation_config=gen_config)
    eos = _ids(eos_token_ids)
    pad = tokens.pad_token_id(tokenizer=tokenizer, config=config, generation_config=gen_config)
    recall = _recall_default(model) if recall is None else bool(recall)
    if (recall or force is not None) and getattr(config, "recall_start_token_id", None) is None:
        raise RecallmError(
            "constrained or forced recall needs a model with recall tokens (recall_start_token_id); "
            "convert it with `recallm-create-model`"
        )
    groups: dict[tuple, list[int]] = {}
    for i, request in enumerate(requests):
        key = request.sampling_key()
        if request.repetition_penalty != 1.0:  # HF's penalty would also count the padding
            key = (*key, i)
        groups.setdefault(key, []).append(i)
    results: list[GenResult | None] = [None] * len(requests)
    for members in groups.values():
        step = batch_size or len(members)
        for start in range(0, len(members), step):
            chunk = members[start : start + step]
            out = _generate_batch(
                model,
                [requests[i] for i in chunk],
                eos=eos,
                pad=pad,
                recall=recall,
                force=force,
                log_probs=log_probs,
                stops=None if cancelled is None else [cancelled[i] for i in chunk],
                wrap=wrap,
                progress=progress,
                span_draft_tokens=span_draft_tokens,
            )
            for i, result in zip(chunk, out, strict=True):
                results[i] = result
    return results  # type: ignore[return-value]


def _chain(
    model, requests: list[GenRequest], attention_mask: torch.Tensor, *, pad: int, recall: bool, force, log_probs: bool
) -> Chain:
    """The batch's processing (``recallm.decoding.Chain``, vLLM's order): recall mask, repetition
    penalty, temperature, top-k, top-p, the log-prob recorders, the forced spans, the choice (greedy,
    or each row's draw from its own stream)."""
    request = requests[0]  # the batch's sampling parameters
    chain = Chain(log_probs=log_probs)
    if recall:
        from recallm.recall.hf import RecallLogitsProcessor

        chain.recall = RecallLogitsProcessor.from_config(
            model.config, prompt_attention_mask=attention_mask, pad_token_id=pad
        )
    if request.repetition_penalty != 1.0:
        chain.penalty = RepetitionPenaltyLogitsProcessor(penalty=request.repetition_penalty)
    if not request.greedy:
        if request.temperature != 1.0:
            chain.temperature = TemperatureLogitsWarper(request.temperature)
        if request.top_k > 0:
            chain.truncation.append(TopKLogitsWarper(top_k=request.top_k))
        if request.top_p < 1.0:
            chain.truncation.append(TopPLogitsWarper(top_p=request.top_p))
        chain.streams = RowStreams([r.seed for r in requests])
    if force is not None:
        from recallm.recall.hf import ForceRecallSpans
        from recallm.tokens import RecallTokenIds

        ids = RecallTokenIds.from_config(model.config)
        every, length = force
        chain.force = ForceRecallSpans(ids.start, ids.end, every=int(every), length=int(length))
    return chain


def _cut(tokens: list[int], limit: int, eos: set[int]) -> tuple[list[int], str]:
    """The generated tokens up to the first end-of-sequence token (kept) and the finish reason."""
    tokens = tokens[:limit]
    for j, token in enumerate(tokens):
        if token in eos:
            return tokens[: j + 1], "stop"
    return tokens, "length"


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _generate_batch(
    model,
    requests: list[GenRequest],
    *,
    eos: list[int],
    pad: int,
    recall: bool,
    force,
    log_probs: bool,
    stops: list[Callable[[], bool]] | None,
    wrap,
    progress: Callable[[int, int], None] | None = None,
    span_draft_tokens: int = 0,
) -> list[GenResult]:
    if stops is not None and all(stop() for stop in stops):
        if progress is not None:
            progress(0, len(requests))
        return [GenResult([], "cancelled", [] if log_probs else None) for _ in requests]
    device = _device(model)
    width = max(len(r.prompt_ids) for r in requests)
    input_ids = torch.full((len(requests), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(requests), width), dtype=torch.long)
    for row, r in enumerate(requests):  # left padding
        if r.prompt_ids:
            input_ids[row, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            attention_mask[row, width - len(r.prompt_ids) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    chain = _chain(model, requests, attention_mask, pad=pad, recall=recall, force=force, log_probs=log_probs)
    if span_draft_tokens > 0 and recall and wrap is None and supports_speculation(model):
        generated, lps, stopped_at = decode(
            model,
            input_ids,
            attention_mask,
            chain,
            budgets=[r.max_new_tokens for r in requests],
            eos=set(eos),
            pad=pad,
            draft_tokens=span_draft_tokens,
            stops=stops,
            progress=progress,
            prompts=[list(r.prompt_ids) for r in requests],
        )
    else:
        generated, lps, stopped_at = _hf_generate(
            model, requests, input_ids, attention_mask, chain, eos=eos, pad=pad, stops=stops, wrap=wrap, progress=progress
        )
    eos_set = set(eos)
    results = []
    for row, r in enumerate(requests):
        token_ids, reason = _cut(generated[row], r.max_new_tokens, eos_set)
        stopped = stopped_at[row]
        # cut by its cancellation unless it would have ended on its own (end-of-sequence, or its own
        # limit) within the `stopped` tokens it had; its batch may have run on (padding) or ended there
        own_end = len(token_ids) if reason == "stop" else r.max_new_tokens
        if stopped is not None and stopped < own_end:
            token_ids, reason = token_ids[:stopped], "cancelled"
        results.append(GenResult(token_ids, reason, lps[row][: len(token_ids)] if lps is not None else None))
    return results


def _hf_generate(
    model,
    requests: list[GenRequest],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    chain: Chain,
    *,
    eos: list[int],
    pad: int,
    stops: list[Callable[[], bool]] | None,
    wrap,
    progress: Callable[[int, int], None] | None,
) -> tuple[list[list[int]], list[list[float]] | None, list[int | None]]:
    """One Hugging Face ``generate`` call over the batch, its choice made by the chain (greedy search
    takes the one-hot row of a sampled step): each row's generated ids, log-probs and cancellation point."""
    width = input_ids.shape[1]
    max_new = max(r.max_new_tokens for r in requests)
    processors, recorder, truncated = chain.hf_processors()
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "logits_processor": processors,
        "max_new_tokens": max_new,
        "do_sample": False,  # a sampled step's draw is the chain's (RowSampler): generate takes its one-hot row
        "num_beams": 1,
        "repetition_penalty": 1.0,
        "pad_token_id": pad,
        "eos_token_id": eos or None,
    }
    cancel_rows = _CancelledRows(stops, width) if stops is not None else None
    reporter = _Progress(progress, [r.max_new_tokens for r in requests], set(eos), width) if progress else None
    criteria = [c for c in (cancel_rows, reporter) if c is not None]
    if criteria:
        kwargs["stopping_criteria"] = StoppingCriteriaList(criteria)
    from recallm.modeling import RecallMaskMixin

    if isinstance(model, RecallMaskMixin):
        kwargs["recall_constrained"] = chain.recall is not None  # ours is in `processors`; none added twice
    context = (
        wrap(
            input_ids=input_ids,
            attention_mask=attention_mask,
            prompt_lengths=[len(r.prompt_ids) for r in requests],
            max_new_tokens=max_new,
        )
        if wrap is not None
        else contextlib.nullcontext()
    )
    with torch.inference_mode(), _plain_generation_config(model, eos, pad), context as extra:
        if extra:
            kwargs.update(extra)
        try:
            sequences = model.generate(**kwargs)
        finally:
            if reporter is not None:
                reporter.close()
    lps = None
    if recorder is not None:
        lps = recorder.finish(sequences)
        if truncated is not None:  # a forced token outside top-k/top-p: its log-prob before them
            before = truncated.finish(sequences)
            lps = torch.where(torch.isfinite(lps), lps, before)
        lps = lps.tolist()
    stopped_at = cancel_rows.stopped_at if cancel_rows is not None else [None] * len(requests)
    return sequences[:, width:].tolist(), lps, stopped_at
