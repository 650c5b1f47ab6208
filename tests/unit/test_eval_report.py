"""The report's paper-shaped tables from stored runs: every number below is worked out by hand from the records."""

from __future__ import annotations

import json

import pytest

from recallm.eval.benchmarks import make_benchmarks
from recallm.eval.runner import summarize

LENGTHS = [4096, 8192, 16384, 32768, 65536, 131072]


def rec(bench, task, length, index, score, **metrics):
    return {
        "benchmark": bench,
        "task": task,
        "example_id": f"{bench}/{task}/{length}/{index}",
        "length": length,
        "index": index,
        "prompt_tokens": length,
        "output_tokens": 10,
        "finish_reason": "stop",
        "score": score,
        "correct": score == 1.0,
        "metrics": metrics,
        "spans": {"count": 1, "verbatim": 1, "source": "tokens"},
        "followup": None,
    }


from recallm.eval.benchmarks.helmet.tasks import REPORTED, TASKS  # noqa: E402
from recallm.eval.benchmarks.ruler import RULER_TASKS  # noqa: E402

HELMET_TASKS = list(TASKS)


def store(path, records, run_info, benchmarks):
    path.mkdir(parents=True)
    summary = summarize(records, benchmarks, run_info)
    summary["planned"] = len(records)
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    suite = {
        "generation": {"max_new_tokens": 8},
        "benchmarks": {
            "ruler": {"lengths": LENGTHS, "per_cell": 1, "tasks": list(RULER_TASKS)},
            "helmet": {"lengths": [4096, 8192, 131072], "per_cell": 1, "tasks": HELMET_TASKS},
            "lost_in_thought": {"lengths": [4096, 65536], "per_cell": 2},
            "in_domain": {"data_dir": "unused"},
        },
    }
    benchmarks = make_benchmarks(suite)
    records = []
    # RULER: all 13 tasks right up to 32K, half right at 64K, wrong at 128K -> 100, 100, 100, 100, 50, 0; avg 75
    for n in LENGTHS:
        value = {65536: 0.5, 131072: 0.0}.get(n, 1.0)
        records += [rec("ruler", task, n, 0, value) for task in RULER_TASKS]
    # HELMET: every task; 0 at 4K (outside Table 2's 8K-128K), 1 at 8K, 0.5 at 128K -> 75 each; no judge: the judged
    # tasks have only their fallback metric
    for task in HELMET_TASKS:
        main, fallback = REPORTED[task]
        names = fallback or main
        judged = {"judged": 0.0} if TASKS[task].judged else {}
        records += [rec("helmet", task, n, 0, v, **{m: v for m in names}, **judged)
                    for n, v in ((4096, 0.0), (8192, 1.0), (131072, 0.5))]  # fmt: skip
    # lost in thought (no judge: string-matched injection): 4K retrieval 100, reasoning retrieval 50, injected 100
    lit = [
        rec("lost_in_thought", "retrieval", 4096, 0, 1.0, accuracy=1.0),
        rec("lost_in_thought", "retrieval", 4096, 1, 1.0, accuracy=1.0),
        rec("lost_in_thought", "reasoning_retrieval", 4096, 0, 0.0, accuracy=0.0, math=1.0, accuracy_given_math=0.0,
            attempted=1.0, located_by_judge=0.0, injected=1.0),
        rec("lost_in_thought", "reasoning_retrieval", 4096, 1, 1.0, accuracy=1.0, math=1.0, accuracy_given_math=1.0,
            attempted=1.0, located_by_judge=0.0, injected=1.0),
        rec("lost_in_thought", "retrieval", 65536, 0, 0.0, accuracy=0.0),
        rec("lost_in_thought", "reasoning_retrieval", 65536, 0, 0.0, accuracy=0.0, math=0.0),
    ]  # fmt: skip
    records += lit
    # in-domain: retrieval 100 / 50, ICL 50 / 0 at 4K / 64K
    for task, short, long in (("retrieval", 1.0, 0.5), ("icl", 0.5, 0.0)):
        records += [rec("in_domain", task, 4096, 0, short), rec("in_domain", task, 65536, 0, long)]
    info = {"name": "qwen", "model_path": "/m/qwen", "backend": "vllm", "paper_model": "RecaLLM-Qwen2.5-7B",
            "notes": ["the sandbox ran unisolated"]}  # fmt: skip
    qwen = store(root / "qwen", records, info, benchmarks)
    two = [r for r in records if r["benchmark"] == "ruler" and r["task"] in ("niah_single_2", "vt")]
    base = store(root / "base", two, {"name": "base"}, benchmarks)  # RULER with 2 of its 13 tasks
    return {"qwen": qwen, "base": base}


