"""Benchmark: the composite reward over one paper GRPO step vs a plain exact-match scorer.

Run: ``.venv/bin/python bench/rewards.py`` (one process, one core).

One GRPO step of the paper is 128 prompts x 16 rollouts = 2,048 responses. Prompts are ~8K
tokens (~32K characters of documents), each with 2-6 gold passages; responses are ~4K tokens
(~16K characters) of reasoning with 0-12 recall spans copied from the prompt (from gold
passages or elsewhere), then ``Answer:``; the ten categories are mixed. The baseline scores the
same responses with a plain exact match of the text after ``Answer:``. Both are timed over the
whole step (best of 3).

Adversarial row (issue 18): responses of ``--adversarial-chars`` (40,000) characters built to hit
the worst case of every parser — a 40K-character citation answer without brackets, a 40K run of
spaces in a list answer, 5,700 ``\\boxed{`` in a row, 40K ``<``, 20K distinct list items, 1,300
tiny recall spans against 26 gold passages, one 40K-character span, 5,000 ``Answer:`` markers,
40K digits... Each is scored with ``score_response`` (best of 5, in CPU time of this process, so
that other processes on a shared machine inflate it little); the worst must stay under 50 ms.
Same-run baselines: the mean CPU time of a typical response of the step above (256 of them), and
the three regular expressions the parsers used before (quadratic) on the same kind of input at a
tenth of the length (4,000 characters; at 40K they take minutes).

Last lines: ``RESULT responses_per_s=<x> cost_vs_exact_match=<ratio>`` and ``RESULT
adversarial_worst_ms=<ms> adversarial_vs_typical=<ratio> old_regexes_4k_ms=<ms>``.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_gen.base import CATEGORIES  # noqa: E402
from rewards import load_reward_config, score_response  # noqa: E402
from rewards.metrics import exact_match  # noqa: E402

CHARS_PER_TOKEN = 4


def _words(rng: random.Random, n: int, vocab: list[str]) -> str:
    return " ".join(rng.choice(vocab) for _ in range(n))


def make_prompt(rng: random.Random, vocab: list[str], n_docs: int = 40, prompt_tokens: int = 8192):
    """~prompt_tokens tokens of numbered documents; returns (text, doc spans [(start, end)])."""
    per_doc = prompt_tokens * CHARS_PER_TOKEN // n_docs // 6  # ~6 characters per word
    text, docs = "Read the documents and answer the question.\n\n", []
    for i in range(1, n_docs + 1):
        text += f"Document [{i}]: "
        body = _words(rng, per_doc, vocab) + "."
        docs.append((len(text), len(text) + len(body)))
        text += body + "\n"
    return text + "\nQuestion: which documents matter?\n", docs


def make_ground_truth(rng: random.Random, category: str, prompt: str, docs):
    n_gold = rng.randint(2, 6)
    picked = rng.sample(range(len(docs)), n_gold)
    gold = [{"text": prompt[s:e], "start": s, "end": e} for s, e in (docs[i] for i in picked)]
    answers = [prompt[docs[picked[0]][0] : docs[picked[0]][0] + 12].split()[0]]
    gt = {"category": category, "answers": answers, "gold": gold}
    if category in ("long_doc_qa",):
        gt["choices"] = ["alpha", "beta", "gamma", "delta"]
        gt["answers"] = ["B"]
    if category == "reranking":
        gt["relevance"] = {str(i + 1): rng.randint(1, 3) for i in picked}
        gt["doc_ids"] = [str(i + 1) for i in range(len(docs))]
    if category == "entity_citation":
        gt["entities"] = [
            {"answers": [prompt[s : s + 8].split()[0]], "docs": [str(i + 1)]}
            for i, (s, _) in zip(picked, (docs[i] for i in picked), strict=True)
        ]
    return gt, picked


def make_response(rng: random.Random, vocab: list[str], prompt: str, docs, picked, gt, response_tokens=4096) -> str:
    n_spans = rng.randint(0, 12)
    chunks = []
    budget = response_tokens * CHARS_PER_TOKEN
    for _ in range(n_spans):
        s, e = docs[rng.choice(picked)] if rng.random() < 0.6 else docs[rng.randrange(len(docs))]
        a = rng.randint(s, max(s, e - 40))
        chunks.append(_words(rng, rng.randint(20, 80), vocab))
        chunks.append(f"<|start_recall|>{prompt[a : a + rng.randint(10, 200)]}<|end_recall|>")
    text = " ".join(chunks)
    filler = budget - len(text)
    if filler > 0:
        text = _words(rng, filler // 6, vocab) + " " + text
    category = gt["category"]
    answer = {
        "reranking": " > ".join(f"[{i + 1}]" for i in picked),
        "entity_citation": ", ".join(f"{e['answers'][0]} [{e['docs'][0]}]" for e in gt.get("entities", [])),
        "long_doc_qa": rng.choice("ABCD"),
    }.get(category, gt["answers"][0] if rng.random() < 0.7 else rng.choice(vocab))
    return f"{text}</think>\nAnswer: {answer}"


_ANSWER = re.compile(r"Answer:\s*(.*)\Z", re.DOTALL)


def plain_exact_match(response: str, ground_truth) -> float:
    m = _ANSWER.search(response)
    return exact_match(m.group(1).strip() if m else None, ground_truth.get("answers") or [])


# the three patterns the parsers used before (issue 18 item 5), kept here as the same-run reference
_OLD_PATTERNS = {
    "citation item": (r"([^\[\]\n;]*?)\s*((?:\[[^\[\]]+\]\s*)+)", lambda n: "a" * n),
    "list split": (r"\s*[\n;,]\s*", lambda n: "a" + " " * n + "b"),
    "boxed": (r"\\boxed\s*\{(.*)\}", lambda n: "\\boxed{" * (n // 7)),
}


def _old_regex_ms(n_chars: int) -> dict[str, float]:
    out = {}
    for name, (pattern, make) in _OLD_PATTERNS.items():
        regex, text = re.compile(pattern, re.DOTALL), make(n_chars)
        t = time.perf_counter()
        if name == "citation item":
            list(regex.finditer(text))
        elif name == "list split":
            regex.split(text)
        else:
            regex.search(text)
        out[name] = (time.perf_counter() - t) * 1e3
    return out


def adversarial_cases(rng: random.Random, vocab: list[str], n_chars: int = 40_000):
    """(name, response, ground truth, prompt text, data source) of responses built to hit each parser's
    worst case; every response is about ``n_chars`` characters long."""
    prompt, docs = make_prompt(rng, vocab, n_docs=40)
    golds = [{"text": prompt[s:e], "start": s, "end": e} for s, e in docs[:26]]
    relevance = {str(i + 1): 1 + i % 3 for i in range(26)}
    doc_ids = [str(i + 1) for i in range(len(docs))]
    entities = [{"answers": [vocab[i]], "docs": [str(i + 1)]} for i in range(20)]
    truth = {
        "citation": {"category": "entity_citation", "entities": entities, "gold": golds[:20]},
        "list": {"category": "aggregation", "answers": [vocab[i] for i in range(10)]},
        "math": {"category": "short_math", "answers": ["12"]},
        "qa": {"category": "single_hop_qa", "answers": [vocab[0]], "gold": golds[:1]},
        "rank": {"category": "reranking", "relevance": relevance, "doc_ids": doc_ids, "gold": golds},
        "retrieval": {"category": "retrieval", "answers": [vocab[1]], "gold": golds[:6]},
    }
    head = "<think>\nreasoning</think>\nAnswer: "
    fill = n_chars - len(head)
    spans_per = len("<|start_recall|>") + len("<|end_recall|>") + 3
    tiny_spans = "".join(
        f"<|start_recall|>{prompt[s + i % 20 : s + i % 20 + 3]}<|end_recall|>"
        for i, (s, _) in zip(range(fill // spans_per), (docs[i % 26] for i in range(10**9)), strict=False)
    )
    big_span = "<|start_recall|>" + prompt[: fill - 40] + "<|end_recall|>"
    items = ", ".join(f"w{i}" for i in range(fill // 6))
    cases = [
        ("citation: letters, no bracket", head + "a" * fill, "citation", None),
        ("citation: unclosed brackets", head + "[a" * (fill // 2), "citation", None),
        ("citation: 8K citations", head + "x [1], " * (fill // 7), "citation", None),
        ("list: run of spaces", head + "a" + " " * (fill - 2) + "b", "list", None),
        ("list: distinct items", head + items, "list", None),
        ("list: one item repeated", head + (vocab[0] + ", ") * (fill // (len(vocab[0]) + 2)), "list", None),
        ("math: \\boxed{ repeated", head + "\\boxed{" * (fill // 7), "math", None),
        ("math: digits / digits", head + "1" * (fill // 2) + "/" + "7" * (fill // 2 - 1), "math", None),
        ("markers: '<' everywhere", "<" * n_chars, "qa", None),
        ("markers: unpaired starts", "<|start_recall|>" * (n_chars // 16), "qa", None),
        ("markers: 5,000 Answer:", "</think>" + "Answer: " * (fill // 8), "qa", None),
        ("recall: 1,300 tiny spans", tiny_spans + "</think>\nAnswer: [1] > [2]", "rank", None),
        ("recall: one prompt-long span", big_span + "</think>\nAnswer: x", "retrieval", None),
        ("ranking: 8K ids", head + " > ".join(f"[{i % 40}]" for i in range(fill // 6)), "rank", None),
        ("niah list: run of spaces", head + "a" + " " * (fill - 2) + "b", "retrieval", "multi_niah"),
    ]
    return [(name, response[:n_chars], truth[kind], prompt, source) for name, response, kind, source in cases]


def run_adversarial(rng, vocab, config, n_chars: int, typical_s: float) -> None:
    worst = ("", 0.0)
    print(f"\nadversarial responses, {n_chars:,} characters each (CPU time of this process, best of 5):")
    for name, response, gt, prompt, source in adversarial_cases(rng, vocab, n_chars):
        best = float("inf")
        for _ in range(5):
            t = time.process_time()
            b = score_response(
                response,
                gt,
                prompt_text=prompt,
                n_tokens=len(response) // CHARS_PER_TOKEN,
                data_source=source,
                config=config,
            )
            best = min(best, time.process_time() - t)
        assert 0.0 <= b.score <= 1.0
        print(
            f"  {name:32} {len(response):>7,} chars {best * 1e3:8.2f} ms  ({best / typical_s:6.1f}x a typical response)"
        )
        worst = max(worst, (name, best), key=lambda x: x[1])
    old = _old_regex_ms(n_chars // 10)
    print(
        f"before (quadratic regexes alone, {n_chars // 10:,} characters): "
        + ", ".join(f"{k} {v:.0f} ms" for k, v in old.items())
    )
    verdict = "within" if worst[1] <= 0.050 else "OVER"
    print(f"worst: {worst[0]} {worst[1] * 1e3:.2f} ms ({verdict} the 50 ms budget)")
    print(
        f"RESULT adversarial_worst_ms={worst[1] * 1e3:.2f} adversarial_vs_typical={worst[1] / typical_s:.1f} "
        f"old_regexes_4k_ms={sum(old.values()):.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--adversarial-chars", type=int, default=40_000)
    args = parser.parse_args()
    rng = random.Random(0)
    vocab = [
        "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(1, 4)))
        for _ in range(5000)
    ]
    items = []
    for p in range(args.prompts):
        prompt, docs = make_prompt(rng, vocab)
        category = CATEGORIES[p % len(CATEGORIES)]
        gt, picked = make_ground_truth(rng, category, prompt, docs)
        for _ in range(args.rollouts):
            items.append((make_response(rng, vocab, prompt, docs, picked, gt), gt, prompt))
    config = load_reward_config()
    n = len(items)
    mean_chars = sum(len(r) for r, _, _ in items) / n
    mean_spans = sum(r.count("<|start_recall|>") for r, _, _ in items) / n

    def ours() -> list[float]:
        return [
            score_response(r, gt, prompt_text=prompt, n_tokens=len(r) // CHARS_PER_TOKEN, config=config).score
            for r, gt, prompt in items
        ]

    def baseline() -> list[float]:
        return [plain_exact_match(r, gt) for r, gt, _ in items]

    timings = {"ours": [], "baseline": []}
    for _ in range(3):
        for name, fn in (("ours", ours), ("baseline", baseline)):
            t = time.perf_counter()
            scores = fn()
            timings[name].append(time.perf_counter() - t)
            assert len(scores) == n
    t_ours, t_base = min(timings["ours"]), min(timings["baseline"])
    print(
        f"{n} responses ({args.prompts} prompts x {args.rollouts}), mean {mean_chars:,.0f} characters "
        f"(~{mean_chars / CHARS_PER_TOKEN:,.0f} tokens), {mean_spans:.1f} spans; prompts "
        f"~{len(items[0][2]) / CHARS_PER_TOKEN:,.0f} tokens"
    )
    print(
        f"composite reward: {t_ours * 1e3:.0f} ms ({t_ours / n * 1e6:.0f} us/response); "
        f"plain exact match: {t_base * 1e3:.0f} ms ({t_base / n * 1e6:.0f} us/response)"
    )
    print(f"RESULT responses_per_s={n / t_ours:.0f} cost_vs_exact_match={t_ours / t_base:.2f}")
    if args.adversarial_chars:
        sample = items[:: max(1, n // 256)]
        t = time.process_time()
        for r, gt, prompt in sample:
            score_response(r, gt, prompt_text=prompt, n_tokens=len(r) // CHARS_PER_TOKEN, config=config)
        typical = (time.process_time() - t) / len(sample)
        run_adversarial(rng, vocab, config, args.adversarial_chars, typical)


if __name__ == "__main__":
    main()
