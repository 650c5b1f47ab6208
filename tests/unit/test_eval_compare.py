"""Paired comparisons of two runs (recallm.eval.compare), the error kinds and the answer diagnostics
they read, the report's comparison section and accuracy plot, and the pipeline's RESULT line from them.
Every number is worked out by hand from the records below."""

from __future__ import annotations

import json

import pytest

from recallm.errors import RecallmError
from recallm.eval.compare import ALL, error_counts, error_kind, paired_cells
from recallm.eval.runner import summarize


def rec(task, length, index, correct, *, output="", answer="", spans=(0, 0), gold=("v",), score=None, **metrics):
    return {
        "benchmark": "synthetic",
        "task": task,
        "example_id": f"synthetic/{task}/{length}/{index}",
        "length": length,
        "index": index,
        "prompt_tokens": length,
        "prompt_id": f"p{task}{length}{index}",
        "output": output,
        "output_tokens": 10,
        "finish_reason": "stop",
        "answer": answer,
        "score": float(correct) if score is None else score,
        "correct": bool(correct),
        "metrics": metrics,
        "gold": list(gold),
        "spans": {"count": spans[0], "verbatim": spans[1], "source": "tokens", "flags": [True] * spans[1]},
        "followup": None,
    }


def two_runs():
    """At 256: kv a 4/4, b 2/4 (2 discordant for a); math a 2/4, b 3/4 (a 0 only / b 1 only).
    At 1024: kv a 3/4, b 0/4; math a 1/4, b 1/4 (one each way)."""
    a, b = [], []
    outcomes = {
        (256, "kv_retrieval"): ([1, 1, 1, 1], [1, 1, 0, 0]),
        (256, "math_retrieval"): ([1, 1, 0, 0], [1, 1, 1, 0]),
        (1024, "kv_retrieval"): ([1, 1, 1, 0], [0, 0, 0, 0]),
        (1024, "math_retrieval"): ([1, 0, 0, 0], [0, 1, 0, 0]),
    }
    for (length, task), (xs, ys) in outcomes.items():
        a += [rec(task, length, i, x) for i, x in enumerate(xs)]
        b += [rec(task, length, i, y) for i, y in enumerate(ys)]
    return a, b


def test_paired_cells_count_and_test_by_hand():
    a, b = two_runs()
    cells = paired_cells(a, b, benchmark="synthetic")
    assert sorted(cells) == [
        (256, ALL), (256, "kv_retrieval"), (256, "math_retrieval"),
        (1024, ALL), (1024, "kv_retrieval"), (1024, "math_retrieval"),
    ]  # fmt: skip
    kv = cells[(256, "kv_retrieval")]
    assert (kv.n, kv.a_correct, kv.b_correct, kv.diff.diff) == (4, 4, 2, 0.5)
    assert (kv.mcnemar.a_only, kv.mcnemar.b_only, kv.mcnemar.p_value) == (2, 0, 0.5)
    pooled = cells[(1024, ALL)]  # a 4/8, b 1/8: +3/8; discordant a-only 4 (kv 3 + math 1), b-only 1
    assert (pooled.n, pooled.a_correct, pooled.b_correct, pooled.diff.diff) == (8, 4, 1, 0.375)
    assert (pooled.mcnemar.a_only, pooled.mcnemar.b_only) == (4, 1)
    assert pooled.mcnemar.p_value == pytest.approx(2 * (1 + 5) / 32)
    assert pooled.diff.low <= 0.375 <= pooled.diff.high
    math_cell = cells[(1024, "math_retrieval")]  # one each way: no difference, p = 1
    assert (math_cell.diff.diff, math_cell.mcnemar.p_value) == (0.0, 1.0)


def test_runs_with_other_prompts_are_not_compared():
    a, b = two_runs()
    b[0] = dict(b[0], prompt_id="another")
    with pytest.raises(RecallmError, match="another prompt in each run"):
        paired_cells(a, b, benchmark="synthetic")


