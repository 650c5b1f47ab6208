"""Benchmark: the composite reward over one paper GRPO step vs a plain exact-match scorer.

Run: ``.venv/bin/python bench/rewards.py`` (one process, one core).

One GRPO step of the paper is 128 prompts x 16 rollouts = 2,048 responses. Prompts are ~8K
tokens (~32K characters of documents), each with 2-6 gold passages; responses are ~4K tokens
(~16K characters) of reasoning with 0-12 recall spans copied from the prompt (from gold
passages or elsewhere), then ``Answer:``; the ten categories are mixed. The baseline scores the
same responses with a plain exact match of the text after ``Answer:``. Both are timed over the
whole step (best of 3).

Last line: ``RESULT responses_per_s=<x> cost_vs_exact_match=<ratio>``.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--rollouts", type=int, default=16)
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


if __name__ == "__main__":
    main()
