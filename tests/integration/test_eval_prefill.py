"""recallm.eval.prefill: prompts prefilled one by one (a wrap hook of recallm.generation.generate) give
the outputs of HF's batched prefill in the model's dtype — constrained, forced spans, sampled with
seeds, log-probs — and the HF backend's ``prefill_dtype`` option uses it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recallm.errors import RecallmError
from recallm.eval.prefill import RowPrefill
from recallm.generation import GenRequest, generate


def _prompts(tokenizer, lengths, seed):
    rng = np.random.default_rng(seed)
    words = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids][:2000]
    return [rng.choice(words, size=n).tolist() for n in lengths]


@pytest.mark.parametrize("greedy", [True, False])
def test_row_prefill_gives_the_batched_prefill_outputs(tiny, greedy):
    model, tok, _ = tiny
    prompts = _prompts(tok, [37, 5, 61, 1, 20], seed=3)  # uneven lengths (left padding), a one-token prompt
    sampling = {} if greedy else {"temperature": 0.9, "top_p": 0.95, "seed": 11}
    reqs = [GenRequest(tuple(p), 24, **sampling) for p in prompts]
    kwargs = dict(tokenizer=tok, recall=True, force=(3, 5), log_probs=True)
    plain = generate(model, reqs, **kwargs)
    rows = generate(model, reqs, wrap=RowPrefill(model, "float32"), **kwargs)
    for a, b in zip(plain, rows, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert np.allclose(a.log_probs, b.log_probs, atol=1e-4)
    assert any(len(r.token_ids) > 1 for r in rows)


def test_row_prefill_cache_is_left_padded_like_the_batch(tiny):
    model, tok, _ = tiny
    prompts = _prompts(tok, [6, 3], seed=0)
    width = 6
    ids = torch.tensor([prompts[0], [0] * 3 + prompts[1]])
    mask = torch.tensor([[1] * 6, [0] * 3 + [1] * 3])
    hook = RowPrefill(model, "float32")
    cache = hook.cache(ids, mask)
    assert cache.get_seq_length() == width - 1
    keys = cache.layers[0].keys
    assert keys.shape[0] == 2 and keys.shape[2] == width - 1
    assert torch.count_nonzero(keys[1, :, :3]) == 0 and torch.count_nonzero(keys[1, :, 3:]) > 0  # padding: zeros
    alone = hook.decoder(input_ids=torch.tensor([prompts[1][:-1]]), use_cache=True).past_key_values
    assert torch.allclose(keys[1, :, 3:], alone.layers[0].keys[0])
    with hook(input_ids=ids[:, :1], attention_mask=mask[:, :1]) as extra:  # nothing before the last token
        assert extra == {}


def test_bfloat16_prefill_decodes_in_the_models_dtype(tiny):
    model, tok, _ = tiny
    hook = RowPrefill(model, "bfloat16")
    assert hook.prefill_model is not model and next(hook.prefill_model.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32  # the model that decodes is untouched
    prompts = _prompts(tok, [30, 12], seed=5)
    out = generate(model, [GenRequest(tuple(p), 8) for p in prompts], tokenizer=tok, recall=True, wrap=hook)
    assert [len(r.token_ids) for r in out] and all(r.finish_reason in ("stop", "length") for r in out)
    cache = hook.cache(torch.tensor([prompts[0]]), torch.ones(1, 30, dtype=torch.long))
    assert cache.layers[0].keys.dtype == torch.float32
    with pytest.raises(RecallmError, match="prefill_dtype must be one of"):
        RowPrefill(model, "int8")


def test_hf_backend_prefill_option(tiny_dir):
    from recallm.eval.backends import BackendSettings, HFBackend
    from recallm.eval.types import GenerationSettings, TextRequest
    from recallm.tokens import load_tokenizer

    tok = load_tokenizer(tiny_dir)
    texts = ["17: bako\n18: kuri\nThe value of 18 is", "Say hello to the nine keys.", "x"]
    reqs = [TextRequest(t, None, 12) for t in texts]
    settings = GenerationSettings(max_new_tokens=12)
    base = HFBackend(tiny_dir, tok, batch_size=2, force_recall_every=2, force_recall_length=3)
    fast = HFBackend(tiny_dir, tok, batch_size=2, force_recall_every=2, force_recall_length=3, prefill_dtype="float32")
    assert fast.describe()["prefill_dtype"] == "float32" and "prefill_dtype" not in base.describe()
    assert [g.text for g in base.generate(reqs, settings)] == [g.text for g in fast.generate(reqs, settings)]
    assert BackendSettings.from_mapping({"prefill_dtype": "bfloat16"}).prefill_dtype == "bfloat16"
    with pytest.raises(RecallmError, match="backend.prefill_dtype must be one of"):
        BackendSettings.from_mapping({"prefill_dtype": "int4"})
    with pytest.raises(RecallmError, match="exclude each other"):
        HFBackend(
            tiny_dir,
            tok,
            prefill_dtype="bfloat16",
            length_extension=lambda model, tokenizer: (lambda **kw: __import__("contextlib").nullcontext()),
        )
