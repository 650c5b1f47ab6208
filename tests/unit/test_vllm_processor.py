"""The vLLM batch-state core (``recallm.recall.vllm``), driven by recorded ``BatchUpdate``
sequences, without vLLM.

Stand-in objects carry the fields of vLLM's ``BatchUpdate`` (``removed``, ``added``,
``moved``) and ``MoveDirectionality``. A small simulated engine keeps a persistent batch the
way vLLM V1 does (freed indices reused, holes condensed by one-way moves, swaps, preemption
with a new output list, async ``-1`` placeholders) and, at every step, every row's allowed set
is compared with one computed from scratch over that request's full token history.
"""

from __future__ import annotations

import enum
import sys
import types
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import recallm.recall.vllm as rv
from recallm.recall.matcher import RecallMatcher
from recallm.recall.vllm import RecallBatchState, wants_recall_mask
from tests.reference import contains, reference_allowed, reference_spans

V, S, E, EOS = 12, 0, 1, 2  # vocab size, start / end of recall, end of sequence
NEG = float("-inf")


class Direction(enum.Enum):  # stand-in for vllm's MoveDirectionality
    UNIDIRECTIONAL = enum.auto()
    SWAP = enum.auto()


@dataclass(frozen=True)
class Update:  # stand-in for vllm's BatchUpdate
    batch_size: int
    removed: list
    added: list
    moved: list


@dataclass
class Params:  # stand-in for SamplingParams
    extra_args: dict | None = None


# ------------------------------------------------------------------ checking
def scratch_allowed(history, max_recall):
    """The allowed set after ``history`` from a fresh matcher fed from scratch (None outside spans)."""
    m = RecallMatcher(S, E, max_recall_tokens=max_recall)
    m.feed(np.asarray(history, dtype=np.int64))
    got = m.allowed_tokens()
    return None if got is None else set(got.tolist())


def check_rows(before, after, histories, max_recall, independent=True):
    """Row r of ``after`` masks ``before`` to the allowed set of ``histories[r]``; rows outside
    spans are bit-for-bit unchanged."""
    for r, hist in enumerate(histories):
        expected = scratch_allowed(hist, max_recall)
        if independent:
            assert expected == reference_allowed(hist, S, E, max_recall)
        if expected is None:
            assert torch.equal(after[r], before[r]), f"row {r} outside a span was modified"
            continue
        finite = set(torch.nonzero(torch.isfinite(after[r])).flatten().tolist())
        assert finite == expected, f"row {r}: allowed {sorted(finite)} != expected {sorted(expected)}"
        keep = torch.tensor(sorted(expected))
        assert torch.equal(after[r, keep], before[r, keep])
        assert bool((after[r][torch.isinf(after[r])] == NEG).all())


# ---------------------------------------------------------- simulated engine
@dataclass
class Req:
    rid: int
    prompt: list
    output: list  # the live list handed to the processor
    max_new: int
    done: bool = False
    pending: int | None = None  # async: sampled but not yet written into the list

    @property
    def history(self):
        return self.prompt + [t for t in self.output if t >= 0]


