"""Synthetic tasks, length fitting, SFT traces: rows are exact, checkable and deterministic."""

from __future__ import annotations

import random
import re

import pytest

from data_gen.base import make_task, task_names
from data_gen.fit import PromptRenderer, build_row
from data_gen.traces import programmatic_trace, sft_example
from recallm.errors import RecallmError
from rewards import load_reward_config, score_response
from rewards.config import check_ground_truth

CFG = load_reward_config()
SYNTHETIC = {
    "kv_retrieval": {},
    "kv_toy": dict(key_type="toy", value_type="toy"),
    "math_retrieval": {},
    "multi_niah": {},
    "majority_vote": {},
    "top_n_vote": {},
}


@pytest.fixture(scope="module")
def renderer(tiny_dir):
    from recallm.tokens import load_tokenizer

    return PromptRenderer(load_tokenizer(tiny_dir))


def _task(label):
    return make_task("kv_retrieval" if label == "kv_toy" else label, **SYNTHETIC[label])


def _row(task, renderer, target, seed):
    rng = random.Random(seed)
    return build_row(task, task.draft(rng), renderer, target, rng, seed=seed)


@pytest.mark.parametrize("label", sorted(SYNTHETIC))
@pytest.mark.parametrize("target", [1024, 3000])
def test_rows_are_exact_and_scorable(label, target, renderer):
    task = _task(label)
    for seed in range(3):
        row = _row(task, renderer, target, seed)
        assert row.prompt_text.endswith("<think>\n")
        assert renderer.length(row.prompt_text) == row.prompt_tokens
        assert abs(row.prompt_tokens - target) <= 0.05 * target, (row.prompt_tokens, target)
        for gold in row.gold:
            assert row.prompt_text[gold["start"] : gold["end"]] == gold["text"]
        check_ground_truth(row.ground_truth, row.data_source, CFG)
        perfect = "</think>\nAnswer: " + task.answer_text(row)
        assert (
            score_response(
                perfect, row.ground_truth, prompt_text=row.prompt_text, data_source=row.data_source, config=CFG
            ).answer
            == 1.0
        )
        assert row.messages[-1]["role"] == "user" and row.messages[-1]["content"] in row.prompt_text


@pytest.mark.parametrize("label", sorted(SYNTHETIC))
def test_deterministic_in_the_seed(label, renderer):
    task = _task(label)
    a, b, c = (_row(task, renderer, 1024, s) for s in (7, 7, 8))
    assert a.prompt_text == b.prompt_text and a.ground_truth == b.ground_truth
    assert a.prompt_text != c.prompt_text


def test_augmentations_vary(renderer):
    seen = {}
    task = make_task("kv_retrieval")
    for seed in range(30):
        row = _row(task, renderer, 512, seed)
        for key, value in row.augmentations.items():
            seen.setdefault(key, set()).add(value)
    assert seen["kv_format"] == {"lines", "csv", "json"}
    assert seen["question_position"] == {"end", "beginning", "both"}
    assert len(seen["instruction"]) >= 4


def test_gold_position_is_spread(renderer):
    task = make_task("kv_retrieval")
    fractions = []
    for seed in range(40):
        row = _row(task, renderer, 2048, seed)
        fractions.append(row.gold[0]["start"] / len(row.prompt_text))
    assert min(fractions) < 0.3 and max(fractions) > 0.7


def test_math_problems_are_right_and_near_keys_present(renderer):
    task = make_task("math_retrieval", near_keys=3)
    for seed in range(20):
        row = _row(task, renderer, 2048, seed)
        key = int(row.trace_info["key"])
        m = re.search(r"solve for x: (\d+)x \+ (\d+) - (\d+)x = (\d+)", row.question)
        if m:
            a, b, d, c = map(int, m.groups())
            assert (c - b) / (a - d) == key
        else:
            expr = re.search(r"compute ([\d ()+*-]+)\.", row.question).group(1)
            assert eval(expr, {"__builtins__": {}}) == key  # digits and + - * ( ) only
        for near in (key - 3, key - 1, key + 1, key + 3):
            assert re.search(rf"(^|\n|\"|,)\s*\"?{near}\"?[:,]", row.prompt_text), near
        assert f"{key}" not in row.question.split("Problem:")[0]


@pytest.mark.parametrize("key_type", ["int", "signed"])
def test_offset_problems_change_only_the_last_digit(key_type):
    """The one-digit offset (``b + d`` / ``b - d``, no carry or borrow): right, and ``b`` differs from
    the key in its last digit only; both signs occur; the paper's problem types stay the default."""
    import random

    from data_gen.tasks.kv import PAPER_PROBLEM_TYPES, PROBLEM_TYPES

    rng, ops = random.Random(0), set()
    for _ in range(400):
        x = rng.randint(-99999, 99999) if key_type == "signed" else rng.randint(10000, 99999)
        problem, steps = PROBLEM_TYPES["offset"](rng, x)
        b, op, d = problem.split(" ")
        ops.add(op)
        assert eval(problem, {"__builtins__": {}}) == x and 1 <= int(d) <= 9  # digits and + - only
        assert b.lstrip("-")[:-1] == str(x).lstrip("-")[:-1] and b.startswith("-") == (x < 0)
        assert steps == [f"{problem} = {x}."]
    assert ops == {"+", "-"}
    assert make_task("math_retrieval").problem_types == PAPER_PROBLEM_TYPES == ("linear", "arithmetic")


