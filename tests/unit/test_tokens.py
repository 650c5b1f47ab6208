"""Adding the RecaLLM tokens: ids, mean initialisation, tied/untied, growth, idempotence."""

from __future__ import annotations

import pytest
import torch
from tokenizers import AddedToken

from recallm.errors import RecallmError
from recallm.tiny import build_tiny_model, build_tiny_tokenizer
from recallm.tokens import RECALLM_TOKENS, THINK_END, THINK_START, RecallTokenIds, add_recall_tokens


def _weights(model):
    out = {"emb": model.get_input_embeddings().weight.detach().clone()}
    if not model.config.tie_word_embeddings:
        out["head"] = model.get_output_embeddings().weight.detach().clone()
    return out


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("vocab_multiple", [64, 1])  # padded vocab (no resize) / exact vocab (must grow)
def test_add_recall_tokens(tied, vocab_multiple):
    from recallm.tiny import TinySpec

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, tied=tied, spec=TinySpec(vocab_multiple=vocab_multiple))
    n_before, rows_before = len(tokenizer), model.get_input_embeddings().weight.shape[0]
    before = _weights(model)
    ids = add_recall_tokens(model, tokenizer)

    assert ids == RecallTokenIds(n_before, n_before + 1, n_before + 2, n_before + 3)
    rows_after = model.get_input_embeddings().weight.shape[0]
    assert rows_after == max(rows_before, n_before + 4)  # grown when needed, never shrunk
    assert model.config.vocab_size == rows_after
    new = list(ids.as_config().values())
    for name, weight in _weights(model).items():
        assert weight.shape[0] == rows_after
        mean = before[name][:n_before].mean(0)
        for i in new:
            assert torch.allclose(weight[i], mean, atol=1e-7), name
        assert torch.equal(weight[:n_before], before[name][:n_before])  # old rows untouched
        untouched = [r for r in range(n_before, rows_before) if r not in new]
        assert torch.equal(weight[untouched], before[name][untouched])
    if tied:
        assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    # config, tokenizer behaviour, chat template
    assert RecallTokenIds.from_config(model.config) == ids == RecallTokenIds.from_tokenizer(tokenizer)
    assert model.config.max_recall_tokens == 128
    text = "a <|start_recall|>17: bako<|end_recall|> <think>x</think>"
    enc = tokenizer(text)["input_ids"]
    for tok_id in new:
        assert tok_id in enc
    assert tokenizer.decode(enc, skip_special_tokens=True) == text  # non-special: kept
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")

    # idempotent: nothing changes the second time
    snapshot, template, n = _weights(model), tokenizer.chat_template, len(tokenizer)
    assert add_recall_tokens(model, tokenizer) == ids
    assert len(tokenizer) == n and tokenizer.chat_template == template
    for name, weight in _weights(model).items():
        assert torch.equal(weight, snapshot[name])


def test_existing_think_tokens_are_kept():
    """A Qwen3-like tokenizer already has <think> and </think>: only the recall tokens are new."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)])
    model = build_tiny_model(tokenizer, tied=False)
    think = [tokenizer.convert_tokens_to_ids(t) for t in (THINK_START, THINK_END)]
    before = _weights(model)
    ids = add_recall_tokens(model, tokenizer)
    assert (ids.think_start, ids.think_end) == tuple(think)
    assert len(tokenizer) == think[1] + 3  # two new tokens after </think>
    for name, weight in _weights(model).items():
        assert torch.equal(weight[think], before[name][think])


def test_tokenizer_larger_than_embeddings_is_an_error():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    tokenizer.add_tokens([f"extra{i}" for i in range(200)])
    with pytest.raises(RecallmError, match=r"tokenizer has \d+ tokens but the model's embedding matrix has only"):
        add_recall_tokens(model, tokenizer)


def test_ids_errors():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    with pytest.raises(RecallmError, match="no recall tokens .*recallm-create-model"):
        RecallTokenIds.from_config(model.config)
    with pytest.raises(RecallmError, match=r"tokenizer has no <\|start_recall\|>"):
        RecallTokenIds.from_tokenizer(tokenizer)
    with pytest.raises(RecallmError, match="recall_end_token_id=9 is out of range for a vocabulary of 9 rows"):
        RecallTokenIds(1, 9, 2, 3).validate(9)
    with pytest.raises(RecallmError, match="distinct"):
        RecallTokenIds(1, 1, 2, 3).validate(9)
    ids = add_recall_tokens(model, tokenizer)
    model.config.recall_start_token_id = ids.think_end + 1  # in range, but not what the tokenizer says
    with pytest.raises(RecallmError, match="disagree"):
        RecallTokenIds.from_pretrained(model.config, tokenizer)
    assert set(RECALLM_TOKENS) <= set(tokenizer.get_vocab())


def test_template_that_already_opens_think_is_left_alone():
    from recallm.tokens import ensure_think_generation_prompt

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template += "{%- if add_generation_prompt %}{{- '<think>\\n' }}{%- endif %}"
    template = tokenizer.chat_template
    assert ensure_think_generation_prompt(tokenizer) is False
    assert tokenizer.chat_template == template
    tokenizer.chat_template = None
    assert ensure_think_generation_prompt(tokenizer) is True  # ChatML fallback, then <think>
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("assistant\n<think>\n")


def test_padding_rule_left_and_right_padding_refused(tmp_path):
    from recallm.tokens import check_left_padded, load_tokenizer

    tok = build_tiny_tokenizer()
    tok.padding_side = "right"  # as transformers gives a GGUF conversion (SmolLM2)
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert loaded.padding_side == "left"
    enc = loaded(["a b c", "a"], return_tensors="pt", padding=True)
    check_left_padded(enc["attention_mask"])
    check_left_padded(None)
    check_left_padded(torch.ones(1, 1, dtype=torch.long))
    right = loaded(["a b c", "a"], return_tensors="pt", padding=True, padding_side="right")
    with pytest.raises(RecallmError, match=r"prompt rows \[1\] are padded on the right.*padding_side = 'left'"):
        check_left_padded(right["attention_mask"])
    with pytest.raises(RecallmError, match=r"prompt rows \[0, 2\]"):  # a hole is no better
        check_left_padded(torch.tensor([[1, 0, 1], [0, 1, 1], [1, 1, 0]]))