@dataclass
class Engine:
    """A persistent batch in the manner of vLLM V1's InputBatch (see the module docstring)."""

    rng: np.random.Generator
    max_recall: int
    batch: list = field(default_factory=list)  # persistent index -> Req | None
    removed: list = field(default_factory=list)
    added: list = field(default_factory=list)
    moved: list = field(default_factory=list)
    waiting: list = field(default_factory=list)  # preempted requests to re-add
    next_rid: int = 0
    finished: list = field(default_factory=list)

    def _free_index(self):
        holes = [i for i, r in enumerate(self.batch) if r is None]
        if holes:
            i = min(holes)
            if i in self.removed and self.rng.random() < 0.5:
                self.removed.remove(i)  # vLLM pops a reused index from `removed`; both forms are valid
            return i
        self.batch.append(None)
        return len(self.batch) - 1

    def new_request(self):
        prompt = self.rng.integers(3, V, size=int(self.rng.integers(0, 30))).tolist()
        if self.rng.random() < 0.3:  # some prompts already contain spans
            cut = int(self.rng.integers(0, len(prompt) + 1))
            prompt = prompt[:cut] + [S] + prompt[: int(self.rng.integers(0, 4))] + [E] + prompt[cut:]
        if self.rng.random() < 0.15 and prompt:  # ... or end inside one
            prompt = prompt + [S]
        req = Req(self.next_rid, prompt, [], max_new=int(self.rng.integers(1, 40)))
        self.next_rid += 1
        self._insert(req)

    def _insert(self, req):
        i = self._free_index()
        self.batch[i] = req
        self.added.append((i, Params(), req.prompt if req.prompt or self.rng.random() < 0.5 else None, req.output))

    def _drop(self, i):
        self.batch[i] = None
        self.removed.append(i)

    def preempt(self, i):
        req = self.batch[i]
        self._drop(i)
        if req.pending is not None:  # the in-flight token lands before the request is re-added
            req.output.append(req.pending)
            req.pending = None
        req.output = list(req.output)  # re-added with a new list
        self.waiting.append(req)

    def condense(self):
        while True:
            holes = [i for i, r in enumerate(self.batch) if r is None]
            if not holes:
                return
            last = max(i for i, r in enumerate(self.batch) if r is not None) if any(self.batch) else -1
            if last < holes[0]:
                del self.batch[holes[0] :]
                return
            self.batch[holes[0]], self.batch[last] = self.batch[last], None
            self.moved.append((last, holes[0], Direction.UNIDIRECTIONAL))

    def swap(self, i, j):
        self.batch[i], self.batch[j] = self.batch[j], self.batch[i]
        self.moved.append((i, j, Direction.SWAP))

    def schedule(self, p_new, p_preempt, p_swap):
        """Remove finished requests, preempt / add / re-add some, condense, swap; return the update."""
        for i, req in enumerate(self.batch):
            if req is not None and req.done:
                self._drop(i)
                self.finished.append(req)
        for i, req in enumerate(self.batch):
            if req is not None and self.rng.random() < p_preempt:
                self.preempt(i)
        if self.waiting and self.rng.random() < 0.5:
            self._insert(self.waiting.pop(0))
        while self.rng.random() < p_new or not any(self.batch):
            self.new_request()
        self.condense()
        n = len(self.batch)
        if n >= 2 and self.rng.random() < p_swap:
            i, j = self.rng.choice(n, size=2, replace=False).tolist()
            self.swap(i, j)
        if not (self.removed or self.added or self.moved):
            return None
        update = Update(n, self.removed, self.added, self.moved)
        self.removed, self.added, self.moved = [], [], []
        return update


def run_engine(seed, steps, max_recall, async_sched, use_numpy, p_new=0.3, p_preempt=0.05, p_swap=0.3):
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    eng = Engine(rng, max_recall)
    state = RecallBatchState(S, E, max_recall_tokens=max_recall, vocab_size=V, use_numpy=use_numpy)
    for _ in range(steps):
        update = eng.schedule(p_new, p_preempt, p_swap)
        reqs = list(eng.batch)
        if async_sched:  # placeholders are in the lists while update_state runs ...
            for req in reqs:
                if req.pending is not None:
                    req.output.append(-1)
        state.update(update)
        if async_sched:  # ... and fixed before apply
            for req in reqs:
                if req.pending is not None:
                    req.output[-1], req.pending = req.pending, None
        logits = torch.randn(len(reqs), V, generator=gen) * float(rng.choice([0.5, 3.0, 30.0]))
        logits[:, S] += 2.0  # open spans often
        before = logits.clone()
        out = state.apply(logits)
        assert out is logits  # in place
        check_rows(before, out, [r.history for r in reqs], max_recall)
        probs = torch.softmax(out, -1)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1).tolist()
        for req, tok in zip(reqs, nxt, strict=True):
            if async_sched:
                req.pending = tok
            else:
                req.output.append(tok)
            if tok == EOS or len(req.output) + (req.pending is not None) >= req.max_new:
                req.done = True
        for req in reqs:  # a finished request is not scheduled again: land its last token
            if req.done and req.pending is not None:
                req.output.append(req.pending)
                req.pending = None
    return eng


def assert_spans_verbatim(req, max_recall):
    """Independent check: every span produced by sampling is a contiguous copy of what precedes it."""
    hist = req.history
    for start, content in reference_spans(hist, S, E):
        if start < len(req.prompt):
            continue  # a span written in the prompt is not ours to check
        assert len(content) <= max_recall
        assert contains(hist[:start], content), f"span {content} at {start} is not verbatim in {hist[:start]}"


