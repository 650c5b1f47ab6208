"""A Markdown report with plots comparing any number of evaluation runs side by side.

``build_report(runs, out_dir)`` reads each run's ``summary.json`` (``runs``: ``{name: run dir}``,
or run directories named after their ``run.name`` / directory name) and writes
``<out_dir>/report.md`` and PNG plots under ``<out_dir>/plots/`` (matplotlib, ``Agg`` backend).

The report is a list of sections (``SECTIONS``; each a function of a ``ReportContext`` that
returns Markdown lines - add one to extend the report):

* the runs (model, backend, suite, examples, and any ``notes`` a run's info carries);
* the paper's tables, each with reference rows holding the paper's published numbers for the
  base and RecaLLM models (``paper_reference.yaml``, the table each comes from named) and, for a
  run that names its paper model (``paper_model=...``), its distance to it:
  Table 2 / 8 (RULER by length, averaged across tasks), Table 2 / 9 (HELMET categories averaged
  over 8K-128K; the 5-category average of Table 9 beside the 7-category one), Table 4 (lost in
  thought, short = up to 32K and long = 64K and above: reasoning retrieval, injected, retrieval,
  relative gap, coverage, extra reasoning tokens) with the Figure 2 panels, Table 3 and Table 7
  (in-domain categories over all lengths, and short / long) with the Figure 3 panels;
* per benchmark: score by context length (a table and a line plot, one line per run), recall
  usage by length, scores per task / category; in-domain full reward per category;
* span verbatim rates (1.0 under constrained decoding).

Where a number was made differently from the paper's (a judged metric scored by its
deterministic fallback, RULER's essay haystack generated offline, the lost-in-thought injection
located by string matching), the table says so underneath. Scores are shown in percent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError

__all__ = ["load_summary", "resolve_runs", "build_report", "load_reference", "ReportContext", "SECTIONS"]

log = logging.getLogger(__name__)


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise RecallmError(f"{run_dir} has no summary.json (is it an eval out_dir? run `recallm-eval` into it first)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RecallmError(f"{path} is not valid JSON ({exc.msg})") from None


def resolve_runs(runs: Mapping[str, Any] | Sequence[Any]) -> dict[str, Path]:
    """``{name: dir}`` from a mapping, or from a list of directories (named by their run's
    ``run.name``, else the directory name; repeated names get a suffix)."""
    if isinstance(runs, Mapping):
        out = {str(k): Path(str(v)) for k, v in runs.items()}
    else:
        out = {}
        for entry in runs:
            path = Path(str(entry))
            name = (load_summary(path).get("run") or {}).get("name") or path.name
            base, i = name, 2
            while name in out:
                name, i = f"{base}-{i}", i + 1
            out[name] = path
    if not out:
        raise RecallmError("no runs to report on: give runs=[dir,...] or runs={name: dir, ...}")
    return out


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.1f}"


def _num(value: Any) -> str:
    return "–" if value is None else f"{float(value):.0f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def _length_label(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


class _Plots:
    def __init__(self, out_dir: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt = plt
        self.dir = out_dir / "plots"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = []

    def save(self, fig, name: str) -> str:
        path = self.dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        self.plt.close(fig)
        self.files.append(path)
        return f"plots/{path.name}"

    def lines(self, name: str, title: str, ylabel: str, series: Mapping[str, Mapping[int, float | None]]) -> str:
        fig, ax = self.plt.subplots(figsize=(6.4, 4.0))
        lengths = sorted({n for s in series.values() for n in s})
        for label, points in series.items():
            xs = [n for n in lengths if points.get(n) is not None]
            ax.plot(xs, [100 * points[n] for n in xs], marker="o", label=label)
        if lengths:
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [_length_label(n) for n in lengths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(-2, 102)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        return self.save(fig, name)

    def bars(
        self, name: str, title: str, groups: Sequence[str], series: Mapping[str, Mapping[str, float | None]]
    ) -> str:
        import numpy as np

        fig, ax = self.plt.subplots(figsize=(max(6.4, 0.9 * len(groups) + 2), 4.2))
        width = 0.8 / max(1, len(series))
        x = np.arange(len(groups))
        for i, (label, values) in enumerate(series.items()):
            ax.bar(x + i * width - 0.4 + width / 2, [100 * (values.get(g) or 0.0) for g in groups], width, label=label)
        ax.set_xticks(x, groups, rotation=30, ha="right")
        ax.set_ylabel("score (%)")
        ax.set_ylim(0, 102)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize="small")
        return self.save(fig, name)


def _lengths(summaries: Mapping[str, Mapping], bench: str) -> list[int]:
    return sorted(
        {
            int(n)
            for s in summaries.values()
            for n in ((s.get("benchmarks") or {}).get(bench, {}).get("by_length") or {})
        }
    )


def _series(summaries, bench: str, key: str) -> dict[str, dict[int, float | None]]:
    out = {}
    for run, s in summaries.items():
        by_length = (s.get("benchmarks") or {}).get(bench, {}).get("by_length") or {}
        out[run] = {int(n): cell["all"].get(key) for n, cell in by_length.items()}
    return out


def load_reference(path: str | Path | None = None) -> dict[str, Any]:
    """The paper's published numbers (``paper_reference.yaml`` beside this module)."""
    import yaml

    path = Path(path) if path is not None else Path(__file__).with_name("paper_reference.yaml")
    try:
        return yaml.safe_load(path.read_text())["tables"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise RecallmError(f"cannot read the paper's reference numbers from {path} ({type(exc).__name__})") from None


@dataclass
class ReportContext:
    """What every section sees: the runs' summaries (by name), their directories, the plots and
    the paper's reference tables."""

    summaries: dict[str, dict[str, Any]]
    dirs: dict[str, Path]
    plots: _Plots
    reference: dict[str, Any] = field(default_factory=dict)

    def bench(self, run: str, name: str) -> dict[str, Any]:
        return (self.summaries[run].get("benchmarks") or {}).get(name) or {}

    def extra(self, run: str, name: str) -> dict[str, Any]:
        return self.bench(run, name).get("extra") or {}

    def paper_model(self, run: str) -> str | None:
        return (self.summaries[run].get("run") or {}).get("paper_model")

    def runs_with(self, name: str) -> list[str]:
        return [run for run in self.summaries if self.bench(run, name)]


def _reference_rows(ctx: ReportContext, table: str, picks: Sequence[int]) -> list[tuple[str, list[Any]]]:
    """``(label, values)`` reference rows of a paper table, the columns ``picks`` (indices; -1: not there)."""
    out = []
    for model, row in ((ctx.reference.get(table) or {}).get("rows") or {}).items():
        values = row["values"]
        out.append((f"paper · {model} ({row['source']})", [None if i < 0 else values[i] for i in picks]))
    return out


def _paper_value(ctx: ReportContext, table: str, model: str | None, column: int) -> float | None:
    row = ((ctx.reference.get(table) or {}).get("rows") or {}).get(model or "")
    return None if row is None else row["values"][column]


def _ref(value: Any) -> str:
    return "–" if value is None else f"{float(value):.1f}"


def _delta(run_value: float | None, paper: float | None) -> str:
    if run_value is None or paper is None:
        return "–"
    return f"{100 * run_value - paper:+.1f}"


# --------------------------------------------------------------------------- sections


def _runs_section(ctx: ReportContext) -> list[str]:
    lines = ["## Runs", ""]
    rows = []
    notes = []
    for name, s in ctx.summaries.items():
        run = s.get("run") or {}
        rows.append(
            [
                name,
                str(ctx.dirs[name]),
                str(run.get("model_path", "–")),
                str(run.get("backend", "–")),
                str(run.get("recall_constrained", "–")),
                str(run.get("suite", "–")),
                str(run.get("paper_model") or "–"),
                f"{s.get('n_examples', 0)}/{s.get('planned', s.get('n_examples', 0))}",
            ]
        )
        notes += [f"* {name}: {note}" for note in (run.get("notes") or [])]
    lines += _table(["run", "dir", "model", "backend", "constrained", "suite", "paper model", "examples"], rows)
    for name, s in ctx.summaries.items():  # RLM runs whose model-written code ran without bubblewrap
        isolation = (s.get("run") or {}).get("rlm_isolation")
        if isolation and not isolation.get("bubblewrap"):
            lines += [
                f"> **Warning: RLM code of run `{name}` ran without bubblewrap** - {isolation.get('describe')}",
                "",
            ]
    return lines + (notes + [""] if notes else [])


def _ruler_table(ctx: ReportContext) -> list[str]:
    runs = ctx.runs_with("ruler")
    if not runs:
        return []
    lengths = sorted({int(n) for run in runs for n in ctx.bench(run, "ruler").get("by_length") or {}})
    ref_columns = [int(c) for c in (ctx.reference.get("ruler") or {}).get("columns", [])[:-1]]
    lines = ["## Table 2 / Table 8: RULER", "", "Score (%) by context length, averaged across tasks:", ""]
    header = ["run"] + [_length_label(n) for n in lengths] + ["avg", "tasks", "Δ avg vs paper"]
    rows = []
    for run in runs:
        by_length = ctx.bench(run, "ruler").get("by_length") or {}
        points = {}
        tasks: set[str] = set()
        for n in lengths:
            cell = by_length.get(str(n)) or {}
            per_task = [v["score"] for t, v in cell.items() if t != "all" and v.get("score") is not None]
            tasks |= {t for t in cell if t != "all"}
            points[n] = _mean(per_task)
        avg = _mean([points[n] for n in lengths])
        same = lengths == ref_columns
        paper = _paper_value(ctx, "ruler", ctx.paper_model(run), -1) if same else None
        rows.append([run] + [_pct(points[n]) for n in lengths] + [_pct(avg), str(len(tasks)), _delta(avg, paper)])
    picks = [ref_columns.index(n) if n in ref_columns else -1 for n in lengths]
    for label, values in _reference_rows(ctx, "ruler", picks + [len(ref_columns)]):
        rows.append([label] + [_ref(v) for v in values] + ["13", ""])
    lines += _table(header, rows)
    haystacks = {run: ctx.extra(run, "ruler").get("haystack") for run in runs}
    for run, haystack in haystacks.items():
        if haystack and "offline" in haystack:
            lines.append(f"* {run}: the essay haystack is {haystack}.")
    lines.append("The paper averages RULER's 13 tasks; `avg` is over the lengths shown (the paper's: 4K-128K).")
    return lines + [""]


def _helmet_table(ctx: ReportContext) -> list[str]:
    from recallm.eval.benchmarks.helmet import CATEGORIES, TASKS

    runs = ctx.runs_with("helmet")
    if not runs:
        return []
    five = CATEGORIES[:5]
    lines = [
        "## Table 2 / Table 9: HELMET",
        "",
        "Score (%) per category, averaged over the context lengths 8K-128K (all lengths if none is that long):",
        "",
    ]
    header = ["run", *CATEGORIES, "avg (7)", "avg (5, Table 9)", "Δ avg vs paper"]
    rows, notes = [], []
    for run in runs:
        categories = ctx.extra(run, "helmet").get("categories") or {}
        values: dict[str, float | None] = {}
        for category in CATEGORIES:
            entry = categories.get(category)
            if entry is None:
                values[category] = None
                continue
            by_length = {int(n): v for n, v in entry["by_length"].items()}
            long = [v for n, v in by_length.items() if n >= 8192] or list(by_length.values())
            values[category] = _mean(long)
            full = [t for t, task in TASKS.items() if task.category == category]
            if sorted(entry["tasks"]) != sorted(full):
                notes.append(
                    f"* {run}: {category} has {len(entry['tasks'])} of its {len(full)} tasks ({', '.join(entry['tasks'])})."
                )
        seven = _mean([values[c] for c in CATEGORIES]) if all(values[c] is not None for c in CATEGORIES) else None
        fives = _mean([values[c] for c in five]) if all(values[c] is not None for c in five) else None
        model = ctx.paper_model(run)
        paper = _paper_value(ctx, "helmet", model, -1)
        delta = _delta(seven, paper) if paper is not None else _delta(fives, _reference_five(ctx, model))
        rows.append([run] + [_pct(values[c]) for c in CATEGORIES] + [_pct(seven), _pct(fives), delta])
        extra = ctx.extra(run, "helmet")
        judged = extra.get("judged_share") or {}
        if judged:
            if extra.get("judge"):
                fallback = {t: 1 - v for t, v in judged.items() if v < 1}
                if fallback:
                    detail = ", ".join(f"{t} {100 * v:.0f}%" for t, v in fallback.items())
                    notes.append(
                        f"* {run}: judged by {extra['judge']}; scored by the fallback where its answer was unreadable: {detail}."
                    )
                else:
                    notes.append(f"* {run}: LongQA, Summ and the citation NLI judged by {extra['judge']}.")
            else:
                notes.append(
                    f"* {run}: no judge - NarrativeQA by ROUGE-L F1, Summ by ROUGE-Lsum F1, the citation NLI by substring / "
                    "ROUGE-L recall (deterministic fallbacks, not comparable to the paper's judged numbers)."
                )
    ref_columns = (ctx.reference.get("helmet") or {}).get("columns", [])
    for label, ref in _reference_rows(ctx, "helmet", list(range(len(ref_columns)))):
        cats, avg = ref[:-1], ref[-1]
        avg5 = _mean_ref(cats[:5])
        rows.append([label] + [_ref(v) for v in cats] + [_ref(avg), _ref(avg5) + " (computed)", ""])
    lines += _table(header, rows)
    return lines + notes + [""]


def _mean_ref(values: Sequence[Any]) -> float | None:
    return None if any(v is None for v in values) else sum(values) / len(values)


def _reference_five(ctx: ReportContext, model: str | None) -> float | None:
    row = ((ctx.reference.get("helmet") or {}).get("rows") or {}).get(model or "")
    return None if row is None else _mean_ref(row["values"][:5])


_LIT_COLUMNS = (
    ("reasoning_retrieval", "Reas.-Retr."),
    ("injected", "Injected"),
    ("retrieval", "Retrieval"),
    ("relative_gap_pct", "Rel. gap (%)"),
    ("coverage", "Cov."),
    ("reasoning_tokens", "Reas. toks"),
)


def _lost_in_thought(ctx: ReportContext) -> list[str]:
    runs = ctx.runs_with("lost_in_thought")
    if not runs:
        return []
    lines = ["## Table 4: lost in thought", ""]
    header = ["run"] + [f"{label} {b}" for _, label in _LIT_COLUMNS for b in ("S", "L")]
    rows = []
    for run in runs:
        buckets = ctx.extra(run, "lost_in_thought").get("buckets") or {}
        row = [run]
        for key, _ in _LIT_COLUMNS:
            for bucket in ("short", "long"):
                value = (buckets.get(bucket) or {}).get(key)
                row.append(_num(value) if key in ("relative_gap_pct", "reasoning_tokens") else _pct(value))
        rows.append(row)
    for label, values in _reference_rows(ctx, "lost_in_thought", list(range(12))):
        rows.append([label] + [_ref(v) if i < 10 else _num(v) for i, v in enumerate(values)])
    lines += _table(header, rows)
    lines.append(
        "S = mean over lengths up to 32K, L = over 64K and above; Rel. gap = (Retrieval - Reas.-Retr.) / Retrieval; "
        "Injected and Cov. over at most the first 200 math-correct examples per length."
    )
    for run in runs:
        extra = ctx.extra(run, "lost_in_thought")
        if extra.get("locator") == "string":
            lines.append(
                f"* {run}: the first retrieval attempt was located by string matching (no judge): Cov. is not "
                "measured and the cut falls right after the key is first stated."
            )
    lines.append("")
    lines += _lost_in_thought_figure(ctx, runs)
    return lines


def _lost_in_thought_figure(ctx: ReportContext, runs: Sequence[str]) -> list[str]:
    curves = (
        ("math", "math accuracy"),
        ("retrieval", "retrieval"),
        ("reasoning_retrieval_given_math", "reasoning retrieval | correct math"),
        ("injected", "... + injection"),
    )
    plt = ctx.plots.plt
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.8), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        by_length = ctx.extra(run, "lost_in_thought").get("by_length") or {}
        lengths = sorted(int(n) for n in by_length)
        for key, label in curves:
            xs = [n for n in lengths if by_length[str(n)].get(key) is not None]
            ax.plot(xs, [100 * by_length[str(n)][key] for n in xs], marker="o", label=label)
        if lengths:
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [_length_label(n) for n in lengths])
        ax.set_ylim(-2, 102)
        ax.set_title(run)
        ax.set_xlabel("context length (tokens)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy (%)")
    axes[0][0].legend(fontsize="x-small")
    return [f"Figure 2 panels: ![lost in thought]({ctx.plots.save(fig, 'lost_in_thought')})", ""]


