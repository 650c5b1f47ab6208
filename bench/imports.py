"""Benchmark: the import time of the light packages vs the model stack they used to drag in.

Run: ``.venv/bin/python bench/imports.py [--runs 5]`` (fresh interpreters, one at a time).

``import recallm`` used to import ``recallm.modeling`` (torch, transformers and the model classes)
so that the masked model types were registered; ``rewards`` and ``data_gen`` import ``recallm``, so
they paid for it too, as did every command-line subprocess. Now the registration happens where a
model is loaded (``import recallm.modeling``; ARCHITECTURE.md). Each row is the median CPU time
(user + system) of a fresh ``python -c "import ..."`` over ``--runs`` runs (on a loaded machine the
wall time is mostly waiting for a core), the rows interleaved so that load on a
shared machine spreads over all of them. The same-run baseline is ``import recallm.modeling``:
what ``import recallm`` cost before (the same modules), measured now. ``python -c pass`` is the
interpreter's own start-up, included in every row.

Last line: ``RESULT import_recallm_s=<s> import_rewards_s=<s> modeling_s=<s> recallm_vs_modeling=<ratio>
rewards_vs_modeling=<ratio>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.child_cpu import run_cpu_seconds  # noqa: E402

ROWS = {
    "python -c pass": "pass",
    "import recallm": "import recallm",
    "import rewards": "import rewards",
    "import data_gen": "import data_gen",
    "import data_gen.generate": "import data_gen.generate",
    "import rewards.score": "import rewards.score",
    "import recallm.modeling (baseline)": "import recallm.modeling",
}


def _time(code: str) -> float:
    """CPU seconds (user + system) of a fresh interpreter running ``code``: on a shared machine the
    wall time is mostly waiting for a core, the CPU time is what the import costs."""
    cpu, wall = run_cpu_seconds([sys.executable, "-c", code], cwd=ROOT)
    _WALL.append(wall)
    return cpu


_WALL: list[float] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for code in ROWS.values():  # warm the file cache once
        _time(code)
    times: dict[str, list[float]] = {name: [] for name in ROWS}
    for _ in range(args.runs):
        for name, code in ROWS.items():
            times[name].append(_time(code))
    median = {name: statistics.median(values) for name, values in times.items()}
    base = median["import recallm.modeling (baseline)"]
    print(f"CPU seconds per fresh interpreter ({args.runs} runs; wall time of all runs {sum(_WALL):.0f} s)")
    print(f"{'':38} {'median s':>9} {'min s':>7} {'max s':>7} {'vs modeling':>12}")
    for name, values in times.items():
        print(f"{name:38} {median[name]:9.3f} {min(values):7.3f} {max(values):7.3f} {median[name] / base:12.3f}")
    print(
        f"RESULT import_recallm_s={median['import recallm']:.3f} import_rewards_s={median['import rewards']:.3f} "
        f"modeling_s={base:.3f} recallm_vs_modeling={median['import recallm'] / base:.3f} "
        f"rewards_vs_modeling={median['import rewards'] / base:.3f}"
    )


if __name__ == "__main__":
    main()
