"""Benchmark: grouped-query attention without repeating the key-value cache (``recallm.attention``) against
transformers' ``sdpa`` (the baseline), in the evaluation the SmolLM2 experiment runs — the HF backend with
the bfloat16 row prefill and batches of 16 (``configs/experiment/smollm2_cpu.yaml``), on the same prompts
in one run — and, alone, one layer's attention for one decoding step of 16 rows.

Run: ``.venv/bin/python bench/gqa_attention.py`` (``--model DIR``: a RecaLLM model; default ``make smollm2``'s
converted SmolLM2-135M-Instruct: 9 query heads, 3 key-value heads, 30 layers). The prompts are the SmolLM2
suite's (``configs/eval/smollm2.yaml``) at one length.

``RESULT gqa_speedup=<baseline s / gqa s> baseline_s_per_prompt=<s> gqa_s_per_prompt=<s> same_output=<k>/<n>
layer_decode_speedup=<x>``
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.smollm2_prompts import parser, suite_prompts  # noqa: E402


def _layer_step(config, rows: int, length: int, repeats: int = 20) -> tuple[float, float]:
    """Milliseconds of one layer's attention for one decoding step: transformers' sdpa, then ours."""
    import types

    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from recallm.attention import gqa_sdpa_attention

    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    query = torch.randn(rows, heads, 1, dim)
    key, value = torch.randn(2, rows, kv_heads, length, dim).unbind(0)
    keep = torch.ones(rows, 1, 1, length, dtype=torch.bool)
    keep[: rows // 2, ..., : length // 8] = False  # left padding in half the rows
    times = []
    for fn in (sdpa_attention_forward, gqa_sdpa_attention):
        fn(module, query, key, value, keep)
        started = time.perf_counter()
        for _ in range(repeats):
            fn(module, query, key, value, keep)
        times.append((time.perf_counter() - started) / repeats * 1000)
    return times[0], times[1]


def main() -> None:
    args = parser(__doc__.split("\n\n")[0], per_task=6).parse_args()
    bench, examples, requests, tok = suite_prompts(args)
    import torch

    import recallm.generation as generation
    from recallm.attention import GQA_SDPA
    from recallm.eval.backends import HFBackend
    print(f"{len(examples)} prompts of ~{args.length} tokens, up to {args.max_new_tokens} new tokens, greedy, "
          f"{torch.get_num_threads()} threads")

    switch = generation.use_gqa_sdpa
    results = {}
    for name in ("baseline", "gqa"):
        generation.use_gqa_sdpa = switch if name == "gqa" else (lambda model: False)
        backend = HFBackend(args.model, tok, dtype="float32", batch_size=16, prefill_dtype="bfloat16")
        backend.generate(requests[:1], bench.generation)  # warm-up
        started = time.perf_counter()
        outputs = backend.generate(requests, bench.generation)
        seconds = time.perf_counter() - started
        used = backend.model.config._attn_implementation
        assert (used == GQA_SDPA) == (name == "gqa"), used
        tokens = sum(g.n_tokens for g in outputs)
        results[name] = (seconds, outputs)
        print(f"{name} ({used}): {seconds:.1f} s ({seconds / len(requests):.2f} s a prompt, {tokens} tokens)")
        backend.close()
        del backend
    generation.use_gqa_sdpa = switch

    from transformers import AutoConfig

    import recallm.modeling  # noqa: F401  (registers the RecaLLM config classes)

    base_ms, gqa_ms = _layer_step(AutoConfig.from_pretrained(args.model), 16, args.length + 160)
    print(f"one layer, one decoding step of 16 rows at {args.length + 160} tokens: sdpa {base_ms:.1f} ms, ours {gqa_ms:.1f} ms")
    (t0, out0), (t1, out1) = results["baseline"], results["gqa"]
    same = sum(a.text == b.text for a, b in zip(out0, out1, strict=True))
    n = len(requests)
    print(
        f"RESULT gqa_speedup={t0 / t1:.2f} baseline_s_per_prompt={t0 / n:.2f} gqa_s_per_prompt={t1 / n:.2f} "
        f"same_output={same}/{n} layer_decode_speedup={base_ms / gqa_ms:.1f}"
    )


if __name__ == "__main__":
    main()