_IN_DOMAIN = (
    ("single_hop_qa", "1-Hop"),
    ("multi_hop_qa", "N-Hop"),
    ("retrieval", "Ret."),
    ("reasoning_retrieval", "R→Ret."),
    ("short_math", "Math"),
    ("icl", "ICL"),
    ("long_doc_qa", "LQA"),
    ("aggregation", "Agg."),
    ("reranking", "Rerank"),
    ("entity_citation", "Ent. Cite"),
)


def _in_domain_cells(ctx: ReportContext, run: str) -> dict[str, dict[int, float]]:
    by_length = ctx.bench(run, "in_domain").get("by_length") or {}
    out: dict[str, dict[int, float]] = {}
    for n, cell in by_length.items():
        for category, metrics in cell.items():
            if category != "all" and metrics.get("score") is not None:
                out.setdefault(category, {})[int(n)] = metrics["score"]
    return out


def _in_domain_tables(ctx: ReportContext) -> list[str]:
    runs = ctx.runs_with("in_domain")
    if not runs:
        return []
    lines = [
        "## Table 3 / Table 7 / Figure 3: in-domain",
        "",
        "Answer score (%) per category, averaged over all lengths:",
        "",
    ]
    header = ["run"] + [label for _, label in _IN_DOMAIN] + ["avg", "Δ avg vs paper"]
    rows = []
    cells = {run: _in_domain_cells(ctx, run) for run in runs}
    for run in runs:
        values = [_mean(list(cells[run].get(c, {}).values())) for c, _ in _IN_DOMAIN]
        present = [v for v in values if v is not None]
        avg = _mean(present) if len(present) == len(values) else None
        paper = _paper_value(ctx, "in_domain", ctx.paper_model(run), -1)
        rows.append([run] + [_pct(v) for v in values] + [_pct(avg), _delta(avg, paper)])
    for label, values in _reference_rows(ctx, "in_domain", list(range(len(_IN_DOMAIN) + 1))):
        rows.append([label] + [_ref(v) for v in values] + [""])
    lines += _table(header, rows)
    lines += ["Short (4K-32K) and long (64K-128K) buckets (Table 7):", ""]
    header = ["run"] + [f"{label} {b}" for _, label in _IN_DOMAIN for b in ("S", "L")]
    rows = []
    for run in runs:
        row = [run]
        for category, _ in _IN_DOMAIN:
            by_length = cells[run].get(category, {})
            row.append(_pct(_mean([v for n, v in by_length.items() if n <= 32768])))
            row.append(_pct(_mean([v for n, v in by_length.items() if n >= 65536])))
        rows.append(row)
    columns = (ctx.reference.get("in_domain_buckets") or {}).get("columns", [])
    picks = [columns.index(f"{c} {b}") if f"{c} {b}" in columns else -1 for c, _ in _IN_DOMAIN for b in ("S", "L")]
    for label, values in _reference_rows(ctx, "in_domain_buckets", picks):
        rows.append([label] + [_ref(v) for v in values])
    lines += _table(header, rows)
    lines += _in_domain_figure(ctx, runs, cells)
    return lines


