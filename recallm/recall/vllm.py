"""Constrained recall inside vLLM: a batch-state core over ``RecallMatcher`` and a V1 adapter.

Layers
------
* :class:`RecallBatchState` (no vLLM import): one :class:`~recallm.recall.matcher.RecallMatcher`
  per request, keyed by an integer *slot* (vLLM V1: the persistent-batch index). ``add`` /
  ``remove`` / ``move`` follow the batch; ``apply(logits)`` first feeds every request the
  tokens appended to its live output list since the last call, then masks the logits rows of
  requests inside a recall span to ``-inf`` outside their allowed set. The allowed sets come
  from the matcher only (never re-implemented here).
* ``RecallLogitsProcessorV1``: the vLLM V1 logits processor (a subclass of
  ``vllm.v1.sample.logits_processor.LogitsProcessor``). vLLM is imported only when this name
  is first looked up on the module, so ``import recallm.recall.vllm`` works without vLLM;
  :func:`make_v1_processor_class` builds (once) and returns the same class.

Loading it in vLLM (the V1 engine, vLLM 0.24.0 as pinned by ``verl[vllm]==0.9.1``)::

    from recallm.modeling import vllm_hf_overrides
    LLM(model=path, hf_overrides=vllm_hf_overrides(config),
        logits_processors=["recallm.recall.vllm:RecallLogitsProcessorV1"])

``vllm serve``: ``--logits-processors recallm.recall.vllm:RecallLogitsProcessorV1``. In verl::

    +actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors=[recallm.recall.vllm:RecallLogitsProcessorV1]
    +actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides='{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}'

with the ``hf_overrides`` value taken from ``recallm.modeling.vllm_hf_overrides(config)`` for
the checkpoint (vLLM then serves the base architecture; the recall token ids and
``max_recall_tokens`` stay in the config, where the processor reads them). ``recallm`` must be
importable in the Ray actors and in vLLM's spawned processes (installed package or
``PYTHONPATH``). verl's default ``logprobs_mode=processed_logprobs`` returns rollout log-probs
renormalised over the allowed set, which is what the masked trainer forward computes.

Every request is constrained, unless its ``SamplingParams.extra_args`` carries
``{"recall_constrained": False}`` or the model config has ``recall_constrained = False``.

Per engine step (``apply``)
---------------------------
* A Python loop over the tracked requests reads ``len(output)``; a request with a new token
  feeds it to its matcher (one array write outside spans, a survivor filter inside). Trailing
  ``-1`` placeholders (async scheduling) are never fed: feeding stops at the first negative id
  and resumes there at the next call. (vLLM 0.24 fills them in before the processors run when
  a custom processor is loaded; the adapter's ``needs_output_token_ids()`` asks for that in
  versions with the hook.) A list that shrank or whose last fed token changed is replayed from
  scratch. When no request is inside a span nothing else happens: the logits are returned
  untouched.
* In-span requests give their allowed ids (``allowed_tokens()``: a few ids for a running span,
  the context's distinct tokens right after the start token). They are concatenated into one
  index array with the row of each id. Logits on the CPU: numpy views, no copy; elsewhere one
  host->device transfer (from a pinned staging buffer when ``pin_memory``), then on the
  device: gather the allowed logits, fill the in-span rows with ``-inf``, scatter the gathered
  values back. Rows outside spans are never written. No vocab-sized host structure is built
  per step, and nothing is read back from the device. (On a CPU the ``-inf`` fill of the rows
  is memory-bound and dominates: ``bench/vllm_mask_batch.py``.)

Tested against the real engine by ``scripts/test_vllm.sh`` (the CPU build of vLLM 0.24.0:
sampled spans verbatim, greedy outputs equal to HF ``generate``, the per-request opt-out).

Model Runner V2 (vLLM >= 0.31)
------------------------------
MRV2's processor interface (``__init__(vllm_config, req_states)``, ``add_request(req_idx,
sampling_params)``, ``apply_staged_writes()``, ``apply(logits, ctx)``) fits the same core with a
thin adapter and no change here or in the matcher:

* slot = MRV2's ``req_idx``; ``add_request`` calls ``state.add(req_idx, prompt_ids, history)``
  where ``history`` is a host list the adapter owns (any sequence with ``len`` and slicing);
  a finished request is ``state.remove(req_idx)``; MRV2 does not move requests between slots,
  so ``move`` is unused;
* token history lives on the device (``req_states.all_token_ids``): once per step the adapter
  copies the newly sampled ids of all requests to the host in one transfer and appends them to
  the ``history`` lists (the core then feeds them in ``apply``);
* logits rows map to slots through ``ctx.expanded_idx_mapping``: the adapter passes it (as a
  host sequence) to ``state.apply(logits, keys=mapping)``; row ``r`` is masked with the state
  of slot ``keys[r]`` (a slot may own several rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from recallm.recall.matcher import RecallMatcher

__all__ = ["RecallBatchState", "make_v1_processor_class", "wants_recall_mask", "V1_PROCESSOR_FQCN", "EXTRA_ARG"]

#: What to pass to vLLM's ``logits_processors`` (``LLM(...)``, ``--logits-processors``, verl).
V1_PROCESSOR_FQCN = "recallm.recall.vllm:RecallLogitsProcessorV1"

#: ``SamplingParams.extra_args`` key: False leaves that request unconstrained.
EXTRA_ARG = "recall_constrained"


class _Request:
    """One tracked request: its matcher and how much of its live output list it has seen."""

    __slots__ = ("matcher", "prompt", "output", "fed", "last")

    def __init__(self, matcher: RecallMatcher, prompt: Sequence[int] | None, output: Sequence[int]) -> None:
        self.matcher = matcher
        self.prompt = prompt
        self.output = output
        self.fed = 0  # output[:fed] has been fed to the matcher
        self.last = -1  # output[fed - 1] when it was fed (a changed value means the list was rewritten)


def wants_recall_mask(sampling_params) -> bool:
    """False when a request opts out with ``SamplingParams(extra_args={"recall_constrained": False})``."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    return extra.get(EXTRA_ARG, True) is not False


