"""``recallm.generation.generate``, the one batched constrained-generation function: batched =
one by one under greedy, log-probs = the masked forward's, spans verbatim, the pad-token rule,
seeds, finish reasons, cancellation, the wrap hook, and no leak of the model's generation config."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from recallm.errors import RecallmError
from recallm.generation import GenRequest, generate, generated_spans
from recallm.tokens import RecallTokenIds, load_tokenizer, pad_token_id
from tests.reference import contains, reference_spans

PROMPTS = [
    "find the value of key 2 in the list below\n1: bazo\n2: kelu\n3: mifa\n4: zuno",
    "what is the value of key 7\n7: lomi\n8: rade\n9: sepa\nthe answer is",
    "key value table\n11: dafo 12: kise 13: muvo",
    "two words",
]


@pytest.fixture(scope="module")
def tiny_model(tiny_dir):
    """A model of its own (tests here change its generation config and restore it)."""
    import recallm  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    tokenizer = load_tokenizer(tiny_dir)
    return model, tokenizer, RecallTokenIds.from_pretrained(model.config, tokenizer)


def _ids(tokenizer) -> list[tuple[int, ...]]:
    return [tuple(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]


def _masked_log_probs(model, prompt, response, temperature: float = 1.0) -> torch.Tensor:
    """The masked model's forward on prompt + response (what verl's actor computes), logits / T."""
    seq = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0].float()
    log_probs = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    return log_probs.gather(1, torch.tensor(response)[:, None]).squeeze(1)


@pytest.mark.parametrize("force", [None, (4, 3)])
def test_batched_equals_one_by_one_under_greedy(tiny_model, force):
    model, tokenizer, _ = tiny_model
    requests = [GenRequest(p, 10 + 4 * i) for i, p in enumerate(_ids(tokenizer))]  # unequal lengths and budgets
    batched = generate(model, requests, tokenizer=tokenizer, force=force, log_probs=True)
    single = [generate(model, [r], tokenizer=tokenizer, force=force, log_probs=True)[0] for r in requests]
    by_two = generate(model, requests, tokenizer=tokenizer, force=force, log_probs=True, batch_size=2)
    for a, b, c in zip(batched, single, by_two, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.finish_reason == b.finish_reason == c.finish_reason
        assert max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs, strict=True)) < 1e-4
    for request, result in zip(requests, batched, strict=True):
        assert 1 <= len(result.token_ids) <= request.max_new_tokens
        assert len(result.log_probs) == len(result.token_ids)


@pytest.mark.parametrize(("temperature", "top_k"), [(0.0, 0), (0.7, 0), (1.3, 0), (1.0, 5)])
def test_log_probs_equal_the_masked_forward(tiny_model, temperature, top_k):
    """Processed log-probs (recall mask, temperature, top-k) = the masked model's forward log-probs,
    renormalised over the k best under top-k; greedy: the masked logits' (no temperature)."""
    model, tokenizer, ids = tiny_model
    prompts = _ids(tokenizer)
    requests = [GenRequest(p, 24, temperature=temperature, top_k=top_k, seed=7) for p in prompts]
    results = generate(model, requests, tokenizer=tokenizer, force=(5, 4), log_probs=True)
    n_spans = 0
    for request, result in zip(requests, results, strict=True):
        response = result.token_ids
        n_spans += len(generated_spans(request.prompt_ids, response, ids.start, ids.end))
        seq = torch.tensor([list(request.prompt_ids) + response])
        with torch.no_grad():
            logits = model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0].float()
        logits = logits[len(request.prompt_ids) - 1 : -1] / (temperature if temperature > 0 else 1.0)
        if top_k:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)
        got = torch.tensor(result.log_probs)
        finite = torch.isfinite(expected)  # a forced token outside the top k: its log-prob before top-k
        assert torch.allclose(got[finite], expected[finite], atol=1e-4), (got, expected)
        assert torch.isfinite(got).all()
        if not top_k:
            assert finite.all()
            assert torch.allclose(
                got, _masked_log_probs(model, request.prompt_ids, response, temperature or 1.0), atol=1e-4
            )
    assert n_spans >= len(requests)  # spans were forced, so the mask was exercised