def test_the_same_messages_rendered_by_another_chat_template_are_paired():
    from recallm.eval.runner import content_id

    messages = [{"role": "user", "content": "the value of key 12?"}]
    assert content_id(messages) == content_id([{"content": "the value of key 12?", "role": "user"}])
    assert content_id(messages) != content_id([{"role": "user", "content": "the value of key 13?"}])
    a, b = two_runs()
    a = [dict(r, content_id=f"c{r['example_id']}") for r in a]
    b = [dict(r, content_id=f"c{r['example_id']}", prompt_id=r["prompt_id"] + "<think>") for r in b]
    assert paired_cells(a, b, benchmark="synthetic") == paired_cells(*two_runs(), benchmark="synthetic")
    b[0] = dict(b[0], content_id="another question")
    with pytest.raises(RecallmError, match="another prompt in each run"):
        paired_cells(a, b, benchmark="synthetic")


def test_only_the_prompts_both_runs_have_are_paired():
    a, b = two_runs()
    cells = paired_cells(a, b[:3], benchmark="synthetic")  # b finished 3 kv prompts at 256
    assert list(cells) == [(256, "kv_retrieval"), (256, ALL)] and cells[(256, ALL)].n == 3


@pytest.mark.parametrize(
    ("record", "kind"),
    [
        (rec("kv_retrieval", 256, 0, True), None),
        (rec("kv_retrieval", 256, 0, False, answer="", answer_parsed=0.0), "no_answer"),
        (rec("math_retrieval", 256, 0, False, answer="abcdef", key_in_output=0.0, answer_in_prompt=1.0,
             answer_similarity=0.1), "wrong_key"),
        (rec("math_retrieval", 256, 0, False, answer="abcdef", key_in_output=1.0, answer_in_prompt=1.0,
             answer_similarity=0.1), "other_entry"),
        (rec("kv_retrieval", 256, 0, False, answer="abcdeg", answer_in_prompt=0.0, answer_similarity=0.83),
         "garbled_copy"),
        (rec("kv_retrieval", 256, 0, False, answer="zzz", answer_in_prompt=0.0, answer_similarity=0.1),
         "not_in_context"),
        (rec("multi_niah", 256, 0, False, answer="a1, b2", score=0.5), "partial"),
        (rec("multi_niah", 256, 0, False, answer="c3", score=0.0), "none_found"),
    ],
)  # fmt: skip
def test_error_kinds(record, kind):
    assert error_kind(record) == kind


def test_error_counts_by_length_and_task():
    records = [
        rec("kv_retrieval", 256, 0, False, answer="x1234", answer_in_prompt=1.0, answer_similarity=0.2),
        rec("kv_retrieval", 256, 1, False, answer="x1234", answer_in_prompt=1.0, answer_similarity=0.2),
        rec("kv_retrieval", 256, 2, True),
        rec("multi_niah", 1024, 0, False, answer="c3", score=0.0),
    ]
    counts = error_counts(records)
    assert counts == {(256, "kv_retrieval"): {"other_entry": 2}, (1024, "multi_niah"): {"none_found": 1}}


def test_answer_diagnostics():
    from recallm.eval.benchmarks.synthetic import answer_diagnostics
    from recallm.eval.types import Example, Score, Spec

    prompt = "63723: aaaa1111bb\n63724: 7f95d6viqj\n63725: cccc2222dd\nProblem: compute 63728 - 4."
    example = Example(Spec(256, "synthetic", 0, "math_retrieval"), [], prompt, 40, {"key": "63724"})
    right = "63728 - 4 = 63724. The key is 63724.</think>\nAnswer: 7f95d6viqj"
    d = answer_diagnostics(example, right, Score(1.0, True, "7f95d6viqj", gold=["7f95d6viqj"]))
    assert d == {"key_in_output": 1.0, "answer_in_prompt": 1.0, "answer_similarity": 1.0}
    # a slip to the next key: its value is in the prompt; the right key is absent (63724 inside 637245 is not it)
    slip = "63728 - 4 = 637245. The key is 63725.</think>\nAnswer: cccc2222dd"
    d = answer_diagnostics(example, slip, Score(0.0, False, "cccc2222dd", gold=["7f95d6viqj"]))
    assert d["key_in_output"] == 0.0 and d["answer_in_prompt"] == 1.0 and d["answer_similarity"] < 0.3
    # the key only after the final answer does not count
    late = "I do not know.</think>\nAnswer: 7f95d6viqx (key 63724)"
    d = answer_diagnostics(example, late, Score(0.0, False, "7f95d6viqx (key 63724)", gold=["7f95d6viqj"]))
    assert d["key_in_output"] == 0.0 and d["answer_in_prompt"] == 0.0
    assert answer_diagnostics(example, right, Score(1.0, True, "a", gold=["a", "b"])) == {}  # several answers


