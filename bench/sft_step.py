"""Benchmark: one stage-2 SFT step on the tiny model with the recall mask in the forward vs without.

Run: ``.venv/bin/python bench/sft_step.py``.

Same model, same batch (16 programmatic traces of the tiny mixture, recall spans included), same
optimizer; forward + backward + AdamW step timed with ``config.recall_constrained`` on (the
masked loss SFT optimises) and off, interleaved, medians compared.

Last line: ``RESULT mask_overhead=<masked step time / plain step time>``.
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

    def step(masked: bool) -> float:
        model.config.recall_constrained = masked
        t = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - t

    step(True), step(False)  # warm-up
    times = {True: [], False: []}
    for _ in range(args.repeats):
        for masked in (True, False):
            times[masked].append(step(masked))
    tokens = int(batch["attention_mask"].sum())
    spans = int((batch["input_ids"] == model.config.recall_start_token_id).sum())
    masked, plain = statistics.median(times[True]), statistics.median(times[False])
    print(f"batch: {args.batch} sequences, {tokens} tokens, {spans} recall spans")
    print(
        f"step with mask {masked * 1e3:.1f} ms ({tokens / masked:,.0f} tokens/s), "
        f"without {plain * 1e3:.1f} ms ({tokens / plain:,.0f} tokens/s)"
    )
    print(f"RESULT mask_overhead={masked / plain:.3f}")


if __name__ == "__main__":
    main()
