"""HELMET's citation NLI (``judge.nli=true_t5``) on tiny T5 models built here: the input format, the greedy
generation, "exactly 1" as entailment, and batching that gives each row the result it has alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from recallm.errors import RecallmError

WORDS = ["premise:", "hypothesis:", "paris", "is", "in", "france", "berlin", "germany", "title:", "a", "b", "rome"]


def _tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "0": 3, "1": 4, **{w: 5 + i for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    tok.save_pretrained(path)
    return tok, len(vocab)


def _t5(path, answer: str | None, seed: int = 0):
    """A tiny T5. ``answer`` "1" / "0": its decoder layers are zero, so each step reads the embedding of the
    previous token; the weights make it say ``answer`` then end. None: random weights."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    tok, vocab = _tokenizer(path)
    torch.manual_seed(seed)
    config = T5Config(vocab_size=vocab, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)  # fmt: skip
    model = T5ForConditionalGeneration(config).eval()
    if answer is not None:  # T5 ties its output layer to the shared embedding: logits = norm(embedding) . rows
        said = {"1": 4, "0": 3}[answer]
        u1, u2 = torch.eye(16)[0], torch.eye(16)[1]
        with torch.no_grad():
            for p in model.decoder.block.parameters():
                p.zero_()
            model.shared.weight.zero_()
            model.shared.weight[0] = u1  # the start token: the answer's row scores highest ...
            model.shared.weight[said] = 10 * (u1 + u2) / 2**0.5
            model.shared.weight[1] = 30 * (3 * u2 - u1) / 10**0.5  # ... and after the answer, the end's
    else:  # random, sharpened: the outputs differ from pair to pair (padding must not change them)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(4.0)
            model.shared.weight[0].zero_()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 1
    model.save_pretrained(path)
    return tok, model


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    """The three tiny T5 models (built once): always "1", always "0", random."""
    root = tmp_path_factory.mktemp("t5")
    built = {name: _t5(root / name, answer, seed=3) for name, answer in (("yes", "1"), ("no", "0"), ("random", None))}
    return root, built


def _nli(path, batch_size=4):
    from recallm.eval.judge import make_nli

    return make_nli({"model": None, "nli": "true_t5", "nli_model": str(path), "nli_batch_size": batch_size}, None)


PAIRS = [
    ("Title: a\nparis is in france", "paris is in france"),
    ("Title: b\nberlin is in germany", "rome is in france"),
    ("Title: a\nparis", "berlin is in germany paris rome"),
]


def test_true_t5_reads_exactly_one_as_entailment(t5):
    root, _ = t5
    yes, no = _nli(root / "yes"), _nli(root / "no")
    assert yes.entails_batch(PAIRS) == [True, True, True] and no.entails_batch(PAIRS) == [False, False, False]
    assert yes.describe() == {"nli": "true_t5", "model": str(root / "yes")} and yes.device == "cpu"


def test_batched_rows_equal_upstreams_one_at_a_time(t5):
    """eval_alce.py's _run_nli_autoais, one claim at a time: "premise: {} hypothesis: {}", generate (10 new
    tokens at most), decode, == "1". A random tiny T5 gives varied outputs; padding must not change them."""
    import torch

    root, built = t5
    tok, model = built["random"]
    expected = []
    for premise, claim in PAIRS * 2:
        ids = tok(f"premise: {premise} hypothesis: {claim}", return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=10, do_sample=False)
        expected.append(tok.decode(out[0], skip_special_tokens=True))
    assert len(set(expected)) > 1  # (the random model's answers differ between pairs)
    nli = _nli(root / "random")
    for size in (1, 3, 8):
        nli.settings = replace(nli.settings, nli_batch_size=size)
        texts = []
        for start in range(0, len(PAIRS * 2), size):
            batch = nli.tokenizer(
                [f"premise: {p} hypothesis: {h}" for p, h in (PAIRS * 2)[start : start + size]],
                return_tensors="pt",
                padding=True,
            )
            with torch.inference_mode():
                ids = nli.model.generate(**batch, max_new_tokens=10, do_sample=False)
            texts += nli.tokenizer.batch_decode(ids, skip_special_tokens=True)
        assert texts == expected, size
        assert nli.entails_batch(PAIRS * 2) == [t == "1" for t in expected]


def test_citations_scored_with_the_t5_nli(t5):
    from recallm.eval.scoring import citation_scores

    yes = _nli(t5[0] / "yes")
    docs = ["Title: a\nparis is in france", "Title: b\nberlin is in germany"]
    # every judged claim is entailed: recall = cited claims in range / claims; precision 1
    scores = citation_scores("Paris is in France [1]. Rome is big [5]. No cite here.", docs, yes.entails_batch)
    assert scores == {"citation_rec": pytest.approx(1 / 3), "citation_prec": 1.0}


def test_nli_settings_are_checked(tmp_path):
    from recallm.eval.judge import make_judge, make_nli

    with pytest.raises(RecallmError, match="nli=true_t5 needs eval.judge.nli_model"):
        make_nli({"nli": "true_t5"}, None)
    with pytest.raises(RecallmError, match="eval.judge.nli must be llm or true_t5"):
        make_nli({"nli": "roberta"}, None)
    with pytest.raises(RecallmError, match="is not a model directory"):
        make_nli({"nli": "true_t5", "nli_model": str(tmp_path)}, None)
    assert make_nli(None, None) is None and make_nli({"model": None}, None) is None  # the fallback
    assert (
        make_judge({"model": None, "nli": "true_t5", "nli_model": str(tmp_path)}) is None
    )  # (keys beside the endpoint)