# --------------------------------------------------------------------- tests
@given(
    seed=st.integers(0, 2**31 - 1),
    steps=st.integers(1, 40),
    max_recall=st.integers(1, 10),
    async_sched=st.booleans(),
    use_numpy=st.booleans(),
)
def test_random_batch_streams_match_scratch_reference(seed, steps, max_recall, async_sched, use_numpy):
    eng = run_engine(seed, steps, max_recall, async_sched, use_numpy)
    for req in eng.finished + [r for r in eng.batch if r is not None] + eng.waiting:
        assert_spans_verbatim(req, max_recall)


def test_long_stream_produces_many_verbatim_spans():
    eng = run_engine(1234, 300, 6, async_sched=True, use_numpy=True, p_new=0.25, p_preempt=0.02)
    reqs = eng.finished + [r for r in eng.batch if r is not None] + eng.waiting
    spans = 0
    for req in reqs:
        assert_spans_verbatim(req, 6)
        spans += sum(1 for start, c in reference_spans(req.history, S, E) if start >= len(req.prompt) and c)
    assert spans > 50 and len(eng.finished) > 20


def _drive(state, steps, max_recall=8):
    """Recorded steps: (update | None, {row: history}); apply on random logits and check each row."""
    gen = torch.Generator().manual_seed(0)
    for update, histories in steps:
        state.update(update)
        n = max(histories) + 1
        logits = torch.randn(n, V, generator=gen)
        before = logits.clone()
        state.apply(logits)
        check_rows(before, logits, [histories[r] for r in range(n)], max_recall)


def test_recorded_add_remove_move_swap_reuse_preempt():
    a_out, b_out, c_out = [], [], []
    p_a, p_b, p_c = [5, 6, 7, 8], [9, 10, 9, 11], [4, 4, 5]
    state = RecallBatchState(S, E, max_recall_tokens=8, vocab_size=V)
    steps = []
    # step 0: A at 0, B at 1 (prefill)
    steps.append((Update(2, [], [(0, Params(), p_a, a_out), (1, Params(), p_b, b_out)], []), {0: p_a, 1: p_b}))
    state.update(steps[-1][0])
    a_out.append(S)
    b_out.append(9)
    state.apply(torch.zeros(2, V))
    assert state.matcher(0).in_span and not state.matcher(1).in_span
    # step 1: swap 0 <-> 1 (A now at 1)
    a_out.append(6)
    b_out.append(S)
    _drive(
        state,
        [(Update(2, [], [], [(0, 1, Direction.SWAP)]), {0: p_b + b_out, 1: p_a + a_out})],
    )
    # step 2: B finishes; C reuses index 0; A stays at 1
    a_out.append(7)
    _drive(state, [(Update(2, [0], [(0, Params(), p_c, c_out)], []), {0: p_c, 1: p_a + a_out})])
    # step 3: A is preempted (removed), C moves 0 -> ... stays; A re-added at 1 with a new list
    a_new = list(a_out) + [E, S]
    _drive(state, [(Update(2, [1], [(1, Params(), p_a, a_new)], []), {0: p_c, 1: p_a + a_new})])
    a_out.append(99)  # the old list is dead: whatever happens to it is ignored
    # step 4: A (index 1) moves to 0 one way, C was removed first
    c_out.append(S)
    a_new.append(5)
    _drive(state, [(Update(1, [0], [], [(1, 0, Direction.UNIDIRECTIONAL)]), {0: p_a + a_new})])
    assert state.slots() == [0]


def test_unidirectional_move_drops_destination_and_swap_with_empty_slot():
    state = RecallBatchState(S, E, vocab_size=V)
    x, y = [S], [3]
    state.update(Update(3, [], [(0, Params(), [4, 5], x), (2, Params(), [6], y)], []))
    state.move(0, 2)  # y is dropped
    assert state.slots() == [2]
    state.move(2, 1, swap=True)  # swap with an empty slot: a plain move
    assert state.slots() == [1]
    logits = torch.zeros(2, V)
    state.apply(logits)
    assert torch.equal(logits[0], torch.zeros(V))
    assert set(torch.nonzero(torch.isfinite(logits[1])).flatten().tolist()) == {E, 4, 5}


