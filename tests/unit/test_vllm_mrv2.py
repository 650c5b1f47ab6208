"""The Model Runner V2 adapter of ``recallm.recall.vllm`` and the one name that loads on either runner,
without vLLM.

A stand-in ``vllm.v1.worker.gpu.sample.logits_processor`` carries MRV2's interface (vLLM 0.32's
``interface.py``: ``__init__(vllm_config, req_states)``, ``add_request`` -> bool,
``apply_staged_writes``, abstract ``apply(logits, ctx)``). A small simulated engine runs it the way
MRV2 does (vLLM 0.32, ``vllm/v1/worker/gpu``): slots from a free list (popped from the end) and never
removed from the processor's view, the token history in a device tensor (``all_token_ids``, one row per
slot) written after ``add_request`` and flushed before ``apply_staged_writes``, sampled tokens written
there after each step, rows reordered every step (``idx_mapping_np``), chunked prefill (rows whose
samples are discarded), preemption (re-admitted with prompt + output so far as its prefill, in another
slot) and opted-out requests. At every step every row is compared with the allowed set computed from
scratch over that request's full history; the real interface classes and loader are exercised by the
vLLM tier (``tests/vllm_tier/test_mrv2.py``).
"""

from __future__ import annotations

import sys
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import recallm.recall.vllm as rv
from recallm.engines import OVERRIDE_ENV, UntestedEngines
from tests.reference import contains, reference_spans
from tests.unit.test_vllm_processor import EOS, NEG, E, Params, S, V, scratch_allowed

V1_MODULE = "vllm.v1.sample.logits_processor"
V2_MODULE = "vllm.v1.worker.gpu.sample.logits_processor"


class StandInV2(ABC):
    """MRV2's ``LogitsProcessor`` (vLLM 0.32, interface.py), method for method."""

    def __init__(self, vllm_config, req_states): ...  # noqa: B027

    @classmethod  # noqa: B027
    def validate_params(cls, sampling_params) -> None: ...

    def add_request(self, req_idx, sampling_params) -> bool:
        return True

    def apply_staged_writes(self) -> None: ...  # noqa: B027

    @abstractmethod
    def apply(self, logits, ctx): ...


class StandInV1(ABC):
    """V1's ``LogitsProcessor`` (its abstract methods)."""

    @abstractmethod
    def __init__(self, vllm_config, device, is_pin_memory): ...

    @abstractmethod
    def apply(self, logits): ...

    @abstractmethod
    def is_argmax_invariant(self): ...

    @abstractmethod
    def update_state(self, batch_update): ...


def _install(monkeypatch, *, v1: bool, v2: bool, version: str | None = "0.32.0"):
    """Stand-in vLLM modules with the chosen interfaces (and ``vllm.__version__``); classes built afresh."""
    names = ["vllm", "vllm.v1"]
    if v1:
        names += ["vllm.v1.sample", V1_MODULE]
    if v2:
        names += ["vllm.v1.worker", "vllm.v1.worker.gpu", "vllm.v1.worker.gpu.sample", V2_MODULE]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    # the stand-in engine is checked as a serving engine (``recallm.engines``: with verl imported in the process,
    # as it is once any GRPO test ran, the processor would be checked as verl's rollout, and 0.32 is no GRPO pair)
    monkeypatch.delitem(sys.modules, "verl", raising=False)
    if version is not None:
        sys.modules["vllm"].__version__ = version
    if v1:
        sys.modules[V1_MODULE].LogitsProcessor = StandInV1
    if v2:
        sys.modules[V2_MODULE].LogitsProcessor = StandInV2
    monkeypatch.setattr(rv, "_CLASSES", {})


def _config(max_recall=8, spec=None, **extra):
    hf = types.SimpleNamespace(
        recall_start_token_id=S,
        recall_end_token_id=E,
        think_start_token_id=10,
        think_end_token_id=11,
        max_recall_tokens=max_recall,
        vocab_size=V,
        **extra,
    )
    return types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=hf), speculative_config=spec)