def test_spans_are_verbatim_and_unconstrained_ones_are_not(tiny_model):
    model, tokenizer, ids = tiny_model
    requests = [GenRequest(p, 40, temperature=1.0, seed=3) for p in _ids(tokenizer)[:3] for _ in range(2)]
    constrained = generate(model, requests, tokenizer=tokenizer, force=(3, 5))
    n_spans = 0
    for request, result in zip(requests, constrained, strict=True):
        seq = list(request.prompt_ids) + result.token_ids
        spans = generated_spans(request.prompt_ids, result.token_ids, ids.start, ids.end)
        n_spans += len(spans)
        assert all(span.verbatim for span in spans)
        for start, content in reference_spans(seq, ids.start, ids.end):  # the independent check
            assert contains(seq[:start], content)
    assert n_spans >= 2 * len(requests)
    free = generate(model, requests, tokenizer=tokenizer, force=(3, 5), recall=False)
    spans = [
        s
        for r, out in zip(requests, free, strict=True)
        for s in generated_spans(r.prompt_ids, out.token_ids, ids.start, ids.end)
    ]
    assert spans and not all(s.verbatim for s in spans)  # random weights: forced spans are (almost surely) not copies


def test_pad_token_rule_and_padding_never_changes_an_output(tiny_model, monkeypatch):
    """Rows are left-padded with ``recallm.tokens.pad_token_id``'s id, and which id that is does not
    change what is generated (the attention mask hides the padding from the model and the matcher)."""
    model, tokenizer, _ = tiny_model
    requests = [GenRequest(p, 12) for p in _ids(tokenizer)]
    seen: list[tuple[torch.Tensor, int]] = []
    real_generate = type(model).generate

    def spy(self, *args, **kwargs):
        seen.append((kwargs["input_ids"].clone(), kwargs["pad_token_id"]))
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "generate", spy)
    first = generate(model, requests, tokenizer=tokenizer, force=(3, 3), span_draft_tokens=0)  # through generate()
    expected_pad = pad_token_id(tokenizer=tokenizer, config=model.config, generation_config=model.generation_config)
    width = max(len(r.prompt_ids) for r in requests)
    short = min(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
    n_pad = width - len(requests[short].prompt_ids)
    assert n_pad > 0 and seen[0][1] == expected_pad
    assert seen[0][0][short, :n_pad].eq(expected_pad).all()

    class OtherPad:  # the rule's first source is the tokenizer's pad token: point it elsewhere
        pad_token_id = 4
        eos_token_id = tokenizer.eos_token_id

    assert expected_pad != 4
    other = generate(model, requests, tokenizer=OtherPad(), force=(3, 3), span_draft_tokens=0)
    assert seen[-1][1] == 4 and seen[-1][0][short, :n_pad].eq(4).all()
    assert [r.token_ids for r in first] == [r.token_ids for r in other]
    # the speculative decoder (drafts inside spans) pads its blocks with the same id, to the same effect
    drafted = [generate(model, requests, tokenizer=t, force=(3, 3)) for t in (tokenizer, OtherPad())]
    assert [r.token_ids for r in drafted[0]] == [r.token_ids for r in drafted[1]] == [r.token_ids for r in first]


def test_no_pad_and_no_eos_is_an_error(tiny_model, monkeypatch):
    model, _, _ = tiny_model

    class NoTokens:
        pad_token_id = None
        eos_token_id = None

    monkeypatch.setattr(model.config, "pad_token_id", None)
    monkeypatch.setattr(model.config, "eos_token_id", None)
    monkeypatch.setattr(model, "generation_config", type(model.generation_config)())
    with pytest.raises(RecallmError, match="no pad token"):
        generate(model, [GenRequest((5, 6, 7), 3)], tokenizer=NoTokens())


def test_the_models_generation_config_does_not_leak_in(tiny_model, monkeypatch):
    """Shipped sampling defaults (top_k, repetition penalty, ...) do not change a request, and the
    model's generation config is left as it was."""
    model, tokenizer, _ = tiny_model
    requests = [GenRequest(p, 16, temperature=1.0, seed=11) for p in _ids(tokenizer)[:2]]
    requests.append(GenRequest(_ids(tokenizer)[2], 16))
    before = generate(model, requests, tokenizer=tokenizer, log_probs=True)
    shipped = copy.deepcopy(model.generation_config)
    shipped.top_k, shipped.repetition_penalty, shipped.no_repeat_ngram_size = 1, 3.0, 1
    monkeypatch.setattr(model, "generation_config", shipped)
    after = generate(model, requests, tokenizer=tokenizer, log_probs=True)
    assert [r.token_ids for r in before] == [r.token_ids for r in after]
    assert [r.log_probs for r in before] == [r.log_probs for r in after]
    assert model.generation_config is shipped and shipped.top_k == 1


def test_seeds_and_the_callers_rng(tiny_model):
    model, tokenizer, _ = tiny_model
    prompt = _ids(tokenizer)[0]
    seeded = [GenRequest(prompt, 20, temperature=1.0, seed=5)]
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = generate(model, seeded, tokenizer=tokenizer)[0]
    assert torch.equal(torch.get_rng_state(), state)  # a seeded batch leaves the caller's RNG alone
    b = generate(model, seeded, tokenizer=tokenizer)[0]
    assert a.token_ids == b.token_ids
    unseeded = [GenRequest(prompt, 20, temperature=1.0)]
    torch.manual_seed(5)
    c = generate(model, unseeded, tokenizer=tokenizer)[0]
    assert c.token_ids == a.token_ids  # seed=None draws from the caller's RNG: the same stream here
    assert not torch.equal(torch.get_rng_state(), state)


def test_finish_reasons_and_per_request_budgets(tiny_model):
    model, tokenizer, _ = tiny_model
    prompts = _ids(tokenizer)
    free = generate(model, [GenRequest(p, 12) for p in prompts], tokenizer=tokenizer, eos_token_ids=[])
    assert all(r.finish_reason == "length" and len(r.token_ids) == 12 for r in free)
    stop_id = free[0].token_ids[5]
    first = free[0].token_ids.index(stop_id)
    requests = [GenRequest(prompts[0], 12), GenRequest(prompts[1], 3)]
    out = generate(model, requests, tokenizer=tokenizer, eos_token_ids=[stop_id])
    assert out[0].finish_reason == "stop" and out[0].token_ids == free[0].token_ids[: first + 1]
    row = free[1].token_ids[:3]
    expected = row[: row.index(stop_id) + 1] if stop_id in row else row
    assert out[1].token_ids == expected and out[1].finish_reason == ("stop" if stop_id in row else "length")


def test_progress_counts_tokens_per_step_and_each_row_as_it_ends(tiny_model):
    model, tokenizer, _ = tiny_model
    prompts = _ids(tokenizer)
    free = generate(model, [GenRequest(p, 12) for p in prompts[:2]], tokenizer=tokenizer, eos_token_ids=[])
    stop_id = free[0].token_ids[3]  # row 0 ends at its first stop_id, within 4 tokens
    requests = [GenRequest(prompts[0], 12), GenRequest(prompts[1], 7), GenRequest(prompts[2], 12)]
    calls: list[tuple[int, int]] = []
    out = generate(
        model, requests, tokenizer=tokenizer, eos_token_ids=[stop_id], progress=lambda t, f: calls.append((t, f))
    )
    assert sum(t for t, _ in calls) == sum(len(r.token_ids) for r in out)  # every generated token, once
    assert sum(f for _, f in calls) == 3  # every row, once
    ended = [step for step, (_, f) in enumerate(calls, 1) for _ in range(f)]
    # row 0 is counted at its stop token, before the batch's last step (not when the batch ends)
    assert ended[0] == len(out[0].token_ids) <= 4 < len(calls)
    assert calls[0][0] == 3  # three rows running at the first step
    by_two: list[tuple[int, int]] = []
    generate(
        model,
        requests,
        tokenizer=tokenizer,
        eos_token_ids=[],
        batch_size=2,
        progress=lambda t, f: by_two.append((t, f)),
    )
    assert sum(f for _, f in by_two) == 3 and sum(t for t, _ in by_two) == 12 + 7 + 12


def test_cancelled_rows_and_batches(tiny_model):
    model, tokenizer, _ = tiny_model
    requests = [GenRequest(p, 15) for p in _ids(tokenizer)[:3]]
    calls = {"n": 0}

    def after_four():
        calls["n"] += 1
        return calls["n"] > 4  # polled after every generated token: true at the fifth

    out = generate(
        model, requests, tokenizer=tokenizer, eos_token_ids=[], cancelled=[lambda: False, after_four, lambda: False]
    )
    assert [r.finish_reason for r in out] == ["length", "cancelled", "length"]
    assert 1 <= len(out[1].token_ids) < 15 and len(out[0].token_ids) == 15
    full = generate(model, requests[1:2], tokenizer=tokenizer, eos_token_ids=[])[0]
    assert full.token_ids[: len(out[1].token_ids)] == out[1].token_ids
    none = generate(model, requests, tokenizer=tokenizer, cancelled=[lambda: True] * 3, log_probs=True)
    assert all(r.finish_reason == "cancelled" and r.token_ids == [] == r.log_probs for r in none)


def test_groups_by_sampling_and_the_wrap_hook(tiny_model):
    """Requests are batched by equal sampling parameters (results in request order); ``wrap``
    sees every batch and what it yields extends ``generate``'s arguments."""
    model, tokenizer, _ = tiny_model
    prompts = _ids(tokenizer)
    requests = [
        GenRequest(prompts[0], 10),
        GenRequest(prompts[1], 10, temperature=0.8, seed=1),
        GenRequest(prompts[2], 10),
        GenRequest(prompts[3], 10, repetition_penalty=1.2),
    ]
    batches = []

    @contextlib.contextmanager
    def wrap(*, input_ids, attention_mask, prompt_lengths, max_new_tokens):
        batches.append((tuple(input_ids.shape), list(prompt_lengths), max_new_tokens))
        yield {"max_new_tokens": 4}

    out = generate(model, requests, tokenizer=tokenizer, eos_token_ids=[], wrap=wrap)
    lengths = [len(p) for p in prompts]
    assert sorted(batches) == sorted(
        [
            ((2, max(lengths[0], lengths[2])), [lengths[0], lengths[2]], 10),
            ((1, lengths[1]), [lengths[1]], 10),
            ((1, lengths[3]), [lengths[3]], 10),
        ]
    )
    assert all(len(r.token_ids) == 4 for r in out)
    alone = generate(model, [requests[2]], tokenizer=tokenizer, eos_token_ids=[])[0]
    assert out[2].token_ids == alone.token_ids[:4]


def test_bad_requests_and_options(tiny_model, tiny_base_dir):
    model, tokenizer, _ = tiny_model
    with pytest.raises(RecallmError, match="max_new_tokens"):
        GenRequest((1, 2), 0)
    with pytest.raises(RecallmError, match="top_p"):
        GenRequest((1, 2), 3, top_p=0.0)
    with pytest.raises(RecallmError, match="batch_size"):
        generate(model, [GenRequest((5, 6), 2)], tokenizer=tokenizer, batch_size=0)
    base = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()
    base_tok = load_tokenizer(tiny_base_dir)
    with pytest.raises(RecallmError, match="recall tokens"):
        generate(base, [GenRequest((5, 6), 2)], tokenizer=base_tok, recall=True)
    out = generate(base, [GenRequest((5, 6, 7), 4), GenRequest((8,), 4)], tokenizer=base_tok)  # a plain model
    assert all(1 <= len(r.token_ids) <= 4 for r in out)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_request_gives_the_same_tokens_in_any_batch(tiny_model, temperature):
    """Each sampled request draws from a stream of its own (its seed): the same requests batched 8, 3
    or 1 at a time, in another order, and decoded with or without drafts inside spans, give the same
    tokens; two requests of one prompt with different seeds are two samples."""
    import random

    model, tokenizer, _ = tiny_model
    prompts = _ids(tokenizer)
    sampling = {"temperature": temperature, "top_p": 0.95} if temperature else {}
    requests = [GenRequest(p, 20, seed=1000 + i, **sampling) for i, p in enumerate(prompts * 2)]
    order = list(range(len(requests)))
    random.Random(0).shuffle(order)

    def tokens(batch_size, shuffled=False, **kwargs):
        chosen = [requests[i] for i in order] if shuffled else requests
        out = [
            r.token_ids
            for r in generate(model, chosen, tokenizer=tokenizer, force=(4, 6), batch_size=batch_size, **kwargs)
        ]
        if not shuffled:
            return out
        back = [None] * len(out)
        for position, i in enumerate(order):
            back[i] = out[position]
        return back

    reference = tokens(8)
    assert tokens(3) == reference
    assert tokens(1) == reference
    assert tokens(8, shuffled=True) == reference
    assert tokens(3, shuffled=True, span_draft_tokens=0) == reference  # Hugging Face generate's loop, no drafts
    if temperature:
        assert reference[0] != reference[len(prompts)]  # the same prompt, another seed: another sample


@pytest.fixture
def copying_model(tiny_model):
    """The tiny model with its ``<|end_recall|>`` logit lowered by 8 (a hook on the output layer): a
    span runs until it is forced closed or its context runs out, as a trained model's copy of a passage
    does; counts the forward passes and the tokens they read."""
    model, tokenizer, ids = tiny_model
    calls = {"forwards": 0, "tokens": 0}

    def lower_end(module, inputs, output):
        return output.index_add(-1, torch.tensor([ids.end]), torch.full((*output.shape[:-1], 1), -8.0))

    def count(module, args, kwargs):
        calls["forwards"] += 1
        calls["tokens"] += kwargs["input_ids"].shape[1] if "input_ids" in kwargs else args[0].shape[1]

    hooks = [model.lm_head.register_forward_hook(lower_end), model.register_forward_pre_hook(count, with_kwargs=True)]
    try:
        yield model, tokenizer, ids, calls
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "penalty"),
    [(0.0, 0, 1.0, 1.0), (1.0, 0, 1.0, 1.0), (0.8, 20, 0.9, 1.0), (1.0, 0, 1.0, 1.3)],
)
def test_speculative_in_span_decoding_equals_plain_decoding(copying_model, temperature, top_k, top_p, penalty):
    """Drafts of the matcher's continuation, verified in one forward pass with the recall mask at every
    position, give the tokens and log-probs of one-token-at-a-time decoding (Hugging Face ``generate``),
    greedy and sampled (top-k, top-p, a repetition penalty), in fewer forward passes; every span is a
    verbatim copy."""
    model, tokenizer, ids, calls = copying_model
    requests = [
        GenRequest(p, 40, temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=penalty, seed=50 + i)
        for i, p in enumerate(_ids(tokenizer)[:3])
    ]
    plain = generate(model, requests, tokenizer=tokenizer, force=(3, 24), log_probs=True, span_draft_tokens=0)
    calls.update(forwards=0, tokens=0)
    drafted = generate(model, requests, tokenizer=tokenizer, force=(3, 24), log_probs=True, span_draft_tokens=6)
    # a request with a repetition penalty goes alone: one forward pass a token without drafts
    longest = sum(len(r.token_ids) for r in drafted) if penalty != 1.0 else max(len(r.token_ids) for r in drafted)
    assert calls["forwards"] < longest  # tokens accepted from drafts: fewer forward passes than tokens
    for request, a, b in zip(requests, plain, drafted, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs, strict=True)) < 1e-4
        spans = generated_spans(request.prompt_ids, b.token_ids, ids.start, ids.end)
        assert spans and all(span.verbatim for span in spans)
    assert (
        max(
            len(s.tokens)
            for r, o in zip(requests, drafted, strict=True)
            for s in generated_spans(r.prompt_ids, o.token_ids, ids.start, ids.end)
        )
        >= 8
    )


