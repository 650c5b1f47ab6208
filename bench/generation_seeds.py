"""Benchmark: batched sampling with one random stream per request vs batched sampling from one stream.

Run: ``.venv/bin/python bench/generation_seeds.py`` (``--quick`` for a short smoke run; ``--vocab N`` to grow
the tiny model's vocabulary to N rows, e.g. 152064 as Qwen2.5's, where the per-row draw's ``softmax`` and
``cumsum`` over the vocabulary cost the most relative to the model).

Both sides sample the same batch of ``--batch`` requests (temperature 1, top-p 0.95, the recall constraint
on, spans forced open so the mask works too), one Hugging Face ``generate`` call each, in one process,
runs interleaved, medians of ``--repeats``:

* **seeded** (ours): ``recallm.generation.generate`` with a seed per request and ``span_draft_tokens=0``
  (so that only the sampler differs): every row draws one uniform number per token from its own
  ``torch.Generator`` and takes the token at that point of the processed distribution's cumulative sum
  (``recallm.decoding.RowSampler``), and greedy search takes that one-hot row;
* **unseeded** (the baseline: what a batch sampled before per-request streams): the same processors,
  ``generate(do_sample=True)`` drawing every row from torch's one generator (``torch.multinomial``).

Also printed: ours with ``seed=None`` (the same code drawing from the caller's generator) and ours with
the default in-span drafts. The last line is ``RESULT seeded_vs_unseeded=...`` (time of the unseeded
baseline / time of seeded: 1.0 = as fast, above 0.95 = within 5%).
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
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=None, help="grow the vocabulary to this many rows")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.quick:
        args.repeats, args.new_tokens = 2, 16

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, LogitsProcessorList, TopPLogitsWarper
    from transformers import logging as hf_logging

    import recallm.modeling  # noqa: F401
    from recallm.generation import GenRequest, generate
    from recallm.recall.hf import ForceRecallSpans, RecallLogitsProcessor
    from recallm.tiny import create_tiny
    from recallm.tokens import RecallTokenIds, load_tokenizer, pad_token_id

    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        path = create_tiny(Path(tmp) / "tiny")
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        tokenizer = load_tokenizer(path)
    if args.vocab:
        model.resize_token_embeddings(args.vocab)
    ids = RecallTokenIds.from_config(model.config)
    pad = pad_token_id(tokenizer=tokenizer, config=model.config)
    rng = np.random.default_rng(0)
    words = [i for i in range(ids.start) if i not in tokenizer.all_special_ids]
    prompts = [tuple(rng.choice(words, size=int(rng.integers(150, 250))).tolist()) for _ in range(args.batch)]
    force = (6, 8)

    def ours(seeded: bool, drafts: int = 0) -> float:
        requests = [
            GenRequest(p, args.new_tokens, temperature=1.0, top_p=0.95, seed=(1000 + i) if seeded else None)
            for i, p in enumerate(prompts)
        ]
        started = time.perf_counter()
        generate(model, requests, tokenizer=tokenizer, eos_token_ids=[], force=force, span_draft_tokens=drafts)
        return time.perf_counter() - started

    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, p in enumerate(prompts):
        input_ids[row, width - len(p) :] = torch.tensor(p)
        attention_mask[row, width - len(p) :] = 1

    def unseeded_hf() -> float:
        processors = LogitsProcessorList(
            [
                RecallLogitsProcessor.from_config(model.config, prompt_attention_mask=attention_mask, pad_token_id=pad),
                TopPLogitsWarper(top_p=0.95),
                ForceRecallSpans(ids.start, ids.end, every=force[0], length=force[1]),
            ]
        )
        started = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                logits_processor=processors,
                recall_constrained=True,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=pad,
            )
        return time.perf_counter() - started

    runs = {
        "unseeded (HF multinomial, one stream)": unseeded_hf,
        "seeded (a stream per request)": lambda: ours(True),
        "seed=None (ours, the caller's stream)": lambda: ours(False),
        "seeded + in-span drafts (default)": lambda: ours(True, drafts=8),
    }
    for run in runs.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            times[name].append(run())
    print(
        f"tiny model, vocabulary {model.config.vocab_size}, batch {args.batch}, {args.new_tokens} new tokens, "
        f"spans forced every {force[0]} ({force[1]} long), torch threads {torch.get_num_threads()}"
    )
    base = statistics.median(times["unseeded (HF multinomial, one stream)"])
    for name, values in times.items():
        median = statistics.median(values)
        tokens = args.batch * args.new_tokens / median
        print(f"{name:40} {median:7.3f} s  {tokens:8.1f} tok/s  ratio {base / median:.3f}")
    seeded = statistics.median(times["seeded (a stream per request)"])
    print(f"RESULT seeded_vs_unseeded={base / seeded:.3f}")


if __name__ == "__main__":
    main()
