"""A Markdown report with plots comparing any number of evaluation runs side by side.

``build_report(runs, out_dir)`` reads each run's ``summary.json`` (``runs``: ``{name: run dir}``,
or run directories named after their ``run.name`` / directory name) and writes
``<out_dir>/report.md`` and PNG plots under ``<out_dir>/plots/`` (matplotlib, ``Agg`` backend):

* per benchmark: score by context length (a table and a line plot, one line per run), recall
  usage by length (table and plot), scores per task / category (table and grouped bars);
* lost in thought: the paper's Table 4 (short = up to 32K and long = 64K and above averages of
  reasoning retrieval, injected, retrieval, relative gap, math accuracy, extra reasoning tokens)
  and its Figure 2 (per run: math, retrieval, reasoning retrieval given correct math, injected,
  against length);
* in-domain: answer score and full reward per category (Table 7 style);
* span verbatim rates (1.0 under constrained decoding).

Scores are shown in percent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError

__all__ = ["load_summary", "resolve_runs", "build_report"]

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


def _lost_in_thought(summaries, plots: _Plots) -> list[str]:
    lines = ["### Lost in thought (Table 4)", ""]
    cols = [
        ("reasoning_retrieval", "Reas.-Retr."),
        ("injected", "Injected"),
        ("retrieval", "Retrieval"),
        ("relative_gap_pct", "Rel. gap (%)"),
        ("math", "Math"),
        ("reasoning_tokens", "Reas. toks"),
    ]
    header = ["run"] + [f"{label} {b}" for _, label in cols for b in ("S", "L")]
    rows = []
    for run, s in summaries.items():
        buckets = (((s.get("benchmarks") or {}).get("lost_in_thought") or {}).get("extra") or {}).get("buckets") or {}
        row = [run]
        for key, _ in cols:
            for bucket in ("short", "long"):
                value = (buckets.get(bucket) or {}).get(key)
                row.append(_num(value) if key in ("relative_gap_pct", "reasoning_tokens") else _pct(value))
        rows.append(row)
    lines += _table(header, rows)
    lines.append(
        "S = mean over lengths up to 32K, L = over 64K and above; Rel. gap = (Retrieval - Reas.-Retr.) / Retrieval."
    )
    lines.append("")
    curves = (
        ("math", "math accuracy"),
        ("retrieval", "retrieval"),
        ("reasoning_retrieval_given_math", "reasoning retrieval | correct math"),
        ("injected", "... + injection"),
    )
    plt = plots.plt
    fig, axes = plt.subplots(1, len(summaries), figsize=(4.2 * len(summaries), 3.8), squeeze=False)
    for ax, (run, s) in zip(axes[0], summaries.items(), strict=True):
        by_length = (((s.get("benchmarks") or {}).get("lost_in_thought") or {}).get("extra") or {}).get(
            "by_length"
        ) or {}
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
    lines += [f"![lost in thought]({plots.save(fig, 'lost_in_thought')})", ""]
    return lines


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
    runs: Mapping[str, Any] | Sequence[Any], out_dir: str | Path, *, curves: Mapping[str, Any] | None = None
) -> Path:
    """Write ``report.md`` and ``plots/*.png`` for ``runs`` under ``out_dir``; return the report's path.
    ``curves``: ``{name: GRPO metrics log}`` whose training curves the report adds (``recallm.grpo.curves``)."""
    resolved = resolve_runs(runs)
    summaries = {name: load_summary(path) for name, path in resolved.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = _Plots(out_dir)
    lines = ["# RecaLLM evaluation report", "", "## Runs", ""]
    rows = []
    for name, s in summaries.items():
        run = s.get("run") or {}
        rows.append(
            [
                name,
                str(resolved[name]),
                str(run.get("model_path", "–")),
                str(run.get("backend", "–")),
                str(run.get("recall_constrained", "–")),
                str(run.get("suite", "–")),
                f"{s.get('n_examples', 0)}/{s.get('planned', s.get('n_examples', 0))}",
            ]
        )
    lines += _table(["run", "dir", "model", "backend", "constrained", "suite", "examples"], rows)
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
        if bench == "lost_in_thought":
            lines += _lost_in_thought(summaries, plots)
    lines += ["## Recall spans", "", "Verbatim spans (% of spans; – without spans):", ""]
    lines += _table(
        ["run"] + benches,
        [
            [run]
            + [
                _pct(((s.get("benchmarks") or {}).get(b) or {}).get("overall", {}).get("span_verbatim_rate"))
                for b in benches
            ]
            for run, s in summaries.items()
        ],
    )
    if curves:
        from recallm.grpo.curves import report_section

        lines += ["", *report_section(curves, out_dir)]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    log.info("wrote %s and %d plots", report, len(plots.files))
    return report
