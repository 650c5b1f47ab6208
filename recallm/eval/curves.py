"""Training curves of GRPO runs from verl's logged metrics: the paper's Figure 10 panels.

verl logs one record of metrics per training step. Two of its loggers are read here:

* ``file`` (``trainer.logger=[console,file]``): JSON lines ``{"step": N, "data": {...}}``;
  ``recallm-grpo`` writes them to ``<trainer.default_local_dir>/metrics.jsonl`` and appends across
  resumed runs (``recallm.grpo.worker_hooks``);
* ``console``: lines ``step:N - key:value - ...`` in a run's output (a pipeline job's log, say).

A resumed run logs again from its checkpoint's step (a validation record, then the steps after
it): when the steps go back, every earlier record after the new step is dropped and the records
of that step are merged (the later values win) — so a restart from scratch replaces the whole
earlier history and a resume keeps what its checkpoint had.

Panels (Figure 10 of the paper, plus the recall-specific diagnostic):

(a) overall score (``critic/score/mean``); (b) recall spans per completion
(``recallm/spans_per_response``); (c) gold overlap (``recallm/reward/recall_overlap``);
(d) answer score per task category (``recallm/answer/<category>``); (e) the rollout-vs-actor
log-prob gap inside recall spans (``recallm/logprob_gap_in_spans``).

``recallm-grpo plot`` draws them for one or more runs; ``recallm-eval mode=report curves=...``
(and so the pipeline's report) adds them to an evaluation report.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from recallm.errors import RecallmError
from recallm.grpo.console import number as _metric_number
from recallm.grpo.console import step_record
from recallm.paths import METRICS_FILE

__all__ = [
    "PANELS",
    "read_metrics",
    "read_runs",
    "series",
    "training_steps",
    "window_mean",
    "plot_curves",
    "report_section",
    "METRICS_FILE",
]

log = logging.getLogger(__name__)

SCORE = "critic/score/mean"
ANSWER_PREFIX = "recallm/answer/"

# (key, title, y label); key None: the per-category panel
PANELS: tuple[tuple[str | None, str, str], ...] = (
    (SCORE, "(a) overall score", "score"),
    ("recallm/spans_per_response", "(b) recall spans per completion", "mean # spans"),
    ("recallm/reward/recall_overlap", "(c) gold overlap", "mean overlap"),
    (None, "(d) answer score per category", "answer score"),
    ("recallm/logprob_gap_in_spans", "(e) rollout vs actor log-prob gap in spans", "mean |Δ log p|"),
)

# verl's console lines and metric values are read as the GRPO launch reads them (its one-line summary)
_number = _metric_number
_console_record = step_record


def _records(path: Path) -> list[tuple[int, dict[str, float]]]:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise RecallmError(f"cannot read the metrics log {path}: {exc.strerror or exc}") from None
    records: list[tuple[int, dict[str, float]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if number == len(text.splitlines()):  # a run killed while writing its last line
                    continue
                raise RecallmError(f"{path}:{number}: not a JSON metrics record") from None
            except (ValueError, RecursionError):  # an integer of over 4,300 digits; nesting too deep
                raise RecallmError(f"{path}:{number}: not a readable JSON metrics record") from None
            step = row.get("step") if isinstance(row, dict) else None
            if not isinstance(row.get("data") if isinstance(row, dict) else None, dict) or not _is_step(step):
                raise RecallmError(f"{path}:{number}: not a verl metrics record ({{'step': N, 'data': {{...}}}})")
            data = {k: n for k, v in row["data"].items() if (n := _number(v)) is not None}
            records.append((int(row["step"]), data))
        else:
            record = _console_record(line)
            if record is not None:
                records.append(record)
    return records


def _is_step(step: object) -> bool:
    """A training step number: a non-negative integer of at most 18 digits (not a bool, a float or a string)."""
    return isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 10**18


def read_metrics(path: str | Path) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` from a metrics log (verl's JSONL file logger, or console output),
    or from a directory holding ``metrics.jsonl``.

    Records are taken in file order; when a step is not after the previous record's (a resumed or
    restarted run), the earlier records after it are dropped, and records of one step are merged
    (later values win: verl logs a step's validation and training metrics separately)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise RecallmError(f"metrics log {path} does not exist (run GRPO with trainer.logger=[console,file])")
    steps: dict[int, dict[str, float]] = {}
    last = None
    for step, data in _records(path):
        if last is not None and step <= last:
            for old in [s for s in steps if s > step]:
                del steps[old]
        steps.setdefault(step, {}).update(data)
        last = step
    if not steps:
        raise RecallmError(f"metrics log {path} holds no training step")
    return dict(sorted(steps.items()))


def read_runs(runs: Mapping[str, str | Path]) -> dict[str, dict[int, dict[str, float]]]:
    """``{run name: read_metrics(path)}``."""
    if not runs:
        raise RecallmError("no GRPO metrics logs given")
    return {str(name): read_metrics(path) for name, path in runs.items()}


#: metrics measured inside recall spans: a step without spans has none (older logs wrote 1.0 / 0.0 there)
SPAN_KEYS = ("recallm/spans_verbatim", "recallm/logprob_gap_in_spans")
SPANS = "recallm/spans_per_response"


def series(metrics: Mapping[int, Mapping[str, float]], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of one metric (steps where it was not logged are skipped; so are a span
    metric's values at steps that had no recall span: logs written before it was left out there)."""
    steps = [
        s for s in sorted(metrics)
        if key in metrics[s] and not (key in SPAN_KEYS and metrics[s].get(SPANS, 1.0) == 0.0)
    ]  # fmt: skip
    return steps, [metrics[s][key] for s in steps]


