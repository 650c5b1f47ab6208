"""Benchmark: one tiny-model GRPO step on the CPU through verl — its time by phase, the recall
overhead, and the CPU plugin's speed-ups against the step without them.

Run: ``.venv/bin/python bench/grpo_step.py`` (~4 minutes on a quiet 2-core machine).

Three runs of ``recallm-grpo`` (the tiny_cpu recipe: verl's own trainer, the HF rollout) on the same
model and data, spans forced open in all (every 8 tokens, 6 long), 4 prompts x 4 rollouts a step:

* ``recall``: the recall processor in the rollout, masked log-probs (actor and reference) — the
  default CPU path;
* ``plain``: ``recallm.recall_constrained=false`` — plain decoding, plain log-probs;
* ``baseline``: as ``recall``, with ``RECALLM_CPU_BASELINE=1`` and gradient checkpointing back on
  (``actor_rollout_ref.model.enable_gradient_checkpointing=true``, which the CPU platform turns off) —
  the CPU step before the plugin removed what is not inherent to it (verl's per-token log-prob loop,
  gradient checkpointing, Ray's 5-second reporter and autoscaler polling; see ``recallm.grpo.cpu``).

verl's ``timing_s/*`` of every step after the first (warm-up) are read from its JSONL metrics log;
the medians are compared. Printed: the phase split (rollout, reward, old and reference log-probs,
update, weight sync, the rest) of ``baseline`` and ``recall``, then

``RESULT recall_step_overhead=<recall / plain> step_s_tiny=<recall step, s> speedup_vs_baseline=<baseline / recall>``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PHASES = (
    ("gen", "rollout (generation)"),
    ("reward", "reward"),
    ("old_log_prob", "old log-probs"),
    ("ref", "reference log-probs"),
    ("update_actor", "update"),
    ("update_weights", "weight sync"),
)


def run(model: Path, data: Path, out: Path, steps: int, *, recall: bool, baseline: bool) -> dict[str, list[float]]:
    """One ``recallm-grpo`` run; ``{timing key: [seconds of each step after the first]}``."""
    from recallm.eval.curves import read_metrics

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
        f"recallm.recall_constrained={'true' if recall else 'false'}",
        *(["actor_rollout_ref.model.enable_gradient_checkpointing=true"] if baseline else []),
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out}",
        "trainer.resume_mode=disable",
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "RECALLM_CPU_BASELINE": "1" if baseline else "0",
    }
    env.pop("VERL_FILE_LOGGER_PATH", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"recallm-grpo failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    metrics = read_metrics(out / "metrics.jsonl")
    timings: dict[str, list[float]] = {}
    for step, values in metrics.items():
        if step == 1:
            continue
        for key, value in values.items():
            if key.startswith("timing_s/"):
                timings.setdefault(key[len("timing_s/") :], []).append(value)
    if not timings.get("step"):
        raise SystemExit(f"no step timings logged in {out / 'metrics.jsonl'} (run more than one step)")
    return timings


def split(timings: dict[str, list[float]]) -> dict[str, float]:
    """Median seconds of each phase, and of the rest of the step."""
    med = {key: statistics.median(timings.get(key) or [0.0]) for key, _ in PHASES}
    med["step"] = statistics.median(timings["step"])
    med["other"] = max(0.0, med["step"] - sum(med[key] for key, _ in PHASES))
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per run (the first is not timed)")
    args = parser.parse_args()
    from data_gen.generate import run_schedule, schedule_from_config
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
        run_schedule(schedule_from_config(mix), tmp / "data", model, workers=1, progress=False)
        data = tmp / "data" / "train.parquet"
        baseline = split(run(model, data, tmp / "baseline", args.steps, recall=True, baseline=True))
        recall = split(run(model, data, tmp / "recall", args.steps, recall=True, baseline=False))
        plain = split(run(model, data, tmp / "plain", args.steps, recall=False, baseline=False))
    print(f"median seconds per step after the first ({args.steps - 1} steps a run):")
    print(f"  {'phase':22s} {'baseline':>9s} {'recall':>9s} {'plain':>9s}  baseline/recall")
    for key, label in (*PHASES, ("other", "rest (driver, Ray)"), ("step", "step")):
        ratio = baseline[key] / recall[key] if recall[key] > 0 else float("nan")
        print(f"  {label:22s} {baseline[key]:9.2f} {recall[key]:9.2f} {plain[key]:9.2f}  {ratio:6.2f}")
    print(
        f"RESULT recall_step_overhead={recall['step'] / plain['step']:.3f} step_s_tiny={recall['step']:.2f} "
        f"speedup_vs_baseline={baseline['step'] / recall['step']:.2f}"
    )


if __name__ == "__main__":
    main()
