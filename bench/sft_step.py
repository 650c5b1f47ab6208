"""Benchmark: one stage-2 SFT step on the tiny model — the recall mask's cost, and what computing
logits only at the labelled (completion) positions saves.

Run: ``.venv/bin/python bench/sft_step.py``.

Same model, same batch (16 programmatic traces of the tiny mixture, recall spans included), same
optimizer; forward + backward + AdamW step timed, interleaved, medians compared:

* ``mask_overhead``: full logits with ``config.recall_constrained`` on (the masked loss SFT
  optimises) / off;
* ``label_logits_speedup``: masked, full logits / masked, logits at labelled positions only
  (``model.label_logits_only()``, what ``recallm-sft`` uses); the two losses are checked equal;
* ``smollm2_mask_overhead`` (when SmolLM2 has been converted, ``make smollm2``, or ``--smollm2 DIR``):
  the same comparison on a real 135M checkpoint — a step of 4 traces of its own tokenizer (key-value
  and math retrieval, ~300-token prompts), logits at labelled positions as SFT runs it, masked / not.

Last line: ``RESULT mask_overhead=<ratio> label_logits_speedup=<ratio> [smollm2_mask_overhead=<ratio>]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


SMOLLM2_DEFAULT = Path.home() / ".cache" / "recallm" / "models" / "smollm2-135m-instruct-recallm"


def _batch(model_dir: Path, mix: dict, n: int, tmp: str):
    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.sft.data import SFTCollator, load_sft_file
    from recallm.tokens import load_tokenizer, pad_token_id

    run_schedule(schedule_from_config(mix), Path(tmp) / "data", model_dir, workers=1, progress=False)
    tokenizer = load_tokenizer(model_dir)
    data, _ = load_sft_file(
        Path(tmp) / "data" / "sft" / "train.jsonl", tokenizer, max_length=8192, vocab_size=len(tokenizer)
    )
    return SFTCollator(pad_token_id(tokenizer=tokenizer))([data[i] for i in range(len(data))][:n])


def _time_steps(model, batch, variants: dict[str, tuple[bool, bool]], repeats: int) -> dict[str, float]:
    """Median seconds of forward + backward + AdamW for each (masked, label_only) variant, interleaved."""
    import torch

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def step(masked: bool, label_only: bool) -> float:
        model.config.recall_constrained = masked
        model.label_logits_only(label_only)
        t = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - t

    for masked, label_only in variants.values():  # warm-up
        step(masked, label_only)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, (masked, label_only) in variants.items():
            times[name].append(step(masked, label_only))
    return {name: statistics.median(t) for name, t in times.items()}


def _report(label: str, batch, med: dict[str, float], start_id: int) -> None:
    tokens = int(batch["attention_mask"].sum())
    labelled = int((batch["labels"] != -100).sum())
    spans = int((batch["input_ids"] == start_id).sum())
    print(
        f"{label}: {batch['input_ids'].shape[0]} sequences, {tokens} tokens ({labelled} labelled), {spans} recall spans"
    )
    for name, value in med.items():
        print(f"  step {name:10s} {value * 1e3:8.1f} ms ({tokens / value:,.0f} tokens/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--smollm2", type=Path, default=SMOLLM2_DEFAULT, help="converted SmolLM2 (make smollm2)")
    parser.add_argument("--smollm2-repeats", type=int, default=5)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM
    from transformers import logging as hf_logging

    import recallm.modeling  # noqa: F401
    from recallm.tiny import create_tiny

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
        batch = _batch(model_dir, mix, args.batch, tmp)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.train()
    with torch.no_grad():
        full_loss = model(**batch).loss.item()
        model.label_logits_only(True)
        label_loss = model(**batch).loss.item()
    if abs(full_loss - label_loss) > 1e-4 * max(1.0, abs(full_loss)):
        raise SystemExit(f"label-only loss {label_loss} differs from the full loss {full_loss}")
    variants = {"masked": (True, False), "plain": (False, False), "label_only": (True, True)}
    med = _time_steps(model, batch, variants, args.repeats)
    _report("tiny", batch, med, model.config.recall_start_token_id)
    result = f"RESULT mask_overhead={med['masked'] / med['plain']:.3f} label_logits_speedup={med['masked'] / med['label_only']:.2f}"

    if (args.smollm2 / "config.json").is_file():
        smol_mix = {
            "train": {
                "lengths": [256, 384],
                "entries": [
                    {"task": "kv_retrieval", "count": 4, "params": {"key_type": "int", "value_type": "alnum"}},
                    {
                        "task": "math_retrieval",
                        "count": 4,
                        "params": {"key_type": "int", "value_type": "alnum", "near_keys": 2},
                    },
                ],
            },
            "sft": {"count": 4, "val_fraction": 0.0},
        }
        with tempfile.TemporaryDirectory() as tmp:
            batch = _batch(args.smollm2, smol_mix, 4, tmp)
        model = AutoModelForCausalLM.from_pretrained(args.smollm2, dtype=torch.float32)
        model.train()
        med = _time_steps(model, batch, {"masked": (True, True), "plain": (False, True)}, args.smollm2_repeats)
        _report(f"SmolLM2-135M ({args.smollm2})", batch, med, model.config.recall_start_token_id)
        result += f" smollm2_mask_overhead={med['masked'] / med['plain']:.3f}"
    else:
        print(f"SmolLM2 row skipped: no converted model at {args.smollm2} (make smollm2)")
    print(result)


if __name__ == "__main__":
    main()