def _in_domain_figure(ctx: ReportContext, runs: Sequence[str], cells) -> list[str]:
    categories = [c for c, _ in _IN_DOMAIN if any(c in cells[run] for run in runs)]
    categories += sorted({c for run in runs for c in cells[run]} - set(categories))
    if not categories:
        return []
    plt = ctx.plots.plt
    cols = min(4, len(categories))
    rows = (len(categories) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    for ax in axes.flat[len(categories) :]:
        ax.axis("off")
    for ax, category in zip(axes.flat, categories, strict=False):
        lengths = sorted({n for run in runs for n in cells[run].get(category, {})})
        for run in runs:
            points = cells[run].get(category, {})
            xs = [n for n in lengths if n in points]
            ax.plot(xs, [100 * points[n] for n in xs], marker="o", label=run)
        if lengths:
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [_length_label(n) for n in lengths], fontsize="x-small")
        ax.set_ylim(-2, 102)
        ax.set_title(category, fontsize="small")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("answer score (%)")
    axes[0][0].legend(fontsize="x-small")
    return [f"Figure 3 panels: ![in-domain per category]({ctx.plots.save(fig, 'in_domain_categories')})", ""]


def _benchmark_sections(ctx: ReportContext) -> list[str]:
    summaries, plots = ctx.summaries, ctx.plots
    lines: list[str] = []
    benches = sorted({b for s in summaries.values() for b in (s.get("benchmarks") or {})})
    for bench in benches:
        lengths = _lengths(summaries, bench)
        lines += [f"## {bench}", "", "Score (%) by context length:", ""]
        scores = _series(summaries, bench, "score")
        header = ["run"] + [_length_label(n) for n in lengths] + ["avg"]
        rows = [
            [run] + [_pct(points.get(n)) for n in lengths] + [_pct(_mean([points.get(n) for n in lengths]))]
            for run, points in scores.items()
        ]
        lines += _table(header, rows)
        lines += [f"![{bench} score]({plots.lines(f'{bench}_score', f'{bench}: score', 'score (%)', scores)})", ""]
        usage = _series(summaries, bench, "recall_usage")
        lines += ["Recall usage (% of outputs with at least one recall span):", ""]
        lines += _table(
            ["run"] + [_length_label(n) for n in lengths],
            [[run] + [_pct(p.get(n)) for n in lengths] for run, p in usage.items()],
        )
        lines += [
            f"![{bench} recall usage]({plots.lines(f'{bench}_recall_usage', f'{bench}: recall usage', 'outputs with a span (%)', usage)})",
            "",
        ]
        tasks, per_task = _by_task(summaries, bench, "score")
        if len(tasks) > 1 or bench == "in_domain":
            title = "category" if bench == "in_domain" else "task"
            lines += [f"Score (%) per {title}, all lengths:", ""]
            lines += _table(
                [title] + list(summaries), [[t] + [_pct(per_task[r].get(t)) for r in summaries] for t in tasks]
            )
            lines += [
                f"![{bench} per {title}]({plots.bars(f'{bench}_{title}', f'{bench}: score per {title}', tasks, per_task)})",
                "",
            ]
        if bench == "in_domain":
            _, reward = _by_task(summaries, bench, "reward")
            lines += ["Full reward (%) per category (the training reward, same settings):", ""]
            lines += _table(
                ["category"] + list(summaries), [[t] + [_pct(reward[r].get(t)) for r in summaries] for t in tasks]
            )
    return lines


