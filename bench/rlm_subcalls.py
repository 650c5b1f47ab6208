"""Benchmark: an RLM's batched sub-calls vs the same sub-calls made one by one.

Run: ``.venv/bin/python bench/rlm_subcalls.py`` (``--sub scripted|hf|both``, ``--calls``,
``--latency``, ``--pool``, ``--hf-calls``, ``--hf-tokens``).

Depth-1 RLM runs on the same context, in this process, through the whole stack (the root loop,
the sandboxed REPL process, the pipe protocol, the host's call pool and budget): the scripted
root's code asks the sub-model one question per chunk of the context:

* **sequential**: ``[llm_query(p) for p in prompts]`` - one call after another, as the paper's
  implementation does;
* **batched**: ``llm_query_batched(prompts)`` - all in the pool at once.

Two sub-models, each with its own sequential baseline measured in the same run:

* ``scripted`` - a stub with a fixed ``--latency`` (100 ms) per call, ``--calls`` (64) chunks, a
  pool of ``--pool`` (16): what concurrency alone buys (a server that serves calls in parallel).
  Both runs must end with ``FINAL`` and the same answer. ``RESULT batched_speedup=...``;
* ``hf`` - the tiny model through transformers ``generate`` on this CPU, ``--hf-calls`` (32)
  chunks, ``--hf-tokens`` (16) greedy new tokens each: the batched run's concurrent requests
  reach the engine as a few ``generate`` calls (printed), the sequential run's as one each.
  ``RESULT hf_batched_speedup=...``.

Wall time of each run (sandbox start included). Numbers measured on a loaded, shared machine
are ratios first: both sides of a ratio run back to back in one process.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recallm.rlm import RLM, RLMSettings, SandboxLimits, ScriptedModel, SubCallSettings  # noqa: E402

CODE = """```repl
chunks = [context[i * size:(i + 1) * size] for i in range({calls})]
prompts = ['How many words are in this text? ' + c for c in chunks]
{line}
answer = {combine}
print(len(answers), answer)
```
FINAL_VAR(answer)"""


def _line(mode: str) -> str:
    return "answers = llm_query_batched(prompts)" if mode == "batched" else "answers = [llm_query(p) for p in prompts]"


def run(
    mode: str, root_code: str, sub, calls: int, pool: int, context: str, max_new_tokens: int = 1024
) -> tuple[float, str]:
    root = ScriptedModel([root_code])
    rlm = RLM(
        root,
        sub,
        settings=RLMSettings(max_depth=1, max_iterations=3),
        subcalls=SubCallSettings(pool_size=pool, timeout_s=600, retries=0, max_new_tokens=max_new_tokens),
        sandbox=SandboxLimits(wall_s=600, cpu_s=600),
    )
    start = time.perf_counter()
    result = rlm.run(context, "How many words are there in total?")
    wall = time.perf_counter() - start
    subcalls = [e for e in result.events if e["event"] == "subcall"]
    if result.outcome != "final" or len(subcalls) != calls or any(e["error"] for e in subcalls):
        raise SystemExit(f"{mode} run failed: {result.outcome} ({result.reason}), {len(subcalls)} sub-calls")
    return wall, str(result.answer)


def scripted(args) -> float:
    context = " ".join(f"word{i}" for i in range(args.calls * 50))
    size = len(context) // args.calls

    def code(mode: str, calls: int) -> str:
        return CODE.format(calls=calls, line=_line(mode), combine="sum(int(a) for a in answers)").replace(
            "size", str(size)
        )

    def stub(latency: float) -> ScriptedModel:
        return ScriptedModel(lambda messages: str(len(messages[-1]["content"].split()) - 7), latency_s=latency)

    run("batched", code("batched", 2), stub(0.0), 2, args.pool, context)  # warm-up: imports, the bubblewrap probe
    sequential, answer_s = run("sequential", code("sequential", args.calls), stub(args.latency), args.calls,
                               args.pool, context)  # fmt: skip
    batched, answer_b = run("batched", code("batched", args.calls), stub(args.latency), args.calls, args.pool, context)
    if answer_s != answer_b:
        raise SystemExit(f"the two runs disagree: {answer_s} vs {answer_b}")
    ideal = args.calls * args.latency
    print(f"[scripted] sub-calls: {args.calls} per run, {args.latency * 1000:.0f} ms each, pool {args.pool}; "
          f"answer {answer_b}")  # fmt: skip
    print(f"[scripted] sequential: {sequential:.3f}s (sub-call time alone {ideal:.1f}s)")
    print(f"[scripted] batched:    {batched:.3f}s (ideal {ideal / min(args.pool, args.calls):.2f}s)")
    speedup = sequential / batched
    print(f"RESULT batched_speedup={speedup:.2f}")
    return speedup


def hf(args) -> float:
    from recallm.rlm.models import make_model
    from recallm.tiny import create_tiny

    with tempfile.TemporaryDirectory(prefix="rlm-bench-") as tmp:
        path = create_tiny(Path(tmp) / "tiny", tied=True, seed=0)
        model = make_model(
            {"name": "hf", "model_path": str(path), "recall_constrained": False, "device": "cpu", "dtype": "float32",
             "batch_size": args.hf_calls, "max_new_tokens": args.hf_tokens},  # fmt: skip
            "sub",
        )
        batches: list[int] = []
        generate = model.backend.generate
        model.backend.generate = lambda requests, settings: batches.append(len(requests)) or generate(
            requests, settings
        )
        context = " ".join(f"word{i}" for i in range(args.hf_calls * 40))
        size = len(context) // args.hf_calls

        def code(mode: str, calls: int) -> str:
            return CODE.format(calls=calls, line=_line(mode), combine="len(answers)").replace("size", str(size))

        tokens = args.hf_tokens
        run("batched", code("batched", 2), model, 2, args.pool, context, tokens)  # warm-up
        batches.clear()
        sequential, answer_s = run("sequential", code("sequential", args.hf_calls), model, args.hf_calls,
                                   args.pool, context, tokens)  # fmt: skip
        seq_batches, batches[:] = list(batches), []
        batched, answer_b = run("batched", code("batched", args.hf_calls), model, args.hf_calls, args.pool, context,
                                tokens)  # fmt: skip
        model.close()
    if answer_s != answer_b:
        raise SystemExit(f"the two runs disagree: {answer_s} vs {answer_b}")
    print(f"[hf] tiny model on this CPU: {args.hf_calls} sub-calls per run, {args.hf_tokens} greedy tokens each, "
          f"pool {args.pool}")  # fmt: skip
    print(f"[hf] sequential: {sequential:.3f}s in {len(seq_batches)} generate calls (sizes {sorted(set(seq_batches))})")
    print(f"[hf] batched:    {batched:.3f}s in {len(batches)} generate calls (sizes {batches})")
    speedup = sequential / batched
    print(f"RESULT hf_batched_speedup={speedup:.2f}")
    return speedup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sub", choices=("scripted", "hf", "both"), default="both")
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per stub sub-call")
    parser.add_argument("--pool", type=int, default=16)
    parser.add_argument("--hf-calls", type=int, default=32)
    parser.add_argument("--hf-tokens", type=int, default=16)
    args = parser.parse_args()
    if args.sub in ("scripted", "both"):
        scripted(args)
    if args.sub in ("hf", "both"):
        hf(args)


if __name__ == "__main__":
    main()