def test_placeholders_are_not_fed_and_resume():
    out = []
    prompt = [4, 5, 6, 4, 7]
    state = RecallBatchState(S, E, vocab_size=V)
    state.update(Update(1, [], [(0, Params(), prompt, out)], []))

    def allowed_now():
        logits = torch.zeros(1, V)
        state.apply(logits)
        return set(torch.nonzero(torch.isfinite(logits[0])).flatten().tolist())

    out.extend([S, -1])  # apply sees an unresolved placeholder (bulk path): the state lags one token
    assert allowed_now() == {E, 4, 5, 6, 7}
    out[-1] = 4  # resolved: fed at the next apply
    assert allowed_now() == {E, 5, 7}
    out.append(-1)  # one new entry, a placeholder (single-token path)
    assert allowed_now() == {E, 5, 7}
    out.extend([-1, -1])
    assert allowed_now() == {E, 5, 7}
    out[-3:] = [5, 6, -1]
    assert allowed_now() == {E, 4}
    out[-1] = 4
    assert allowed_now() == {E, 7}
    assert state.matcher(0).tokens().tolist() == prompt + out


def test_readded_list_with_placeholders_and_history():
    """A preempted request comes back with a list that already holds tokens (and a placeholder)."""
    prompt = [4, 5, 6, 4, 5, 8]
    out = [3, S, 4, -1]
    state = RecallBatchState(S, E, vocab_size=V)
    state.update(Update(1, [], [(0, Params(), prompt, out)], []))
    out[-1] = 5
    logits = torch.zeros(1, V)
    state.apply(logits)
    check_rows(torch.zeros(1, V), logits, [prompt + out], 128)


def test_shortened_output_list_rebuilds():
    """Output lists only grow in vLLM; if one ever shrinks, the state is rebuilt from the history."""
    out = [S, 4]
    prompt = [4, 5, 4, 6]
    state = RecallBatchState(S, E, vocab_size=V)
    state.add(0, prompt, out)
    state.apply(torch.zeros(1, V))
    del out[1:]
    for _ in range(2):
        logits = torch.zeros(1, V)
        state.apply(logits)
        check_rows(torch.zeros(1, V), logits, [prompt + out], 128)
        out.append(6)
    del out[:]
    logits = torch.zeros(1, V)
    state.apply(logits)
    check_rows(torch.zeros(1, V), logits, [prompt], 128)
    for rewrite in ([S, 4], [S, 5], [S, 6, 4], [3, 3, S, 4]):  # rewritten in place, then regrown
        out[:] = rewrite
        logits = torch.zeros(1, V)
        state.apply(logits)
        check_rows(torch.zeros(1, V), logits, [prompt + out], 128)


def test_no_span_returns_untouched_logits():
    state = RecallBatchState(S, E, vocab_size=V)
    outs = [[3], [4, 5]]
    state.update(Update(2, [], [(0, Params(), [4, 5], outs[0]), (1, Params(), None, outs[1])], []))
    logits = torch.randn(2, V)
    ptr, before = logits.data_ptr(), logits.clone()
    out = state.apply(logits)
    assert out is logits and out.data_ptr() == ptr and torch.equal(out, before)
    assert [len(state.matcher(i)) for i in (0, 1)] == [3, 2]


@pytest.mark.parametrize("use_numpy", [True, False])
def test_only_in_span_rows_are_written(use_numpy):
    """Rows outside spans keep their exact values (NaN included: never touched)."""
    state = RecallBatchState(S, E, vocab_size=V, use_numpy=use_numpy)
    outs = [[3], [S], [4], [S, 4]]
    for i, o in enumerate(outs):
        state.add(i, [4, 5, 4, 9], o)
    logits = torch.randn(4, V)
    logits[0, 3] = float("nan")
    logits[2, 5] = float("nan")
    before = logits.clone()
    state.apply(logits)
    assert torch.equal(logits[[0, 2]].nan_to_num(7.0), before[[0, 2]].nan_to_num(7.0))
    assert set(torch.nonzero(torch.isfinite(logits[1])).flatten().tolist()) == {E, 4, 5, 9}
    assert set(torch.nonzero(torch.isfinite(logits[3])).flatten().tolist()) == {E, 5, 9}


def test_keys_map_rows_to_slots():
    """Model Runner V2 style: row r uses slot keys[r]; one slot may own several rows."""
    state = RecallBatchState(S, E, vocab_size=V)
    state.add(5, [4, 5, 6], [S, 4])  # in span: {5, E}
    state.add(9, [7, 8], [3])  # outside
    logits = torch.randn(4, V)
    before = logits.clone()
    state.apply(logits, keys=[9, 5, 7, 5])  # slot 7 is unknown: untouched
    for r in (0, 2):
        assert torch.equal(logits[r], before[r])
    for r in (1, 3):
        assert set(torch.nonzero(torch.isfinite(logits[r])).flatten().tolist()) == {E, 5}


