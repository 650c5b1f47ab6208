"""`recallm-sft`: one stage of the SFT cold start (see ``recallm.sft.train`` for the recipe).

The command line and the run's settings (``recallm.sft.train.check_config``: types, ranges, data
files, output directories) are checked before anything is written; mistakes are one line, exit 2.
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from recallm.cli.common import run_hydra
from recallm.errors import cli_errors
from recallm.paths import CONFIG_DIR


def check(cfg: DictConfig) -> None:
    from recallm.sft.train import check_config

    check_config(OmegaConf.to_container(cfg, resolve=True))


@cli_errors
def run(cfg: DictConfig):
    from recallm.sft.train import run_sft

    return run_sft(OmegaConf.to_container(cfg, resolve=True))


@hydra.main(config_path=str(CONFIG_DIR), config_name="sft", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    logging.getLogger("transformers").setLevel(logging.WARNING)
    run(cfg)


def main() -> None:
    run_hydra("sft", _hydra_main, check)


if __name__ == "__main__":
    sys.exit(main())