@dataclass(frozen=True)
class Ctx:  # MRV2's LogitsContext (the fields the adapter reads, and the others)
    expanded_idx_mapping: torch.Tensor
    idx_mapping: torch.Tensor
    idx_mapping_np: np.ndarray
    expanded_local_pos: torch.Tensor
    input_ids: torch.Tensor
    pos: torch.Tensor
    seq_lens_upper_bound_np: np.ndarray


# ---------------------------------------------------------- simulated engine
@dataclass
class Req:
    rid: int
    prompt: list
    max_new: int
    params: Params
    output: list = field(default_factory=list)
    slot: int | None = None
    prefill: list = field(default_factory=list)  # what the slot was filled with (prompt + output so far)
    computed: int = 0  # tokens of the slot's history whose KV is computed
    done: bool = False

    @property
    def history(self):
        return self.prompt + self.output


class MRV2Engine:
    """Slots, device history and steps the way Model Runner V2 keeps them (module docstring). ``ctx_type`` and
    ``params_type``: the step layout's and the requests' classes (vLLM's own in the vLLM tier)."""

    ctx_type = Ctx
    params_type = Params

    def __init__(self, proc, rng, max_reqs=5, max_len=160, chunk=16):
        self.proc, self.rng, self.chunk, self.max_len = proc, rng, chunk, max_len
        self.free = list(range(max_reqs))
        self.all_token_ids = torch.full((max_reqs, max_len), -7, dtype=torch.int32)  # stale garbage
        self.req_states = types.SimpleNamespace(
            device=torch.device("cpu"),
            max_num_reqs=max_reqs,
            vocab_size=V,
            all_token_ids=types.SimpleNamespace(gpu=self.all_token_ids),  # StagedWriteTensor's .gpu
            prompt_len=types.SimpleNamespace(np=np.zeros(max_reqs, dtype=np.int32)),  # UvaBackedTensor's .np
            prefill_len=types.SimpleNamespace(np=np.zeros(max_reqs, dtype=np.int32)),
            total_len=types.SimpleNamespace(gpu=torch.zeros(max_reqs, dtype=torch.int32)),
        )
        self.running: list[Req] = []
        self.waiting: list[Req] = []
        self.finished: list[Req] = []
        self.next_rid = 0
        self.checked_rows = 0

    def new_request(self):
        rng = self.rng
        prompt = rng.integers(3, V, size=int(rng.integers(1, 40))).tolist()
        if rng.random() < 0.3:  # some prompts hold spans ...
            cut = int(rng.integers(0, len(prompt) + 1))
            prompt = prompt[:cut] + [S] + prompt[: int(rng.integers(0, 4))] + [E] + prompt[cut:]
        if rng.random() < 0.15:  # ... or end inside one
            prompt.append(S)
        off = rng.random() < 0.2
        params = self.params_type(extra_args={"recall_constrained": False} if off else None)
        self.waiting.append(Req(self.next_rid, prompt, int(rng.integers(1, 50)), params))
        self.next_rid += 1

    def admit(self):
        added = False
        while self.waiting and self.free:
            req = self.waiting.pop(0)
            slot = self.free.pop()
            req.slot, req.prefill, req.computed = slot, list(req.history), 0
            rs = self.req_states
            rs.prompt_len.np[slot] = len(req.prompt)
            rs.prefill_len.np[slot] = len(req.prefill)
            self.proc.add_request(slot, req.params)  # the history is only staged at this point
            self.all_token_ids[slot, : len(req.prefill)] = torch.tensor(req.prefill, dtype=torch.int32)
            self.running.append(req)
            added = True
        if added and self.rng.random() < 0.8:  # vLLM flushes, then calls this (else apply reads it itself)
            self.proc.apply_staged_writes()

    def release(self, req, preempt):
        self.running.remove(req)
        self.free.append(req.slot)  # no hook: the processor keeps the slot's state until it is reused
        req.slot = None
        (self.waiting if preempt else self.finished).append(req)

    def step(self, gen):
        rng = self.rng
        while rng.random() < 0.35 or not (self.running or self.waiting):
            self.new_request()
        for req in list(self.running):
            if rng.random() < 0.04:
                self.release(req, preempt=True)
        self.admit()
        if not self.running:
            return
        order = rng.permutation(len(self.running)).tolist()  # rows are reordered every step
        reqs = [self.running[i] for i in order]
        seq_lens = []
        for req in reqs:
            left = len(req.prefill) - req.computed
            n = min(left, int(rng.integers(1, self.chunk + 1))) if left > 0 else 1
            seq_lens.append(req.computed + n)
        slots = np.asarray([r.slot for r in reqs], dtype=np.int32)
        padded = np.zeros(len(reqs) + int(rng.integers(0, 3)), dtype=np.int32)
        padded[: len(reqs)] = seq_lens
        ctx = self.ctx_type(
            expanded_idx_mapping=torch.from_numpy(slots),
            idx_mapping=torch.from_numpy(slots),
            idx_mapping_np=slots,
            expanded_local_pos=torch.zeros(len(reqs), dtype=torch.int32),
            input_ids=torch.zeros(len(reqs), dtype=torch.int32),
            pos=torch.tensor(seq_lens, dtype=torch.int64) - 1,
            seq_lens_upper_bound_np=padded,
        )
        logits = torch.randn(len(reqs), V, generator=gen) * float(rng.choice([0.5, 3.0, 30.0]))
        logits[:, S] += 2.0  # open spans often
        before = logits.clone()
        out = self.proc.apply(logits, ctx)
        assert out is logits  # in place
        probs = torch.softmax(out, -1)
        sampled = torch.multinomial(probs, 1, generator=gen).squeeze(1).tolist()
        for r, (req, n, tok) in enumerate(zip(reqs, seq_lens, sampled, strict=True)):
            req.computed = n
            if n < len(req.prefill):
                continue  # a partial prefill: vLLM discards its sample (its row is not checked)
            history = req.prefill + req.output[len(req.prefill) - len(req.prompt) :]
            assert len(history) == n
            self._check_row(before[r], out[r], history, req.params)
            self.all_token_ids[req.slot, n] = tok  # MRV2's post_update
            req.output.append(tok)
            if tok == EOS or len(req.output) >= req.max_new or len(req.history) + 1 >= self.max_len:
                self.release(req, preempt=False)

    def _check_row(self, before, after, history, params):
        max_recall = self.proc.state.max_recall_tokens
        expected = scratch_allowed(history, max_recall) if rv.wants_recall_mask(params) else None
        if expected is None:
            assert torch.equal(after, before), "a row outside a span (or opted out) was modified"
        else:
            finite = set(torch.nonzero(torch.isfinite(after)).flatten().tolist())
            assert finite == expected, f"allowed {sorted(finite)} != expected {sorted(expected)} after {history}"
            keep = torch.tensor(sorted(expected))
            assert torch.equal(after[keep], before[keep])
            assert bool((after[torch.isinf(after)] == NEG).all())
        self.checked_rows += 1