def test_accept_leaves_opted_out_requests_unconstrained():
    state = RecallBatchState(S, E, vocab_size=V)
    state.add(0, [4, 5], [7])  # an old request in slot 0, replaced by an opted-out one
    off = Params(extra_args={"recall_constrained": False})
    state.update(Update(2, [], [(0, off, [4, 5], [S]), (1, Params({"x": 1}), [4, 5], [S])], []), wants_recall_mask)
    assert state.slots() == [1]
    logits = torch.zeros(2, V)
    state.apply(logits)
    assert torch.equal(logits[0], torch.zeros(V))
    assert set(torch.nonzero(torch.isfinite(logits[1])).flatten().tolist()) == {E, 4, 5}


def test_from_config_reads_ids_and_limit():
    cfg = types.SimpleNamespace(
        recall_start_token_id=S,
        recall_end_token_id=E,
        think_start_token_id=10,
        think_end_token_id=11,
        max_recall_tokens=2,
        vocab_size=V,
    )
    state = RecallBatchState.from_config(cfg)
    assert (state.start_id, state.end_id, state.max_recall_tokens, state.vocab_size) == (S, E, 2, V)
    state.add(0, [4, 5, 6, 7], [S, 4, 5])  # two tokens: only the end token is left
    logits = torch.zeros(1, V)
    state.apply(logits)
    assert torch.nonzero(torch.isfinite(logits[0])).flatten().tolist() == [E]


def test_module_imports_without_vllm():
    if "vllm" in sys.modules or _vllm_importable():
        pytest.skip("vLLM is installed here")
    with pytest.raises(ImportError, match="needs vLLM"):
        rv.RecallLogitsProcessorV1  # noqa: B018
    assert rv.V1_PROCESSOR_FQCN == "recallm.recall.vllm:RecallLogitsProcessorV1"


def _vllm_importable():
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def test_v1_adapter_against_stand_in_interface(monkeypatch):
    """The V1 adapter built over a stand-in ``vllm.v1.sample.logits_processor``, driven the way
    vLLM drives it (update_state, then apply)."""
    from abc import ABC, abstractmethod

    class LogitsProcessor(ABC):
        @abstractmethod
        def __init__(self, vllm_config, device, is_pin_memory): ...

        @abstractmethod
        def apply(self, logits): ...

        @abstractmethod
        def is_argmax_invariant(self): ...

        @abstractmethod
        def update_state(self, batch_update): ...

    names = ["vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.logits_processor"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["vllm.v1.sample.logits_processor"].LogitsProcessor = LogitsProcessor
    monkeypatch.setattr(rv, "_CLASSES", {})  # built afresh over the stand-in

    cls = rv.RecallLogitsProcessorV1
    assert issubclass(cls, LogitsProcessor)
    assert cls.__module__ == "recallm.recall.vllm" and cls.__qualname__ == "RecallLogitsProcessorV1"
    assert rv.make_v1_processor_class() is cls
    assert cls.validate_params(Params()) is None
    hf = types.SimpleNamespace(
        recall_start_token_id=S,
        recall_end_token_id=E,
        think_start_token_id=10,
        think_end_token_id=11,
        max_recall_tokens=8,
        vocab_size=V,
    )
    config = types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=hf))
    proc = cls(config, torch.device("cpu"), False)
    assert proc.is_argmax_invariant() is False and proc.needs_output_token_ids() is True
    a, b = [S], [S]
    off = Params(extra_args={"recall_constrained": False})
    proc.update_state(Update(2, [], [(0, Params(), [4, 5, 6], a), (1, off, [4, 5, 6], b)], []))
    proc.update_state(None)
    logits = torch.zeros(2, V)
    assert proc.apply(logits) is logits
    assert set(torch.nonzero(torch.isfinite(logits[0])).flatten().tolist()) == {E, 4, 5, 6}
    assert torch.equal(logits[1], torch.zeros(V))
    proc.update_state(Update(2, [], [], [(0, 1, Direction.SWAP)]))
    a.append(5)
    logits = torch.zeros(2, V)
    proc.apply(logits)
    assert torch.equal(logits[0], torch.zeros(V))
    assert set(torch.nonzero(torch.isfinite(logits[1])).flatten().tolist()) == {E, 6}

    hf.recall_constrained = False  # the "no logit masking" ablation: a no-op processor
    proc = cls(config, torch.device("cpu"), False)
    proc.update_state(Update(1, [], [(0, Params(), [4, 5], [S])], []))
    logits = torch.zeros(1, V)
    proc.apply(logits)
    assert torch.equal(logits, torch.zeros(1, V))