def section(text: str, title: str) -> str:
    return text.split(title)[1].split("\n## ")[0]


def test_paper_tables_with_the_papers_numbers_beside(runs, tmp_path):
    from recallm.eval.report import build_report

    report = build_report({"qwen": runs["qwen"], "base": runs["base"]}, tmp_path)
    text = report.read_text()
    assert "| qwen | " in section(text, "## Runs") and "* qwen: the sandbox ran unisolated" in text
    assert "* qwen · helmet: judge = none (ROUGE fallbacks); citation_nli = none" in text  # the protocol header
    ruler = section(text, "## Table 2 / Table 8: RULER")
    # 13 tasks x 1 example per length; the average's bootstrap interval is a point: every cell holds one value
    assert (
        "| qwen | 100.0 (13) | 100.0 (13) | 100.0 (13) | 100.0 (13) | 50.0 (13) | 0.0 (13) | 75.0 [75.0, 75.0] | 13 | -17.8 |"
        in ruler
    )  # 75.0 - 92.8
    assert "| base | n/a (2 of 13 tasks) |" in ruler and "| n/a (2 of 13 tasks) | 2 | – |" in ruler  # no average
    assert "| paper · RecaLLM-Qwen2.5-7B (Table 2) | 98.8 | 96.7 | 95.8 | 93.1 | 89.7 | 82.9 | 92.8 | 13 |  |" in ruler
    assert "| paper · RecaLLM-Qwen2.5-7B (No Recall Reward) (Table 8) | 96.7 |" in ruler
    assert "the essay haystack is generated English-word sentences (offline default" in ruler
    helmet = section(text, "## Table 2 / Table 9: HELMET")
    # every task 1 at 8K and 0.5 at 128K (4K is outside 8K-128K): 75 per category; examples = tasks x 2 lengths
    assert (
        "| qwen | 75.0 (8) | 75.0 (8) | 75.0 (10) | 75.0 (4) | 75.0 (2) | 75.0 (6) | 75.0 (4) | 75.0 [75.0, 75.0] | "
        "75.0 [75.0, 75.0] | +21.5 |" in helmet
    )  # 75.0 - 53.5
    assert (
        "| paper · Llama-3.1-8B-Instruct (Table 2) | 77.0 | 63.0 | 3.0 | 10.0 | 21.3 | 36.3 | 39.2 | 35.7 | 34.9 (computed) |  |"
        in helmet
    )
    assert (
        "| paper · RecaLLM-Qwen2.5-7B (No Logit Masking) (Table 9) | 87.7 | 78.3 | 76.7 | 15.4 | 44.9 | – | – | – |"
        in helmet
    )
    assert "infbench_sum, multi_lexsum, narrativeqa scored by the deterministic fallback" in helmet
    assert "no citation NLI" in helmet
    lit = section(text, "## Table 4: lost in thought")
    # S: reasoning retrieval 50, injected 100, retrieval 100, gap 50%, coverage not measured, 0 extra tokens
    assert "| qwen | 50.0 (2) | 0.0 (1) | 100.0 (2) | – | 100.0 (2) | 0.0 (1) | 50 | – | – | – | 0 | 0 |" in lit
    assert (
        "| paper · Llama-3.1-8B-Instruct (Table 4) | 27.1 | 2.2 | 40.7 | 7.9 | 80.6 | 25.5 | 66.3 | 91.4 | 95.8 | 60.7 | – | – |"
        in lit
    )
    assert "located by string matching" in lit and "plots/lost_in_thought.png" in lit
    in_domain = section(text, "## Table 3 / Table 7 / Figure 3: in-domain")
    assert "| qwen | – | – | 75.0 | – | – | 25.0 | – | – | – | – | – | – |" in in_domain  # 2 of the 10 categories
    assert (
        "| paper · RecaLLM-Qwen2.5-7B (Table 3) | 63.4 | 62.2 | 96.7 | 92.8 | 61.0 | 77.9 | 72.2 | 86.5 | 38.8 | 61.8 | 71.3 |  |"
        in in_domain
    )
    assert "| qwen | – | – | – | – | 100.0 | 50.0 | – | – | – | – | 50.0 | 0.0 |" in in_domain  # Table 7 S / L
    assert (
        "| paper · RecaLLM-Qwen2.5-7B (Table 7) | 68.8 | 56.3 | 69.9 | 51.9 | 98.3 | 94.5 | 97.6 | 86.3 | 61.0 | – |"
        in in_domain
    )
    for png in ("lost_in_thought.png", "in_domain_categories.png", "ruler_score.png", "helmet_task.png"):
        assert (tmp_path / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    # the report is a list of sections: a caller may give its own
    from recallm.eval.report import SECTIONS

    only = build_report({"qwen": runs["qwen"]}, tmp_path / "one", sections=[SECTIONS[0], lambda ctx: ["## Extra", ""]])
    assert only.read_text().endswith("## Extra\n") and "Table 2" not in only.read_text()


def test_the_reference_file_matches_the_papers_own_sums():
    """Cross-checks of the transcription: averages and gaps the paper states or that follow from its rows."""
    from recallm.eval.report import load_reference

    ref = load_reference()
    for table in ("ruler", "helmet", "in_domain"):
        for model, row in ref[table]["rows"].items():
            values = [v for v in row["values"][:-1] if v is not None]
            if row["values"][-1] is not None:  # the avg column is the mean of the row (to rounding)
                assert sum(values) / len(values) == pytest.approx(row["values"][-1], abs=0.06), (table, model)
    for model, row in ref["lost_in_thought"]["rows"].items():
        rr_s, rr_l, _, _, r_s, r_l, gap_s, gap_l = row["values"][:8]
        assert 100 * (r_s - rr_s) / r_s == pytest.approx(gap_s, abs=0.15), model  # Rel. Gap
        assert 100 * (r_l - rr_l) / r_l == pytest.approx(gap_l, abs=0.15), model
    helmet = ref["helmet"]["rows"]
    assert helmet["RecaLLM-Qwen2.5-7B"]["values"][-1] - helmet["Qwen2.5-7B-Instruct"]["values"][-1] == pytest.approx(
        16.1
    )
    assert helmet["RecaLLM-Llama-3.1-8B"]["values"][-1] - helmet["Llama-3.1-8B-Instruct"]["values"][
        -1
    ] == pytest.approx(17.7)


def test_honest_numbers_outside_the_papers_grid(tmp_path):
    """A 384 / 1,536-token run is not filed under the paper's 4K-32K rows; a rate with no span is n/a (0 spans);
    a HELMET category with a task missing has no number; an interval comes from the examples."""
    from recallm.eval.report import bootstrap_ci, build_report

    suite = {
        "generation": {"max_new_tokens": 8},
        "benchmarks": {
            "lost_in_thought": {"lengths": [384, 1536], "per_cell": 1, "key_type": "toy", "value_type": "toy"},
            "helmet": {"lengths": [8192], "per_cell": 1, "tasks": ["json_kv", "nq"]},
        },
    }
    benchmarks = make_benchmarks(suite)
    records = []
    for n in (384, 1536):
        records += [
            rec("lost_in_thought", "retrieval", n, 0, 1.0, accuracy=1.0),
            rec("lost_in_thought", "reasoning_retrieval", n, 0, 0.0, accuracy=0.0, math=1.0, accuracy_given_math=0.0),
        ]
    records += [rec("helmet", "json_kv", 8192, 0, 1.0, substring_exact_match=1.0)]
    records += [rec("helmet", "nq", 8192, 0, 0.0, substring_exact_match=0.0)]
    for r in records:
        r["spans"] = {"count": 0, "verbatim": 0, "source": "tokens"}
    run = store(tmp_path / "small", records, {"name": "small"}, benchmarks)
    text = build_report({"small": run}, tmp_path / "report").read_text()
    lit = section(text, "## Table 4: lost in thought")
    assert "| small | n/a | n/a | n/a |" in lit and "its lengths (384, 1536) are outside the paper's buckets" in lit
    helmet = section(text, "## Table 2 / Table 9: HELMET")
    assert "| small | n/a (1 of 4 tasks) | n/a (1 of 4 tasks) | – |" in helmet and "n/a (0 of 7 categories)" in helmet
    spans = section(text, "## Recall spans")
    assert "| small | n/a (0 spans) | n/a (0 spans) |" in spans
    # the interval: 100 examples half right -> about 50 +- 10 points; a cell of equal values -> a point
    lo, hi = bootstrap_ci({"a": [[0.0], [1.0]] * 50}, lambda v: v["a"])
    assert 0.38 < lo < 0.5 < hi < 0.62
    assert bootstrap_ci({"a": [[1.0]] * 5}, lambda v: v["a"]) == (1.0, 1.0)