def assert_spans_verbatim(req, max_recall):
    hist = req.history
    for start, content in reference_spans(hist, S, E):
        if start < len(req.prompt):
            continue
        assert len(content) <= max_recall
        assert contains(hist[:start], content), f"span {content} at {start} is not verbatim in {hist[:start]}"


# --------------------------------------------------------------------- tests
def _engine_with(cls_name, seed=7, max_recall=6, **extra):
    """A simulated engine driving a processor class built by the engine's own constructor call."""
    eng = MRV2Engine(None, np.random.default_rng(seed))
    eng.proc = getattr(rv, cls_name)(_config(max_recall, **extra), eng.req_states)
    return eng, eng.proc


def _ctx(slots, seq_lens) -> Ctx:
    s = np.asarray(slots, dtype=np.int32)
    n = len(s)
    return Ctx(
        expanded_idx_mapping=torch.from_numpy(s),
        idx_mapping=torch.from_numpy(s),
        idx_mapping_np=s,
        expanded_local_pos=torch.zeros(n, dtype=torch.int32),
        input_ids=torch.zeros(n, dtype=torch.int32),
        pos=torch.as_tensor(seq_lens) - 1,
        seq_lens_upper_bound_np=np.asarray(seq_lens, dtype=np.int32),
    )


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(1, 40), max_recall=st.integers(1, 10))
def test_mrv2_adapter_matches_scratch_reference(seed, steps, max_recall):
    with pytest.MonkeyPatch.context() as mp:
        _install(mp, v1=False, v2=True)
        eng, _ = _engine_with("RecallLogitsProcessorV2", seed=seed, max_recall=max_recall)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            eng.step(gen)
        for req in eng.finished + eng.running + eng.waiting:
            if rv.wants_recall_mask(req.params):
                assert_spans_verbatim(req, max_recall)


