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


HELMET_TASKS = ["json_kv", "nq", "trec_coarse", "alce_asqa", "msmarco_rerank", "narrativeqa", "multi_lexsum"]


def store(path, records, run_info, benchmarks):
    path.mkdir(parents=True)
    summary = summarize(records, benchmarks, run_info)
    summary["planned"] = len(records)
    (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    suite = {
        "generation": {"max_new_tokens": 8},
        "benchmarks": {
            "ruler": {"lengths": LENGTHS, "per_cell": 1, "tasks": ["niah_single_2", "vt"]},
            "helmet": {"lengths": [4096, 8192, 131072], "per_cell": 1, "tasks": HELMET_TASKS},
            "lost_in_thought": {"lengths": [4096, 65536], "per_cell": 2},
            "in_domain": {"data_dir": "unused"},
        },
    }
    benchmarks = make_benchmarks(suite)
    records = []
    # RULER: both tasks right up to 32K, half right at 64K, wrong at 128K -> 100, 100, 100, 100, 50, 0; avg 75
    for n in LENGTHS:
        value = {65536: 0.5, 131072: 0.0}.get(n, 1.0)
        records += [rec("ruler", "niah_single_2", n, 0, value), rec("ruler", "vt", n, 0, value)]
    # HELMET: one task per category; 0 at 4K (outside Table 2's 8K-128K), 1 at 8K, 0.5 at 128K -> 75 each
    for task in HELMET_TASKS:
        extra = {"judged": 0.0} if task in ("alce_asqa", "narrativeqa", "multi_lexsum") else {}
        records += [rec("helmet", task, n, 0, v, **extra) for n, v in ((4096, 0.0), (8192, 1.0), (131072, 0.5))]
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
    base = store(root / "base", [r for r in records if r["benchmark"] == "ruler"], {"name": "base"}, benchmarks)
    return {"qwen": qwen, "base": base}


def section(text: str, title: str) -> str:
    return text.split(title)[1].split("\n## ")[0]


def test_paper_tables_with_the_papers_numbers_beside(runs, tmp_path):
    from recallm.eval.report import build_report

    report = build_report({"qwen": runs["qwen"], "base": runs["base"]}, tmp_path)
    text = report.read_text()
    assert "| qwen | " in section(text, "## Runs") and "* qwen: the sandbox ran unisolated" in text
    ruler = section(text, "## Table 2 / Table 8: RULER")
    assert "| qwen | 100.0 | 100.0 | 100.0 | 100.0 | 50.0 | 0.0 | 75.0 | 2 | -17.8 |" in ruler  # 75.0 - 92.8
    assert "| base | 100.0 | 100.0 | 100.0 | 100.0 | 50.0 | 0.0 | 75.0 | 2 | – |" in ruler
    assert "| paper · RecaLLM-Qwen2.5-7B (Table 2) | 98.8 | 96.7 | 95.8 | 93.1 | 89.7 | 82.9 | 92.8 | 13 |  |" in ruler
    assert "| paper · RecaLLM-Qwen2.5-7B (No Recall Reward) (Table 8) | 96.7 |" in ruler
    assert "the essay haystack is generated English-word sentences (offline default" in ruler
    helmet = section(text, "## Table 2 / Table 9: HELMET")
    assert "| qwen | 75.0 | 75.0 | 75.0 | 75.0 | 75.0 | 75.0 | 75.0 | 75.0 | 75.0 | +21.5 |" in helmet  # 75.0 - 53.5
    assert (
        "| paper · Llama-3.1-8B-Instruct (Table 2) | 77.0 | 63.0 | 3.0 | 10.0 | 21.3 | 36.3 | 39.2 | 35.7 | 34.9 (computed) |  |"
        in helmet
    )
    assert (
        "| paper · RecaLLM-Qwen2.5-7B (No Logit Masking) (Table 9) | 87.7 | 78.3 | 76.7 | 15.4 | 44.9 | – | – | – |"
        in helmet
    )
    assert "Recall has 1 of its 4 tasks (json_kv)" in helmet and "no judge - NarrativeQA by ROUGE-L F1" in helmet
    lit = section(text, "## Table 4: lost in thought")
    # S: reasoning retrieval 50, injected 100, retrieval 100, gap 50%, coverage not measured, 0 extra tokens
    assert "| qwen | 50.0 | 0.0 | 100.0 | – | 100.0 | 0.0 | 50 | – | – | – | 0 | 0 |" in lit
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
