"""Benchmark: speculative decoding inside recall spans vs plain decoding (``recallm.generation.generate``).

Run: ``.venv/bin/python bench/span_speculation.py`` (``--quick`` for a short smoke run; ``--model DIR``
for a RecaLLM model directory instead of the embedded tiny model, e.g. SmolLM2 from ``make smollm2``).

What is compared, in one process, runs interleaved, medians of ``--repeats``:

* **plain**: ``generate(..., span_draft_tokens=0)`` — Hugging Face ``generate``, one token per forward pass;
* **speculative**: ``generate(...)`` with its default ``span_draft_tokens`` — inside a span the matcher's
  continuation is drafted and verified in one forward pass (``recallm.decoding``).

The workload is responses with long recall spans: prompts of toy words (a key-value-like context, one
token per word), spans forced open every ``--every`` tokens outside spans and closed after ``--length``
tokens (``force``, the test and demo aid). An untrained model ends a span after a token or two on its own,
which a trained model copying a passage does not: the model's ``<|end_recall|>`` logit is lowered by
``--end-bias`` (a forward hook on the output layer, applied in both runs), so that a span runs until it is
forced closed or its context runs out — a stand-in for a trained model's long copies. Greedy and sampled
(temperature 1, one seed per request) decoding; batch sizes 1 and ``--batch``.

Printed: end-to-end tokens/s of both and their ratio; for batch 1, tokens/s inside spans (the decoding
steps whose every token was generated inside a span, timed step by step through ``generate``'s
``progress`` callback) and outside them; the same on responses without spans (the speculative decoder's
own loop against ``generate``'s, nothing to draft); and whether both gave the same tokens (they must:
``tokens_equal=1``). The last line is
``RESULT span_tokens_per_s_ratio=... end_to_end_ratio_greedy=... end_to_end_ratio_sampled=...
end_to_end_ratio_batch=... no_span_ratio=... tokens_equal=...`` (ratios: speculative / plain).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _load(model_dir: str | None, tmp: Path):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers import logging as hf_logging

    import recallm.modeling  # noqa: F401
    from recallm.tiny import create_tiny
    from recallm.tokens import RecallTokenIds, load_tokenizer

    hf_logging.set_verbosity_error()
    path = Path(model_dir) if model_dir else create_tiny(tmp / "tiny")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(path)
    return model, tokenizer, RecallTokenIds.from_pretrained(model.config, tokenizer)


def _prompts(tokenizer, n: int, words: int, seed: int) -> list[tuple[int, ...]]:
    import random

    from recallm.tiny import TOY_VALUES

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lines = [
            f"{rng.randrange(1000)}: {' '.join(rng.choice(TOY_VALUES) for _ in range(5))}" for _ in range(words // 6)
        ]
        text = "find the values below and copy them\n" + "\n".join(lines) + "\nanswer:"
        out.append(tuple(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def _in_span_flags(prompt, output, start: int, end: int) -> list[bool]:
    """For every generated token: was it generated inside a span (the matcher's state before it)?"""
    inside = bool(prompt) and prompt[-1] == start
    flags = []
    for token in output:
        flags.append(inside)
        if inside and token == end:
            inside = False
        elif not inside and token == start:
            inside = True
    return flags


def _run(model, tokenizer, requests, *, force, drafts, batch):
    from recallm.generation import generate

    stamps: list[tuple[float, int]] = []

    def progress(tokens: int, finished: int) -> None:
        stamps.append((time.perf_counter(), tokens))

    kwargs = {} if drafts is None else {"span_draft_tokens": drafts}
    started = time.perf_counter()
    out = generate(model, requests, tokenizer=tokenizer, force=force, batch_size=batch, progress=progress, **kwargs)
    return time.perf_counter() - started, out, started, stamps


def _split(prompt, output, started, stamps, ids) -> tuple[float, int, float, int]:
    """Batch of one: (seconds, tokens) of the steps entirely inside spans and of the other steps after
    the first (the first step holds the prompt's forward pass)."""
    flags = _in_span_flags(prompt, output.token_ids, ids.start, ids.end)
    span_t = span_n = out_t = out_n = 0
    done = 0
    previous = started
    for i, (stamp, tokens) in enumerate(stamps):
        step = flags[done : done + tokens]
        if i > 0 and step:
            if all(step):
                span_t, span_n = span_t + stamp - previous, span_n + len(step)
            elif not any(step):
                out_t, out_n = out_t + stamp - previous, out_n + len(step)
        done += tokens
        previous = stamp
    return span_t, span_n, out_t, out_n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a RecaLLM model directory (default: the tiny model)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=192)
    parser.add_argument("--prompt-words", type=int, default=300)
    parser.add_argument("--every", type=int, default=8)
    parser.add_argument("--length", type=int, default=48)
    parser.add_argument("--end-bias", type=float, default=8.0)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.quick:
        args.repeats, args.new_tokens = 2, 64

    import torch

    from recallm.generation import GenRequest
    from recallm.tokens import DEFAULT_SPAN_DRAFT_TOKENS

    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer, ids = _load(args.model, Path(tmp))
    lowered = torch.tensor([ids.end])

    def end_bias(module, inputs, output):
        return output.index_add(-1, lowered.to(output.device), torch.full((*output.shape[:-1], 1), -args.end_bias))

    model.get_output_embeddings().register_forward_hook(end_bias)
    force = (args.every, args.length)
    prompts = _prompts(tokenizer, args.batch, args.prompt_words, seed=0)
    print(
        f"model: {args.model or 'tiny'}; prompts of {[len(p) for p in prompts]} tokens, {args.new_tokens} new; "
        f"spans forced every {args.every}, closed after {args.length}; end-of-span logit -{args.end_bias}; "
        f"span_draft_tokens={DEFAULT_SPAN_DRAFT_TOKENS}; torch threads {torch.get_num_threads()}"
    )

    def requests(temperature: float, n: int) -> list[GenRequest]:
        return [
            GenRequest(p, args.new_tokens, temperature=temperature, seed=100 + i) for i, p in enumerate(prompts[:n])
        ]

    cases = {
        "greedy": (requests(0.0, 1), force),
        "sampled": (requests(1.0, 1), force),
        f"batch{args.batch}": (requests(1.0, args.batch), force),
        "no_span": (requests(1.0, 1), None),
    }
    equal = True
    ratios: dict[str, float] = {}
    span_rates: dict[str, list[float]] = {"plain": [], "speculative": []}
    for name, (reqs, forced) in cases.items():
        for drafts in (0, None):  # warm-up
            _run(model, tokenizer, reqs, force=forced, drafts=drafts, batch=len(reqs))
        times: dict[str, list[float]] = {"plain": [], "speculative": []}
        spans = {"plain": [0.0, 0, 0.0, 0], "speculative": [0.0, 0, 0.0, 0]}
        outputs = {}
        for _ in range(args.repeats):
            for label, drafts in (("plain", 0), ("speculative", None)):
                seconds, out, started, stamps = _run(
                    model, tokenizer, reqs, force=forced, drafts=drafts, batch=len(reqs)
                )
                times[label].append(seconds)
                outputs.setdefault(label, [o.token_ids for o in out])
                equal &= outputs[label] == [o.token_ids for o in out]
                if len(reqs) == 1 and forced is not None:
                    split = _split(reqs[0].prompt_ids, out[0], started, stamps, ids)
                    spans[label] = [a + b for a, b in zip(spans[label], split, strict=True)]
        equal &= outputs["plain"] == outputs["speculative"]
        n_tokens = sum(len(t) for t in outputs["plain"])
        plain, spec = statistics.median(times["plain"]), statistics.median(times["speculative"])
        ratios[name] = plain / spec
        in_spans = sum(
            f
            for r, o in zip(reqs, outputs["plain"], strict=True)
            for f in _in_span_flags(r.prompt_ids, o, ids.start, ids.end)
        )
        print(
            f"{name:9} {n_tokens} tokens ({in_spans} inside spans): plain {n_tokens / plain:8.1f} tok/s, "
            f"speculative {n_tokens / spec:8.1f} tok/s, ratio {ratios[name]:.2f}"
        )
        if len(reqs) == 1 and forced is not None:
            for label in ("plain", "speculative"):
                span_t, span_n, out_t, out_n = spans[label]
                rate = span_n / span_t if span_t else float("nan")
                span_rates[label].append(rate)
                print(
                    f"          {label:11} inside spans {rate:8.1f} tok/s ({span_n} tokens), "
                    f"outside {out_n / out_t if out_t else float('nan'):8.1f} tok/s ({out_n} tokens)"
                )
    span_ratio = statistics.fmean(s / p for s, p in zip(span_rates["speculative"], span_rates["plain"], strict=True))
    print(
        f"RESULT span_tokens_per_s_ratio={span_ratio:.2f} end_to_end_ratio_greedy={ratios['greedy']:.2f} "
        f"end_to_end_ratio_sampled={ratios['sampled']:.2f} end_to_end_ratio_batch={ratios[f'batch{args.batch}']:.2f} "
        f"no_span_ratio={ratios['no_span']:.2f} tokens_equal={int(equal)}"
    )


if __name__ == "__main__":
    main()
