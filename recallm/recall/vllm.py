"""Constrained recall inside vLLM: a batch-state core over ``RecallMatcher`` and one adapter per
vLLM processor interface.

Layers
------
* :class:`RecallBatchState` (no vLLM import): one :class:`~recallm.recall.matcher.RecallMatcher`
  per request, keyed by an integer *slot* (V1: the persistent-batch index; Model Runner V2: the
  request's ``req_idx``). ``add`` / ``remove`` / ``move`` follow the batch; ``apply(logits)`` first
  feeds every request the tokens appended to its live output list since the last call, then masks
  the logits rows of requests inside a recall span to ``-inf`` outside their allowed set. The
  allowed sets come from the matcher only (never re-implemented here).
* Two thin adapters over it, one per interface vLLM has had (``docs/guide/vllm-versions.md``):
  ``_V1Adapter`` (``vllm.v1.sample.logits_processor``: vLLM 0.24-0.33, removed in 0.34) and
  ``_V2Adapter`` (Model Runner V2's ``vllm.v1.worker.gpu.sample.logits_processor``, vLLM PR #56497:
  vLLM >= 0.32, whose MRV2 loader rejects V1-interface classes).
* The classes vLLM loads by name, built (once) by :func:`make_processor_class` when the name is
  first looked up on this module (so ``import recallm.recall.vllm`` works without vLLM), after
  ``recallm.engines.check_engines`` has refused an untested vLLM in one line:

  ``RecallLogitsProcessor`` (:data:`PROCESSOR_FQCN`, the one name to pass): a subclass of every
  interface the installed vLLM has. Both model runners load it, and each constructs it its own way
  (``(vllm_config, device, is_pin_memory)`` / ``(vllm_config, req_states)``), which selects the
  adapter. ``RecallLogitsProcessorV1`` / ``RecallLogitsProcessorV2``: one interface each (verl 0.9.1's
  rollout passes the V1 name; it keeps working wherever vLLM has the V1 interface).

Loading it in vLLM::

    from recallm.modeling import vllm_hf_overrides
    LLM(model=path, hf_overrides=vllm_hf_overrides(config),
        logits_processors=["recallm.recall.vllm:RecallLogitsProcessor"])

``vllm serve``: ``--logits-processors recallm.recall.vllm:RecallLogitsProcessor`` (``recallm-serve``
adds it). In verl (0.9.1 with vLLM 0.24: ``recallm-grpo`` adds it)::

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

Per engine step, V1
-------------------
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

Per engine step, Model Runner V2
--------------------------------
MRV2 keeps each request's token history on the device (``req_states.all_token_ids``, one row per
slot) and gives ``apply`` the step's layout (``ctx``: row -> slot, each row's sequence length on the
host). The adapter keeps, per slot, the prefill it read at admission and a host list of the tokens
after it; per step it copies the tokens it has not seen (one per decoding request) to the host in
one gather, appends them, and hands the core the row -> slot mapping (``state.apply(logits,
keys=...)``). Everything else is the core's, as above. Details: ``_V2Adapter``.

Tested: ``tests/unit/test_vllm_processor.py`` and ``test_vllm_mrv2.py`` (both adapters over stand-in
interfaces, driven by simulated engines: V1's persistent batch; MRV2's slots, device history, chunked
prefill, preemption), ``tests/vllm_tier`` on vLLM's CPU builds (``scripts/test_vllm.sh``): 0.24.0
(the V1 runner) and 0.32.0 (the V1 runner, which its CPU build runs without a Triton CPU backend; the
MRV2 adapter there against MRV2's own classes and loader, not in a running MRV2 engine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from recallm.recall.matcher import RecallMatcher

__all__ = [
    "RecallBatchState",
    "make_processor_class",
    "make_v1_processor_class",
    "wants_recall_mask",
    "PROCESSOR_FQCN",
    "V1_PROCESSOR_FQCN",
    "V2_PROCESSOR_FQCN",
    "EXTRA_ARG",
]

#: What to pass to vLLM's ``logits_processors`` (``LLM(...)``, ``--logits-processors``): the class of
#: every processor interface the installed vLLM has, so the V1 runner and Model Runner V2 both load it.
PROCESSOR_FQCN = "recallm.recall.vllm:RecallLogitsProcessor"
#: The V1 interface only (vLLM 0.24-0.33; what verl 0.9.1's rollout passes to vLLM 0.24).
V1_PROCESSOR_FQCN = "recallm.recall.vllm:RecallLogitsProcessorV1"
#: Model Runner V2's interface only (vLLM >= 0.32).
V2_PROCESSOR_FQCN = "recallm.recall.vllm:RecallLogitsProcessorV2"

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


# ------------------------------------------------------- vLLM's two processor interfaces
class _V1Adapter:
    """vLLM's V1 interface (``vllm.v1.sample.logits_processor.LogitsProcessor``, vLLM 0.24-0.33) over
    :class:`RecallBatchState`: slot = persistent-batch index, the core follows vLLM's ``BatchUpdate``
    records and reads each request's live output list."""

    def _setup_v1(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        hf_config = vllm_config.model_config.hf_config
        self.interface = "V1"
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

    def _apply_v1(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return logits
        return self.state.apply(logits)


def _host(values) -> np.ndarray:
    """A host array of one of MRV2's per-slot buffers (``UvaBackedTensor``: its ``.np``, the source of
    truth; a plain tensor or array otherwise)."""
    arr = getattr(values, "np", values)
    return arr.numpy() if isinstance(arr, torch.Tensor) else np.asarray(arr)


def _device(values) -> torch.Tensor:
    """The device tensor of one of MRV2's per-slot buffers (``StagedWriteTensor``: its ``.gpu``)."""
    return getattr(values, "gpu", values)


class _V2Adapter:
    """Model Runner V2's interface (``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor``,
    vLLM >= 0.32, vLLM PR #56497) over :class:`RecallBatchState`.

    * slot = MRV2's ``req_idx``. ``add_request`` resets the slot (a slot keeps its last occupant's
      state until it is reused: MRV2 has no removal hook and never indexes a freed slot) and returns
      whether the request is constrained (vLLM then runs ``apply`` for its row);
    * ``apply_staged_writes`` (after the runner flushed ``req_states``) reads the prefill of every
      request added since: ``all_token_ids[slot, :prefill_len]`` (the prompt, plus the output so far
      after a preemption), in one device->host copy, and tracks it as the core's prompt with an
      empty host list for what follows;
    * ``apply(logits, ctx)``: the tokens each row sees are ``all_token_ids[slot, :seq_len]``
      (``seq_len`` = ``ctx.seq_lens_upper_bound_np``, exact without speculative decoding); the ones
      not yet on the host (in decoding, the token sampled last step) are gathered from the device in
      one copy and appended to the lists, then the core feeds them and masks row ``r`` with the state
      of slot ``ctx.idx_mapping_np[r]``. A partial prefill row (``seq_len < prefill_len``) adds
      nothing; its sample is discarded by vLLM. A history that became shorter is cut and replayed.

    Speculative decoding (one row per draft token) is refused when the processor is built.
    """

    def _setup_v2(self, vllm_config, req_states) -> None:
        if getattr(vllm_config, "speculative_config", None) is not None:
            raise ValueError(
                "the recall logits processor does not support speculative decoding (Model Runner V2 gives "
                "it a row per draft token); serve without --speculative-config"
            )
        hf_config = vllm_config.model_config.hf_config
        self.interface = "V2"
        self.enabled = bool(getattr(hf_config, "recall_constrained", True))
        self.req_states = req_states
        device = torch.device(getattr(req_states, "device", "cpu"))
        self.state = RecallBatchState.from_config(hf_config, pin_memory=device.type == "cuda")
        self._pending: set[int] = set()  # added, prefill not read yet
        self._base: dict[int, int] = {}  # slot -> prefill length (fed as the core's prompt)
        self._out: dict[int, list[int]] = {}  # slot -> the tokens after the prefill (the core's live list)

    def add_request(self, req_idx: int, sampling_params) -> bool:
        slot = int(req_idx)
        self.state.remove(slot)
        self._base.pop(slot, None)
        self._out.pop(slot, None)
        if not (self.enabled and wants_recall_mask(sampling_params)):
            self._pending.discard(slot)
            return False
        self._pending.add(slot)
        return True

    def apply_staged_writes(self) -> None:
        if not self._pending:
            return
        slots = sorted(self._pending)
        self._pending.clear()
        lengths = [int(n) for n in _host(self.req_states.prefill_len)[slots]]
        tokens = _device(self.req_states.all_token_ids)
        index = torch.as_tensor(slots, dtype=torch.int64).to(tokens.device)
        rows = tokens[index, : max(lengths)].cpu().numpy()  # one device->host copy for all of them
        for slot, n, row in zip(slots, lengths, rows, strict=True):
            out: list[int] = []
            self.state.add(slot, row[:n].astype(np.int64), out)
            self._base[slot] = n
            self._out[slot] = out

    def _apply_v2(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        if not self.enabled:
            return logits
        self.apply_staged_writes()  # (already done by vLLM before the forward pass of an admitting step)
        slots = np.asarray(ctx.idx_mapping_np)[: logits.shape[0]]
        seq_lens = np.asarray(ctx.seq_lens_upper_bound_np)
        want_slot: list[int] = []
        want_pos: list[int] = []
        grow: list[tuple[list[int], int]] = []
        for i, slot in enumerate(slots.tolist()):
            out = self._out.get(slot)
            if out is None:
                continue  # not constrained
            base, n = self._base[slot], int(seq_lens[i])
            have = base + len(out)
            if n > have:  # tokens on the device the host has not seen (decoding: the last sampled one)
                want_slot += [slot] * (n - have)
                want_pos += range(have, n)
                grow.append((out, n - have))
            elif base <= n < have:  # the history became shorter: the core replays it
                del out[n - base :]
        if want_slot:
            tokens = _device(self.req_states.all_token_ids)
            index = torch.as_tensor(np.asarray([want_slot, want_pos], dtype=np.int64)).to(tokens.device)
            new = tokens[index[0], index[1]].cpu().tolist()  # one device->host copy per step
            at = 0
            for out, k in grow:
                out += new[at : at + k]
                at += k
        return self.state.apply(logits, keys=slots)


#: vLLM's module of each interface, and the name of its base class there
_INTERFACES = {
    "V1": "vllm.v1.sample.logits_processor",
    "V2": "vllm.v1.worker.gpu.sample.logits_processor",
}
_CLASSES: dict[str, type] = {}


def _interface_base(interface: str) -> type | None:
    import importlib

    try:
        return importlib.import_module(_INTERFACES[interface]).LogitsProcessor
    except (ImportError, AttributeError):
        return None


def _no_vllm(name: str, want: str) -> ImportError:
    return ImportError(
        f"{name} needs vLLM with {want} ({' or '.join(_INTERFACES[i] for i in want.split(' or '))}); "
        "install the GPU extra (pip install -e '.[gpu]'). RecallBatchState works without it."
    )


def make_processor_class(interface: str = "any") -> type:
    """Build (once) and return a recall logits processor class for the installed vLLM.

    ``interface``: ``"V1"`` (``RecallLogitsProcessorV1``), ``"V2"`` (``RecallLogitsProcessorV2``, Model
    Runner V2's interface), or ``"any"`` (``RecallLogitsProcessor``: a subclass of every interface this
    vLLM has, so either model runner loads it, and it takes the runner's interface from how the runner
    constructs it). Checks the vLLM version first (``recallm.engines``: an untested vLLM is refused in
    one line unless ``RECALLM_ALLOW_UNTESTED_ENGINES=1``). Raises ImportError without vLLM."""
    if interface in _CLASSES:
        return _CLASSES[interface]
    from recallm.engines import check_engines

    names = {"V1": "RecallLogitsProcessorV1", "V2": "RecallLogitsProcessorV2", "any": "RecallLogitsProcessor"}
    if interface not in names:
        raise ValueError(f"interface must be one of {sorted(names)}, got {interface!r}")
    name = names[interface]
    if interface == "any":
        bases = {i: b for i in ("V1", "V2") if (b := _interface_base(i)) is not None}
        if not bases:
            raise _no_vllm(name, "V1 or V2")
    else:
        base = _interface_base(interface)
        if base is None:
            raise _no_vllm(name, interface)
        bases = {interface: base}
    check_engines("processor")
    if set(bases) == {"V1"}:
        cls = type(name, (_V1Adapter, bases["V1"]), {"__init__": _V1Adapter._setup_v1, "apply": _V1Adapter._apply_v1})
    elif set(bases) == {"V2"}:
        cls = type(name, (_V2Adapter, bases["V2"]), {"__init__": _V2Adapter._setup_v2, "apply": _V2Adapter._apply_v2})
    else:
        cls = type(name, (_EitherRunner, bases["V1"], bases["V2"]), {})
    cls.__module__ = __name__
    cls.__qualname__ = name
    cls.__doc__ = _PROCESSOR_DOC.format(name=name, interfaces=" and ".join(_INTERFACES[i] for i in bases))
    _CLASSES[interface] = cls
    return cls


class _EitherRunner(_V1Adapter, _V2Adapter):
    """Both interfaces: the V1 runner constructs it with ``(vllm_config, device, is_pin_memory)`` and
    calls ``apply(logits)``; Model Runner V2 with ``(vllm_config, req_states)`` and ``apply(logits, ctx)``."""

    def __init__(self, vllm_config, *args) -> None:
        if len(args) == 2:
            self._setup_v1(vllm_config, *args)
        elif len(args) == 1:
            self._setup_v2(vllm_config, *args)
        else:
            raise TypeError(
                "a recall logits processor is built with (vllm_config, device, is_pin_memory) by vLLM's V1 model "
                f"runner or (vllm_config, req_states) by Model Runner V2, not with {1 + len(args)} arguments"
            )

    def apply(self, logits: torch.Tensor, ctx=None) -> torch.Tensor:
        return self._apply_v1(logits) if ctx is None else self._apply_v2(logits, ctx)


_PROCESSOR_DOC = """vLLM logits processor ({interfaces}): recall spans are verbatim copies of their context.

Reads the recall token ids, ``max_recall_tokens``, ``vocab_size`` and ``recall_constrained`` from
``vllm_config.model_config.hf_config`` (a RecaLLM config, served as its base architecture through
``recallm.modeling.vllm_hf_overrides``). Load with ``logits_processors=["recallm.recall.vllm:{name}"]``.
A request opts out with ``SamplingParams(extra_args={{"recall_constrained": False}})``.
"""


def make_v1_processor_class() -> type:
    """``RecallLogitsProcessorV1`` (:func:`make_processor_class` ``("V1")``); raises ImportError without vLLM."""
    return make_processor_class("V1")


def __getattr__(name: str):
    # vLLM resolves "recallm.recall.vllm:RecallLogitsProcessor" with getattr: build it then.
    interface = {"RecallLogitsProcessor": "any", "RecallLogitsProcessorV1": "V1", "RecallLogitsProcessorV2": "V2"}
    if name in interface:
        return make_processor_class(interface[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
