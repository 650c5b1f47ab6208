"""The tiny default: deterministic, ~1M parameters, single-token toy vocabulary, exact decoding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from recallm.tiny import TOY_KEYS, TOY_VALUES, TOY_WORDS, TinySpec, build_tiny_model, build_tiny_tokenizer


def test_deterministic_and_sized():
    tok_a, tok_b = build_tiny_tokenizer(), build_tiny_tokenizer()
    assert tok_a.backend_tokenizer.to_str() == tok_b.backend_tokenizer.to_str()
    a, b = build_tiny_model(tok_a, seed=3), build_tiny_model(tok_b, seed=3)
    c = build_tiny_model(tok_a, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    n = sum(p.numel() for p in a.parameters())
    assert 0.7e6 < n < 1.3e6, n
    assert a.config.hidden_size // a.config.num_attention_heads >= 32
    assert a.config.vocab_size % 64 == 0 and a.config.vocab_size >= len(tok_a)
    untied = build_tiny_model(tok_a, tied=False)
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in untied.parameters()) == n + untied.lm_head.weight.numel()


def test_toy_words_are_single_tokens_everywhere():
    tok = build_tiny_tokenizer()
    for word in (*TOY_KEYS, *TOY_VALUES, *TOY_WORDS):
        for text in (word, f"{word}: x", f"key {word}?", f"\n{word}\n"):
            pieces = tok.convert_ids_to_tokens(tok(text)["input_ids"])
            assert word in pieces, (text, pieces)


@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126) | st.sampled_from("\n\t"), max_size=200))
def test_decode_is_exact_for_ascii(text):
    tok = build_tiny_tokenizer()
    assert tok.decode(tok(text)["input_ids"]) == text


def test_spec_validation():
    with pytest.raises(ValueError, match="head_dim"):
        TinySpec(hidden_size=64, num_attention_heads=4)
