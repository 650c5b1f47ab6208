"""Benchmark: the recall matcher vs the naive rescan, and generate with vs without the processor.

Run: ``.venv/bin/python bench/recall_mask.py`` (``--quick`` for a short smoke run).

1. Per decoding step inside a recall span, the cost of producing the allowed set *and the
   vocab-sized boolean mask row*, for contexts of 4K, 32K and 128K tokens drawn from a Zipf
   distribution over a 152K vocabulary, with 64-token spans copied from random positions:
   * ours: ``RecallMatcher`` (index built once, survivors filtered per token);
   * naive (the paper's, App. B.1): at every step rescan the whole context for every
     occurrence of the span so far (a vectorised sliding-window compare, O(context x span));
   * also shown: a cheaper rescan that filters by the first token, then verifies (O(context)).
   All three produce identical mask rows (checked on every measured step).
2. ``generate`` of 256 new tokens on a 2K-token prompt with the tiny model, spans forced open
   (``ForceRecallSpans``, every 16 tokens, 32 long) in both runs; with vs without the
   ``RecallLogitsProcessor``. Runs are interleaved and the medians compared. The processor's own
   time per step is printed too: on a 2-core CPU the measured gap is larger than that time
   (numpy work between torch ops lets torch's worker threads fall asleep; waking them costs).

The last line is ``RESULT speedup_vs_naive_128k=... step_us_128k=... index_ms_128k=... generate_ratio=...``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recallm.recall.matcher import RecallMatcher  # noqa: E402

VOCAB = 152_064
SPAN = 64
START, END = VOCAB - 2, VOCAB - 1


def zipf_context(rng: np.random.Generator, n: int) -> np.ndarray:
    out = np.empty(0, dtype=np.int64)
    while out.size < n:
        draw = rng.zipf(1.1, size=2 * n)
        out = np.concatenate((out, draw[draw < START] - 1))
    return out[:n].astype(np.int64)


def naive_row(context: np.ndarray, prefix: np.ndarray, row: np.ndarray) -> None:
    """Allowed set by rescanning the whole context for the prefix (O(M * k))."""
    k = prefix.size
    row[:] = False
    if k == 0:
        row[context] = True
    elif k < context.size:
        windows = np.lib.stride_tricks.sliding_window_view(context, k)[: context.size - k]
        hits = np.flatnonzero((windows == prefix).all(axis=1))
        row[context[hits + k]] = True
    row[START] = False
    row[END] = True


def first_token_row(context: np.ndarray, prefix: np.ndarray, row: np.ndarray) -> None:
    """A cheaper rescan: positions of the first token (O(M)), then verify the rest."""
    k = prefix.size
    row[:] = False
    if k == 0:
        row[context] = True
    else:
        cand = np.flatnonzero(context[: context.size - k] == prefix[0])
        for j in range(1, k):
            cand = cand[context[cand + j] == prefix[j]]
        row[context[cand + k]] = True
    row[START] = False
    row[END] = True


def bench_length(rng, n: int, n_spans: int, n_naive_spans: int) -> dict[str, float]:
    context = zipf_context(rng, n)
    t0 = time.perf_counter()
    matcher = RecallMatcher(START, END, vocab_size=VOCAB)
    matcher.feed(context)
    t1 = time.perf_counter()
    matcher.feed_one(START)  # opens the span: builds the token -> positions index
    t2 = time.perf_counter()
    index_ms = (t2 - t0) * 1e3
    ours: list[float] = []
    ours_naive_spans: list[float] = []
    naive: list[float] = []
    first: list[float] = []
    row = np.zeros(VOCAB, dtype=bool)
    check = np.zeros(VOCAB, dtype=bool)
    for s in range(n_spans):
        src = int(rng.integers(0, n - SPAN))
        span = context[src : src + SPAN]
        m = RecallMatcher(START, END, vocab_size=VOCAB)
        m.feed(context)
        m.feed_one(START)
        steps = []
        for k in range(SPAN):  # ours, timed on its own (no other work between steps)
            a = time.perf_counter()
            m.fill_mask_row(row)
            m.feed_one(int(span[k]))
            steps.append(time.perf_counter() - a)
        ours.extend(steps)
        if s >= n_naive_spans:
            continue
        ours_naive_spans.extend(steps)
        for k in range(SPAN):  # the baselines over the same steps
            a = time.perf_counter()
            naive_row(context, span[:k], check)
            naive.append(time.perf_counter() - a)
        for k in range(SPAN):
            a = time.perf_counter()
            first_token_row(context, span[:k], check)
            first.append(time.perf_counter() - a)
        # untimed: all three give the same mask row at every step
        m = RecallMatcher(START, END, vocab_size=VOCAB)
        m.feed(context)
        m.feed_one(START)
        for k in range(SPAN):
            m.fill_mask_row(row)
            naive_row(context, span[:k], check)
            assert np.array_equal(row, check), f"naive and matcher rows differ at n={n} k={k}"
            first_token_row(context, span[:k], check)
            assert np.array_equal(row, check), f"first-token and matcher rows differ at n={n} k={k}"
            m.feed_one(int(span[k]))
    return {
        "n": n,
        "index_ms": index_ms,
        "feed_ms": (t1 - t0) * 1e3,
        "step_us_median": statistics.median(ours) * 1e6,
        "step_us_mean": statistics.fmean(ours) * 1e6,
        "step_us_max": max(ours) * 1e6,
        "naive_us_mean": statistics.fmean(naive) * 1e6,
        "first_us_mean": statistics.fmean(first) * 1e6,
        "speedup_naive": sum(naive) / sum(ours_naive_spans),
        "speedup_first": sum(first) / sum(ours_naive_spans),
    }


def bench_generate(n_prompt: int, n_new: int, repeats: int) -> dict[str, float]:
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM
    from transformers import logging as hf_logging

    import recallm.modeling  # noqa: F401
    from recallm.recall import ForceRecallSpans, RecallLogitsProcessor, find_spans
    from recallm.tiny import create_tiny
    from recallm.tokens import RecallTokenIds, load_tokenizer

    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        path = create_tiny(Path(tmp) / "tiny")
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        tokenizer = load_tokenizer(path)
    ids = RecallTokenIds.from_config(model.config)
    rng = np.random.default_rng(0)
    words = [i for i in range(ids.start) if i not in tokenizer.all_special_ids]
    prompt = torch.tensor([rng.choice(words, size=n_prompt).tolist()])

    class TimedRecall(RecallLogitsProcessor):
        spent = 0.0

        def __call__(self, input_ids, scores):
            t = time.perf_counter()
            out = super().__call__(input_ids, scores)
            TimedRecall.spent += time.perf_counter() - t
            return out

    def run(constrained: bool) -> tuple[float, list[int]]:
        procs = []
        if constrained:
            procs.append(TimedRecall.from_config(model.config))
        procs.append(ForceRecallSpans(ids.start, ids.end, every=16, length=32))
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                logits_processor=procs,
                recall_constrained=constrained,
                max_new_tokens=n_new,
                min_new_tokens=n_new,
                do_sample=False,
            )
        return time.perf_counter() - t, out[0].tolist()

    run(True), run(False)  # warm-up
    TimedRecall.spent = 0.0
    with_t, without_t = [], []
    seq_with = None
    for _ in range(repeats):
        t, seq_with = run(True)
        with_t.append(t)
        t, _ = run(False)
        without_t.append(t)
    spans = find_spans(seq_with, ids.start, ids.end)
    in_span = sum(len(s.tokens) for s in spans)
    assert spans and all(s.verbatim for s in spans), "constrained spans must be verbatim"
    return {
        "with_s": statistics.median(with_t),
        "without_s": statistics.median(without_t),
        "ratio": statistics.median(without_t) / statistics.median(with_t),
        "proc_us_per_step": TimedRecall.spent / (repeats * n_new) * 1e6,
        "spans": len(spans),
        "span_tokens": in_span,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer spans and repeats (smoke run)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths = [4096, 32768, 131072]
    spans, naive_spans, repeats = (4, 1, 2) if args.quick else (30, 3, 7)
    results = {}
    print(
        f"{'context':>8} {'index ms':>9} {'step us med':>12} {'mean':>8} {'max':>9} "
        f"{'naive us':>10} {'x naive':>8} {'1st-tok us':>11} {'x 1st-tok':>9}"
    )
    for n in lengths:
        r = bench_length(rng, n, spans, naive_spans)
        results[n] = r
        print(
            f"{n:>8} {r['index_ms']:>9.2f} {r['step_us_median']:>12.1f} {r['step_us_mean']:>8.1f} "
            f"{r['step_us_max']:>9.1f} {r['naive_us_mean']:>10.0f} {r['speedup_naive']:>8.0f} "
            f"{r['first_us_mean']:>11.0f} {r['speedup_first']:>9.1f}"
        )
    print(
        "(index ms = copy the context into the matcher + build the token->positions index at the span start;"
        " step = allowed set + 152K mask row + advance; x = total time ratio over the same steps)"
    )
    g = bench_generate(2048, 256, repeats)
    print(
        f"generate 256 tokens on a 2K prompt (tiny model, spans forced in both runs): "
        f"with processor {g['with_s']:.3f} s, without {g['without_s']:.3f} s; "
        f"{g['spans']} spans, {g['span_tokens']} tokens inside spans, all verbatim; "
        f"the processor's own time {g['proc_us_per_step']:.0f} us/step"
    )
    big = results[131072]
    print(
        f"RESULT speedup_vs_naive_128k={big['speedup_naive']:.0f} step_us_128k={big['step_us_median']:.1f} "
        f"index_ms_128k={big['index_ms']:.2f} generate_ratio={g['ratio']:.3f}"
    )


if __name__ == "__main__":
    main()
