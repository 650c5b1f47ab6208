"""Benchmark: which of many distinct recall spans occur in a long prompt (issue 31).

Run: ``.venv/bin/python bench/reward_spans.py`` (one process).

A 500,000-character prompt of random words and 30,000 distinct spans, half copied from the prompt
(3-40 characters), half random 20-character strings that do not occur. The baseline is the
search of each span in the whole prompt (``span in prompt``, what the reward did: time grows as
spans x prompt length); ``rewards.recall.occurring`` indexes the prompt once. Both give the same
answer (checked); best of 3 each, in the same run.

Last line: ``RESULT direct_s=<s> indexed_s=<s> speedup=<ratio>``.
"""

from __future__ import annotations

import random
import string
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rewards.recall import occurring  # noqa: E402


def main() -> None:
    rng = random.Random(0)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9))) for _ in range(5000)]
    prompt = " ".join(rng.choice(words) for _ in range(80000))[:500_000]
    spans = ["".join(rng.choice(string.ascii_lowercase) for _ in range(20)) for _ in range(15000)]
    for _ in range(15000):
        a = rng.randrange(0, len(prompt) - 40)
        spans.append(prompt[a : a + rng.randint(3, 40)])
    spans = list(dict.fromkeys(spans))

    def best(fn) -> tuple[float, list]:
        times, out = [], None
        for _ in range(3):
            t = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t)
        return min(times), out

    direct_s, expected = best(lambda: [s for s in spans if s in prompt])
    indexed_s, got = best(lambda: occurring(prompt, spans))
    assert got == expected, "the index disagrees with the direct search"
    print(f"{len(spans)} distinct spans, prompt {len(prompt)} characters, {len(expected)} occur")
    print(f"RESULT direct_s={direct_s:.2f} indexed_s={indexed_s:.2f} speedup={direct_s / indexed_s:.1f}")


if __name__ == "__main__":
    main()
