"""The SmolLM2 suite's prompts at one length, for the evaluation benchmarks (``bench/eval_speed.py``,
``bench/gqa_attention.py``): their shared command line and their shared setup."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

DEFAULT_MODEL = Path.home() / ".cache" / "recallm" / "models" / "smollm2-135m-instruct-recallm"


def parser(description: str, per_task: int) -> argparse.ArgumentParser:
    """``--model``, ``--length``, ``--per-task``, ``--max-new-tokens``, ``--threads``."""
    out = argparse.ArgumentParser(description=description)
    out.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    out.add_argument("--length", type=int, default=2048)
    out.add_argument("--per-task", type=int, default=per_task, help="prompts of each of the 3 tasks")
    out.add_argument("--max-new-tokens", type=int, default=160)
    out.add_argument("--threads", type=int, default=int(os.environ.get("RECALLM_NUM_THREADS", "0")) or None)
    return out


def suite_prompts(args: argparse.Namespace):
    """``(benchmark, examples, requests, tokenizer)``: the suite's three tasks (``configs/eval/smollm2.yaml``) at
    ``args.length``, ``args.per_task`` prompts each, rendered for ``args.model``; sets the thread count."""
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"error: {args.model} is not a model directory (make smollm2, or --model DIR)")
    import torch
    import yaml

    if args.threads:
        torch.set_num_threads(args.threads)
    from data_gen.fit import PromptRenderer
    from recallm.eval.benchmarks import make_benchmarks
    from recallm.eval.types import TextRequest
    from recallm.paths import CONFIG_DIR
    from recallm.tokens import load_tokenizer

    suite = yaml.safe_load((CONFIG_DIR / "eval" / "smollm2.yaml").read_text())
    suite["benchmarks"]["synthetic"].update(lengths=[args.length], per_cell=args.per_task)
    suite["benchmarks"]["in_domain"]["enabled"] = False
    suite["generation"]["max_new_tokens"] = args.max_new_tokens
    (bench,) = make_benchmarks(suite)
    tok = load_tokenizer(args.model)
    renderer = PromptRenderer(tok, suite.get("system_prompt"))
    examples = [bench.build(spec, renderer) for spec in sorted(bench.specs(), key=lambda s: (s.task, s.index))]
    requests = [TextRequest(e.prompt_text, None, args.max_new_tokens) for e in examples]
    return bench, examples, requests, tok
