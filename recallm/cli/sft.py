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
def run(cfg: DictConfig, plan: bool = False):
    if plan:  # recallm-plan sft with this node's values (recallm.cli.plan)
        from recallm.cli.plan import node_args, show

        return show("sft", OmegaConf.to_container(cfg, resolve=True), node_args())
    from recallm.sft.train import run_sft

    return run_sft(OmegaConf.to_container(cfg, resolve=True))


main = hydra_command(
    "sft",
    run,
    check=check,
    flags={"--plan": "print whether the run fits this node (recallm-plan sft for other clusters), train nothing"},
)


if __name__ == "__main__":
    sys.exit(main())
