"""Constrained decoding with the HF processor: spans verbatim, training masks reproduce the
allowed sets decoding used, and the masked model's log-probs equal the processed ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessor, LogitsProcessorList

from recallm.recall import ForceRecallSpans, RecallLogitsProcessor, allowed_positions
from tests.reference import contains, reference_allowed, reference_spans

V, S, E, PAD, EOS = 12, 0, 1, 2, 3


def _left_pad(rows, pad):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r) :] = torch.tensor(r)
        mask[b, width - len(r) :] = 1
    return ids, mask


@given(
    prompts=st.lists(st.lists(st.integers(4, V - 1), min_size=1, max_size=40), min_size=1, max_size=4),
    seed=st.integers(0, 2**31 - 1),
    steps=st.integers(1, 50),
    greedy=st.booleans(),
    max_recall=st.integers(1, 12),
    scale=st.floats(0.1, 50.0),
    dense=st.booleans(),
)
def test_processor_random_logits_spans_are_verbatim(prompts, seed, steps, greedy, max_recall, scale, dense):
    ids, mask = _left_pad(prompts, PAD)
    proc = RecallLogitsProcessor(S, E, max_recall_tokens=max_recall, prompt_attention_mask=mask, dense=dense)
    gen = torch.Generator().manual_seed(seed)
    finished = torch.zeros(len(prompts), dtype=torch.bool)
    for _ in range(steps):
        scores = torch.randn(len(prompts), V, generator=gen) * scale
        scores[:, S] += scale  # open spans often
        before = scores.clone()
        out = proc(ids, scores)
        assert torch.equal(scores, before)  # the input is never modified in place
        for b in range(len(prompts)):
            seq = ids[b, : mask.shape[1]][mask[b].bool()].tolist() + ids[b, mask.shape[1] :].tolist()
            if finished[b]:
                continue
            expected = reference_allowed(seq, S, E, max_recall)
            finite = set(torch.nonzero(torch.isfinite(out[b])).flatten().tolist())
            assert finite == (set(range(V)) if expected is None else expected)
        if greedy:
            nxt = out.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(out, -1), 1, generator=gen).squeeze(1)
        nxt = torch.where(finished, torch.full_like(nxt, PAD), nxt)
        finished |= nxt == EOS
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    for b in range(len(prompts)):
        seq = ids[b][torch.cat([mask[b], torch.ones(ids.shape[1] - mask.shape[1], dtype=torch.long)]).bool()].tolist()
        if EOS in seq[len(prompts[b]) :]:
            seq = seq[: len(prompts[b]) + seq[len(prompts[b]) :].index(EOS) + 1]
        for start, content in reference_spans(seq, S, E):
            assert len(content) <= max_recall
            assert contains(seq[:start], content), (seq, start, content)


class _Record(LogitsProcessor):
    """Keeps a copy of the scores it sees (place it right after the recall processor)."""

    def __init__(self):
        self.scores: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        self.scores.append(scores.detach().clone())
        return scores


def _prompts(tokenizer, lengths, seed):
    rng = np.random.default_rng(seed)
    words = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids][:2000]
    return [rng.choice(words, size=n).tolist() for n in lengths]


@settings(max_examples=8)
@given(
    lengths=st.lists(st.integers(3, 60), min_size=1, max_size=3),
    seed=st.integers(0, 10_000),
    greedy=st.booleans(),
    every=st.integers(1, 6),
    length=st.integers(1, 12),
)
def test_generate_masks_and_logprobs_agree(tiny, lengths, seed, greedy, every, length):
    model, tokenizer, ids = tiny
    prompts = _prompts(tokenizer, lengths, seed)
    input_ids, attention_mask = _left_pad(prompts, tokenizer.pad_token_id)
    space = tokenizer.convert_tokens_to_ids(" ")
    recall = RecallLogitsProcessor.from_config(model.config, prompt_attention_mask=attention_mask)
    record = _Record()
    force = ForceRecallSpans(ids.start, ids.end, every=every, length=length)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            logits_processor=LogitsProcessorList([recall, record, force]),
            max_new_tokens=30,
            do_sample=not greedy,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            eos_token_id=[tokenizer.eos_token_id, space],  # rows finish at different steps
            pad_token_id=tokenizer.pad_token_id,
        )
    P, _T = input_ids.shape[1], out.shape[1]
    eos = {tokenizer.eos_token_id, space}
    # the layout a trainer sees: prompt mask, then ones up to and including each row's stop token
    full_mask = torch.zeros_like(out)
    full_mask[:, :P] = attention_mask
    ends = []
    for b in range(out.shape[0]):
        gen = out[b, P:].tolist()
        stop = next((i for i, t in enumerate(gen) if t in eos), len(gen) - 1)
        full_mask[b, P : P + stop + 1] = 1
        ends.append(P + stop)  # last valid position
    # 1. spans verbatim (independent check)
    for b in range(out.shape[0]):
        seq = out[b][full_mask[b].bool()].tolist()
        for start, content in reference_spans(seq, ids.start, ids.end):
            assert contains(seq[:start], content)
    # 2. the training-time mask reproduces the allowed sets decoding used, padded and packed
    decoded = {}
    for step, scores in enumerate(record.scores):
        t = P + step - 1  # position whose next token this step chose
        for b in range(out.shape[0]):
            finite = torch.isfinite(scores[b])
            if t < ends[b] and not bool(finite.all()):
                decoded[(b, t)] = frozenset(torch.nonzero(finite).flatten().tolist())
    pos_ids = (full_mask.cumsum(1) - 1).clamp(min=0)
    padded = allowed_positions(out, ids.start, ids.end, attention_mask=full_mask, position_ids=pos_ids).as_dict()
    padded = {k: v for k, v in padded.items() if k[1] < ends[k[0]]}
    assert padded == decoded
    assert decoded or all(end - P < every for end in ends)  # spans were forced unless rows stopped first
    rows = [out[b][full_mask[b].bool()] for b in range(out.shape[0])]
    packed_ids = torch.cat(rows)[None]
    packed_pos = torch.cat([torch.arange(len(r)) for r in rows])[None]
    packed = allowed_positions(packed_ids, ids.start, ids.end, position_ids=packed_pos).as_dict()
    where = [(b, int(t)) for b in range(out.shape[0]) for t in torch.nonzero(full_mask[b]).flatten()]
    packed = {where[t]: v for (_, t), v in packed.items() if where[t][1] < ends[where[t][0]]}
    assert packed == decoded
    # 3. the masked model's log-probs equal those of the processed scores
    with torch.no_grad():
        logits = model(input_ids=out, attention_mask=full_mask, position_ids=pos_ids).logits
    logp_model = torch.log_softmax(logits.float(), -1)
    for step, scores in enumerate(record.scores):
        t = P + step - 1
        logp_gen = torch.log_softmax(scores, -1)
        for b in range(out.shape[0]):
            if t >= ends[b]:
                continue
            tok = int(out[b, t + 1])
            assert abs(float(logp_gen[b, tok]) - float(logp_model[b, t, tok])) <= 1e-5


def test_generate_override_adds_the_processor_and_refuses_beams(tiny):
    from recallm.errors import RecallmError

    model, tokenizer, ids = tiny
    enc = tokenizer(["17: bako\n18: kuri\n", "what"], return_tensors="pt", padding=True)
    force = ForceRecallSpans(ids.start, ids.end, every=2, length=5)
    torch.manual_seed(0)
    out = model.generate(**enc, logits_processor=[force], max_new_tokens=25, do_sample=True, top_k=0)
    n_spans = 0
    for b in range(out.shape[0]):
        seq = out[b][enc["attention_mask"][b].bool().tolist() + [True] * (out.shape[1] - enc["input_ids"].shape[1])]
        seq = seq.tolist()
        if tokenizer.eos_token_id in seq:
            seq = seq[: seq.index(tokenizer.eos_token_id)]
        for start, content in reference_spans(seq, ids.start, ids.end):
            n_spans += 1
            assert contains(seq[:start], content)
    assert n_spans >= 2
    with pytest.raises(RecallmError, match="beam search"):
        model.generate(**enc, num_beams=2, max_new_tokens=3)
    # unconstrained: the same forced spans are (almost surely) not all verbatim
    torch.manual_seed(0)
    free = model.generate(
        **enc,
        logits_processor=[ForceRecallSpans(ids.start, ids.end, every=2, length=5)],
        max_new_tokens=25,
        do_sample=True,
        top_k=0,
        recall_constrained=False,
    )
    seqs = [r.tolist() for r in free]
    assert any(
        not contains(s[:start], content) for s in seqs for start, content in reference_spans(s, ids.start, ids.end)
    )


def test_processor_detects_reordered_rows():
    proc = RecallLogitsProcessor(S, E)
    ids = torch.tensor([[5, 6], [7, 8]])
    proc(ids, torch.zeros(2, V))
    with pytest.raises(RuntimeError, match="changed between steps"):
        proc(torch.tensor([[7, 8, 9], [5, 6, 9]]), torch.zeros(2, V))