def _is_swap(direction: Any) -> bool:
    """vLLM's ``MoveDirectionality.SWAP`` (or a stand-in with that name, or a bool)."""
    if isinstance(direction, bool):
        return direction
    return str(getattr(direction, "name", direction)).upper().endswith("SWAP")


class RecallBatchState:
    """Recall-span state of a batch of requests, in slots that follow the engine's batch.

    Args:
        start_id, end_id: ids of ``<|start_recall|>`` and ``<|end_recall|>``.
        max_recall_tokens: span length after which only the end token is allowed.
        vocab_size: if given, token ids are checked against it.
        mask_value: value written into disallowed logits.
        pin_memory: stage the index array in pinned host memory for a non-blocking transfer
            (CUDA logits only).
        use_numpy: mask CPU logits through numpy views (default, the fastest on a CPU) or, with
            False, through the torch ops used for accelerator logits (to test that path on a CPU).
    """

    def __init__(
        self,
        start_id: int,
        end_id: int,
        *,
        max_recall_tokens: int = 128,
        vocab_size: int | None = None,
        mask_value: float = float("-inf"),
        pin_memory: bool = False,
        use_numpy: bool = True,
    ) -> None:
        RecallMatcher(start_id, end_id, max_recall_tokens=max_recall_tokens, vocab_size=vocab_size)  # validates
        self.start_id = int(start_id)
        self.end_id = int(end_id)
        self.max_recall_tokens = int(max_recall_tokens)
        self.vocab_size = vocab_size
        self.mask_value = float(mask_value)
        self.pin_memory = bool(pin_memory)
        self.use_numpy = bool(use_numpy)
        self._requests: dict[int, _Request] = {}
        self._staging: torch.Tensor | None = None  # pinned host buffer for the index array
        self._staging_event: Any = None  # marks the end of the last copy out of it

    @classmethod
    def from_config(cls, config, **kwargs) -> RecallBatchState:
        """Build from a RecaLLM model config (token ids, ``max_recall_tokens``, ``vocab_size``)."""
        from recallm.tokens import DEFAULT_MAX_RECALL_TOKENS, RecallTokenIds

        ids = RecallTokenIds.from_config(config)
        kwargs.setdefault("max_recall_tokens", getattr(config, "max_recall_tokens", None) or DEFAULT_MAX_RECALL_TOKENS)
        kwargs.setdefault("vocab_size", getattr(config, "vocab_size", None))
        return cls(ids.start, ids.end, **kwargs)

    # ------------------------------------------------------------ batch changes
    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, slot: int) -> bool:
        return slot in self._requests

    def slots(self) -> list[int]:
        """The occupied slots."""
        return list(self._requests)

    def matcher(self, slot: int) -> RecallMatcher:
        """The matcher of the request in ``slot`` (as of the last ``apply``/``sync``)."""
        return self._requests[slot].matcher

    def add(self, slot: int, prompt_ids: Sequence[int] | np.ndarray | None, output_ids: Sequence[int]) -> None:
        """Track a request in ``slot`` (replacing whatever was there).

        ``output_ids`` is the request's live output list (kept by reference: the tokens it gains
        are fed at the next ``apply``); it may already hold tokens (a preempted request that is
        re-added) and may end in ``-1`` placeholders. The prompt is fed now.
        """
        matcher = RecallMatcher(
            self.start_id, self.end_id, max_recall_tokens=self.max_recall_tokens, vocab_size=self.vocab_size
        )
        if prompt_ids is not None and len(prompt_ids):
            matcher.feed(np.asarray(prompt_ids, dtype=np.int64))
            matcher.index_now()  # at prefill, not in the decode step where a span opens
        self._requests[int(slot)] = _Request(matcher, prompt_ids, output_ids)

    def remove(self, slot: int) -> None:
        """Stop tracking ``slot`` (no error if it is empty)."""
        self._requests.pop(int(slot), None)

    def move(self, src: int, dst: int, swap: bool = False) -> None:
        """vLLM's moves: the request in ``src`` goes to ``dst`` (whatever was in ``dst`` is
        dropped), or, with ``swap``, the two slots exchange their requests."""
        reqs = self._requests
        a = reqs.pop(int(src), None)
        b = reqs.pop(int(dst), None)
        if a is not None:
            reqs[int(dst)] = a
        if swap and b is not None:
            reqs[int(src)] = b

    def update(self, batch_update, accept: Callable[[Any], bool] | None = None) -> None:
        """Apply a vLLM ``BatchUpdate`` (or anything with ``removed``, ``added``, ``moved``):
        removals, then additions ``(index, params, prompt_ids, output_ids)``, then moves
        ``(i, j, directionality)``. ``None`` (no change to the batch) is a no-op.

        ``accept(params)`` returning False leaves an added request untracked (unconstrained).
        """
        if batch_update is None:
            return
        for slot in batch_update.removed:
            self.remove(slot)
        for slot, params, prompt_ids, output_ids in batch_update.added:
            if accept is None or accept(params):
                self.add(slot, prompt_ids, output_ids)
            else:
                self.remove(slot)  # an untracked slot: its rows are never masked
        for src, dst, direction in batch_update.moved:
            self.move(src, dst, swap=_is_swap(direction))

    # --------------------------------------------------------------- stepping
    def _catch_up(self, req: _Request, n: int) -> None:
        out = req.output
        if n < req.fed or (req.fed and out[req.fed - 1] != req.last):
            # the list was shortened or rewritten (vLLM discards tokens after a KV-load failure):
            # rebuild from the full history
            matcher = RecallMatcher(
                self.start_id, self.end_id, max_recall_tokens=self.max_recall_tokens, vocab_size=self.vocab_size
            )
            if req.prompt is not None and len(req.prompt):
                matcher.feed(np.asarray(req.prompt, dtype=np.int64))
            req.matcher, req.fed, req.last = matcher, 0, -1
            if n == 0:
                return
        if n - req.fed == 1:  # the decoding fast path
            tok = int(out[req.fed])
            if tok >= 0:
                req.matcher.feed_one(tok)
                req.fed, req.last = n, tok
            return
        new = np.asarray(out[req.fed : n], dtype=np.int64)
        neg = np.flatnonzero(new < 0)
        if neg.size:  # async placeholders: feed up to the first one, resume there next time
            new = new[: int(neg[0])]
        if new.size:
            req.matcher.feed(new)
            req.fed += int(new.size)
            req.last = int(new[-1])

    def sync(self) -> list[int]:
        """Feed every request the tokens its output list gained; return the in-span slots.

        Output lists only grow in vLLM; one that shrank, or whose last fed token changed, is
        replayed from scratch (prompt + the whole list).
        """
        in_span = []
        for slot, req in self._requests.items():
            out = req.output
            n = len(out)
            if n != req.fed or (n and out[n - 1] != req.last):
                self._catch_up(req, n)
            if req.matcher.in_span:
                in_span.append(slot)
        return in_span

    def apply(self, logits: torch.Tensor, keys: Sequence[int] | None = None) -> torch.Tensor:
        """Feed new tokens, then mask in place the rows of in-span requests; return ``logits``.

        ``logits`` is ``[rows, vocab]``. Row ``r`` belongs to slot ``r`` (vLLM V1), or to slot
        ``keys[r]`` when ``keys`` is given (Model Runner V2's index mapping). Rows whose slot is
        outside a span (or untracked) are left untouched. Same as
        ``write_mask(logits, allowed_index(sync(), len(logits), keys))``.
        """
        in_span = self.sync()
        if not in_span:
            return logits
        return self.write_mask(logits, self.allowed_index(in_span, logits.shape[0], keys))

    def allowed_index(
        self, in_span: Sequence[int], n_rows: int, keys: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(rows, row_of, cols)``: the distinct logits rows to mask and, for every allowed id
        ``cols[i]`` (possibly repeated), its row ``row_of[i]``. ``None`` when no row is masked."""
        if keys is None:
            rows = [s for s in in_span if s < n_rows]
            allowed = [self._requests[s].matcher.allowed_tokens() for s in rows]
        else:
            per_slot = dict.fromkeys(in_span)
            rows, allowed = [], []
            for r, s in enumerate(keys[:n_rows] if len(keys) > n_rows else keys):
                s = int(s)
                if s in per_slot:
                    ids = per_slot[s]
                    if ids is None:
                        ids = per_slot[s] = self._requests[s].matcher.allowed_tokens()
                    rows.append(r)
                    allowed.append(ids)
        if not rows:
            return None
        rows_np = np.asarray(rows, dtype=np.int64)
        cols = np.concatenate(allowed) if len(allowed) > 1 else allowed[0]
        row_of = np.repeat(rows_np, [a.size for a in allowed])
        return rows_np, row_of, cols

    def write_mask(self, logits: torch.Tensor, index: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> torch.Tensor:
        """Set, in place, every entry of ``index``'s rows to ``mask_value`` except its allowed ids."""
        if index is None:
            return logits
        if self.use_numpy and logits.device.type == "cpu" and logits.dtype in _NUMPY_DTYPES:
            self._mask_numpy(logits, *index)
        else:
            self._mask_torch(logits, *index)
        return logits

    # ---------------------------------------------------------------- masking
    def _mask_numpy(self, logits: torch.Tensor, rows: np.ndarray, row_of: np.ndarray, cols: np.ndarray) -> None:
        a = logits.detach().numpy()
        keep = a[row_of, cols]
        if rows.size == a.shape[0]:  # every row is in a span (rows are distinct)
            a.fill(self.mask_value)
        else:
            a[rows] = self.mask_value
        a[row_of, cols] = keep

    def _mask_torch(self, logits: torch.Tensor, rows: np.ndarray, row_of: np.ndarray, cols: np.ndarray) -> None:
        r, n = rows.size, cols.size
        index = self._to_device(np.concatenate((rows, row_of, cols.astype(np.int64, copy=False))), logits.device)
        rows_t, row_of_t, cols_t = index[:r], index[r : r + n], index[r + n :]
        keep = logits[row_of_t, cols_t]
        if r == logits.shape[0]:
            logits.fill_(self.mask_value)
        else:
            logits.index_fill_(0, rows_t, self.mask_value)
        logits.index_put_((row_of_t, cols_t), keep)

    def _to_device(self, index: np.ndarray, device: torch.device) -> torch.Tensor:
        """One host->device copy of the index array (non-blocking from pinned memory on CUDA)."""
        if device.type == "cpu":
            return torch.from_numpy(index)
        if not (self.pin_memory and device.type == "cuda"):
            return torch.from_numpy(index).to(device)
        if self._staging_event is not None:
            self._staging_event.synchronize()  # the previous copy out of the buffer has finished
        if self._staging is None or self._staging.numel() < index.size:
            size = max(index.size, 2 * (0 if self._staging is None else self._staging.numel()), 4096)
            self._staging = torch.empty(size, dtype=torch.int64, pin_memory=True)
        host = self._staging[: index.size]
        host.numpy()[:] = index
        out = host.to(device, non_blocking=True)
        self._staging_event = torch.cuda.Event()
        self._staging_event.record()
        return out


_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


# ------------------------------------------------------------------ vLLM V1
_V1_CLASS: type | None = None


def make_v1_processor_class() -> type:
    """Build (once) and return ``RecallLogitsProcessorV1``; raises ImportError without vLLM."""
    global _V1_CLASS
    if _V1_CLASS is not None:
        return _V1_CLASS
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessor
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "RecallLogitsProcessorV1 needs vLLM (vllm.v1.sample.logits_processor); "
            "install the GPU extra (pip install -e '.[gpu]'). RecallBatchState works without it."
        ) from exc

    class RecallLogitsProcessorV1(LogitsProcessor):
        """vLLM V1 logits processor: recall spans are verbatim copies of their context.

        Reads the recall token ids, ``max_recall_tokens``, ``vocab_size`` and
        ``recall_constrained`` from ``vllm_config.model_config.hf_config`` (a RecaLLM config,
        served as its base architecture through ``recallm.modeling.vllm_hf_overrides``). Load
        with ``logits_processors=["recallm.recall.vllm:RecallLogitsProcessorV1"]``; in verl with
        ``+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors=[recallm.recall.vllm:RecallLogitsProcessorV1]``
        plus ``+actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides=<vllm_hf_overrides(config) as JSON>``.
        A request opts out with ``SamplingParams(extra_args={"recall_constrained": False})``.
        """

        def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
            hf_config = vllm_config.model_config.hf_config
            self.enabled = bool(getattr(hf_config, "recall_constrained", True))
            self.state = RecallBatchState.from_config(hf_config, pin_memory=bool(is_pin_memory))

        @classmethod
        def validate_params(cls, sampling_params) -> None:
            return None  # every request is accepted

        def is_argmax_invariant(self) -> bool:
            return False  # the mask changes the argmax

        def needs_output_token_ids(self) -> bool:
            return True  # versions that know this hook then keep output lists free of placeholders

        def update_state(self, batch_update) -> None:
            if self.enabled:
                self.state.update(batch_update, accept=wants_recall_mask)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            if not self.enabled:
                return logits
            return self.state.apply(logits)

    RecallLogitsProcessorV1.__module__ = __name__
    RecallLogitsProcessorV1.__qualname__ = "RecallLogitsProcessorV1"
    _V1_CLASS = RecallLogitsProcessorV1
    return _V1_CLASS


def __getattr__(name: str):
    # vLLM resolves "recallm.recall.vllm:RecallLogitsProcessorV1" with getattr: build it then.
    if name == "RecallLogitsProcessorV1":
        return make_v1_processor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
