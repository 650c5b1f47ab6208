"""GRPO on upstream verl: the launcher, the per-step metrics, the CPU plugin."""
