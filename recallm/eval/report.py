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
located by string matching), the table says so underneath, and the runs section lists every
benchmark's protocol options that differ from upstream's (``extra.protocol``), so that two runs
are never compared across protocols silently. Scores are shown in percent.

Honest numbers: an average is printed only over a complete set (RULER's 13 tasks, a HELMET
category's tasks, the paper's lengths), else ``n/a (k of 13 tasks)``; every number carries its
example count ``(n)``; each average has a 95% confidence interval, a bootstrap over the examples of
each cell (``results.jsonl``; 1,000 resamples, seed 0); a rate with nothing to measure is ``n/a (0
spans)``, never 1.0; the paper's short / long buckets (4K-32K, 64K-128K) hold only those lengths, so a
run at other lengths is shown at its own lengths, not filed beside the paper's rows.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError
from recallm.io import verify_file, write_text_atomic

__all__ = [
    "load_summary",
    "resolve_runs",
    "build_report",
    "load_reference",
    "bootstrap_ci",
    "ReportContext",
    "SECTIONS",
]

log = logging.getLogger(__name__)


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise RecallmError(f"{run_dir} has no summary.json (is it an eval out_dir? run `recallm-eval` into it first)")
    verify_file(path)  # the checksum recorded when the run finished
    try:
        summary = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise RecallmError(f"{path} is not UTF-8 text (a damaged summary)") from None
    except json.JSONDecodeError as exc:
        raise RecallmError(f"{path} is not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise RecallmError(f"{path} is nested too deeply (a damaged summary)") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("benchmarks", {}), dict):
        raise RecallmError(f"{path} is not an eval summary (a JSON object with a 'benchmarks' mapping)")
    return summary


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


def _count(value: Any, n: int | None) -> str:
    """A percentage with its example count: ``75.0 (200)``."""
    return _pct(value) if n is None or value is None else f"{_pct(value)} ({n})"


#: the paper's buckets (Tables 4 and 7): short = 4K-32K, long = 64K-128K
BUCKETS = (("S", 4096, 32768), ("L", 65536, 131072))


def _in_bucket(n: int, bucket: str) -> bool:
    lo, hi = next((lo, hi) for name, lo, hi in BUCKETS if name == bucket)
    return lo <= n <= hi


def bootstrap_ci(
    cells: Mapping[Any, Any],
    combine: Callable[[Mapping[Any, float | None]], float | None],
    *,
    n: int = 1000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A 95% percentile bootstrap interval of ``combine(cell values)``: each cell is an array of
    examples x metrics (NaN where an example lacks a metric); a resample draws each cell's examples
    with replacement, a cell's value is the mean over metrics of each metric's mean. None when a
    resample leaves the statistic undefined or there is nothing to resample."""
    import warnings

    import numpy as np

    if not cells:
        return None
    rng = np.random.default_rng(seed)
    arrays = {k: np.asarray(v, dtype=float).reshape(len(v), -1) for k, v in cells.items() if len(v)}
    if not arrays:
        return None
    draws: dict[Any, np.ndarray] = {}  # per cell: the n resamples' values at once
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (an all-NaN metric: undefined, below)
        for key, arr in arrays.items():
            means = np.nanmean(arr[rng.integers(0, len(arr), (n, len(arr)))], axis=1)  # n x metrics
            draws[key] = np.where(np.isnan(means).any(axis=1), np.nan, means.mean(axis=1))
    stats = []
    for i in range(n):
        stat = combine({k: (None if np.isnan(v[i]) else float(v[i])) for k, v in draws.items()})
        if stat is None:
            return None
        stats.append(stat)
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(lo), float(hi)


def _ci(interval: tuple[float, float] | None) -> str:
    return "" if interval is None else f" [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


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

    def _length_axes(self, fig, ax, name: str, title: str, ylabel: str, lengths: list[int]) -> str:
        """A percentage against context length (log2 axis, a tick per length), labelled; saved as ``name``."""
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

    def lines(self, name: str, title: str, ylabel: str, series: Mapping[str, Mapping[int, float | None]]) -> str:
        fig, ax = self.plt.subplots(figsize=(6.4, 4.0))
        lengths = sorted({n for s in series.values() for n in s})
        for label, points in series.items():
            xs = [n for n in lengths if points.get(n) is not None]
            ax.plot(xs, [100 * points[n] for n in xs], marker="o", label=label)
        return self._length_axes(fig, ax, name, title, ylabel, lengths)

    def lines_ci(
        self,
        name: str,
        title: str,
        ylabel: str,
        series: Mapping[str, Mapping[int, tuple[float, float, float] | None]],
    ) -> str:
        """One line per run with error bars: ``series[run][length] = (value, low, high)``."""
        fig, ax = self.plt.subplots(figsize=(6.4, 4.2))
        lengths = sorted({n for s in series.values() for n in s})
        markers = "osD^vP*X"
        for i, (label, points) in enumerate(series.items()):
            xs = [n for n in lengths if points.get(n) is not None]
            values = [100 * points[n][0] for n in xs]
            below = [100 * (points[n][0] - points[n][1]) for n in xs]
            above = [100 * (points[n][2] - points[n][0]) for n in xs]
            ax.errorbar(xs, values, yerr=[below, above], marker=markers[i % len(markers)], capsize=3, label=label)
        return self._length_axes(fig, ax, name, title, ylabel, lengths)

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

    def records(self, run: str, name: str) -> list[dict[str, Any]]:
        """The run's finished records of benchmark ``name`` (``results.jsonl``, read only; a line
        cut short by a crash is skipped). Empty without the file."""
        cache = self.__dict__.setdefault("_records", {})
        if run not in cache:
            path = self.dirs[run] / "results.jsonl"
            rows = []
            if path.is_file():
                verify_file(path)
                for line in path.read_text(errors="replace").splitlines():
                    try:
                        row = json.loads(line)
                    except (json.JSONDecodeError, RecursionError):
                        continue
                    if isinstance(row, dict):
                        rows.append(row)
            cache[run] = rows
        return [r for r in cache[run] if r.get("benchmark") == name]


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
    protocol = []
    for name, summary in ctx.summaries.items():  # every option a run's benchmarks used that differs from upstream
        for bench, entry in sorted((summary.get("benchmarks") or {}).items()):
            options = (entry.get("extra") or {}).get("protocol") or {}
            if options:
                protocol.append(f"* {name} · {bench}: " + "; ".join(f"{k} = {v}" for k, v in options.items()))
    if protocol:
        lines += [
            "Protocol options that differ from upstream's (compare runs only with the same ones):",
            "",
            *protocol,
            "",
        ]
    for name, s in ctx.summaries.items():  # RLM runs whose model-written code ran without bubblewrap
        isolation = (s.get("run") or {}).get("rlm_isolation")
        if isolation and not isolation.get("bubblewrap"):
            lines += [
                f"> **Warning: RLM code of run `{name}` ran without bubblewrap** - {isolation.get('describe')}",
                "",
            ]
    return lines + (notes + [""] if notes else [])


RULER_TASK_COUNT = 13


def _ruler_table(ctx: ReportContext) -> list[str]:
    from recallm.eval.benchmarks.ruler import RULER_TASKS

    runs = ctx.runs_with("ruler")
    if not runs:
        return []
    lengths = sorted({int(n) for run in runs for n in ctx.bench(run, "ruler").get("by_length") or {}})
    ref_columns = [int(c) for c in (ctx.reference.get("ruler") or {}).get("columns", [])[:-1]]
    lines = [
        "## Table 2 / Table 8: RULER",
        "",
        "Score (%) by context length, averaged across RULER's 13 tasks (examples in parentheses; the average with "
        "its 95% bootstrap interval):",
        "",
    ]
    header = ["run"] + [_length_label(n) for n in lengths] + ["avg", "tasks", "Δ avg vs paper"]
    rows = []
    for run in runs:
        by_length = ctx.bench(run, "ruler").get("by_length") or {}
        tasks = sorted({t for n in lengths for t in (by_length.get(str(n)) or {}) if t != "all"})
        complete = sorted(tasks) == sorted(RULER_TASKS) and all(
            all(t in (by_length.get(str(n)) or {}) for t in tasks) for n in lengths
        )
        row = [run]
        points = {}
        for n in lengths:
            cell = by_length.get(str(n)) or {}
            count = sum(int(v.get("n", 0)) for t, v in cell.items() if t != "all")
            if complete:
                points[n] = _mean([v["score"] for t, v in cell.items() if t != "all" and v.get("score") is not None])
                row.append(_count(points[n], count))
            else:
                row.append(f"n/a ({len([t for t in cell if t != 'all'])} of {RULER_TASK_COUNT} tasks)" if cell else "–")
        if complete:
            avg = _mean([points[n] for n in lengths])
            cells: dict[tuple[str, int], list[list[float]]] = {}
            for r in ctx.records(run, "ruler"):
                cells.setdefault((r["task"], int(r["length"])), []).append([float(r["score"])])

            def combine(values, lengths=lengths, tasks=tasks):
                per_length = [_mean([values.get((t, n)) for t in tasks]) for n in lengths]
                return None if any(v is None for v in per_length) else sum(per_length) / len(per_length)

            interval = bootstrap_ci(cells, combine) if cells else None
            same = lengths == ref_columns
            paper = _paper_value(ctx, "ruler", ctx.paper_model(run), -1) if same else None
            row += [_pct(avg) + _ci(interval), str(len(tasks)), _delta(avg, paper)]
        else:
            row += [f"n/a ({len(tasks)} of {RULER_TASK_COUNT} tasks)", str(len(tasks)), "–"]
        rows.append(row)
    picks = [ref_columns.index(n) if n in ref_columns else -1 for n in lengths]
    for label, values in _reference_rows(ctx, "ruler", picks + [len(ref_columns)]):
        rows.append([label] + [_ref(v) for v in values] + ["13", ""])
    lines += _table(header, rows)
    haystacks = {run: ctx.extra(run, "ruler").get("haystack") for run in runs}
    for run, haystack in haystacks.items():
        if haystack and "offline" in haystack:
            lines.append(f"* {run}: the essay haystack is {haystack}.")
    lines.append(
        "The paper averages RULER's 13 tasks; a run with fewer has no average (n/a). `avg` is over the lengths shown "
        "(the paper's: 4K-128K); Δ only where the lengths are the paper's."
    )
    return lines + [""]


def _helmet_cells(ctx: ReportContext, run: str, fallback: Sequence[str]) -> dict[tuple[str, int], list[list[float]]]:
    """Per (task, length): examples x the metrics HELMET reports for the task (NaN where missing)."""
    from recallm.eval.benchmarks.helmet.tasks import REPORTED

    cells: dict[tuple[str, int], list[list[float]]] = {}
    for r in ctx.records(run, "helmet"):
        main, alt = REPORTED.get(r["task"], (("score",), ()))
        names = alt if r["task"] in fallback else main
        metrics = {**(r.get("metrics") or {}), "score": r["score"]}
        cells.setdefault((r["task"], int(r["length"])), []).append(
            [float(metrics[k]) if k in metrics else float("nan") for k in names]
        )
    return cells


def _helmet_table(ctx: ReportContext) -> list[str]:
    from recallm.eval.benchmarks.helmet import CATEGORIES, TASKS

    runs = ctx.runs_with("helmet")
    if not runs:
        return []
    five = CATEGORIES[:5]
    lines = [
        "## Table 2 / Table 9: HELMET",
        "",
        "Score (%) per category, averaged over the context lengths 8K-128K (all lengths if none is that long), as "
        "HELMET's collect_results.py (examples in parentheses; averages with their 95% bootstrap interval); a "
        "category with some of its tasks missing is n/a:",
        "",
    ]
    header = ["run", *CATEGORIES, "avg (7)", "avg (5, Table 9)", "Δ avg vs paper"]
    rows, notes = [], []
    task_of = {t: TASKS[t].category for t in TASKS}
    for run in runs:
        extra = ctx.extra(run, "helmet")
        categories = extra.get("categories") or {}
        counts = extra.get("counts") or {}
        values: dict[str, float | None] = {}
        used: dict[str, list[int]] = {}
        row = [run]
        for category in CATEGORIES:
            entry = categories.get(category)
            full = [t for t, task in TASKS.items() if task.category == category]
            if entry is None:
                values[category] = None
                row.append("–")
                continue
            by_length = {int(n): v for n, v in entry["by_length"].items()}
            long = [n for n in by_length if n >= 8192] or list(by_length)
            used[category] = long
            n_examples = sum(int(c.get("n", 0)) for t in entry["tasks"] for k, c in (counts.get(t) or {}).items()
                             if int(k) in long)  # fmt: skip
            if sorted(entry["tasks"]) != sorted(full) or not entry.get("complete", True):
                values[category] = None
                row.append(f"n/a ({len(entry['tasks'])} of {len(full)} tasks)")
                notes.append(
                    f"* {run}: {category} has {len(entry['tasks'])} of its {len(full)} tasks ({', '.join(entry['tasks'])})."
                )
                continue
            values[category] = (
                _mean([by_length[n] for n in long]) if all(by_length[n] is not None for n in long) else None
            )
            row.append(_count(values[category], n_examples))
        fallback = extra.get("fallback_metric") or []
        cells = _helmet_cells(ctx, run, fallback)

        def average(names, values=values, used=used, cells=cells):
            def combine(v):
                cats = []
                for c in names:
                    tasks = [t for t in TASKS if task_of[t] == c]
                    per_length = [_mean([v.get((t, n)) for t in tasks]) if all(v.get((t, n)) is not None for t in tasks)
                                  else None for n in used.get(c, [])]  # fmt: skip
                    if not per_length or any(x is None for x in per_length):
                        return None
                    cats.append(sum(per_length) / len(per_length))
                return sum(cats) / len(cats)

            if not all(values[c] is not None for c in names):
                return None, None
            wanted = {k: v for k, v in cells.items() if task_of.get(k[0]) in names}
            return _mean([values[c] for c in names]), bootstrap_ci(wanted, combine) if wanted else None

        seven, seven_ci = average(CATEGORIES)
        fives, fives_ci = average(five)
        model = ctx.paper_model(run)
        paper = _paper_value(ctx, "helmet", model, -1)
        delta = _delta(seven, paper) if paper is not None else _delta(fives, _reference_five(ctx, model))
        missing = sum(values[c] is None for c in CATEGORIES)
        row += [
            _pct(seven) + _ci(seven_ci) if seven is not None else f"n/a ({7 - missing} of 7 categories)",
            _pct(fives) + _ci(fives_ci) if fives is not None else "n/a",
            delta,
        ]
        rows.append(row)
        judged = extra.get("judged_share") or {}
        dropped = {t: sum(int(c.get("dropped", 0)) for c in by.values()) for t, by in counts.items()}
        dropped = {t: d for t, d in dropped.items() if d}
        if dropped:
            notes.append(
                f"* {run}: left out of a metric's mean, as HELMET leaves them out (unreadable verdicts, ALCE outputs "
                "without a sentence): " + ", ".join(f"{t} {d}" for t, d in sorted(dropped.items())) + " examples."
            )
        if fallback:
            notes.append(
                f"* {run}: no judge - {', '.join(fallback)} scored by the deterministic fallback (NarrativeQA by ROUGE-L "
                "F1, Summ by ROUGE-Lsum F1; not comparable to the paper's judged numbers)."
            )
        nli = str((extra.get("protocol") or {}).get("citation_nli", ""))
        if nli.startswith("none"):
            notes.append(
                f"* {run}: no citation NLI - claims checked by substring / ROUGE-L recall (a deterministic fallback, not "
                "comparable to the paper's NLI-judged Cite numbers)."
            )
        if judged and extra.get("judge"):
            notes.append(f"* {run}: LongQA and Summ judged by {extra['judge']}.")
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
    outside = []
    for run in runs:
        extra = ctx.extra(run, "lost_in_thought")
        buckets = extra.get("buckets") or {}
        row = [run]
        for key, _ in _LIT_COLUMNS:
            for bucket in ("short", "long"):
                entry = buckets.get(bucket)
                if entry is None:
                    row.append("n/a")
                    continue
                value = entry.get(key)
                if key in ("relative_gap_pct", "reasoning_tokens"):
                    row.append(_num(value))
                else:
                    row.append(_count(value, entry.get("pairs")))
        rows.append(row)
        own = sorted(int(n) for n in extra.get("by_length") or {})
        if not any(_in_bucket(n, b) for n in own for b in ("S", "L")):
            outside.append(f"* {run}: its lengths ({', '.join(_length_label(n) for n in own)}) are outside the paper's "
                           "buckets: see its per-length table below, not these rows.")  # fmt: skip
    for label, values in _reference_rows(ctx, "lost_in_thought", list(range(12))):
        rows.append([label] + [_ref(v) if i < 10 else _num(v) for i, v in enumerate(values)])
    lines += _table(header, rows)
    lines.append(
        "S = mean over the lengths 4K-32K, L = over 64K-128K (pairs in parentheses); Rel. gap = (Retrieval - "
        "Reas.-Retr.) / Retrieval of the bucket's means (Table 4); Injected and Cov. over at most the first 200 "
        "math-correct examples per length."
    )
    lines += outside
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
    lines += [
        "Short (4K-32K) and long (64K-128K) buckets (Table 7; n/a: none of the run's lengths is in the bucket):",
        "",
    ]
    header = ["run"] + [f"{label} {b}" for _, label in _IN_DOMAIN for b in ("S", "L")]
    rows = []
    for run in runs:
        row = [run]
        for category, _ in _IN_DOMAIN:
            by_length = cells[run].get(category, {})
            for bucket in ("S", "L"):
                inside = [v for n, v in by_length.items() if _in_bucket(n, bucket)]
                row.append(_pct(_mean(inside)) if inside else "n/a" if by_length else "–")
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
        lines += [f"## {bench}", "", "Score (%) by context length (examples in parentheses):", ""]
        scores = _series(summaries, bench, "score")
        counts = _series(summaries, bench, "n")
        header = ["run"] + [_length_label(n) for n in lengths] + ["avg"]
        rows = []
        for run, points in scores.items():
            cells = [_count(points.get(n), counts[run].get(n)) for n in lengths]
            total = sum(int(counts[run].get(n) or 0) for n in lengths)
            present = [points.get(n) for n in lengths if points.get(n) is not None]
            avg = _mean(present) if len(present) == len(lengths) else None
            rows.append([run, *cells, _count(avg, total) if avg is not None else "n/a" if present else "–"])
        lines += _table(header, rows)
        lines += [f"![{bench} score]({plots.lines(f'{bench}_score', f'{bench}: score', 'score (%)', scores)})", ""]
        lines += _accuracy(ctx, bench, lengths, counts)
        usage = _series(summaries, bench, "recall_usage")
        lines += ["Recall usage (% of outputs with at least one recall span; outputs in parentheses):", ""]
        lines += _table(
            ["run"] + [_length_label(n) for n in lengths],
            [[run] + [_count(p.get(n), counts[run].get(n)) for n in lengths] for run, p in usage.items()],
        )
        lines += [
            f"![{bench} recall usage]({plots.lines(f'{bench}_recall_usage', f'{bench}: recall usage', 'outputs with a span (%)', usage)})",
            "",
        ]
        lines += _spans_by_length(ctx, bench, lengths, counts)
        tasks, per_task = _by_task(summaries, bench, "score")
        _, task_counts = _by_task(summaries, bench, "n")
        if tasks:  # every task any run has (one task too), each run's count beside
            title = "category" if bench == "in_domain" else "task"
            lines += [f"Score (%) per {title}, all lengths (examples in parentheses; – : not in that run):", ""]
            lines += _table(
                [title] + list(summaries),
                [[t] + [_count(per_task[r].get(t), task_counts[r].get(t)) for r in summaries] for t in tasks],
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


def _accuracy(ctx: ReportContext, bench: str, lengths: Sequence[int], counts) -> list[str]:
    """Accuracy (share correct) by length with a 95% Wilson interval, a table and one plot of every
    run (the paper's Figure 1 at the run's own lengths)."""
    from recallm.eval.stats import wilson_interval

    correct = _series(ctx.summaries, bench, "correct")
    points: dict[str, dict[int, tuple[float, float, float] | None]] = {}
    rows = []
    for run, values in correct.items():
        points[run] = {}
        row = [run]
        for n in lengths:
            rate, total = values.get(n), counts[run].get(n)
            if rate is None or not total:
                row.append("–")
                continue
            k = round(float(rate) * int(total))
            low, high = wilson_interval(k, int(total))
            points[run][n] = (k / int(total), low, high)
            row.append(f"{100 * k / int(total):.1f} ({k}/{total}) [{100 * low:.0f}, {100 * high:.0f}]")
        rows.append(row)
    if not any(points.values()):
        return []
    lines = ["Accuracy (% correct; correct/examples; 95% Wilson interval) by context length:", ""]
    lines += _table(["run"] + [_length_label(n) for n in lengths], rows)
    plot = ctx.plots.lines_ci(f"{bench}_accuracy", f"{bench}: accuracy by context length", "correct (%)", points)
    return lines + [f"![{bench} accuracy]({plot})", ""]


def _spans_by_length(ctx: ReportContext, bench: str, lengths: Sequence[int], counts) -> list[str]:
    """Per run with spans: spans per output, the verbatim share of its spans and the spans' overlap
    with the gold evidence (the reward's ``recall_overlap``, mean over outputs), by length."""
    per_output = _series(ctx.summaries, bench, "spans_per_output")
    verbatim = _series(ctx.summaries, bench, "span_verbatim_rate")
    overlap = _series(ctx.summaries, bench, "recall_overlap")
    rows = []
    for run in ctx.summaries:
        if not any(per_output[run].get(n) for n in lengths):
            continue
        row = [run]
        for n in lengths:
            spans = round(float(per_output[run].get(n) or 0.0) * int(counts[run].get(n) or 0))
            rate, hit = verbatim[run].get(n), overlap[run].get(n)
            cell = f"{float(per_output[run].get(n) or 0.0):.2f}; " + (
                "n/a (0 spans)" if not spans or rate is None else f"{_pct(rate)}% of {spans}"
            )
            if hit is not None:
                cell += f"; {_pct(hit)}%"
            row.append(cell)
        rows.append(row)
    if not rows:
        return []
    lines = [
        "Recall spans by length (spans per output; verbatim share of the spans; their overlap with the gold "
        "evidence, the reward's `recall_overlap`, mean over outputs):",
        "",
    ]
    return lines + _table(["run"] + [_length_label(n) for n in lengths], rows)


def _recall_spans(ctx: ReportContext) -> list[str]:
    benches = sorted({b for s in ctx.summaries.values() for b in (s.get("benchmarks") or {})})
    lines = ["## Recall spans", "", "Verbatim spans (% of spans, spans in parentheses; n/a without spans):", ""]
    rows = []
    for run in ctx.summaries:
        row = [run]
        for b in benches:
            overall = ctx.bench(run, b).get("overall")
            if not overall:
                row.append("–")
                continue
            spans = round(float(overall.get("spans_per_output") or 0.0) * int(overall.get("n") or 0))
            rate = overall.get("span_verbatim_rate")
            row.append("n/a (0 spans)" if not spans or rate is None else _count(rate, spans))
        rows.append(row)
    return lines + _table(["run"] + benches, rows)


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
    compare: Sequence[Sequence[str]] | None = None,
    html: bool = True,
) -> Path:
    """Write ``report.md`` and ``plots/*.png`` for ``runs`` under ``out_dir``; return the report's
    path. ``sections``: the report's sections (default ``SECTIONS``); ``curves``: ``{name: GRPO
    metrics log}`` whose training curves the report adds (``recallm.eval.curves``); ``compare``:
    pairs of run names compared prompt by prompt (``recallm.eval.compare``: a section per benchmark
    and ``comparison.json``); ``html``: also ``report.html``, one self-contained page (the report,
    its plots inlined, and example outputs of every run with their recall spans marked:
    ``recallm.eval.html``)."""
    resolved = resolve_runs(runs)
    pairs = [tuple(str(x) for x in pair) for pair in (compare or [])]
    for pair in pairs:
        if len(pair) != 2 or pair[0] == pair[1]:
            raise RecallmError(f"compare: each entry must name two different runs, got {list(pair)}")
        missing = [name for name in pair if name not in resolved]
        if missing:
            raise RecallmError(f"compare: no run named {missing[0]!r}; the runs are {', '.join(resolved)}")
    summaries = {name: load_summary(path) for name, path in resolved.items()}
    out_dir = Path(out_dir)
    made = [p for p in (out_dir, out_dir / "plots") if not p.exists()]  # removed again if the report fails
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _write_report(
            ctx_args=(summaries, resolved, out_dir), sections=sections, curves=curves, pairs=pairs, html=html
        )
    except BaseException:
        for path in reversed(made):
            shutil.rmtree(path, ignore_errors=True)
        raise


def _rate(k: int, n: int) -> str:
    from recallm.eval.stats import wilson_interval

    if not n:
        return "–"
    low, high = wilson_interval(k, n)
    return f"{k / n:.3f} ({k}/{n}) [{low:.2f}, {high:.2f}]"


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def _comparison_section(
    records: Mapping[str, Sequence[Mapping]], pairs: Sequence[tuple[str, str]], benchmark: str
) -> list[str]:
    """Markdown: per pair, a table of paired cells; then every run's wrong answers by kind."""
    from collections import Counter

    from recallm.eval.compare import ALL, ERROR_KINDS, error_counts, paired_cells

    lines = [f"## {benchmark}: paired comparisons", ""]
    lines += [
        "Each row compares two runs on the same prompts: their accuracy (share correct, with the count and a 95% "
        "Wilson interval), the difference with a 95% paired bootstrap interval (10,000 resamples of prompts; the "
        "pooled row resamples within each task) and McNemar's exact test (prompts only the first run got right / "
        "only the second, two-sided p).",
        "",
    ]
    for a, b in pairs:
        cells = paired_cells(records[a], records[b], benchmark=benchmark)
        if not cells:
            lines += [f"### {a} vs {b}", "", "no prompts in common", ""]
            continue
        rows = []
        for (length, task), cell in cells.items():
            rows.append(
                [
                    _length_label(length),
                    f"**{task}**" if task == ALL else task,
                    _rate(cell.a_correct, cell.n),
                    _rate(cell.b_correct, cell.n),
                    f"{_signed(cell.diff.diff)} [{_signed(cell.diff.low)}, {_signed(cell.diff.high)}]",
                    f"{cell.mcnemar.a_only} / {cell.mcnemar.b_only}",
                    _p(cell.mcnemar.p_value),
                ]
            )
        lines += [f"### {a} vs {b}", ""]
        lines += _table(["length", "task", a, b, f"{a} − {b} [95% CI]", "only a / only b", "McNemar p"], rows)
    lines += ["### Wrong answers by kind", ""]
    lines += ["; ".join(f"`{k}`: {v}" for k, v in ERROR_KINDS.items()) + ".", ""]
    rows = []
    for run, recs in records.items():
        counts = error_counts([r for r in recs if r.get("benchmark") == benchmark])
        totals = Counter((int(r["length"]), r["task"]) for r in recs if r.get("benchmark") == benchmark)
        for (length, task), counter in sorted(counts.items()):
            kinds = ", ".join(f"{k} {counter[k]}" for k in ERROR_KINDS if counter.get(k))
            rows.append([run, _length_label(length), task, f"{sum(counter.values())}/{totals[(length, task)]}", kinds])
    lines += _table(["run", "length", "task", "wrong", "kinds"], rows) if rows else ["no wrong answers", ""]
    return lines


def _comparisons(ctx: ReportContext, pairs, out_dir: Path) -> list[str]:
    """The paired comparisons of every benchmark both runs of a pair have (and ``comparison.json``)."""
    from recallm.eval.compare import comparison_json, write_comparison

    lines: list[str] = []
    data = {}
    benches = sorted({b for s in ctx.summaries.values() for b in (s.get("benchmarks") or {})})
    for bench in benches:
        usable = [(a, b) for a, b in pairs if ctx.records(a, bench) and ctx.records(b, bench)]
        if not usable:
            continue
        records = {run: ctx.records(run, bench) for run in ctx.summaries}
        lines += _comparison_section(records, usable, bench)
        data[bench] = comparison_json(records, usable, bench)
    if data:
        write_comparison(out_dir / "comparison.json", data)
    return lines


def _write_report(ctx_args, sections, curves, pairs=(), html=True) -> Path:
    summaries, resolved, out_dir = ctx_args
    ctx = ReportContext(summaries, resolved, _Plots(out_dir), load_reference())
    lines = ["# RecaLLM evaluation report", ""]
    chosen = list(SECTIONS if sections is None else sections)
    if pairs:  # after the per-benchmark sections
        index = chosen.index(_benchmark_sections) + 1 if _benchmark_sections in chosen else len(chosen)
        chosen.insert(index, lambda c: _comparisons(c, pairs, out_dir))
    for section in chosen:
        try:
            lines += section(ctx)
        except RecallmError:
            raise
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as exc:
            # a summary.json or results.jsonl whose fields have other types than eval writes
            names = ", ".join(str(p) for p in resolved.values())
            raise RecallmError(
                f"the summaries of {names} do not have the structure recallm-eval writes "
                f"({type(exc).__name__}: {exc}); run the evaluation again"
            ) from None
    if curves:
        from recallm.eval.curves import report_section

        lines += ["", *report_section(curves, out_dir)]
    report = write_text_atomic(out_dir / "report.md", "\n".join(lines))
    if html:
        from recallm.eval.html import write_html

        write_html(out_dir / "report.html", "\n".join(lines), out_dir, ctx)
    log.info("wrote %s and %d plots", report, len(ctx.plots.files))
    return report