def training_steps(metrics: Mapping[int, Mapping[str, float]]) -> list[int]:
    """The steps that logged training metrics (verl's validation before training logs step 0 with
    ``val-*`` metrics only: it is not a training step)."""
    return [s for s in sorted(metrics) if any(not k.startswith("val") for k in metrics[s])]


def window_mean(
    metrics: Mapping[int, Mapping[str, float]], key: str, first: int | None = None, last: int | None = None
) -> float:
    """Mean of a metric over the first (or last) ``n`` logged steps."""
    _, values = series(metrics, key)
    if not values:
        raise RecallmError(f"metric {key} was never logged")
    if first is not None:
        values = values[:first]
    if last is not None:
        values = values[-last:]
    return sum(values) / len(values)


def _smooth(values: Sequence[float], width: int) -> list[float]:
    out = []
    for i in range(len(values)):
        window = values[max(0, i - width + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out


def _categories(runs: Mapping[str, Mapping[int, Mapping[str, float]]]) -> list[str]:
    found = {
        k[len(ANSWER_PREFIX) :] for m in runs.values() for rec in m.values() for k in rec if k.startswith(ANSWER_PREFIX)
    }
    return sorted(found)


def plot_curves(
    runs: Mapping[str, Mapping[int, Mapping[str, float]]], out: str | Path, *, smooth: int | None = None
) -> Path:
    """Draw the five panels for every run (one line per run; panel (d): one line per run and
    category) into the PNG ``out``. ``smooth``: moving-average width drawn over the raw values
    (default: a tenth of the longest run, at least 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    longest = max((len(m) for m in runs.values()), default=1)
    width = smooth if smooth is not None else max(1, longest // 10)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    flat = list(axes.flat)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    categories = _categories(runs)
    for ax, (key, title, ylabel) in zip(flat, PANELS, strict=False):
        drawn = 0
        for r, (name, metrics) in enumerate(runs.items()):
            lines = (
                [(f"{name}: {c}" if len(runs) > 1 else c, ANSWER_PREFIX + c) for c in categories]
                if key is None
                else [(name, key)]
            )
            for j, (label, metric) in enumerate(lines):
                steps, values = series(metrics, metric)
                if not steps:
                    continue
                color = colors[(r * max(1, len(lines)) + j) % len(colors)]
                style = "-" if key is not None or len(runs) == 1 else ["-", "--", ":", "-."][r % 4]
                if width > 1:
                    ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
                    ax.plot(steps, _smooth(values, width), color=color, linestyle=style, linewidth=2, label=label)
                else:
                    ax.plot(steps, values, color=color, linestyle=style, marker=".", label=label)
                drawn += 1
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    flat[-1].axis("off")
    if width > 1:
        fig.suptitle(f"GRPO training dynamics (thin: per step; thick: mean of the last {width} steps)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _window(metrics, key: str, n: int, which: str) -> float | None:
    try:
        return window_mean(metrics, key, **{which: n})
    except RecallmError:
        return None


def report_section(
    runs: Mapping[str, str | Path], out_dir: str | Path, *, figure: str = "plots/grpo_curves.png"
) -> list[str]:
    """Markdown lines of a report's "Training curves" section: the figure (written to
    ``out_dir/figure``) and a table of each panel's metric over the first and last ten steps."""
    read = read_runs(runs)
    out_dir = Path(out_dir)
    plot_curves(read, out_dir / figure)
    lines = ["## Training curves (GRPO)", "", f"![GRPO training curves]({figure})", ""]
    keys = [k for k, _, _ in PANELS if k is not None] + [ANSWER_PREFIX + c for c in _categories(read)]
    header = ["metric"] + [f"{name} {part}" for name in read for part in ("first 10", "last 10")]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in keys:
        cells = [key]
        for metrics in read.values():
            for which in ("first", "last"):
                value = _window(metrics, key, 10, which)
                no_spans = key in SPAN_KEYS and any(SPANS in m for m in metrics.values())
                cells.append("n/a (0 spans)" if value is None and no_spans else _fmt(value))
        lines.append("| " + " | ".join(cells) + " |")
    parts = []
    for name, m in read.items():
        trained = training_steps(m)
        extra = len(m) - len(trained)
        parts.append(
            f"{name}: {len(trained)} training steps" + (f" (+{extra} validation-only record)" if extra else "")
        )
    steps = ", ".join(parts)
    lines += ["", f"Logged steps: {steps}. Sources: " + ", ".join(f"`{p}`" for p in runs.values()), ""]
    return lines
