"""Token-in/token-out generation with Hugging Face ``generate`` for the ``hf_cpu`` rollout.

No Ray and no verl here: :class:`HFGenerator` is what the rollout server calls, and what a test
calls directly. It turns verl's requests (prompt ids + the sampling parameters verl sends) into
``recallm.generation.GenRequest`` objects and generates them with :func:`recallm.generation.generate`
(the one batched constrained-generation function; left-padded batches, one ``generate`` call per
group of equal sampling parameters, at most ``max_batch_size`` requests each) with
``log_probs=True``: every request gets its generated ids (up to and including the first
end-of-sequence token) and the log-probability of every generated token under the *processed*
distribution — what vLLM returns with ``logprobs_mode=processed_logprobs``, verl's
``rollout_log_probs``: the recall mask, then repetition penalty, temperature, top-k and top-p
applied to the logits, then a log-softmax (see ``recallm.generation`` for the processors, their
order, and the log-prob of forced tokens).

Forced spans (``force_every``, a test aid: ``recallm.recall.hf.ForceRecallSpans``) are applied
*after* the log-probs are recorded: the log-prob of a forced token is the one the policy gives
it (what the trainer recomputes), not the 0 of a forced choice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recallm.config import MAX_BATCH, MAX_SECONDS, MAX_SEED, MAX_TOKENS, MAX_WORKERS
from recallm.errors import RecallmError
from recallm.generation import GenRequest, GenResult, generate
from recallm.tokens import DEFAULT_SPAN_DRAFT_TOKENS

__all__ = ["HFCPUSettings", "HFGenerator", "request_seeds"]

#: where the settings live in the GRPO config (named in every error)
SECTION = "actor_rollout_ref.rollout.engine_kwargs.hf_cpu"
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class HFCPUSettings:
    """``actor_rollout_ref.rollout.engine_kwargs.hf_cpu`` — the ``hf_cpu`` rollout's settings.

    The recall constraint is not a setting of the rollout: it follows the model config's
    ``recall_constrained`` (with ``override_config`` applied, as the actor's masked log-probs do),
    which the launcher derives from ``recallm.recall_constrained``.

    Attributes:
        force_every: open a recall span every N tokens generated outside spans (test aid,
            ``ForceRecallSpans``); ``None``: never force.
        force_length: close a forced span after this many tokens.
        dtype: weights and compute dtype of the rollout model (``float32``; ``bfloat16`` makes
            the rollout's log-probs drift from the fp32 actor's).
        attn_implementation: attention kernel (``sdpa`` or ``eager``; flash attention needs a GPU).
        threads: ``torch.set_num_threads`` in the rollout server (``None``: all cores).
        max_batch_size: most requests generated together in one ``generate`` call.
        batch_wait_ms: how long the server waits for more requests to arrive before it
            starts a batch (requests that arrive together are generated together).
        seed: the run's sampling seed on the server (``None``: the rollout config's ``seed``); requests
            without a seed of their own draw from torch's generator seeded with it + the replica's rank.
        seed_per_request: every request draws from a random stream of its own, seeded with a hash of the
            run's seed, the training step, its prompt, its index in the step's batch (verl's
            ``priority``; a caller that gives none, such as the RLM's loop: the replica's rank) and how
            many requests with that prompt and index came before it in the step (:func:`request_seeds`):
            a response is the same whichever requests are batched with it, in
            whatever order, so two runs of the same job (one of them stopped and resumed) sample the same
            responses. Batched as any request (``recallm.generation``: one stream per row). ``false``:
            every request draws from the server's one stream (what it draws depends on the batches).
        span_draft_tokens: most tokens drafted and verified in one forward pass inside a recall span
            (speculative in-span decoding, ``recallm.decoding``; the same tokens as plain decoding);
            0 decodes one token per forward pass.
    """

    force_every: int | None = field(default=None, metadata={"max": MAX_TOKENS})
    force_length: int = field(default=6, metadata={"max": MAX_TOKENS})
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    threads: int | None = field(default=None, metadata={"max": MAX_WORKERS})
    max_batch_size: int = field(default=64, metadata={"max": MAX_BATCH})
    batch_wait_ms: float = field(default=20.0, metadata={"max": MAX_SECONDS * 1000})
    seed: int | None = field(default=None, metadata={"min": 0, "max": MAX_SEED})
    seed_per_request: bool = True
    span_draft_tokens: int = field(default=DEFAULT_SPAN_DRAFT_TOKENS, metadata={"min": 0, "max": MAX_TOKENS})

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise RecallmError(f"dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise RecallmError(f"attn_implementation must be sdpa or eager, got {self.attn_implementation!r}")
        for name, low in (
            ("force_every", 1),
            ("force_length", 1),
            ("threads", 1),
            ("max_batch_size", 1),
            ("span_draft_tokens", 0),
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise RecallmError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.batch_wait_ms < 0:
            raise RecallmError(f"batch_wait_ms must be >= 0, got {self.batch_wait_ms!r}")

    @classmethod
    def from_engine_kwargs(cls, values: Mapping[str, Any] | None) -> HFCPUSettings:
        """Build from the ``engine_kwargs.hf_cpu`` mapping (``recallm.config.typed``: this class is its
        schema; unknown keys and values of the wrong kind are one line naming the key)."""
        from recallm.config import typed

        return typed(cls, values, SECTION)


class HFGenerator:
    """A causal LM and the generation loop of the ``hf_cpu`` rollout (see module doc)."""

    def __init__(
        self,
        model,
        settings: HFCPUSettings | None = None,
        *,
        eos_token_ids: Iterable[int] | int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.settings = settings or HFCPUSettings()
        self.model = model.eval()
        config = model.config
        from recallm import tokens

        if eos_token_ids is None:
            eos_token_ids = tokens.eos_token_ids(
                config=config, generation_config=getattr(model, "generation_config", None)
            )
        if isinstance(eos_token_ids, int):
            eos_token_ids = [eos_token_ids]
        self.eos_token_ids: list[int] = [int(i) for i in (eos_token_ids or [])]
        self.max_model_len = int(max_model_len or getattr(config, "max_position_embeddings", 1 << 30))
        # the model config's recall_constrained (recallm.recall_constrained, through override_config)
        self.recall = bool(getattr(config, "recall_constrained", False)) and (
            getattr(config, "recall_start_token_id", None) is not None
        )
        self._state = model.state_dict(keep_vars=True)
        self._received: set[str] = set()

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        settings: HFCPUSettings | None = None,
        *,
        config=None,
        max_model_len: int | None = None,
    ) -> HFGenerator:
        """Load ``path`` with ``AutoModelForCausalLM`` (RecaLLM classes registered) on the CPU."""
        from recallm.modeling import load_causal_lm  # (registers recallm_<base> with the Auto classes)

        settings = settings or HFCPUSettings()
        kwargs: dict[str, Any] = {"dtype": _DTYPES[settings.dtype], "attn_implementation": settings.attn_implementation}
        if config is not None:
            kwargs["config"] = config
        model = load_causal_lm(path, **kwargs)
        return cls(model, settings, max_model_len=max_model_len)

    # --- requests ------------------------------------------------------------------------------

    def make_request(
        self,
        prompt_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        default_max_tokens: int | None = None,
    ) -> GenRequest:
        """A request from verl's ``sampling_params`` (``max_tokens``/``max_new_tokens``,
        ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``; ``logprobs`` is accepted,
        log-probs are always computed)."""
        params = dict(sampling_params)
        prompt = tuple(int(t) for t in prompt_ids)
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise ValueError(
                f"prompt of {len(prompt)} tokens leaves no room to generate within max_model_len={self.max_model_len}"
            )
        max_tokens = params.pop("max_tokens", None)
        if max_tokens is None:
            max_tokens = params.pop("max_new_tokens", None)
        if max_tokens is None:
            max_tokens = default_max_tokens if default_max_tokens is not None else room
        max_tokens = max(1, min(int(max_tokens), room))
        if params.pop("ignore_eos", False):
            raise NotImplementedError("the hf_cpu rollout does not support ignore_eos=True")
        top_k = params.pop("top_k", -1)
        top_p = params.pop("top_p", 1.0)
        temperature = params.pop("temperature", 1.0)
        repetition = params.pop("repetition_penalty", 1.0)
        return GenRequest(
            prompt_ids=prompt,
            max_new_tokens=max_tokens,
            temperature=float(1.0 if temperature is None else temperature),
            top_p=float(1.0 if top_p is None else top_p),
            top_k=int(-1 if top_k is None else top_k),
            repetition_penalty=float(1.0 if repetition is None else repetition),
        )

    # --- generation ----------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        """Generate every request (``recallm.generation.generate`` with log-probs); results in
        request order. A request with a ``seed`` samples from a stream of its own; one without draws
        from the process's torch RNG (the server seeds it once)."""
        force = self.settings
        return generate(
            self.model,
            requests,
            eos_token_ids=self.eos_token_ids,
            recall=self.recall,
            force=(force.force_every, force.force_length) if force.force_every is not None else None,
            log_probs=True,
            batch_size=self.settings.max_batch_size,
            span_draft_tokens=self.settings.span_draft_tokens,
        )

    # --- weights -------------------------------------------------------------------------------

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy ``(name, tensor)`` pairs (the actor's state-dict names) into the model."""
        unknown = []
        count = 0
        for name, tensor in named_tensors:
            target = self._state.get(name)
            if target is None:
                unknown.append(name)
                continue
            if tuple(target.shape) != tuple(tensor.shape):
                raise RuntimeError(
                    f"hf_cpu weight update: {name} has shape {tuple(tensor.shape)}, the rollout model "
                    f"{tuple(target.shape)}"
                )
            target.copy_(tensor)
            self._received.add(name)
            count += 1
        if unknown:
            raise RuntimeError(
                f"hf_cpu weight update: {len(unknown)} weight(s) the rollout model does not have, e.g. {unknown[:3]}"
            )
        return count

    def finish_weight_update(self) -> None:
        """Check that every weight of the model arrived since the last check (tied weights count
        once), then start a new round."""
        received_storage = {self._state[name].data_ptr() for name in self._received}
        missing = [
            name
            for name, tensor in self._state.items()
            if name not in self._received and tensor.data_ptr() not in received_storage
        ]
        self._received = set()
        if missing:
            raise RuntimeError(
                f"hf_cpu weight update: {len(missing)} weight(s) of the rollout model were not sent, e.g. {missing[:3]}"
            )


def request_seeds(
    requests: Sequence[GenRequest],
    base: int,
    step: int | None,
    seen: dict[tuple, int],
    samples: Sequence[int | str] | None = None,
) -> list[GenRequest]:
    """``requests`` with a seed each (``HFCPUSettings.seed_per_request``): a hash of ``base``, the
    training ``step``, the prompt, the request's ``samples`` entry (verl's ``priority``: the response's
    index in the step's batch; 0 when not given) and how many requests with that prompt and sample
    came before it in ``seen`` (updated: the caller keeps one per step). Requests that share a prompt
    and a sample (a GRPO group whose caller passes no index) are interchangeable, so which of them
    arrives first does not matter."""
    seeded = []
    for i, request in enumerate(requests):
        sample = samples[i] if samples is not None else 0
        key = (request.prompt_ids, sample)
        k = seen.get(key, 0)
        seen[key] = k + 1
        digest = hashlib.blake2b(repr((base, step, request.prompt_ids, sample, k)).encode(), digest_size=8).digest()
        seeded.append(dataclasses.replace(request, seed=int.from_bytes(digest, "big") & (2**63 - 1)))
    return seeded


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
