"""`recallm-export`: turn a verl GRPO checkpoint into a Hugging Face RecaLLM model directory.

recallm-export --checkpoint outputs/grpo/tiny_cpu --out outputs/grpo/tiny_cpu/hf
recallm-export --checkpoint outputs/grpo/tiny_cpu/global_step_20 --out model-step20
recallm-export --checkpoint /runs/grpo-llama --step 60 --out /runs/grpo-llama/hf-step60   (App. D.3's step)

argparse, not Hydra (``recallm.cli.common``): a one-shot conversion of one checkpoint, three
flags and no recipe settings or config tree to compose.
"""

from __future__ import annotations

import argparse
import sys

from recallm.errors import cli_errors
from recallm.io import check_out_dir


@cli_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="recallm-export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="run directory, global_step_N directory or its actor dir")
    parser.add_argument(
        "--step",
        type=int,
        default=None,
        help="with a run directory: export global_step_STEP instead of the newest (e.g. 60 for the Llama recipe)",
    )
    parser.add_argument("--out", required=True, help="output directory (must be empty or new)")
    args = parser.parse_args(argv)
    from recallm.grpo.export import export_checkpoint
    from recallm.modeling import check_recallm_model

    check_out_dir(args.out, "--out")
    if args.step is not None and args.step < 1:
        parser.error(f"--step must be a positive step number, got {args.step}")
    out = export_checkpoint(args.checkpoint, args.out, step=args.step)
    print(f"wrote {out}")
    for key, value in check_recallm_model(out).items():
        print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
