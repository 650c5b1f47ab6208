"""Benchmark: GRPO, DAPO's dynamic sampling, GSPO and one-step-off-policy rollouts side by side on the toy
lost-in-thought task — accuracy after training, the reward curve, wall time per step.

Run the experiment first (``recallm-pipeline experiment=toy_rl_algorithms``: one SFT model, then one GRPO run
per arm, the same recipe, steps, batch and seeds; the arms run one at a time), then
``.venv/bin/python bench/toy_rl_algorithms.py [--run-dir DIR] [--figure PNG]``. It reads the run directory
(each arm's ``grpo/<arm>/metrics.jsonl`` and ``eval/after_<arm>/summary.json``, the SFT model's
``eval/before``), prints one table row per arm and draws the three panels into one figure
(``docs/img/toy_rl_algorithms.png`` by default). Wall time per step is the median of verl's
``timing_s/step`` over every step; each arm's ratio is against GRPO's, measured in the same run (the arms ran
one after the other on the same machine: on a shared machine its load may differ between them).

Last line: ``RESULT acc_before=<x> acc_<arm>=<x> ... step_ratio_<arm>=<arm s/step / grpo s/step> ...``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = ("grpo", "dapo", "gspo", "one_step_off")
LABELS = {"grpo": "GRPO", "dapo": "DAPO (dynamic sampling)", "gspo": "GSPO", "one_step_off": "GRPO, one-step-off"}
LENGTH = "360"


def accuracy(run_dir: Path, run: str) -> float | None:
    path = run_dir / "eval" / run / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return float(summary["benchmarks"]["synthetic"]["by_length"][LENGTH]["all"]["correct"])


def arm_metrics(run_dir: Path, arm: str) -> dict[int, dict[str, float]]:
    from recallm.eval.curves import read_metrics

    path = run_dir / "grpo" / arm / "metrics.jsonl"
    return {s: m for s, m in read_metrics(path).items() if s > 0} if path.is_file() else {}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(run_dir: Path) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for arm in ARMS:
        metrics = arm_metrics(run_dir, arm)
        if not metrics:
            continue
        steps = sorted(metrics)
        times = [metrics[s]["timing_s/step"] for s in steps if "timing_s/step" in metrics[s]]
        scores = [metrics[s].get("critic/score/mean") for s in steps]
        rows[arm] = {
            "steps": steps,
            "scores": scores,
            "acc": accuracy(run_dir, f"after_{arm}"),
            "s_per_step": statistics.median(times) if times else None,
            "reward_first5": _mean([x for x in scores[:5] if x is not None]),
            "reward_last5": _mean([x for x in scores[-5:] if x is not None]),
            "dropped": _mean([metrics[s]["dynamic_sampling/dropped_groups"] for s in steps if "dynamic_sampling/dropped_groups" in metrics[s]]),
            "gen_batches": _mean([metrics[s]["dynamic_sampling/gen_batches"] for s in steps if "dynamic_sampling/gen_batches" in metrics[s]]),
            "zero_var": _mean([metrics[s]["recallm/health/zero_variance_share"] for s in steps if "recallm/health/zero_variance_share" in metrics[s]]),
            "warnings": sum(int(metrics[s].get("recallm/health/warnings", 0)) for s in steps),
            "gap_in_spans": _mean([metrics[s]["recallm/logprob_gap_in_spans"] for s in steps if "recallm/logprob_gap_in_spans" in metrics[s]]),
        }
    return rows


def _f(value, fmt: str = "{:.3f}") -> str:
    return "–" if value is None else fmt.format(value)


def table(rows: dict[str, dict], before: float | None) -> list[str]:
    base = rows.get("grpo", {}).get("s_per_step")
    lines = [
        f"Accuracy before GRPO (the SFT model, greedy, 360 tokens): {_f(before)}",
        "",
        "| arm | accuracy after | reward, first 5 steps | reward, last 5 steps | s / step (median) | vs GRPO | groups dropped / step | generation rounds / step | zero-variance share | health warnings | log-prob gap in spans |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, r in rows.items():
        ratio = r["s_per_step"] / base if base and r["s_per_step"] else None
        lines.append(
            f"| {LABELS[arm]} | {_f(r['acc'])} | {_f(r['reward_first5'])} | {_f(r['reward_last5'])} | "
            f"{_f(r['s_per_step'], '{:.1f}')} | {_f(ratio, '{:.2f}x')} | {_f(r['dropped'], '{:.1f}')} | "
            f"{_f(r['gen_batches'], '{:.2f}')} | {_f(r['zero_var'], '{:.2f}')} | {r['warnings']} | {_f(r['gap_in_spans'], '{:.1e}')} |"
        )
    return lines


def figure(rows: dict[str, dict], before: float | None, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, curve_ax, time_ax) = plt.subplots(1, 3, figsize=(15, 4.2))
    arms = list(rows)
    accs = [rows[a]["acc"] or 0.0 for a in arms]
    acc_ax.bar([LABELS[a] for a in arms], accs, color=[f"C{i}" for i in range(len(arms))])
    if before is not None:
        acc_ax.axhline(before, color="grey", linestyle="--", label=f"before GRPO ({before:.2f})")
        acc_ax.legend(loc="upper left")
    acc_ax.set_ylabel("accuracy after training (greedy, 360 tokens)")
    acc_ax.set_ylim(0, 1)
    acc_ax.tick_params(axis="x", labelrotation=20)
    for i, arm in enumerate(arms):
        steps = rows[arm]["steps"]
        scores = [s if s is not None else float("nan") for s in rows[arm]["scores"]]
        curve_ax.plot(steps, scores, marker="o", markersize=3, color=f"C{i}", label=LABELS[arm])
    curve_ax.set_xlabel("training step")
    curve_ax.set_ylabel("mean reward (critic/score/mean)")
    curve_ax.legend()
    times = [rows[a]["s_per_step"] or 0.0 for a in arms]
    time_ax.bar([LABELS[a] for a in arms], times, color=[f"C{i}" for i in range(len(arms))])
    time_ax.set_ylabel("wall time per step, s (median; shared 2-core machine)")
    time_ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle("toy lost-in-thought, tiny model on a CPU: the same SFT start, steps, batch and seeds per arm")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=ROOT / "outputs" / "pipeline" / "toy_rl_algorithms")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "toy_rl_algorithms.png")
    args = parser.parse_args(argv)
    rows = summarise(args.run_dir)
    if "grpo" not in rows:
        print(f"error: {args.run_dir} has no GRPO arm's metrics (grpo/grpo/metrics.jsonl): run the experiment first", file=sys.stderr)
        return 2
    before = accuracy(args.run_dir, "before")
    print("\n".join(table(rows, before)))
    figure(rows, before, args.figure)
    print(f"figure: {args.figure}")
    base = rows["grpo"]["s_per_step"]
    parts = [f"acc_before={_f(before)}"] + [f"acc_{a}={_f(r['acc'])}" for a, r in rows.items()]
    parts += [f"step_ratio_{a}={r['s_per_step'] / base:.2f}" for a, r in rows.items() if a != "grpo" and r["s_per_step"]]
    print("RESULT " + " ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