def test_speculative_decoding_progress_budgets_and_cancellation(copying_model):
    """The drafting decoder reports every token and every row once, stops each row at its own budget and
    its end-of-sequence token, and a cancelled row keeps the tokens it had (a prefix of its full output)."""
    model, tokenizer, ids, _ = copying_model
    prompts = _ids(tokenizer)
    requests = [GenRequest(p, 30 - 7 * i, temperature=1.0, seed=i) for i, p in enumerate(prompts[:3])]
    full = generate(model, requests, tokenizer=tokenizer, force=(3, 20), eos_token_ids=[])
    assert [len(r.token_ids) for r in full] == [30, 23, 16] and all(r.finish_reason == "length" for r in full)
    calls: list[tuple[int, int]] = []
    again = generate(
        model,
        requests,
        tokenizer=tokenizer,
        force=(3, 20),
        eos_token_ids=[],
        progress=lambda t, f: calls.append((t, f)),
    )
    assert [r.token_ids for r in again] == [r.token_ids for r in full]
    assert sum(t for t, _ in calls) == 30 + 23 + 16 and sum(f for _, f in calls) == 3
    assert len(calls) < 30  # steps that took several tokens
    stop_id = full[0].token_ids[12]
    stopped = generate(model, requests[:1], tokenizer=tokenizer, force=(3, 20), eos_token_ids=[stop_id])[0]
    assert (
        stopped.finish_reason == "stop"
        and stopped.token_ids == full[0].token_ids[: full[0].token_ids.index(stop_id) + 1]
    )
    polls = {"n": 0}

    def after_three():
        polls["n"] += 1
        return polls["n"] > 3

    out = generate(
        model,
        requests,
        tokenizer=tokenizer,
        force=(3, 20),
        eos_token_ids=[],
        cancelled=[lambda: False, after_three, lambda: False],
    )
    assert [r.finish_reason for r in out] == ["length", "cancelled", "length"]
    assert 1 <= len(out[1].token_ids) < 23 and out[1].token_ids == full[1].token_ids[: len(out[1].token_ids)]
    assert out[0].token_ids == full[0].token_ids and out[2].token_ids == full[2].token_ids
