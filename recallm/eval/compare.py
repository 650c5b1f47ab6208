"""Two evaluation runs compared prompt by prompt: paired differences, McNemar's test, error kinds.

Runs of one suite see the same prompts (a prompt is fixed by the suite's seed and its example id),
so two models can be compared on each prompt rather than only on their averages:
:func:`paired_cells` matches the records of two runs by example id (the prompt's hash must agree,
else the runs are not comparable and it says so) and gives, per length and task and pooled over
the tasks of a length, the two accuracies with their counts, their difference with a paired
bootstrap interval (``recallm.eval.stats.paired_bootstrap``; pooled cells resample within each
task) and McNemar's exact test. :func:`error_kind` sorts a wrong answer into what it says about how
it was made (``ERROR_KINDS``), from the diagnostics the synthetic benchmark records
(``recallm.eval.benchmarks.synthetic.answer_diagnostics``). :func:`comparison_json` gives the numbers
for programs (``comparison.json``); the report's section (``recallm.eval.report``) prints them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError
from recallm.eval.stats import McNemar, PairedDiff, mcnemar_exact, paired_bootstrap

__all__ = [
    "ALL",
    "ERROR_KINDS",
    "PairedCell",
    "read_records",
    "paired_cells",
    "paired_cell",
    "error_kind",
    "error_counts",
    "comparison_json",
    "write_comparison",
]

ALL = "all"  # the pooled cell of a length

#: wrong answers, by what they say (kv and math retrieval; multi-needle: partial or none)
ERROR_KINDS = {
    "no_answer": "no final answer",
    "wrong_key": "the key was computed wrong (math retrieval: the right key is not in the output)",
    "other_entry": "the value of another entry of the context",
    "garbled_copy": "a near copy of the right value (similarity >= 0.6)",
    "not_in_context": "a string that is in no entry (similarity < 0.6)",
    "partial": "some of the values (multi-needle)",
    "none_found": "none of the values (multi-needle)",
}


@dataclass(frozen=True)
class PairedCell:
    """One cell of a paired comparison: ``n`` prompts both runs answered, each run's successes,
    the difference ``a - b`` with its bootstrap interval, and McNemar's test."""

    n: int
    a_correct: int
    b_correct: int
    diff: PairedDiff
    mcnemar: McNemar

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "a_correct": self.a_correct,
            "b_correct": self.b_correct,
            "a_rate": self.diff.mean_a,
            "b_rate": self.diff.mean_b,
            "diff": self.diff.diff,
            "ci_low": self.diff.low,
            "ci_high": self.diff.high,
            "mcnemar": asdict(self.mcnemar),
        }


def read_records(run_dir: str | Path, benchmark: str | None = None) -> list[dict[str, Any]]:
    """The finished records of a run (``results.jsonl``), optionally of one benchmark."""
    from recallm.eval.runner import RESULTS_FILE, read_results

    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise RecallmError(f"{run_dir} has no {RESULTS_FILE} (is it an eval out_dir?)")
    records = read_results(path)
    return [r for r in records if benchmark is None or r.get("benchmark") == benchmark]


def _matched(a: Sequence[Mapping], b: Sequence[Mapping]) -> list[tuple[Mapping, Mapping]]:
    by_id = {r["example_id"]: r for r in b}
    pairs = []
    for r in a:
        other = by_id.get(r["example_id"])
        if other is None:
            continue
        same_content = r.get("content_id") is not None and r.get("content_id") == other.get("content_id")
        if r.get("prompt_id") != other.get("prompt_id") and not same_content:
            raise RecallmError(
                f"example {r['example_id']} has another prompt in each run (prompt ids {r.get('prompt_id')} and "
                f"{other.get('prompt_id')}, content ids {r.get('content_id')} and {other.get('content_id')}): the runs "
                "used other suites or seeds and cannot be compared prompt by prompt (results written before content "
                "ids were recorded match only when the rendered prompts are equal)"
            )
        pairs.append((r, other))
    return pairs


def _outcome(record: Mapping, metric: str) -> float:
    value = record.get(metric) if metric in ("correct", "score") else (record.get("metrics") or {}).get(metric)
    if value is None:
        raise RecallmError(f"record {record.get('example_id')} has no metric {metric!r}")
    return float(value)


