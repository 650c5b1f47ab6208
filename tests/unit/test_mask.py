"""Training-time masks: layouts, the dense equivalent, gradients, and the masked forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from recallm.recall.mask import MASK_VALUE, allowed_positions, apply_recall_mask, sequence_segments
from tests.reference import reference_allowed

V, S, E = 9, 0, 1


def _dense_reference(ids: torch.Tensor, mask: torch.Tensor | None, max_recall: int) -> torch.Tensor:
    """(B, T, V) bool: True where a logit must be masked, from the definition, row by row."""
    B, T = ids.shape
    out = torch.zeros(B, T, V, dtype=torch.bool)
    for b in range(B):
        valid = [t for t in range(T) if mask is None or mask[b, t]]
        seq = ids[b, valid].tolist()
        for j, t in enumerate(valid):
            allowed = reference_allowed(seq[: j + 1], S, E, max_recall)
            if allowed is not None:
                out[b, t] = True
                out[b, t, sorted(allowed)] = False
    return out


rows = st.lists(st.lists(st.integers(0, V - 1), min_size=1, max_size=30), min_size=1, max_size=4)


@given(rows, st.integers(1, 6), st.booleans())
def test_apply_mask_equals_dense_reference(seqs, max_recall, left):
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), 2)
    mask = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        sl = slice(T - len(s), T) if left else slice(0, len(s))
        ids[b, sl] = torch.tensor(s)
        mask[b, sl] = 1
    logits = torch.randn(len(seqs), T, V)
    masked = apply_recall_mask(logits.clone(), ids, S, E, attention_mask=mask, max_recall_tokens=max_recall)
    dense = _dense_reference(ids, mask, max_recall)
    expected = logits.masked_fill(dense, MASK_VALUE)
    assert torch.equal(masked, expected)


@given(rows, st.integers(1, 6))
def test_packed_layout_equals_separate_sequences(seqs, max_recall):
    separate = [allowed_positions(torch.tensor([s]), S, E, max_recall_tokens=max_recall).as_dict() for s in seqs]
    packed_ids = torch.tensor([sum(seqs, [])])
    packed_pos = torch.tensor([sum((list(range(len(s))) for s in seqs), [])])
    packed = allowed_positions(packed_ids, S, E, position_ids=packed_pos, max_recall_tokens=max_recall).as_dict()
    offsets = np.cumsum([0] + [len(s) for s in seqs])
    expected = {(0, int(offsets[i]) + t): v for i, d in enumerate(separate) for (_, t), v in d.items()}
    assert packed == expected


def test_sequence_segments_layouts():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert [(b, s.tolist()) for b, s in sequence_segments((2, 5), mask)] == [(0, [2, 3, 4]), (1, [0, 1, 2, 3])]
    pos = torch.tensor([[0, 1, 2, 0, 1]])
    assert [(b, s.tolist()) for b, s in sequence_segments((1, 5), None, pos)] == [(0, [0, 1, 2]), (0, [3, 4])]
    # left padding with HF-style position ids (pads at position 1) still gives one sequence
    pos = torch.tensor([[1, 1, 0, 1, 2]])
    assert [(b, s.tolist()) for b, s in sequence_segments((1, 5), torch.tensor([[0, 0, 1, 1, 1]]), pos)] == [
        (0, [2, 3, 4])
    ]
    with pytest.raises(ValueError, match="attention_mask has shape"):
        sequence_segments((2, 5), torch.ones(2, 4))


def test_logits_to_keep_offset_and_gradients():
    ids = torch.tensor([[4, 5, 6, S, 5, 6, E, 7, S]])
    full = torch.randn(1, ids.shape[1], V, requires_grad=True)
    masked_full = apply_recall_mask(full * 1.0, ids, S, E)
    last3 = torch.randn(1, 3, V, requires_grad=True)
    masked_last = apply_recall_mask(last3 * 1.0, ids, S, E)
    dense = _dense_reference(ids, None, 128)
    assert torch.equal(masked_last == MASK_VALUE, dense[:, -3:])
    assert torch.equal(masked_full == MASK_VALUE, dense)
    # gradients flow to allowed logits only
    masked_full.sum().backward()
    assert torch.equal(full.grad == 0, dense)


def test_token_out_of_vocab_is_a_clear_error():
    with pytest.raises(ValueError, match="out of range for vocab size 9"):
        apply_recall_mask(torch.zeros(1, 3, V), torch.tensor([[4, S, 12]]), S, E)


def test_masked_forward_and_loss(tiny):
    model, tokenizer, ids = tiny
    text = "17: bako\n18: kuri\nThe value of 18 is <|start_recall|>18: kuri<|end_recall|> so kuri"
    enc = tokenizer(text, return_tensors="pt")
    labels = enc["input_ids"].clone()
    with torch.no_grad():
        out = model(**enc, labels=labels)
        model.config.recall_constrained = False
        try:
            plain = model(**enc, labels=labels)
        finally:
            model.config.recall_constrained = True
    expected = apply_recall_mask(plain.logits.clone(), enc["input_ids"], ids.start, ids.end)
    assert torch.equal(out.logits, expected)
    assert not torch.equal(out.logits, plain.logits)
    manual = torch.nn.functional.cross_entropy(expected[0, :-1].float(), labels[0, 1:])
    assert torch.allclose(out.loss, manual, atol=1e-6)
    assert out.loss < plain.loss  # the span's tokens are easier under the mask
    # return_dict=False gives the tuple form
    with torch.no_grad():
        tup = model(**enc, labels=labels, return_dict=False)
    assert torch.allclose(tup[0], out.loss) and torch.equal(tup[1], out.logits)
