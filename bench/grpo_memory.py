"""Benchmark: the memory peak of a GRPO step on the CPU against the micro batch size (issue 38: the own-model
defaults peaked at 16.3 GB on SmolLM2, micro batches of 2 at 5.2 GB at the same step time).

Run: ``.venv/bin/python bench/grpo_memory.py --model DIR --data DIR`` (a RecaLLM model, e.g. ``make smollm2``'s,
and a ``recallm-data`` directory of it). Needs the free memory of the largest run; shorten the sequences
(``--response``) to measure the ratio with less.

One training step of ``recallm-grpo grpo=own_cpu`` (verl's trainer, the CPU plugin, the HF rollout) per micro
batch size, the same model, data, prompts and lengths; the three micro batches (the actor's update and the
reference's and rollout's log-prob passes) set together. While each runs, the resident memory of the launcher's
process tree (Ray's workers included) is sampled every 0.2 s; verl's ``timing_s/step`` is read from its step line.
Printed per run: the peak of the largest process (the trainer's worker) and of the whole tree, the step time; then

``RESULT peak_ratio=<largest process, first / last micro batch> tree_ratio=<...> step_ratio=<time, first / last>``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_ARR = "actor_rollout_ref"


def _sample(pid: int, stop: threading.Event, peaks: dict[str, int]) -> None:
    import psutil

    root = psutil.Process(pid)
    while not stop.is_set():
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        sizes = []
        for proc in procs:
            try:
                sizes.append(proc.memory_info().rss)
            except psutil.Error:
                pass
        if sizes:
            peaks["largest"] = max(peaks.get("largest", 0), max(sizes))
            peaks["tree"] = max(peaks.get("tree", 0), sum(sizes))
        time.sleep(0.2)


def run(model: Path, data: Path, micro: int, prompt: int, response: int, workdir: Path) -> dict[str, float]:
    from recallm.grpo.console import step_record

    cmd = [
        sys.executable, "-m", "recallm.cli.grpo", "grpo=own_cpu",
        f"{_ARR}.model.path={model}", f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'train.parquet'}", f"data.max_prompt_length={prompt}",
        f"data.max_response_length={response}", "data.shuffle=False",
        f"{_ARR}.actor.ppo_micro_batch_size_per_gpu={micro}", f"{_ARR}.ref.log_prob_micro_batch_size_per_gpu={micro}",
        f"{_ARR}.rollout.log_prob_micro_batch_size_per_gpu={micro}", "trainer.total_training_steps=1",
        "trainer.save_freq=-1", f"trainer.default_local_dir={workdir / f'micro{micro}'}",
        "trainer.val_before_train=False", "recallm.console=full",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir)
    peaks: dict[str, int] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(proc.pid, stop, peaks), daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"micro batch {micro}: recallm-grpo failed ({proc.returncode}):\n{out[-4000:]}")
    step_s = next((r[1]["timing_s/step"] for line in out.splitlines() if (r := step_record(line)) and "timing_s/step" in r[1]), float("nan"))
    return {"largest_gib": peaks.get("largest", 0) / 2**30, "tree_gib": peaks.get("tree", 0) / 2**30, "step_s": step_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True, help="a recallm-data directory (train.parquet)")
    p.add_argument("--micro", type=int, nargs="+", default=[8, 2], help="micro batch sizes, first against last")
    p.add_argument("--prompt", type=int, default=512, help="data.max_prompt_length")
    p.add_argument("--response", type=int, default=128, help="data.max_response_length")
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="grpo-memory-") as tmp:
        for micro in args.micro:
            results[micro] = run(args.model.resolve(), args.data.resolve(), micro, args.prompt, args.response, Path(tmp))
            r = results[micro]
            print(f"micro batch {micro}: largest process {r['largest_gib']:.2f} GiB, process tree {r['tree_gib']:.2f} GiB, "
                  f"step {r['step_s']:.1f} s", flush=True)  # fmt: skip
    first, last = results[args.micro[0]], results[args.micro[-1]]
    print(
        f"RESULT peak_ratio={first['largest_gib'] / last['largest_gib']:.2f} "
        f"tree_ratio={first['tree_gib'] / last['tree_gib']:.2f} step_ratio={first['step_s'] / last['step_s']:.2f}"
    )


if __name__ == "__main__":
    main()