def _cell(pairs: Sequence[tuple[Mapping, Mapping]], metric: str, seed: int) -> PairedCell:
    a = [_outcome(x, metric) for x, _ in pairs]
    b = [_outcome(y, metric) for _, y in pairs]
    strata = [x["task"] for x, _ in pairs]
    diff = paired_bootstrap(a, b, strata=strata if len(set(strata)) > 1 else None, seed=seed)
    return PairedCell(len(pairs), int(sum(v >= 0.5 for v in a)), int(sum(v >= 0.5 for v in b)), diff, mcnemar_exact(a, b))


def paired_cells(
    records_a: Sequence[Mapping],
    records_b: Sequence[Mapping],
    *,
    benchmark: str,
    metric: str = "correct",
    seed: int = 0,
) -> dict[tuple[int, str], PairedCell]:
    """``{(length, task or ALL): PairedCell}`` over the prompts of ``benchmark`` both runs have."""
    pairs = _matched(
        [r for r in records_a if r.get("benchmark") == benchmark],
        [r for r in records_b if r.get("benchmark") == benchmark],
    )
    out: dict[tuple[int, str], PairedCell] = {}
    for length in sorted({int(x["length"]) for x, _ in pairs}):
        at = [(x, y) for x, y in pairs if int(x["length"]) == length]
        for task in sorted({x["task"] for x, _ in at}):
            out[(length, task)] = _cell([(x, y) for x, y in at if x["task"] == task], metric, seed)
        out[(length, ALL)] = _cell(at, metric, seed)
    return out


def paired_cell(
    dir_a: str | Path, dir_b: str | Path, *, benchmark: str, length: int, task: str = ALL, metric: str = "correct"
) -> PairedCell:
    """One cell of ``paired_cells`` for two run directories (the pipeline's RESULT line)."""
    cells = paired_cells(read_records(dir_a), read_records(dir_b), benchmark=benchmark, metric=metric)
    if (length, task) not in cells:
        raise RecallmError(f"no prompts of {benchmark} at length {length} ({task}) in both {dir_a} and {dir_b}")
    return cells[(length, task)]


def error_kind(record: Mapping) -> str | None:
    """``None`` for a correct answer, else a key of ``ERROR_KINDS``."""
    if record.get("correct"):
        return None
    metrics = record.get("metrics") or {}
    if not (record.get("answer") or "").strip() or metrics.get("answer_parsed", 1.0) < 0.5:
        return "no_answer"
    if record.get("task") == "multi_niah" or "answer_similarity" not in metrics:
        return "partial" if float(record.get("score") or 0.0) > 0 else "none_found"
    if record.get("task") == "math_retrieval" and metrics.get("key_in_output", 1.0) < 0.5:
        return "wrong_key"
    if metrics.get("answer_in_prompt", 0.0) >= 0.5:
        return "other_entry"
    return "garbled_copy" if metrics.get("answer_similarity", 0.0) >= 0.6 else "not_in_context"


def error_counts(records: Sequence[Mapping]) -> dict[tuple[int, str], Counter]:
    """``{(length, task): Counter(kind)}`` of the wrong answers."""
    out: dict[tuple[int, str], Counter] = {}
    for r in records:
        kind = error_kind(r)
        if kind is not None:
            out.setdefault((int(r["length"]), r["task"]), Counter())[kind] += 1
    return out


def comparison_json(
    records: Mapping[str, Sequence[Mapping]], pairs: Sequence[tuple[str, str]], benchmark: str
) -> dict[str, Any]:
    """The paired cells of every pair, and every run's error kinds, as plain data."""
    out: dict[str, Any] = {"benchmark": benchmark, "pairs": {}, "errors": {}}
    for a, b in pairs:
        cells = paired_cells(records[a], records[b], benchmark=benchmark)
        out["pairs"][f"{a}-{b}"] = {f"{length}/{task}": cell.as_dict() for (length, task), cell in cells.items()}
    for run, recs in records.items():
        counts = error_counts([r for r in recs if r.get("benchmark") == benchmark])
        out["errors"][run] = {f"{length}/{task}": dict(c) for (length, task), c in sorted(counts.items())}
    return out


def write_comparison(path: str | Path, data: Mapping[str, Any]) -> Path:
    from recallm.io import write_text_atomic

    return write_text_atomic(Path(path), json.dumps(data, indent=1))