def store(path, records, name):
    path.mkdir(parents=True)
    summary = summarize(records, (), {"name": name})
    summary["planned"] = len(records)
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def stored(tmp_path):
    a, b = two_runs()
    a[0] = dict(a[0], output="Look: <|start_recall|>63724: v<|end_recall|></think>\nAnswer: v", spans=(1, 1))
    a[0]["spans"] = {"count": 1, "verbatim": 1, "source": "tokens", "flags": [True]}
    return {"recall": store(tmp_path / "eval" / "recall", a, "recall"), "norecall": store(tmp_path / "eval" / "norecall", b, "norecall")}


def test_report_compares_runs_prompt_by_prompt(stored, tmp_path):
    from recallm.eval.report import build_report

    out = tmp_path / "report"
    text = build_report(stored, out, compare=[["recall", "norecall"]], html=False).read_text()
    section = text.split("## synthetic: paired comparisons")[1]
    assert "### recall vs norecall" in section
    row = next(line for line in section.splitlines() if line.startswith("| 1K | **all**"))
    assert "0.500 (4/8)" in row and "0.125 (1/8)" in row and "+0.375 [" in row and "| 4 / 1 |" in row
    data = json.loads((out / "comparison.json").read_text())["synthetic"]
    cell = data["pairs"]["recall-norecall"]["1024/all"]
    assert (cell["n"], cell["a_correct"], cell["b_correct"], cell["diff"]) == (8, 4, 1, 0.375)
    assert cell["mcnemar"] == {"a_only": 4, "b_only": 1, "p_value": pytest.approx(0.375)}
    # accuracy by length with counts and intervals, and its plot
    assert "| recall | 75.0 (6/8) [41, 93] | 50.0 (4/8) [22, 78] |" in text
    assert (out / "plots" / "synthetic_accuracy.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(RecallmError, match="no run named 'grpo'"):
        build_report(stored, tmp_path / "r2", compare=[["recall", "grpo"]])


def test_result_line_reads_the_paired_difference(stored, tmp_path):
    from recallm.pipeline import result_line

    exp = {
        "name": "x",
        "model": {},
        "data": "d",
        "sft": "s",
        "variants": {"recall": {}},
        "eval": {"suite": "s"},
        "result": {
            "per_length": {"benchmark": "synthetic", "runs": ["recall", "norecall"]},
            "metrics": {
                "diff_longest": {"run": "recall", "versus": "norecall", "benchmark": "synthetic", "length": 1024},
                "low": {"run": "recall", "versus": "norecall", "benchmark": "synthetic", "length": 1024, "stat": "low"},
            },
        },
    }
    line = result_line(exp, tmp_path, {"stage_seconds": {"eval": 90.0}})
    head = "RESULT recall_256=0.750 recall_1024=0.500 norecall_256=0.625 norecall_1024=0.125 diff_longest=+0.375 low="
    assert line.startswith(head) and line.endswith(" minutes=1.5")
    bad = dict(exp, result={"metrics": {"d": {"run": "recall", "versus": "norecall", "benchmark": "synthetic", "length": 4096}}})
    with pytest.raises(RecallmError, match="result d: no prompts of synthetic at length 4096"):
        result_line(bad, tmp_path, {})
