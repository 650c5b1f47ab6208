"""SFT recipe options: logits at labelled positions only, span stripping (the no-recall ablation),
the length curriculum, PoSE position skips."""

from __future__ import annotations

import random
import re

import pytest
import torch

from recallm.errors import RecallmError
from recallm.sft.data import (
    IGNORE_INDEX,
    SFTCollator,
    check_curriculum,
    curriculum_order,
    group_by_length,
    load_sft_file,
    strip_recall_spans,
)


@pytest.fixture(scope="module")
def toy_sft(tmp_path_factory, tiny_dir):
    from data_gen.generate import run_schedule, schedule_from_config

    mix = {
        "train": {"lengths": [400, 400], "entries": [{"task": "toy_lookup", "count": 8, "params": {"pairs": [2, 40]}}]},
        "sft": {"count": 24, "val_fraction": 0.0},
    }
    out = tmp_path_factory.mktemp("toysft")
    run_schedule(schedule_from_config(mix), out, tiny_dir, workers=1, progress=False)
    return out / "sft" / "train.jsonl"


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_dir):
    from transformers import AutoModelForCausalLM

    import recallm.modeling  # noqa: F401
    from recallm.tokens import load_tokenizer

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_dir), load_tokenizer(tiny_dir)


@pytest.mark.parametrize("skip", [None, 2048])
def test_label_logits_only_gives_the_full_loss_and_gradients(toy_sft, model_and_tokenizer, skip):
    model, tokenizer = model_and_tokenizer
    data, _ = load_sft_file(toy_sft, tokenizer, max_length=1024, vocab_size=model.config.vocab_size)
    batch = SFTCollator(tokenizer.pad_token_id, position_skip=skip)([data[i] for i in range(8)])
    assert (batch["input_ids"] == model.config.recall_start_token_id).sum() == 8  # spans are in the batch
    weight = model.get_input_embeddings().weight
    results = []
    for label_only in (False, True):
        model.label_logits_only(label_only)
        out = model(**batch)
        (grad,) = torch.autograd.grad(out.loss, weight)
        results.append((out.loss.detach(), grad, out.logits))
        n = (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
        summed = model(**batch, num_items_in_batch=n).loss.detach()
        torch.testing.assert_close(summed, out.loss.detach(), rtol=1e-5, atol=1e-6)
    model.label_logits_only(False)
    (full_loss, full_grad, full_logits), (loss, grad, logits) = results
    assert full_logits is not None and logits is None
    torch.testing.assert_close(loss, full_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, full_grad, rtol=1e-4, atol=1e-7)
    # the recall mask matters inside spans: without it the loss is higher (the forced tokens cost something)
    model.config.recall_constrained = False
    model.label_logits_only(True)
    try:
        unmasked = model(**batch).loss.detach()
    finally:
        model.config.recall_constrained = True
        model.label_logits_only(False)
    assert unmasked > loss + 1e-3


def test_strip_recall_spans():
    assert strip_recall_spans([5, 1, 7, 8, 2, 9, 1, 3, 2, 4], 1, 2) == [5, 9, 4]
    assert strip_recall_spans([5, 6], 1, 2) == [5, 6]
    assert strip_recall_spans([5, 1, 7], 1, 2) == [5, 1, 7]  # an unclosed span is kept as written


def test_strip_spans_makes_the_plain_traces(toy_sft, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    ids = (model.config.recall_start_token_id, model.config.recall_end_token_id)
    data, _ = load_sft_file(toy_sft, tokenizer, max_length=1024, vocab_size=model.config.vocab_size)
    plain, _ = load_sft_file(toy_sft, tokenizer, max_length=1024, vocab_size=model.config.vocab_size, strip_spans=ids)
    for a, b in zip(data.records, plain.records, strict=True):
        assert ids[0] in a["input_ids"] and ids[0] not in b["input_ids"] and ids[1] not in b["input_ids"]
        completion = tokenizer.decode(
            [t for t, label in zip(b["input_ids"], b["labels"], strict=True) if label != IGNORE_INDEX]
        )
        assert re.match(r"q = \d+ ; key = \d+ ", completion) and "</think>\nAnswer: " in completion
        assert len(a["input_ids"]) - len(b["input_ids"]) == 6  # markers + "k", ":", " ", "v"


def test_strip_spans_fraction_strips_a_seeded_share(toy_sft, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    ids = (model.config.recall_start_token_id, model.config.recall_end_token_id)
    vocab = model.config.vocab_size

    def with_spans(fraction, seed):
        data, stats = load_sft_file(
            toy_sft, tokenizer, max_length=1024, vocab_size=vocab, strip_spans=ids, strip_fraction=fraction, seed=seed
        )
        kept = [ids[0] in r["input_ids"] for r in data.records]
        assert stats["stripped"] == kept.count(False)
        return kept

    assert not any(with_spans(1.0, 0)) and all(with_spans(0.0, 0))
    half = with_spans(0.5, 0)
    assert 0 < sum(half) < len(half)  # 24 records: some keep their spans, some lose them
    assert with_spans(0.5, 0) == half  # the same file and seed strip the same records
    assert with_spans(0.5, 1) != half


def test_curriculum_order_follows_the_windows():
    rng = random.Random(0)
    lengths = [rng.randint(10, 1000) for _ in range(500)]
    schedule = [{"at": 0.0, "lo": 0.0, "hi": 0.1}, {"at": 0.5, "lo": 0.0, "hi": 0.1}, {"at": 1.0, "lo": 0.8, "hi": 1.0}]
    order = curriculum_order(lengths, 1000, schedule, seed=3)
    assert order == curriculum_order(lengths, 1000, schedule, seed=3)
    ranked = sorted(lengths)
    first_half = [lengths[i] for i in order[:500]]
    assert max(first_half) <= ranked[50]  # the shortest 10% only
    assert min(lengths[i] for i in order[-20:]) >= ranked[int(0.78 * 500)]  # near the end: the longest ~20%
    assert len(set(order[:500])) > 40  # draws spread over the window


def test_group_by_length_keeps_the_draws_and_pads_less():
    rng = random.Random(0)
    lengths = [rng.randint(10, 1000) for _ in range(500)]
    schedule = [{"at": 0.0, "lo": 0.0, "hi": 0.1}, {"at": 0.5, "lo": 0.0, "hi": 0.1}, {"at": 1.0, "lo": 0.5, "hi": 1.0}]
    order = curriculum_order(lengths, 800, schedule, seed=3)
    grouped = group_by_length(order, lengths, 16, 8, seed=3)
    assert grouped == group_by_length(order, lengths, 16, 8, seed=3)  # seeded
    assert group_by_length(order, lengths, 16, 1) == order
    span = 16 * 8
    for start in range(0, len(order), span):  # the same draws within each run of 8 steps
        assert sorted(grouped[start : start + span]) == sorted(order[start : start + span])

    def padded(o):
        return sum(16 * max(lengths[i] for i in o[k : k + 16]) for k in range(0, len(o), 16))

    real = sum(lengths[i] for i in order)
    assert padded(grouped) - real < 0.25 * (padded(order) - real)
    firsts = [lengths[grouped[k]] for k in range(0, span, 16)]
    assert firsts != sorted(firsts)  # the steps of a run are shuffled, not longest last


def test_length_group_needs_a_curriculum():
    from recallm.sft.settings import SFTRecipe, StageRecipe

    stage = StageRecipe(steps=10, lr=1e-3)
    with pytest.raises(RecallmError, match="sft.length_group=4 groups the draws of a curriculum"):
        SFTRecipe(max_length=64, per_device_batch_size=2, global_batch_size=2, embed=stage, full=stage, length_group=4)


def test_right_padded_training_batches_attend_causally(toy_sft, model_and_tokenizer, monkeypatch):
    """A right-padded labelled batch reaches the decoder with an all-ones mask (plain causal attention)
    and gives the loss and gradients of the padding-masked forward; a left-padded one keeps its mask."""
    from recallm.modeling import _causal_only_mask

    model, tokenizer = model_and_tokenizer
    data, _ = load_sft_file(toy_sft, tokenizer, max_length=1024, vocab_size=model.config.vocab_size)
    batch = SFTCollator(tokenizer.pad_token_id, position_skip=2048)([data[i] for i in range(8)])
    assert not batch["attention_mask"].all()  # the batch is padded
    ones = _causal_only_mask(batch["attention_mask"], batch["labels"])
    assert ones.all() and ones.shape == batch["attention_mask"].shape
    left = batch["attention_mask"].flip(-1)
    assert _causal_only_mask(left, batch["labels"].flip(-1)) is left
    labelled_pad = batch["labels"].clone()
    labelled_pad[batch["attention_mask"] == 0] = 5
    assert _causal_only_mask(batch["attention_mask"], labelled_pad) is batch["attention_mask"]

    weight = model.get_input_embeddings().weight
    seen = []  # the attention mask the decoder receives
    hook = model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True
    )
    results = []
    try:
        for causal in (True, False):
            if not causal:
                monkeypatch.setattr("recallm.modeling._causal_only_mask", lambda mask, labels: mask)
            model.label_logits_only(True)
            try:
                loss = model(**batch).loss
                (grad,) = torch.autograd.grad(loss, weight)
            finally:
                model.label_logits_only(False)
            results.append((loss.detach(), grad))
    finally:
        hook.remove()
    assert seen[0].all() and seen[1] is batch["attention_mask"]
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize(
    "schedule",
    [
        [],
        [{"at": 0.5, "lo": 0.2}],
        [{"at": 0.0, "lo": 0.5, "hi": 0.4}],
        [{"at": 0.6, "lo": 0, "hi": 1}, {"at": 0.2, "lo": 0, "hi": 1}],
    ],
)
def test_bad_curricula_are_errors(schedule):
    with pytest.raises(RecallmError, match="curriculum"):
        check_curriculum(schedule)


def test_position_skips_keep_order_and_stay_in_range():
    prompt, completion = 40, 10
    feature = {
        "input_ids": list(range(prompt + completion)),
        "labels": [IGNORE_INDEX] * prompt + list(range(completion)),
    }
    short = {"input_ids": [1, 2, 3], "labels": [IGNORE_INDEX, 2, 3]}
    collator = SFTCollator(0, position_skip=200, seed=1)
    jumps = []
    for _ in range(50):
        pos = collator([feature, short])["position_ids"]
        steps = pos[0, 1:] - pos[0, :-1]
        assert (steps >= 1).all() and int((steps > 1).sum()) <= 1
        assert int(pos[0, -1]) < 200
        if (steps > 1).any():
            at = int(torch.nonzero(steps > 1)[0]) + 1
            assert 1 <= at < prompt  # the jump is inside the prompt; the completion stays contiguous
            jumps.append(int(steps.max()) - 1)
        assert pos[1, :3].tolist() == [0, 1, 2]  # a one-token prompt cannot be cut
    assert len(jumps) > 40 and max(jumps) > 100  # skips are drawn over the whole room
    assert "position_ids" not in SFTCollator(0)([feature])
