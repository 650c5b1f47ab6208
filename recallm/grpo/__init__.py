"""GRPO on upstream verl: the launcher, the per-step metrics, the CPU plugin."""

#: the per-step metrics file of a GRPO run, next to its checkpoints (verl's ``file`` logger; ``recallm.eval.curves`` reads it)
METRICS_FILE = "metrics.jsonl"
