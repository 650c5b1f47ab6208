"""`recallm-pipeline`: the whole recipe under one run directory, resumable stage by stage
(see ``recallm.pipeline``).

recallm-pipeline experiment=tiny_cpu                       # what `make demo` runs: CPU, ~11 min
recallm-pipeline experiment=tiny_cpu redo=[eval,report]    # run two stages again
recallm-pipeline experiment=tiny_cpu only=[data]           # one stage
recallm-pipeline experiment=tiny_cpu --status              # which jobs are done, running, to do
recallm-pipeline experiment=paper_qwen2.5_7b run_dir=... experiment.inputs.base_model=... --dry-run
                                                           # each job's command, nothing run

A value the experiment leaves required (``???``: a paper run's ``run_dir`` and ``experiment.inputs``) is
named, with every other one still unset, in one ``error:`` line before anything is written.
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


def unset(cfg: DictConfig) -> list[str]:
    """The keys of the run still required (``???``), in the config's order: ``run_dir`` and those under
    ``experiment``."""
    found: list[str] = []

    def walk(node, prefix: str) -> None:
        for key in node.keys():
            path = f"{prefix}.{key}" if prefix else str(key)
            if OmegaConf.is_missing(node, key):
                found.append(path)
            elif OmegaConf.is_dict(node._get_node(key)):
                walk(node._get_node(key), path)

    if OmegaConf.is_missing(cfg, "run_dir"):
        found.append("run_dir")
    if OmegaConf.is_dict(cfg._get_node("experiment")):
        walk(cfg.experiment, "experiment")
    return found


def check(cfg: DictConfig) -> PipelineRun:
    """The command's settings, before anything is written (``recallm.cli.common``): every required value set
    (one line naming those that are not), the run directory, the experiment's stages."""
    from recallm.pipeline import experiment_env, experiment_stages

    missing = unset(cfg)
    if missing:
        raise RecallmError(
            f"required but not set: {', '.join(missing)} (set each on the command line, KEY=VALUE; "
            "the experiment's file says what each is)"
        )
    settings = typed(PipelineRun, cfg, "")
    check_out_dir(settings.run_dir, "run_dir")
    exp = OmegaConf.to_container(cfg.experiment, resolve=True)
    experiment_stages(exp, Path(settings.run_dir))
    experiment_env(exp)
    return settings


@cli_errors
def run(cfg: DictConfig, status: bool = False, dry_run: bool = False) -> int:
    from recallm.pipeline import Pipeline, command_line, experiment_env, experiment_stages, result_line

    exp = OmegaConf.to_container(cfg.experiment, resolve=True)
    run_dir = Path(cfg.run_dir)
    stages = experiment_stages(exp, run_dir)
    env = experiment_env(exp)
    pipeline = Pipeline(run_dir, stages, threads=cfg.threads, env=env)
    env_line = "environment of every job: " + " ".join(f"{k}={v}" for k, v in env.items()) if env else None
    if dry_run:
        states = pipeline.states()
        print(f"experiment {exp['name']}: {len(stages)} stages into {run_dir.resolve()} (nothing run)")
        if env_line:
            print(env_line)
        for number, stage in enumerate(stages, 1):
            side = f", {stage.parallel} side by side" if stage.parallel > 1 and len(stage.jobs) > 1 else ""
            print(f"[{number}/{len(stages)}] {stage.name}{side}")
            for job in stage.jobs:
                print(f"  {states[job.name]}  {job.name}: {command_line(job.argv)}")
        return 0
    if status:
        for name, state in pipeline.states().items():
            print(f"{state:7s}  {name}")
        return 0
    print(f"experiment {exp['name']}: {len(stages)} stages into {run_dir.resolve()}", flush=True)
    if env_line:
        print(env_line, flush=True)
    state = pipeline.run(redo=_list(cfg.redo, "redo") or [], only=_list(cfg.only, "only"), echo=_echo)
    if not all(pipeline.status().values()):
        print("not every stage ran (only=...); no result yet")
        return 0
    print(f"report: {(run_dir / 'report' / 'report.md').resolve()}")
    print(result_line(exp, run_dir, state), flush=True)
    return 0


def _echo(message: str) -> None:
    print(message, flush=True)


main = hydra_command(
    "pipeline",
    run,
    check=check,
    flags={
        "--status": "print which jobs are done, running or to do; run nothing",
        "--dry-run": "print each stage's jobs and their command lines, run nothing",
    },
    looking=("--status", "--dry-run"),  # nothing written, not even Hydra's output directory under run_dir
)


if __name__ == "__main__":
    sys.exit(main())
