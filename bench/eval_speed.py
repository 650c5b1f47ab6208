"""Benchmark: the HF evaluation backend on long prompts — HF's batched prefill (the baseline: the
backend's defaults, batches of 8, the model's float32, speculative decoding inside recall spans with
``span_draft_tokens=8``) against the row-by-row bfloat16 prefill (``backend.prefill_dtype=bfloat16``,
``recallm.eval.prefill``) with batches of 16, which decodes with Hugging Face ``generate`` and so without
the in-span speculation, on the same prompts in one run; and how many greedy outputs the two agree on.

Run: ``.venv/bin/python bench/eval_speed.py --model DIR`` (DIR: a RecaLLM model, e.g. the SmolLM2
experiment's ``outputs/pipeline/smollm2_cpu/sft/recall/full/final``; default: ``make smollm2``'s
converted SmolLM2, untrained, which answers less but costs the same). The prompts are the SmolLM2
suite's (``configs/eval/smollm2.yaml``: key-value retrieval, math retrieval, multi-needle) at one length.

``RESULT eval_speedup=<baseline s / fast s> baseline_s_per_prompt=<s> fast_s_per_prompt=<s>
same_output=<k>/<n> same_correct=<k>/<n> baseline_correct=<k> fast_correct=<k>``
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.smollm2_prompts import parser, suite_prompts  # noqa: E402


def main() -> None:
    args = parser(__doc__.split("\n\n")[0], per_task=8).parse_args()
    bench, examples, requests, tok = suite_prompts(args)

    from recallm.eval.backends import HFBackend
    settings = bench.generation
    print(f"{len(examples)} prompts of ~{args.length} tokens, up to {args.max_new_tokens} new tokens, greedy")

    results = {}
    for name, kwargs in (
        ("baseline", {"batch_size": 8}),
        ("fast", {"batch_size": 16, "prefill_dtype": "bfloat16"}),
    ):
        backend = HFBackend(args.model, tok, dtype="float32", **kwargs)
        backend.generate(requests[:1], settings)  # warm-up (allocations, the bfloat16 copy's first kernels)
        started = time.perf_counter()
        outputs = backend.generate(requests, settings)
        seconds = time.perf_counter() - started
        scores = [bench.score(e, g, None) for e, g in zip(examples, outputs, strict=True)]
        results[name] = (seconds, outputs, scores)
        tokens = sum(g.n_tokens for g in outputs)
        print(f"{name}: {seconds:.1f} s ({seconds / len(requests):.2f} s a prompt, {tokens} tokens generated), "
              f"{sum(s.correct for s in scores)}/{len(scores)} correct")
        backend.close()
        del backend

    (t0, out0, sc0), (t1, out1, sc1) = results["baseline"], results["fast"]
    same = sum(a.text == b.text for a, b in zip(out0, out1, strict=True))
    same_correct = sum(a.correct == b.correct for a, b in zip(sc0, sc1, strict=True))
    n = len(requests)
    print(
        f"RESULT eval_speedup={t0 / t1:.2f} baseline_s_per_prompt={t0 / n:.2f} fast_s_per_prompt={t1 / n:.2f} "
        f"same_output={same}/{n} same_correct={same_correct}/{n} baseline_correct={sum(s.correct for s in sc0)} "
        f"fast_correct={sum(s.correct for s in sc1)}"
    )


if __name__ == "__main__":
    main()
