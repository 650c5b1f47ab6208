"""Benchmark: an RLM's batched sub-calls vs the same sub-calls made one by one.

Run: ``.venv/bin/python bench/rlm_subcalls.py`` (``--calls``, ``--latency``, ``--pool``).

Two depth-1 RLM runs on the same context, in this process, through the whole stack (the root
loop, the sandboxed REPL process, the pipe protocol, the host's sub-call executor and budget):
the scripted root's code asks a stub sub-model - a fixed ``--latency`` (100 ms) per call - one
question per chunk of the context, ``--calls`` (64) chunks:

* **sequential**: ``[llm_query(p) for p in prompts]`` - one call after another, as the paper's
  implementation does;
* **batched**: ``llm_query_batched(prompts)`` - concurrently on a pool of ``--pool`` (16) slots.

Both runs must end with ``FINAL`` and the same answer. Wall time of each run (sandbox start
included). Last line: ``RESULT batched_speedup=<sequential wall / batched wall>`` (target >= 8
with a pool of 16).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recallm.rlm import RLM, RLMSettings, SandboxLimits, ScriptedModel, SubCallSettings  # noqa: E402

CODE = """```repl
chunks = [context[i * size:(i + 1) * size] for i in range({calls})]
prompts = ['How many words are in this text? ' + c for c in chunks]
{line}
answer = sum(int(a) for a in answers)
print(len(answers), answer)
```
FINAL_VAR("answer")"""


def run(mode: str, calls: int, latency: float, pool: int, context: str) -> tuple[float, str, int]:
    line = "answers = llm_query_batched(prompts)" if mode == "batched" else "answers = [llm_query(p) for p in prompts]"
    root = ScriptedModel([CODE.format(calls=calls, line=line).replace("size", str(len(context) // calls))])
    sub = ScriptedModel(lambda messages: str(len(messages[-1]["content"].split()) - 7), latency_s=latency)
    rlm = RLM(
        root,
        sub,
        settings=RLMSettings(max_depth=1, max_iterations=3),
        subcalls=SubCallSettings(pool_size=pool, timeout_s=30, retries=0),
        sandbox=SandboxLimits(wall_s=600, cpu_s=600),
    )
    start = time.perf_counter()
    result = rlm.run(context, "How many words are there in total?")
    wall = time.perf_counter() - start
    if result.outcome != "final" or len(sub.calls) != calls:
        raise SystemExit(f"{mode} run failed: {result.outcome} ({result.reason}), {len(sub.calls)} sub-calls")
    return wall, str(result.answer), len(sub.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per stub sub-call")
    parser.add_argument("--pool", type=int, default=16)
    args = parser.parse_args()
    context = " ".join(f"word{i}" for i in range(args.calls * 50))
    run("batched", 2, 0.0, args.pool, context)  # warm-up: imports, the bubblewrap probe
    sequential, answer_s, n_s = run("sequential", args.calls, args.latency, args.pool, context)
    batched, answer_b, n_b = run("batched", args.calls, args.latency, args.pool, context)
    if answer_s != answer_b:
        raise SystemExit(f"the two runs disagree: {answer_s} vs {answer_b}")
    ideal = args.calls * args.latency
    print(f"sub-calls: {n_s} per run, {args.latency * 1000:.0f} ms each, pool {args.pool}; answer {answer_b}")
    print(f"sequential: {sequential:.3f}s (sub-call time alone {ideal:.1f}s)")
    print(f"batched:    {batched:.3f}s (ideal {ideal / min(args.pool, args.calls):.2f}s)")
    print(f"RESULT batched_speedup={sequential / batched:.2f}")


if __name__ == "__main__":
    main()