def test_long_mrv2_stream_produces_many_verbatim_spans(monkeypatch):
    _install(monkeypatch, v1=False, v2=True)
    eng, proc = _engine_with("RecallLogitsProcessorV2", seed=1234)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        eng.step(gen)
    spans = 0
    reqs = eng.finished + eng.running + eng.waiting
    for req in reqs:
        if rv.wants_recall_mask(req.params):
            assert_spans_verbatim(req, 6)
            spans += sum(1 for start, c in reference_spans(req.history, S, E) if start >= len(req.prompt) and c)
    assert spans > 50 and len(eng.finished) > 20 and eng.checked_rows > 500
    preempted = [r for r in reqs if len(r.prefill) > len(r.prompt)]
    assert preempted, "no request was re-admitted after a preemption: the test would not notice its handling"


def test_one_name_loads_on_either_runner(monkeypatch):
    """``RecallLogitsProcessor`` subclasses both interfaces; each runner's constructor call selects the adapter."""
    _install(monkeypatch, v1=True, v2=True)
    cls = rv.RecallLogitsProcessor
    assert issubclass(cls, StandInV1) and issubclass(cls, StandInV2)
    assert cls.__module__ == "recallm.recall.vllm" and cls.__qualname__ == "RecallLogitsProcessor"
    assert rv.make_processor_class() is cls and rv.make_processor_class("any") is cls
    v1, v2 = rv.RecallLogitsProcessorV1, rv.RecallLogitsProcessorV2
    assert issubclass(v1, StandInV1) and not issubclass(v1, StandInV2)
    assert issubclass(v2, StandInV2) and not issubclass(v2, StandInV1)

    # the V1 runner: (vllm_config, device, is_pin_memory), update_state, apply(logits)
    proc = cls(_config(), torch.device("cpu"), False)
    assert proc.interface == "V1" and proc.is_argmax_invariant() is False
    out = [S]
    proc.update_state(types.SimpleNamespace(removed=[], added=[(0, Params(), [4, 5, 6], out)], moved=[]))
    logits = torch.zeros(1, V)
    proc.apply(logits)
    assert set(torch.nonzero(torch.isfinite(logits[0])).flatten().tolist()) == {E, 4, 5, 6}

    # Model Runner V2: (vllm_config, req_states), add_request, apply_staged_writes, apply(logits, ctx)
    eng = MRV2Engine(None, np.random.default_rng(3))
    proc = cls(_config(), eng.req_states)
    eng.proc = proc
    assert proc.interface == "V2"
    gen = torch.Generator().manual_seed(3)
    for _ in range(60):
        eng.step(gen)
    assert eng.checked_rows > 60

    with pytest.raises(TypeError, match="vllm_config, device, is_pin_memory"):
        cls(_config())


@pytest.mark.parametrize("v1, v2, expect", [(True, False, ["V1"]), (False, True, ["V2"])])
def test_one_name_is_what_this_vllm_has(monkeypatch, v1, v2, expect):
    """vLLM 0.24-0.31 has the V1 interface only, 0.34 MRV2's only: the one name is that interface's class."""
    _install(monkeypatch, v1=v1, v2=v2)
    cls = rv.RecallLogitsProcessor
    assert issubclass(cls, StandInV1) == ("V1" in expect) and issubclass(cls, StandInV2) == ("V2" in expect)
    other = "RecallLogitsProcessorV2" if v1 else "RecallLogitsProcessorV1"
    with pytest.raises(ImportError, match="needs vLLM with"):
        getattr(rv, other)


