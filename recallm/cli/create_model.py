"""`recallm-create-model`: turn a local HF causal-LM directory into a RecaLLM model directory.

recallm-create-model --base /models/Qwen2.5-7B-Instruct --out /models/recallm-qwen2.5-7b --yarn-factor 4
recallm-create-model --tiny --out models/tiny            # the embedded tiny default
recallm-create-model --check models/tiny                 # validate an existing directory
"""

from __future__ import annotations

import argparse
import logging
import os

from recallm.errors import RecallmError, cli_errors
from recallm.io import check_out_dir


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recallm-create-model", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--base", help="local Hugging Face model directory (Qwen2, Qwen3, Llama, Mistral)")
    src.add_argument("--tiny", action="store_true", help="build the embedded tiny default instead")
    src.add_argument("--check", metavar="PATH", help="only validate an existing RecaLLM model directory")
    p.add_argument("--out", help="output directory (required with --base and --tiny)")
    p.add_argument("--max-recall-tokens", type=int, default=None, help="tokens allowed in one span (default 128)")
    p.add_argument("--yarn-factor", type=float, default=None, help="set YaRN rope scaling with this factor (paper: 4)")
    p.add_argument("--dtype", default="auto", help="dtype to load and save the weights in (default: as stored)")
    p.add_argument("--untied", action="store_true", help="--tiny: untied input/output embeddings")
    p.add_argument("--seed", type=int, default=0, help="--tiny: weight initialisation seed")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    if not args.verbose:
        import transformers

        transformers.logging.set_verbosity_error()
    from recallm.modeling import check_recallm_model, create_recallm_model

    if args.check:
        summary = check_recallm_model(args.check)
    else:
        if not args.out:
            raise RecallmError("--out is required with --base and --tiny")
        check_out_dir(args.out, "--out")
        if args.base and os.path.isfile(args.base):
            raise RecallmError(f"--base {args.base} is a file, not a directory")
        if args.max_recall_tokens is not None and args.max_recall_tokens < 1:
            raise RecallmError(f"--max-recall-tokens must be >= 1, got {args.max_recall_tokens}")
        if args.tiny:
            from recallm.tiny import create_tiny

            out = create_tiny(args.out, tied=not args.untied, seed=args.seed, max_recall_tokens=args.max_recall_tokens)
        else:
            out = create_recallm_model(
                args.base,
                args.out,
                max_recall_tokens=args.max_recall_tokens,
                yarn_factor=args.yarn_factor,
                dtype=args.dtype,
            )
        summary = check_recallm_model(out)
        print(f"wrote {out}")
    for key, value in summary.items():
        print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
