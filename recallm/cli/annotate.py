"""`recallm-annotate`: annotated SFT traces — teacher traces rewritten with verbatim recall spans.

    recallm-annotate input=rows.parquet tokenizer=/models/recallm output_dir=out \\
        teacher.model=<served name> [teacher.base_url=http://host:8000/v1] [annotator.model=...]
    recallm-annotate input=rows.parquet tokenizer=/models/recallm output_dir=out teacher.traces=traces.jsonl \\
        annotator.model=<served name>

Writes ``train.jsonl``, ``val.jsonl``, ``traces.jsonl`` and ``report.json`` under ``output_dir``
(see ``data_gen.annotate``) and prints the report. The whole config is checked before the first
request; errors are one line (exit code 2).
"""

from __future__ import annotations

import logging
import sys

from omegaconf import DictConfig

from recallm.cli.common import hydra_command
from recallm.errors import cli_errors
from recallm.io import check_out_dir

log = logging.getLogger(__name__)


@cli_errors
def run(cfg: DictConfig) -> dict:
    from data_gen.annotate import annotate_from_config, format_report

    report = annotate_from_config(cfg)
    print(format_report(report))
    print(f"wrote {report['files']['train']}, {report['files']['val']} and {report['files']['report']}")
    return report


def check(cfg: DictConfig) -> None:
    """The command's settings, before anything is written (``recallm.cli.common``); the rest of the
    config is checked by ``data_gen.annotate`` before the first request."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_missing(cfg, "output_dir"):
        check_out_dir(str(cfg.output_dir), "output_dir")


main = hydra_command("annotate", run, check=check, quiet=("transformers", "httpx", "httpcore"))


if __name__ == "__main__":
    sys.exit(main())