def test_math_retrieval_with_offset_problems(renderer):
    task = make_task("math_retrieval", problem_types=["offset"], near_keys=2)
    for seed in range(10):
        row = _row(task, renderer, 512, seed)
        key = int(row.trace_info["key"])
        expr = re.search(r"compute (\d+ [+-] \d)\.", row.question).group(1)
        assert eval(expr, {"__builtins__": {}}) == key and str(key) not in row.question


def test_niah_trace_by_key(renderer):
    """trace_style=by_key: the keys in the question's order, each named, then its needles recalled."""
    from data_gen.traces import programmatic_trace

    task = make_task("multi_niah", decoys=2, target_keys=3, values_per_key=[1, 2], trace_style="by_key")
    for seed in range(6):
        row = _row(task, renderer, 512, seed)
        segments = programmatic_trace(task, row, random.Random(seed))
        keys = list(row.trace_info["per_key"])
        named = re.search(r"codes for (.+)\? List", row.question).group(1).replace(" and ", ", ").split(", ")
        assert keys == named and segments[0] == ("text", f"The question names {len(keys)} key(s).")
        spans = [row.prompt_text[a:b] for kind, (a, b) in ((k, v) for k, v in segments if k == "span")]
        assert sorted(spans) == sorted(g["text"] for g in row.gold)
        order = [next(k for k in keys if s.startswith(f"The special code for {k} is ")) for s in spans]
        assert order == sorted(order, key=keys.index)  # grouped by key, in the question's order
        texts = [v for k, v in segments if k == "text"]
        for key in keys:
            assert f" {key}:" in texts
    with pytest.raises(RecallmError, match="trace_style must be one of"):
        make_task("multi_niah", trace_style="sorted")


def test_votes_ranking_holds_in_the_prompt(renderer):
    for name, top in (("majority_vote", 1), ("top_n_vote", 3)):
        task = make_task(name)
        for seed in range(10):
            row = _row(task, renderer, 2048, seed)
            votes = re.findall(r"Ballot \d+: (.+)", row.prompt_text)
            counts = {c: votes.count(c) for c in set(votes)}
            ranked = sorted(counts, key=lambda c: -counts[c])
            assert ranked[:top] == row.answers
            if len(ranked) > top:
                assert counts[ranked[top - 1]] > counts[ranked[top]]  # strictly separated


def test_niah_answers_are_the_target_needles(renderer):
    task = make_task("multi_niah", decoys=(2, 4))
    row = _row(task, renderer, 2048, 3)
    needles = dict(re.findall(r"The special code for (\S+) is (\S+)\.", row.prompt_text)[::-1])
    assert len(needles) >= 3
    for value in row.answers:
        assert f"is {value}." in row.prompt_text
    assert {g["text"] for g in row.gold} == {
        f"The special code for {k} is {v}." for k, vs in row.trace_info["per_key"].items() for v in vs
    }


def test_toy_keys_and_values_are_single_tokens(renderer):
    task = make_task("kv_retrieval", key_type="toy", value_type="toy", formats=["lines"])
    row = _row(task, renderer, 512, 0)
    tok = renderer.tokenizer
    key, value = row.trace_info["key"], row.trace_info["value"]
    assert len(tok(key, add_special_tokens=False)["input_ids"]) == 1
    assert len(tok(value, add_special_tokens=False)["input_ids"]) == 1


def test_unreachable_lengths_and_bad_params(renderer):
    task = make_task("kv_retrieval", key_type="toy", value_type="toy")
    with pytest.raises(RecallmError, match="cannot reach 60000 tokens: its distractors ran out"):
        _row(task, renderer, 60000, 0)
    with pytest.raises(RecallmError, match="cannot reach a prompt of 10 tokens"):
        _row(task, renderer, 10, 0)
    with pytest.raises(RecallmError, match="without distractors already has"):
        _row(make_task("multi_niah"), renderer, 260, 0)
    with pytest.raises(RecallmError, match="unknown task 'nope'"):
        make_task("nope")
    with pytest.raises(RecallmError, match="formats must be a non-empty subset"):
        make_task("kv_retrieval", formats=["xml"])
    with pytest.raises(RecallmError, match="unexpected keyword"):
        make_task("kv_retrieval", colour="red")
    assert {"kv_retrieval", "math_retrieval", "multi_niah", "majority_vote", "top_n_vote"} <= set(task_names())


