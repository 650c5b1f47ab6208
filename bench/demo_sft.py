"""Benchmark: the demo's SFT stage (``make demo``'s ``sft_full``, the bulk of its time) — the recipe's
steps as they were against as they are, on the same model, in one process.

Run: ``.venv/bin/python bench/demo_sft.py`` (about 5 minutes on an idle 2-core machine; ``--sample``
sets how many of the stage's steps are timed, ``--length-group`` the grouping tried).

It builds the tiny model and the toy mixture's SFT traces (``configs/data/toy.yaml``, fewer of them),
draws the stage's whole step sequence as ``recallm-sft`` does (the curriculum of
``configs/sft/toy_cpu.yaml`` over its ``sft.full.steps``), and times ``--sample`` steps spread evenly
over it — forward, backward, gradient clipping and AdamW, one thread, as the pipeline runs each of the
two variants — once per configuration, interleaved step by step:

* ``before``: the draws as drawn (``sft.length_group=1``), the batch's padding mask passed to the
  attention (the code before the change: a ``(batch, 1, T, T)`` mask);
* ``causal``: the draws as drawn and plain causal attention for right-padded batches
  (``recallm.modeling._causal_only_mask``: the same loss and gradients, the recipe unchanged);
* ``grouped``: that, with ``sft.length_group=--length-group`` (batches of similar lengths: the same
  draws in another order, so the training itself changes; the demo's recipe does not set it).

The sampled steps' CPU seconds (``time.process_time``, which a busy machine inflates far less than
wall time) are summed per configuration and scaled to the stage's steps. The tokens of the
sampled batches (real and padded) are counted too.

Last line: ``RESULT causal_speedup=<before/causal CPU> grouped_speedup=<before/grouped CPU>
padded_tokens_ratio=<before/grouped> stage_cpu_minutes_before=<m> stage_cpu_minutes_causal=<m>
stage_cpu_minutes_grouped=<m>`` (minutes for one variant's stage, from the sample).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _traces(tmp: Path, count: int):
    """The toy mixture's SFT traces (``configs/data/toy.yaml`` with ``count`` of them) and the tiny model."""
    import yaml

    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.paths import CONFIG_DIR
    from recallm.tiny import create_tiny

    model_dir = create_tiny(tmp / "tiny")
    mix = yaml.safe_load((CONFIG_DIR / "data" / "toy.yaml").read_text())
    mix["train"]["entries"][0]["count"] = 50
    mix["val"] = {"lengths": [], "per_cell": 0, "categories": None}
    mix["sft"] = {"count": count, "val_fraction": 0.0}
    run_schedule(schedule_from_config(mix), tmp / "data", model_dir, workers=1, progress=False)
    return model_dir, tmp / "data" / "sft" / "train.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=60, help="steps of the stage timed per configuration")
    parser.add_argument("--traces", type=int, default=4000, help="SFT traces drawn from (the demo: 12,000)")
    parser.add_argument("--recipe", default="toy_cpu", help="configs/sft/<recipe>.yaml")
    parser.add_argument("--length-group", type=int, default=8, help="sft.length_group of the grouped variant")
    args = parser.parse_args()

    import torch
    import yaml
    from transformers import AutoModelForCausalLM
    from transformers import logging as hf_logging

    import recallm.modeling as modeling
    from recallm.paths import CONFIG_DIR
    from recallm.sft.data import SFTCollator, curriculum_order, group_by_length, load_sft_file
    from recallm.tokens import load_tokenizer, pad_token_id

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    recipe = yaml.safe_load((CONFIG_DIR / "sft" / f"{args.recipe}.yaml").read_text())
    steps, batch = int(recipe["full"]["steps"]), int(recipe["global_batch_size"])
    if recipe.get("curriculum") is None or args.length_group <= 1:
        raise SystemExit(f"length grouping needs a curriculum (configs/sft/{args.recipe}.yaml) and --length-group > 1")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, train_file = _traces(Path(tmp), args.traces)
        tokenizer = load_tokenizer(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        data, _ = load_sft_file(
            train_file, tokenizer, max_length=int(recipe["max_length"]), vocab_size=model.config.vocab_size
        )
    lengths = [len(r["input_ids"]) for r in data.records]
    drawn = curriculum_order(lengths, steps * batch, recipe["curriculum"], seed=int(recipe["seed"]))
    grouped = group_by_length(drawn, lengths, batch, args.length_group, seed=int(recipe["seed"]))
    orders = {"before": drawn, "causal": drawn, "grouped": grouped}
    causal_only = modeling._causal_only_mask
    masks = {"before": lambda mask, labels: mask, "causal": causal_only, "grouped": causal_only}
    collate = SFTCollator(pad_token_id(tokenizer=tokenizer), position_skip=recipe.get("position_skip"))
    model.train()
    model.label_logits_only(bool(recipe.get("label_logits_only", True)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    picked = [round(i * (steps - 1) / max(1, args.sample - 1)) for i in range(args.sample)]

    def step(name: str, s: int) -> tuple[float, float, int, int]:
        features = [data[i] for i in orders[name][s * batch : (s + 1) * batch]]
        modeling._causal_only_mask = masks[name]
        try:
            cpu, wall = time.process_time(), time.perf_counter()
            inputs = collate(features)
            loss = model(**inputs).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        finally:
            modeling._causal_only_mask = causal_only
        if not math.isfinite(loss.item()):
            raise SystemExit(f"step {s} ({name}): loss {loss.item()}")
        return cpu, wall, int(inputs["attention_mask"].sum()), inputs["input_ids"].numel()

    for name in orders:  # warm-up
        step(name, picked[-1])
    totals = {name: [0.0, 0.0, 0, 0] for name in orders}
    for s in picked:
        for name in orders:
            for k, v in enumerate(step(name, s)):
                totals[name][k] += v
    scale = steps / len(picked)
    print(
        f"SFT stage full of configs/sft/{args.recipe}.yaml: {steps} steps of {batch}; {len(picked)} steps timed, one thread"
    )
    for name, (cpu, wall, real, padded) in totals.items():
        print(
            f"  {name:6s} CPU {cpu / len(picked) * 1e3:7.1f} ms/step, wall {wall / len(picked) * 1e3:7.1f} ms/step, "
            f"tokens {real / len(picked):6.0f} real / {padded / len(picked):6.0f} padded per step; "
            f"stage ~{cpu * scale / 60:.1f} CPU min"
        )
    before, causal, grouped = totals["before"], totals["causal"], totals["grouped"]
    print(
        f"RESULT causal_speedup={before[0] / causal[0]:.3f} grouped_speedup={before[0] / grouped[0]:.3f} "
        f"padded_tokens_ratio={before[3] / grouped[3]:.3f} stage_cpu_minutes_before={before[0] * scale / 60:.1f} "
        f"stage_cpu_minutes_causal={causal[0] * scale / 60:.1f} stage_cpu_minutes_grouped={grouped[0] * scale / 60:.1f}"
    )


if __name__ == "__main__":
    main()
