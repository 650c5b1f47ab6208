"""GRPO on upstream verl: the launcher, the per-step metrics, the CPU plugin."""

from recallm.paths import METRICS_FILE as METRICS_FILE  # (the run directory's names live in recallm.paths)
