"""The toy demo (``make demo``) across CPU instruction sets: how far its RESULT line moves when torch, MKL and
oneDNN run their AVX-512 code instead of the AVX2 code the demo pins (``configs/experiment/tiny_cpu.yaml``,
``env:``).

Run: ``.venv/bin/python bench/demo_isa.py --out /tmp/demo_isa`` (two whole demos side by side: about 30
minutes on an idle 2-core machine; a CPU without AVX-512 runs the ``pinned`` one twice over).

Two fresh run directories of ``recallm-pipeline experiment=tiny_cpu`` are started together:

* ``pinned``: the experiment as shipped — every job with ``ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2
  ONEDNN_MAX_CPU_ISA=AVX2``: what any x86-64 CPU with AVX2 computes, AVX-512 or not;
* ``native``: ``experiment.env=null`` — the CPU's own kernels (AVX-512 where it has them).

Last line: ``RESULT pinned_<key>=<x> ... native_<key>=<y> ... max_abs_diff=<largest |pinned - native| over the
accuracies>`` (the keys of the demo's own RESULT line, ``minutes`` left out of the difference).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"pinned": [], "native": ["experiment.env=null"]}


def _result(log: Path) -> dict[str, float]:
    lines = [line for line in log.read_text().splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"no RESULT line in {log}: see the run's output there")
    return {k: float(v) for k, v in re.findall(r"(\w+)=([-+0-9.]+)", lines[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a new directory for the two runs and their logs")
    args = parser.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        raise SystemExit(f"--out {args.out} is not empty: give a new directory")
    args.out.mkdir(parents=True, exist_ok=True)
    tool = Path(sys.executable).with_name("recallm-pipeline")
    procs = {}
    for name, extra in RUNS.items():
        log = args.out / f"{name}.log"
        argv = [str(tool), "experiment=tiny_cpu", f"run_dir={args.out / name}", *extra]
        with log.open("w") as f:
            procs[name] = (subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT), log)
    results = {}
    for name, (proc, log) in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"the {name} run failed (exit {proc.returncode}): see {log}")
        results[name] = _result(log)
    keys = [k for k in results["pinned"] if k != "minutes"]
    for name, values in results.items():
        print(f"{name}: " + " ".join(f"{k}={v:g}" for k, v in values.items()))
    diff = max(abs(results["pinned"][k] - results["native"][k]) for k in keys)
    fields = [f"{name}_{k}={results[name][k]:.3f}" for name in RUNS for k in keys]
    print("RESULT " + " ".join(fields) + f" max_abs_diff={diff:.3f}")


if __name__ == "__main__":
    main()
