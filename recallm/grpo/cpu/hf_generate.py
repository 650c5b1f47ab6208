"""Token-in/token-out generation with Hugging Face ``generate`` for the ``hf_cpu`` rollout.

No Ray and no verl here: :class:`HFGenerator` is what the rollout server calls, and what a test
calls directly. It takes a list of requests (prompt ids + the sampling parameters verl sends),
runs them as left-padded batches (one ``generate`` call per group of equal sampling
parameters), and returns for every request its generated ids (up to and including the first
end-of-sequence token) and the log-probability of every generated token under the *processed*
distribution — what vLLM returns with ``logprobs_mode=processed_logprobs``, verl's
``rollout_log_probs``: the recall mask, then repetition penalty, temperature, top-k and top-p
applied to the logits, then a log-softmax.

The logits processors are ours in full, in vLLM's order (``RecallLogitsProcessor``, repetition
penalty, temperature, top-k, top-p); ``generate`` itself adds none (the model's
``generation_config`` is reduced to its token ids, and every sampling option is passed as its
neutral value), so a model's shipped defaults (``top_k=20``, ``temperature=0.7``, ...) cannot
change what verl asked for.

Forced spans (``force_every``, a test aid: ``recallm.recall.hf.ForceRecallSpans``) are applied
*after* the log-probs are recorded: the log-prob of a forced token is the one the policy gives
it (what the trainer recomputes), not the 0 of a forced choice; a forced token that top-k/top-p
would have excluded gets its log-prob before top-k/top-p (finite, as the trainer's).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from recallm.errors import RecallmError

__all__ = ["HFCPUSettings", "GenRequest", "GenResult", "HFGenerator"]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class HFCPUSettings:
    """``actor_rollout_ref.rollout.engine_kwargs.hf_cpu`` — the ``hf_cpu`` rollout's settings.

    Attributes:
        recall: constrain recall spans with ``RecallLogitsProcessor``. ``None`` (default): follow
            the model config's ``recall_constrained`` (true for a RecaLLM model, and the actor's
            masked log-probs follow the same flag). ``false``: plain decoding.
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
        seed: sampling seed of the server (``None``: the rollout config's ``seed`` + replica rank).
    """

    recall: bool | None = None
    force_every: int | None = None
    force_length: int = 6
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    threads: int | None = None
    max_batch_size: int = 64
    batch_wait_ms: float = 20.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise RecallmError(f"hf_cpu.dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise RecallmError(f"hf_cpu.attn_implementation must be sdpa or eager, got {self.attn_implementation!r}")
        for name, low in (("force_every", 1), ("force_length", 1), ("threads", 1), ("max_batch_size", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise RecallmError(f"hf_cpu.{name} must be an integer >= {low}, got {value!r}")
        if self.batch_wait_ms < 0:
            raise RecallmError(f"hf_cpu.batch_wait_ms must be >= 0, got {self.batch_wait_ms!r}")
        if self.recall is not None and not isinstance(self.recall, bool):
            raise RecallmError(f"hf_cpu.recall must be true, false or null, got {self.recall!r}")

    @classmethod
    def from_engine_kwargs(cls, values: Mapping[str, Any] | None) -> HFCPUSettings:
        """Build from the ``engine_kwargs.hf_cpu`` mapping (unknown keys are an error)."""
        if values is None:
            return cls()
        if hasattr(values, "items") and not isinstance(values, dict):  # an OmegaConf DictConfig
            from omegaconf import OmegaConf

            values = OmegaConf.to_container(values, resolve=True)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise RecallmError(
                f"unknown key(s) in actor_rollout_ref.rollout.engine_kwargs.hf_cpu: {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        values = dict(values)
        if values.get("batch_wait_ms") is not None:
            values["batch_wait_ms"] = float(values["batch_wait_ms"])
        return cls(**values)


@dataclass(frozen=True)
class GenRequest:
    """One generation request, with vLLM's sampling parameters (``top_k <= 0``: no top-k;
    ``temperature == 0``: greedy)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-5

    def group_key(self) -> tuple:
        if self.greedy:
            return (True, 1.0, 1.0, -1, self.repetition_penalty)
        top_k = self.top_k if self.top_k > 0 else -1
        return (False, self.temperature, self.top_p, top_k, self.repetition_penalty)


