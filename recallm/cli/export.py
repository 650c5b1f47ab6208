"""`recallm-export`: turn a verl GRPO checkpoint into a Hugging Face RecaLLM model directory.

recallm-export --checkpoint outputs/grpo/tiny_cpu --out outputs/grpo/tiny_cpu/hf
recallm-export --checkpoint outputs/grpo/tiny_cpu/global_step_20 --out model-step20
recallm-export --checkpoint /runs/grpo-llama --step 60 --out /runs/grpo-llama/hf-step60   (App. D.3's step)
recallm-export --checkpoint outputs/grpo/tiny_cpu --out model-bf16 --dtype bfloat16
recallm-export --checkpoint outputs/grpo/lora_run --out model-lora --keep-adapter   (base + model-lora/adapter)
recallm-export --checkpoint outputs/sft/tiny_cpu/full/final/adapter --out merged   (a LoRA adapter, merged)

A LoRA run (``actor_rollout_ref.model.lora_rank`` > 0) is exported with its adapter merged into a plain
model directory, or with ``--keep-adapter`` as its base plus ``<out>/adapter``, the adapter alone; both load
in ``recallm-eval`` and ``recallm-serve``. A LoRA adapter directory (``adapter_config.json``, e.g. SFT's
``final/adapter``) given as ``--checkpoint`` is merged into its base.

The weights keep the dtype the model was trained from (its checkpoint's config records it) unless
``--dtype`` says otherwise; the command prints what it wrote.

argparse, not Hydra (``recallm.cli.common``): a one-shot conversion of one checkpoint, four
flags and no recipe settings or config tree to compose.
"""

from __future__ import annotations

import argparse
import sys

from recallm.errors import RecallmError, cli_errors
from recallm.grpo.export import DTYPES
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
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="dtype of the written weights (default: the trained model's, as its checkpoint's config records it)",
    )
    parser.add_argument(
        "--keep-adapter",
        action="store_true",
        help="a LoRA run: write the base model and the adapter alone (<out>/adapter) instead of merging them",
    )
    args = parser.parse_args(argv)
    from recallm.grpo.export import ADAPTER_SUBDIR, check_source, export_checkpoint, find_actor_dir, trained_dtype
    from recallm.io import lock_output
    from recallm.modeling import adapter_base, check_recallm_model, merge_adapter

    out = check_out_dir(args.out, "--out")
    if out.is_dir() and any(out.iterdir()):
        raise RecallmError(f"--out {out} is not empty: an export writes a new directory; choose another one")
    if args.step is not None and args.step < 1:
        parser.error(f"--step must be a positive step number, got {args.step}")
    base = adapter_base(args.checkpoint)
    if base is not None and (args.keep_adapter or args.step is not None):
        parser.error("--keep-adapter and --step take a GRPO checkpoint; the adapter directory is merged as it is")
    # one export per --out (a second is refused at once); each writes a directory of its own, renamed at the end
    with lock_output(out, "recallm-export"):
        if base is not None:  # a LoRA adapter directory
            merge_adapter(args.checkpoint, out, dtype=args.dtype)
            print(f"wrote {out}: the adapter {args.checkpoint} merged into {base}, {_weights(out)}")
        else:
            actor = find_actor_dir(args.checkpoint, args.step)
            trained = trained_dtype(actor)
            verified = check_source(actor)
            export_checkpoint(actor, out, dtype=args.dtype, keep_adapter=args.keep_adapter, checked=True)
            dtype = args.dtype or trained
            how = "as trained" if dtype == trained else f"converted from the trained {trained} by --dtype"
            print(f"wrote {out} from {actor}: {_weights(out)} in {dtype} ({how})")
            if not verified:
                print(
                    f"warning: {actor} has no checksums (saved before recallm recorded them, or not in a run directory): "
                    f"its files were read unverified; {out}/recallm_files.json records what was read",
                    file=sys.stderr,
                )
            if args.keep_adapter:
                print(f"  the adapter alone: {out / ADAPTER_SUBDIR} (its base: {out})")
    for key, value in check_recallm_model(out).items():
        print(f"  {key}: {value}")
    return 0


def _weights(out) -> str:
    """How many parameters the saved safetensors files hold, and their size."""
    from pathlib import Path

    from safetensors import safe_open

    count, size = 0, 0
    for path in sorted(Path(out).glob("*.safetensors")):
        size += path.stat().st_size
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                n = 1
                for dim in shape:
                    n *= dim
                count += n
    return f"{count:,} parameters, {size / 2**20:.1f} MiB"


if __name__ == "__main__":
    sys.exit(main())
