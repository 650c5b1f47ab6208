"""`recallm-grpo`: GRPO on verl with masked rollouts (see ``recallm.grpo.app``).

recallm-grpo [--print-config] [key=value ...]       # Hydra overrides, any verl key included
recallm-grpo plot [NAME=]METRICS [...] --out DIR     # training curves (Figure 10's panels) from verl's metric logs
recallm-grpo --plan [--gpus N ...] [key=value ...]  # memory, disk, save time (recallm-plan grpo; this node's values by default)

The command line is read by ``recallm.cli.common.hydra_command`` like every Hydra command's, except
that Hydra does not run the job: the config it composes (once) and checks goes to the one GRPO launch
(``recallm.grpo.app.run``: prepare, check, verl's own trainer), which ``recallm-rlm train`` shares.
``plot`` is not a run of the config and takes its own flags (argparse: positional files and
``--out``, no config tree).
"""

from __future__ import annotations

import sys

from recallm.cli.common import hydra_command
from recallm.errors import cli_errors
from recallm.grpo.settings import closed as grpo_keys_closed


@cli_errors
def run(cfg, print_config: bool = False) -> int:
    from recallm.grpo.app import run as launch_grpo

    return launch_grpo(cfg, print_config=print_config)


@cli_errors
def plot(argv: list[str]) -> int:
    """``recallm-grpo plot``: draw the curves of one or more runs into ``--out`` (``curves.png``,
    ``curves.md``)."""
    import argparse
    from pathlib import Path

    from recallm.errors import RecallmError
    from recallm.eval.curves import report_section

    parser = argparse.ArgumentParser(
        prog="recallm-grpo plot",
        description="Draw GRPO training curves (the paper's Figure 10 panels) from verl's metric logs: "
        "a metrics.jsonl (trainer.logger=[console,file]; recallm-grpo writes it next to the checkpoints), "
        "a checkpoint directory holding one, or a console log.",
    )
    parser.add_argument("runs", nargs="+", metavar="[NAME=]METRICS", help="a run's metrics log, optionally named")
    parser.add_argument("--out", required=True, type=Path, help="output directory (curves.png, curves.md)")
    args = parser.parse_args(argv)
    from recallm.io import check_out_dir

    check_out_dir(args.out, "--out")
    runs: dict[str, str] = {}
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = Path(item).stem if Path(item).is_file() else Path(item).name, item
        if name in runs:
            raise RecallmError(f"two runs are named {name!r}; name them: NAME=PATH")
        runs[name] = path
    lines = report_section(runs, args.out, figure="curves.png")
    (args.out / "curves.md").write_text("\n".join(["# GRPO training curves", "", *lines[2:]]))
    print(f"wrote {args.out / 'curves.png'} and {args.out / 'curves.md'}")
    return 0


_main = hydra_command(
    "grpo",
    run,
    closed=grpo_keys_closed,  # ours under recallm.; verl's keys: its own config gives the types
    flags={"--print-config": "print the composed and validated config, launch nothing"},
    subcommands={"plot": plot},
    hydra_run=False,
)

def main(argv: list[str] | None = None) -> int | None:
    """``recallm-grpo ...``; ``recallm-grpo --plan [recallm-plan's flags] [key=value ...]``: whether the run
    fits (``recallm-plan grpo``, on this node's values unless flags say otherwise), launching nothing."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--plan" in args:
        from recallm.cli.plan import main as plan_main

        return plan_main(["grpo", *[a for a in args if a != "--plan"]])
    return _main(args)


if __name__ == "__main__":
    sys.exit(main())