@pytest.mark.parametrize("label", sorted(SYNTHETIC))
def test_programmatic_traces(label, renderer):
    task = _task(label)
    tok = renderer.tokenizer
    row = _row(task, renderer, 1024, 1)
    example = sft_example(tok, row, programmatic_trace(task, row, random.Random(0)), task.answer_text(row))
    assert example.completion_ids[-1] == tok.eos_token_id
    assert tok.decode(example.completion_ids) == example.completion
    for i, j in example.spans:  # each span's ids: a contiguous piece of the prompt, inside the completion
        piece = example.prompt_ids[i:j]
        comp = example.completion_ids
        assert any(comp[k : k + len(piece)] == piece for k in range(len(comp) - len(piece) + 1))
    response = example.completion[: -len(tok.eos_token)]
    b = score_response(
        response,
        row.ground_truth,
        prompt_text=row.prompt_text,
        data_source=row.data_source,
        n_tokens=len(example.completion_ids),
        config=CFG,
    )
    assert b.answer == 1.0 and b.format == 1.0
    if row.gold:
        assert b.recall_overlap == 1.0 and b.n_spans == len(row.gold)
    from recallm.recall import find_spans
    from recallm.tokens import RecallTokenIds

    ids = RecallTokenIds.from_tokenizer(tok)
    for span in find_spans(example.prompt_ids + example.completion_ids, ids.start, ids.end):
        assert span.verbatim  # the constrained decoder could have produced it


@pytest.mark.parametrize("label", ["kv_retrieval", "math_retrieval", "multi_niah", "top_n_vote"])
def test_128k_prompts(label, renderer):
    from data_gen.generate import draft_row

    row = draft_row(make_task(label), renderer, 131072, random.Random(0))
    assert abs(row.prompt_tokens - 131072) <= 0.02 * 131072
    assert all(row.prompt_text[g["start"] : g["end"]] == g["text"] for g in row.gold)


def test_toy_lookup_derives_the_key(renderer):
    task = make_task("toy_lookup", pairs=[3, 40])
    for seed in range(20):
        row = build_row(task, task.draft(random.Random(seed)), renderer, 400, random.Random(seed), seed=seed)
        key, value = row.trace_info["key"], row.answers[0]
        assert row.question == f"q = {int(key) - 1} ; key = q + 1"
        assert re.search(rf"(?<!\d){key}(?!\d)", row.question) is None  # the key must be derived
        assert row.gold[0]["text"] == f"{key}: {value}"
        assert row.prompt_text[row.gold[0]["start"] : row.gold[0]["end"]] == f"{key}: {value}"
        lines = re.findall(r"^(\d+): (\w+)$", row.prompt_text, flags=re.M)
        assert 3 <= len(lines) <= 40 and len({k for k, _ in lines}) == len(lines) == len({v for _, v in lines})
        assert dict(lines)[key] == value
        segments = programmatic_trace(task, row, random.Random(0))
        example = sft_example(renderer.tokenizer, row, segments, task.answer_text(row))
        assert (
            example.completion
            == f"q = {int(key) - 1} ; key = {key} <|start_recall|>{key}: {value}<|end_recall|></think>\nAnswer: {value}<|im_end|>"
        )
        assert (
            score_response(example.completion, row.ground_truth, prompt_text=row.prompt_text, config=CFG).answer == 1.0
        )
    again = build_row(task, task.draft(random.Random(7)), renderer, 400, random.Random(7), seed=7)
    first = build_row(task, task.draft(random.Random(7)), renderer, 400, random.Random(7), seed=7)
    assert again.prompt_text == first.prompt_text


def test_toy_lookup_short_trace_and_bad_trace(renderer):
    worked, short = make_task("toy_lookup", pairs=[3, 40]), make_task("toy_lookup", pairs=[3, 40], trace="short")
    row = build_row(worked, worked.draft(random.Random(3)), renderer, 400, random.Random(3), seed=3)
    again = build_row(short, short.draft(random.Random(3)), renderer, 400, random.Random(3), seed=3)
    assert again.prompt_text == row.prompt_text  # the trace changes the completion only
    key, value = row.trace_info["key"], row.answers[0]
    completion = sft_example(renderer.tokenizer, again, programmatic_trace(short, again, random.Random(0)), value)
    assert completion.completion.startswith(f"key = {key} <|start_recall|>{key}: {value}<|end_recall|>")
    with pytest.raises(RecallmError, match=r"trace must be one of \['worked', 'short'\], got 'long'"):
        make_task("toy_lookup", trace="long")


def test_toy_lookup_fitted_to_a_length(renderer):
    task = make_task("toy_lookup", pairs=None)
    for target in (360, 1440):
        row = build_row(task, task.draft(random.Random(target)), renderer, target, random.Random(1), seed=1)
        assert abs(row.prompt_tokens - target) <= 0.02 * target + 5
    with pytest.raises(RecallmError, match="cannot reach"):
        task.check_length(5000)  # 299 keys at most
    with pytest.raises(RecallmError, match="pairs"):
        make_task("toy_lookup", pairs=[10, 400])
