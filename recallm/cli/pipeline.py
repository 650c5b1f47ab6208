"""`recallm-pipeline`: the whole recipe under one run directory, resumable stage by stage
(see ``recallm.pipeline``).

recallm-pipeline experiment=tiny_cpu                       # what `make demo` runs: CPU, ~30 min
recallm-pipeline experiment=tiny_cpu redo=[eval,report]    # run two stages again
recallm-pipeline experiment=tiny_cpu only=[data]           # one stage
recallm-pipeline experiment=tiny_cpu --status              # which jobs are done, running, to do
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from recallm.cli.common import hydra_command
from recallm.config import typed
from recallm.errors import RecallmError, cli_errors
from recallm.io import check_out_dir
from recallm.pipeline import PipelineRun


def _list(value, name: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if not OmegaConf.is_list(value) and not isinstance(value, list):
        raise RecallmError(f"{name} must be a list of stage names, got {value!r}")
    return [str(v) for v in value]


def check(cfg: DictConfig) -> PipelineRun:
    """The command's settings, before anything is written (``recallm.cli.common``)."""
    settings = typed(PipelineRun, cfg, "")
    check_out_dir(settings.run_dir, "run_dir")
    return settings


@cli_errors
def run(cfg: DictConfig, status: bool = False) -> int:
    from recallm.pipeline import Pipeline, plan_experiment, result_line

    exp = OmegaConf.to_container(cfg.experiment, resolve=True)
    run_dir = Path(cfg.run_dir)
    stages = plan_experiment(exp, run_dir)
    pipeline = Pipeline(run_dir, stages, threads=cfg.threads)
    if status:
        for name, state in pipeline.states().items():
            print(f"{state:7s}  {name}")
        return 0
    print(f"experiment {exp['name']}: {len(stages)} stages into {run_dir.resolve()}", flush=True)
    state = pipeline.run(redo=_list(cfg.redo, "redo") or [], only=_list(cfg.only, "only"), echo=_echo)
    if not all(pipeline.status().values()):
        print("not every stage ran (only=...); no result yet")
        return 0
    print(f"report: {(run_dir / 'report' / 'report.md').resolve()}")
    print(result_line(exp, run_dir, state), flush=True)
    return 0


def _echo(message: str) -> None:
    print(message, flush=True)


main = hydra_command("pipeline", run, check=check, flags={"--status": "print which jobs are done, run nothing"})


if __name__ == "__main__":
    sys.exit(main())