def _recall_spans(ctx: ReportContext) -> list[str]:
    benches = sorted({b for s in ctx.summaries.values() for b in (s.get("benchmarks") or {})})
    lines = ["## Recall spans", "", "Verbatim spans (% of spans; – without spans):", ""]
    lines += _table(
        ["run"] + benches,
        [
            [run] + [_pct(ctx.bench(run, b).get("overall", {}).get("span_verbatim_rate")) for b in benches]
            for run in ctx.summaries
        ],
    )
    return lines


#: the report, in order (append a function of ``ReportContext`` returning Markdown lines to extend it)
SECTIONS: list[Callable[[ReportContext], list[str]]] = [
    _runs_section,
    _ruler_table,
    _helmet_table,
    _lost_in_thought,
    _in_domain_tables,
    _benchmark_sections,
    _recall_spans,
]


def _by_task(summaries, bench: str, key: str) -> tuple[list[str], dict[str, dict[str, float | None]]]:
    tasks = sorted(
        {t for s in summaries.values() for t in ((s.get("benchmarks") or {}).get(bench, {}).get("by_task") or {})}
    )
    series = {
        run: {t: ((s.get("benchmarks") or {}).get(bench, {}).get("by_task") or {}).get(t, {}).get(key) for t in tasks}
        for run, s in summaries.items()
    }
    return tasks, series


def build_report(
    runs: Mapping[str, Any] | Sequence[Any],
    out_dir: str | Path,
    *,
    sections: Sequence[Callable[[ReportContext], list[str]]] | None = None,
    curves: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``report.md`` and ``plots/*.png`` for ``runs`` under ``out_dir``; return the report's
    path. ``sections``: the report's sections (default ``SECTIONS``); ``curves``: ``{name: GRPO
    metrics log}`` whose training curves the report adds (``recallm.grpo.curves``)."""
    resolved = resolve_runs(runs)
    summaries = {name: load_summary(path) for name, path in resolved.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = ReportContext(summaries, resolved, _Plots(out_dir), load_reference())
    lines = ["# RecaLLM evaluation report", ""]
    for section in SECTIONS if sections is None else sections:
        lines += section(ctx)
    if curves:
        from recallm.grpo.curves import report_section

        lines += ["", *report_section(curves, out_dir)]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    log.info("wrote %s and %d plots", report, len(ctx.plots.files))
    return report
