"""Benchmark: one tiny-model GRPO step on CPU through verl, with vs without recall.

Run: ``.venv/bin/python bench/grpo_step.py`` (~3 minutes).

Two runs of ``recallm-grpo`` (the tiny_cpu recipe: verl's own trainer, the HF rollout) on the
same model and data, spans forced open in both (every 8 tokens, 6 long):
* recall: the recall processor in the rollout and masked log-probs (actor and reference);
* plain: ``recallm.recall=false`` — plain decoding, plain log-probs.
verl's ``timing_s/step`` of every step after the first (warm-up) is collected; the medians are
compared.

Last line: ``RESULT recall_step_overhead=<recall step time / plain step time>``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEP = re.compile(r"step:(\d+) - .*?timing_s/step:([0-9.eE+-]+)")


def run(model: Path, data: Path, out: Path, recall: bool, steps: int) -> list[float]:
    cmd = [
        sys.executable,
        "-m",
        "recallm.cli.grpo",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "data.max_response_length=48",
        "data.shuffle=False",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "+actor_rollout_ref.rollout.engine_kwargs.hf_cpu.force_every=8",
        "+actor_rollout_ref.rollout.engine_kwargs.hf_cpu.force_length=6",
        f"recallm.recall={'true' if recall else 'false'}",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        f"trainer.default_local_dir={out}",
        "trainer.resume_mode=disable",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        raise SystemExit(f"recallm-grpo failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    times = {int(s): float(t) for s, t in STEP.findall(proc.stdout)}
    return [times[s] for s in sorted(times) if s > 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    from data_gen.generate import plan_from_config, run_plan
    from recallm.tiny import create_tiny

    mix = {
        "train": {
            "lengths": [256, 384],
            "entries": [{"task": "kv_retrieval", "count": 24, "params": {"key_type": "toy", "value_type": "toy"}}],
        }
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = create_tiny(tmp / "tiny")
        run_plan(plan_from_config(mix), tmp / "data", model, workers=1, progress=False)
        data = tmp / "data" / "train.parquet"
        recall = run(model, data, tmp / "recall", True, args.steps)
        plain = run(model, data, tmp / "plain", False, args.steps)
    r, p = statistics.median(recall), statistics.median(plain)
    print(f"step times after the first, recall: {', '.join(f'{t:.2f}' for t in recall)} s")
    print(f"step times after the first, plain:  {', '.join(f'{t:.2f}' for t in plain)} s")
    print(f"median step: recall {r:.2f} s, plain {p:.2f} s")
    print(f"RESULT recall_step_overhead={r / p:.3f}")


if __name__ == "__main__":
    main()
