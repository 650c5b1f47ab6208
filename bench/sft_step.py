"""Benchmark: one stage-2 SFT step on the tiny model — the recall mask's cost, and what computing
logits only at the labelled (completion) positions saves.

Run: ``.venv/bin/python bench/sft_step.py``.

Same model, same batch (16 programmatic traces of the tiny mixture, recall spans included), same
optimizer; forward + backward + AdamW step timed, interleaved, medians compared:

* ``mask_overhead``: full logits with ``config.recall_constrained`` on (the masked loss SFT
  optimises) / off;
* ``label_logits_speedup``: masked, full logits / masked, logits at labelled positions only
  (``model.label_logits_only()``, what ``recallm-sft`` uses); the two losses are checked equal.

Last line: ``RESULT mask_overhead=<ratio> label_logits_speedup=<ratio>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM
    from transformers import logging as hf_logging

    import recallm  # noqa: F401
    from data_gen.generate import plan_from_config, run_plan
    from recallm.sft.data import SFTCollator, load_sft_file
    from recallm.tiny import create_tiny
    from recallm.tokens import load_tokenizer

    hf_logging.set_verbosity_error()
    mix = {
        "train": {
            "lengths": [384, 512],
            "entries": [
                {"task": "kv_retrieval", "count": args.batch, "params": {"key_type": "toy", "value_type": "toy"}},
                {"task": "math_retrieval", "count": args.batch, "params": {"key_type": "toy", "value_type": "toy"}},
            ],
        },
        "sft": {"count": args.batch, "val_fraction": 0.0},
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = create_tiny(Path(tmp) / "tiny")
        run_plan(plan_from_config(mix), Path(tmp) / "data", model_dir, workers=1, progress=False)
        tokenizer = load_tokenizer(model_dir)
        data, _ = load_sft_file(Path(tmp) / "data" / "sft" / "train.jsonl", tokenizer, max_length=4096, vocab_size=4096)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
    batch = SFTCollator(tokenizer.pad_token_id)([data[i] for i in range(len(data))][: args.batch])
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(masked: bool, label_only: bool = False) -> float:
        model.config.recall_constrained = masked
        model.label_logits_only(label_only)
        t = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - t

    with torch.no_grad():
        full_loss = model(**batch).loss.item()
        model.label_logits_only(True)
        label_loss = model(**batch).loss.item()
    if abs(full_loss - label_loss) > 1e-4 * max(1.0, abs(full_loss)):
        raise SystemExit(f"label-only loss {label_loss} differs from the full loss {full_loss}")
    variants = {"masked": (True, False), "plain": (False, False), "label_only": (True, True)}
    for masked, label_only in variants.values():  # warm-up
        step(masked, label_only)
    times = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (masked, label_only) in variants.items():
            times[name].append(step(masked, label_only))
    tokens = int(batch["attention_mask"].sum())
    labelled = int((batch["labels"] != -100).sum())
    spans = int((batch["input_ids"] == model.config.recall_start_token_id).sum())
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"batch: {args.batch} sequences, {tokens} tokens ({labelled} labelled), {spans} recall spans")
    for name, value in med.items():
        print(f"step {name:10s} {value * 1e3:7.1f} ms ({tokens / value:,.0f} tokens/s)")
    print(
        f"RESULT mask_overhead={med['masked'] / med['plain']:.3f} label_logits_speedup={med['masked'] / med['label_only']:.2f}"
    )


if __name__ == "__main__":
    main()
