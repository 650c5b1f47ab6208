"""`recallm-export`: turn a verl GRPO checkpoint into a Hugging Face RecaLLM model directory.

recallm-export --checkpoint outputs/grpo/tiny_cpu --out outputs/grpo/tiny_cpu/hf
recallm-export --checkpoint outputs/grpo/tiny_cpu/global_step_20 --out model-step20
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
    parser.add_argument("--out", required=True, help="output directory (must be empty or new)")
    args = parser.parse_args(argv)
    from recallm.grpo.export import export_checkpoint
    from recallm.modeling import check_recallm_model

    check_out_dir(args.out, "--out")
    out = export_checkpoint(args.checkpoint, args.out)
    print(f"wrote {out}")
    for key, value in check_recallm_model(out).items():
        print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
