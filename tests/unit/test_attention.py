"""``recallm.attention``: grouped-query sdpa on a CPU gives transformers' ``sdpa`` numbers exactly (one
layer, a whole padded forward, batched generation), is used only where it applies, and is not saved."""

from __future__ import annotations

import json
import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import recallm.generation as generation
from recallm.attention import GQA_SDPA, gqa_sdpa_attention, use_gqa_sdpa
from recallm.generation import GenRequest, generate
from recallm.tiny import TinySpec, build_tiny_model, build_tiny_tokenizer


@pytest.mark.parametrize("queries", [1, 5])
def test_one_layer_equals_transformers_sdpa_with_a_padding_mask(queries):
    torch.manual_seed(0)
    rows, heads, kv_heads, length, dim = 3, 6, 2, 40, 32
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    query = torch.randn(rows, heads, queries, dim)
    key, value = torch.randn(2, rows, kv_heads, length, dim).unbind(0)
    keep = torch.ones(rows, 1, queries, length, dtype=torch.bool).tril(length - queries)
    keep[1, ..., :7] = False  # a left-padded row
    ours, _ = gqa_sdpa_attention(module, query, key, value, keep, scaling=dim**-0.5)
    theirs, _ = sdpa_attention_forward(module, query, key, value, keep, scaling=dim**-0.5)
    assert torch.equal(ours, theirs)
    # without a mask, transformers' own function runs (is_causal from the module)
    ours, _ = gqa_sdpa_attention(module, query, key, value, None)
    theirs, _ = sdpa_attention_forward(module, query, key, value, None)
    assert torch.equal(ours, theirs)


@pytest.fixture(scope="module")
def gqa_model():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, spec=TinySpec(num_attention_heads=4, num_key_value_heads=2))
    return model, tokenizer


def test_a_padded_forward_and_batched_generation_are_unchanged(gqa_model, monkeypatch):
    model, tokenizer = gqa_model
    assert model.config._attn_implementation == "sdpa"
    prompts = ["find key 2\n1: bazo\n2: kelu\n3: mifa", "key 7\n7: lomi", "a b c d e f g h i j k l m n o p"]
    ids = [tuple(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    requests = [GenRequest(p, 12, temperature=t, seed=i) for i, p in enumerate(ids) for t in (0.0, 1.0)]

    width = max(len(p) for p in ids)
    input_ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    with torch.no_grad():
        before = model(input_ids=input_ids, attention_mask=mask).logits
    monkeypatch.setattr(generation, "use_gqa_sdpa", lambda model: False)
    plain = [r.token_ids for r in generate(model, requests, eos_token_ids=[], batch_size=6)]
    assert model.config._attn_implementation == "sdpa"
    monkeypatch.undo()

    switched = [r.token_ids for r in generate(model, requests, eos_token_ids=[], batch_size=6)]
    assert model.config._attn_implementation == GQA_SDPA  # generate switched it
    assert switched == plain
    with torch.no_grad():
        after = model(input_ids=input_ids, attention_mask=mask).logits
    assert torch.equal(after[mask.bool()], before[mask.bool()])


def test_only_grouped_sdpa_models_are_switched_and_the_name_is_not_saved(gqa_model, tmp_path):
    tokenizer = build_tiny_tokenizer()
    multi_head = build_tiny_model(tokenizer)  # 4 query heads, 4 key-value heads: nothing to repeat
    assert not use_gqa_sdpa(multi_head)
    assert multi_head.config._attn_implementation == "sdpa"
    eager = build_tiny_model(tokenizer, spec=TinySpec(num_attention_heads=4, num_key_value_heads=2))
    eager.set_attn_implementation("eager")
    assert not use_gqa_sdpa(eager)
    assert eager.config._attn_implementation == "eager"

    model, _ = gqa_model
    assert use_gqa_sdpa(model) and use_gqa_sdpa(model)  # idempotent
    model.save_pretrained(tmp_path)
    assert GQA_SDPA not in json.dumps(json.loads((tmp_path / "config.json").read_text()))
