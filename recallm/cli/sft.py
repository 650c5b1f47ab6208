"""`recallm-sft`: one stage of the SFT cold start (see ``recallm.sft.train`` for the recipe).

The command line and the run's settings (``recallm.sft.train.check_config``: types, ranges, data
files, output directories) are checked before anything is written; mistakes are one line, exit 2.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig, OmegaConf

from recallm.cli.common import hydra_command
from recallm.errors import cli_errors


def check(cfg: DictConfig) -> None:
    from recallm.sft.train import check_config

    check_config(OmegaConf.to_container(cfg, resolve=True))


@cli_errors
def run(cfg: DictConfig):
    from recallm.sft.preemption import Stopped
    from recallm.sft.train import run_sft

    try:
        return run_sft(OmegaConf.to_container(cfg, resolve=True))
    except Stopped as exc:  # SIGTERM / SIGUSR1: the checkpoint is saved, the next run continues from it
        print(f"recallm-sft: {exc}", file=sys.stderr)
        sys.exit(128 + exc.signum)


_main = hydra_command("sft", run, check=check)


def main(argv: list[str] | None = None) -> int | None:
    """``recallm-sft [key=value ...]``; ``recallm-sft --plan [recallm-plan's flags] [key=value ...]``: whether
    the stage fits (``recallm-plan sft``, on this node's values unless flags say otherwise), before the data
    exists and without training (the run's own checks, such as the data files, are not made)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--plan" in args:
        from recallm.cli.plan import main as plan_main

        return plan_main(["sft", *[a for a in args if a != "--plan"]])
    return _main(args)


main.compose = _main.compose  # type: ignore[attr-defined]  (compose and check a command line, run nothing)


if __name__ == "__main__":
    sys.exit(main())