@dataclass
class GenResult:
    token_ids: list[int]
    log_probs: list[float]


class _LogProbRecorder(LogitsProcessor):
    """Records ``log_softmax`` of the scores it sees; the token chosen at a step is read from the
    next step's ``input_ids`` (and, for the last step, from the finished sequences)."""

    def __init__(self) -> None:
        self._previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._previous is not None:
            self.steps.append(self._previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self._previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.LongTensor) -> torch.Tensor:
        """(B, steps) log-probs of the generated tokens."""
        if self._previous is not None:
            self.steps.append(self._previous.gather(1, sequences[:, -1:]).squeeze(1))
            self._previous = None
        if not self.steps:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self.steps, dim=1)


class HFGenerator:
    """A causal LM and the generation loop of the ``hf_cpu`` rollout (see module doc)."""

    def __init__(
        self,
        model,
        settings: HFCPUSettings | None = None,
        *,
        eos_token_ids: Iterable[int] | int | None = None,
        pad_token_id: int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.settings = settings or HFCPUSettings()
        self.model = model.eval()
        config = model.config
        gen = getattr(model, "generation_config", None)
        from recallm import tokens

        if eos_token_ids is None:
            eos_token_ids = tokens.eos_token_ids(config=config, generation_config=gen)
        if isinstance(eos_token_ids, int):
            eos_token_ids = [eos_token_ids]
        self.eos_token_ids: list[int] = [int(i) for i in (eos_token_ids or [])]
        if pad_token_id is None:
            pad_token_id = tokens.pad_token_id(config=config, generation_config=gen)
        self.pad_token_id = int(pad_token_id)
        self.max_model_len = int(max_model_len or getattr(config, "max_position_embeddings", 1 << 30))
        # generate() fills every unset option from model.generation_config: keep only the token ids
        model.generation_config = GenerationConfig(
            eos_token_id=self.eos_token_ids or None,
            pad_token_id=self.pad_token_id,
            bos_token_id=getattr(gen, "bos_token_id", None),
        )
        self.recall = self._resolve_recall(config)
        if self.settings.force_every is not None:
            from recallm.tokens import RecallTokenIds

            self._force_ids = RecallTokenIds.from_config(config)
        self._state = model.state_dict(keep_vars=True)
        self._received: set[str] = set()

    def _resolve_recall(self, config) -> bool:
        constrained = (
            bool(getattr(config, "recall_constrained", False))
            and getattr(config, "recall_start_token_id", None) is not None
        )
        wanted = self.settings.recall
        if wanted is None:
            return constrained
        if wanted and getattr(config, "recall_start_token_id", None) is None:
            raise RecallmError(
                "hf_cpu.recall=true but the model config has no recall tokens (recall_start_token_id); "
                "convert the model with `recallm-create-model`"
            )
        if wanted != bool(getattr(config, "recall_constrained", False)):
            log.warning(
                "hf_cpu.recall=%s but the model config has recall_constrained=%s: the actor computes its "
                "log-probs %s the recall mask, the rollout samples %s it; set "
                "actor_rollout_ref.model.override_config.recall_constrained=%s to make them agree",
                wanted,
                getattr(config, "recall_constrained", False),
                "under" if getattr(config, "recall_constrained", False) else "without",
                "under" if wanted else "without",
                str(wanted).lower(),
            )
        return bool(wanted)

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
        from transformers import AutoModelForCausalLM

        import recallm.modeling  # noqa: F401  (registers recallm_<base> with the Auto classes)

        settings = settings or HFCPUSettings()
        kwargs: dict[str, Any] = {"dtype": _DTYPES[settings.dtype], "attn_implementation": settings.attn_implementation}
        if config is not None:
            kwargs["config"] = config
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
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
            max_tokens=max_tokens,
            temperature=float(1.0 if temperature is None else temperature),
            top_p=float(1.0 if top_p is None else top_p),
            top_k=int(-1 if top_k is None else top_k),
            repetition_penalty=float(1.0 if repetition is None else repetition),
        )

    # --- generation ----------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        """Generate every request; results in request order."""
        results: list[GenResult | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            key = request.group_key()
            if request.repetition_penalty != 1.0:  # HF's penalty would also count the padding
                key = (*key, i)
            groups.setdefault(key, []).append(i)
        limit = self.settings.max_batch_size
        for members in groups.values():
            for start in range(0, len(members), limit):
                chunk = members[start : start + limit]
                for i, result in zip(chunk, self._generate_batch([requests[i] for i in chunk]), strict=True):
                    results[i] = result
        return results  # type: ignore[return-value]

    def _processors(
        self, request: GenRequest, attention_mask: torch.Tensor
    ) -> tuple[LogitsProcessorList, _LogProbRecorder, _LogProbRecorder | None]:
        processors = LogitsProcessorList()
        if self.recall:
            from recallm.recall.hf import RecallLogitsProcessor

            processors.append(
                RecallLogitsProcessor.from_config(
                    self.model.config, prompt_attention_mask=attention_mask, pad_token_id=self.pad_token_id
                )
            )
        if request.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(penalty=request.repetition_penalty))
        truncated = None  # log-probs before top-k/top-p, for forced tokens they exclude
        if not request.greedy:
            if request.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(request.temperature))
            if self.settings.force_every is not None and (request.top_k > 0 or request.top_p < 1.0):
                truncated = _LogProbRecorder()
                processors.append(truncated)
            if request.top_k > 0:
                processors.append(TopKLogitsWarper(top_k=request.top_k))
            if request.top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p=request.top_p))
        recorder = _LogProbRecorder()
        processors.append(recorder)
        if self.settings.force_every is not None:
            from recallm.recall.hf import ForceRecallSpans

            ids = self._force_ids
            processors.append(
                ForceRecallSpans(ids.start, ids.end, every=self.settings.force_every, length=self.settings.force_length)
            )
        return processors, recorder, truncated

    @torch.inference_mode()
    def _generate_batch(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        request = requests[0]
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, r in enumerate(requests):  # left padding
            if r.prompt_ids:
                input_ids[row, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
                attention_mask[row, width - len(r.prompt_ids) :] = 1
        max_new = max(r.max_tokens for r in requests)
        processors, recorder, truncated = self._processors(request, attention_mask)
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "logits_processor": processors,
            "max_new_tokens": max_new,
            "do_sample": not request.greedy,
            "repetition_penalty": 1.0,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": self.eos_token_ids or None,
            "use_cache": True,
        }
        if not request.greedy:  # neutral values: generate() adds no warper of its own (ours are in `processors`)
            kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
        from recallm.modeling import RecallMaskMixin

        if isinstance(self.model, RecallMaskMixin):
            kwargs["recall_constrained"] = self.recall  # ours is in `processors`; none added twice
        sequences = self.model.generate(**kwargs)
        log_probs = recorder.finish(sequences)
        if truncated is not None:  # a forced token outside top-k/top-p: its log-prob before them
            before = truncated.finish(sequences)
            log_probs = torch.where(torch.isfinite(log_probs), log_probs, before)
        generated = sequences[:, width:].tolist()
        log_probs = log_probs.tolist()
        eos = set(self.eos_token_ids)
        results = []
        for row, r in enumerate(requests):
            tokens = generated[row][: r.max_tokens]
            for j, token in enumerate(tokens):
                if token in eos:
                    tokens = tokens[: j + 1]
                    break
            results.append(GenResult(token_ids=tokens, log_probs=log_probs[row][: len(tokens)]))
        return results

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


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