def test_opt_out_and_ablation_return_false(monkeypatch):
    _install(monkeypatch, v1=False, v2=True)
    eng, proc = _engine_with("RecallLogitsProcessorV2")
    assert proc.add_request(0, Params()) is True
    assert proc.add_request(1, Params(extra_args={"recall_constrained": False})) is False
    eng2, ablation = _engine_with("RecallLogitsProcessorV2", recall_constrained=False)
    assert ablation.add_request(0, Params()) is False
    eng2.all_token_ids[0, 0] = S
    eng2.req_states.prefill_len.np[0] = 1
    assert torch.equal(ablation.apply(torch.zeros(1, V), _ctx([0], [1])), torch.zeros(1, V))


def test_slot_reuse_resets_and_history_cut_is_replayed(monkeypatch):
    """A reused slot starts from its new prefill; a history that became shorter is cut and replayed."""
    _install(monkeypatch, v1=False, v2=True)
    eng, proc = _engine_with("RecallLogitsProcessorV2", max_recall=8)
    toks = eng.all_token_ids

    def step(slot, seq_len):
        logits = torch.zeros(1, V)
        proc.apply(logits, _ctx([slot], [seq_len]))
        got = set(torch.nonzero(torch.isfinite(logits[0])).flatten().tolist())
        return None if got == set(range(V)) else got

    prompt = [4, 5, 6, 4, 7]
    eng.req_states.prefill_len.np[2] = len(prompt)
    proc.add_request(2, Params())
    toks[2, :5] = torch.tensor(prompt, dtype=torch.int32)
    assert step(2, 5) is None  # prefill done, outside a span
    toks[2, 5] = S
    assert step(2, 6) == {E, 4, 5, 6, 7}
    toks[2, 6] = 4
    assert step(2, 7) == {E, 5, 7}
    toks[2, 6] = 6  # the runner rewrote position 6 after cutting the history back to 6 tokens
    assert step(2, 6) == {E, 4, 5, 6, 7}
    assert step(2, 7) == {E, 4}  # ... then re-read from the device: [S, 6] continues with 4
    # the slot is reused by another request (no removal hook): nothing of the old one remains
    eng.req_states.prefill_len.np[2] = 3
    proc.add_request(2, Params())
    toks[2, :3] = torch.tensor([8, 9, S], dtype=torch.int32)
    assert step(2, 3) == {E, 8, 9}


def test_speculative_decoding_is_refused(monkeypatch):
    _install(monkeypatch, v1=False, v2=True)
    with pytest.raises(ValueError, match="speculative decoding"):
        rv.RecallLogitsProcessorV2(_config(spec=object()), MRV2Engine(None, np.random.default_rng(0)).req_states)


def test_untested_vllm_is_refused_where_the_processor_loads(monkeypatch, caplog):
    """The version check runs when vLLM looks the name up: vLLM 0.34 is refused in one line, unless overridden."""
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "verl", raising=False)
    _install(monkeypatch, v1=False, v2=True, version="0.34.0")
    with pytest.raises(UntestedEngines) as err:
        rv.RecallLogitsProcessor  # noqa: B018
    line = str(err.value)
    assert "\n" not in line and "vLLM 0.34.0 is not a tested engine pair" in line and OVERRIDE_ENV in line
    assert "0.24.0" in line and "0.32.0" in line  # names the tested versions
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    with caplog.at_level("WARNING", logger="recallm.engines"):
        assert issubclass(rv.RecallLogitsProcessor, StandInV2)
    assert "vLLM 0.34.0 is not a tested engine pair" in caplog.text


def test_names_stay_in_step():
    from recallm.serve import PROCESSOR, RECALL_PROCESSORS

    assert PROCESSOR == rv.PROCESSOR_FQCN == "recallm.recall.vllm:RecallLogitsProcessor"
    assert set(RECALL_PROCESSORS) == {rv.PROCESSOR_FQCN, rv.V1_PROCESSOR_FQCN, rv.V2_PROCESSOR_FQCN}
