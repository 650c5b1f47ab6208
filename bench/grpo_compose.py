"""Benchmark: what finding verl's YAML tree costs a GRPO command that only composes its config.

Run: ``.venv/bin/python bench/grpo_compose.py [--runs 5]`` (fresh interpreters, one at a time).

``configs/grpo.yaml`` and ``configs/rlm_train.yaml`` add verl's config directory to Hydra's search path. As
``pkg://verl.trainer.config`` (the baseline) Hydra imports the package ``verl.trainer.config`` to find the
directory — verl, tensordict, torch's compiler; as ``file://${recallm.package_dir:verl}/trainer/config`` (now) the
directory is found by ``importlib.util.find_spec`` without importing anything. Both are measured in the same run
on the same commands: ``recallm-grpo --help`` and ``recallm-plan grpo --model qwen2.5_7b`` (which composes the GRPO
config and prints the plan), the baseline from a copy of ``configs/`` whose two files use ``pkg://``
(``RECALLM_CONFIG_DIR``). Each row is the median CPU time (user + system) of a fresh process over ``--runs``
runs, the rows interleaved (on a loaded machine the wall time is mostly waiting for a core).

Last line: ``RESULT help_s=<s> help_baseline_s=<s> help_speedup=<x> plan_s=<s> plan_baseline_s=<s> plan_speedup=<x>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.child_cpu import run_cpu_seconds  # noqa: E402

NOW = "file://${recallm.package_dir:verl}/trainer/config"
BASELINE = "pkg://verl.trainer.config"
COMMANDS = {
    "help": ["-m", "recallm.cli.grpo", "--help"],
    "plan": ["-m", "recallm.cli.plan", "grpo", "--model", "qwen2.5_7b", "--step-seconds", "60"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        baseline_dir = Path(tmp) / "configs"
        shutil.copytree(ROOT / "configs", baseline_dir)
        for name in ("grpo.yaml", "rlm_train.yaml"):
            path = baseline_dir / name
            text = path.read_text()
            if NOW not in text:
                raise SystemExit(f"error: {name} does not use {NOW}: nothing to compare")
            path.write_text(text.replace(NOW, BASELINE))
        envs = {
            "now": {**os.environ, "RECALLM_CONFIG_DIR": str(ROOT / "configs")},
            "baseline": {**os.environ, "RECALLM_CONFIG_DIR": str(baseline_dir)},
        }
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.runs):
            for command, argv in COMMANDS.items():
                for which, env in envs.items():
                    cpu, _ = run_cpu_seconds([sys.executable, *argv], cwd=Path(tmp), env=env, quiet=True)
                    times.setdefault((command, which), []).append(cpu)
    medians = {key: statistics.median(values) for key, values in times.items()}
    for (command, which), value in sorted(medians.items()):
        print(f"{command:5s} {which:9s} {value:6.2f} CPU s (median of {args.runs})")
    h, hb = medians[("help", "now")], medians[("help", "baseline")]
    p, pb = medians[("plan", "now")], medians[("plan", "baseline")]
    print(
        f"RESULT help_s={h:.2f} help_baseline_s={hb:.2f} help_speedup={hb / h:.2f} "
        f"plan_s={p:.2f} plan_baseline_s={pb:.2f} plan_speedup={pb / p:.2f}"
    )


if __name__ == "__main__":
    main()
