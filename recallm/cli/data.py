"""`recallm-data`: generate the task mixture (verl parquet), validation cells and SFT traces.

    recallm-data data=tiny
    recallm-data data=paper tokenizer=/models/recallm-qwen2.5-7b data.dataset_root=/data/raw workers=16

Outputs under ``out_dir``: ``train.parquet``, ``val/<category>_<length>.parquet``,
``sft/{train,val}.jsonl``, ``summary.md`` / ``summary.json``, and ``shards/`` (what a restart
reuses). The settings (types, ``out_dir`` a directory no other run is writing, the tokenizer) are
checked before anything is written; the mixture before the first row is generated. One run
writes an ``out_dir`` at a time: a second is refused in one line.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from data_gen.generate import DataRun
from recallm.cli.common import hydra_command
from recallm.config import typed
from recallm.errors import RecallmError, cli_errors, collect, raise_problems
from recallm.io import check_out_dir, check_unlocked, lock_dir

log = logging.getLogger(__name__)


def resolve_tokenizer(spec: str, out_dir: Path) -> Path:
    """A tokenizer directory: ``tiny`` builds the embedded tiny default under ``out_dir``."""
    if spec == "tiny":
        path = out_dir / "tiny-model"
        if not (path / "tokenizer.json").is_file():
            from recallm.tiny import create_tiny

            create_tiny(path)
        return path
    path = Path(spec)
    if not path.is_dir():
        raise RecallmError(f"tokenizer directory {path} does not exist (pass tokenizer=<RecaLLM model dir> or tiny)")
    return path


def check(cfg: DictConfig) -> None:
    """The command's settings, before anything is written (``recallm.cli.common``): every problem of the
    output directory, the tokenizer and the mixture at once (``recallm.errors.collect``)."""
    from data_gen.generate import schedule_from_config

    settings = typed(DataRun, cfg, "")

    def output() -> None:
        check_unlocked(check_out_dir(settings.out_dir, "out_dir"))

    def tokenizer() -> None:
        named = cfg.data._get_node("name")._value() if "name" in cfg.data else None
        if settings.tokenizer == "tiny" and "recallm.model_name" in str(named):  # data=own_cpu: one's own model's
            raise RecallmError(
                "tokenizer=tiny with a mixture named after its model (data=own_cpu): set tokenizer=<your model dir> "
                "(the tiny default's mixture is data=tiny)"
            )
        if settings.tokenizer != "tiny" and not Path(settings.tokenizer).is_dir():
            raise RecallmError(
                f"tokenizer directory {settings.tokenizer} does not exist (pass tokenizer=<RecaLLM model dir> or tiny)"
            )

    def mixture() -> None:
        schedule = schedule_from_config(OmegaConf.to_container(cfg.data, resolve=True))
        _check_disk(schedule, Path(settings.out_dir))

    raise_problems(collect(output, tokenizer, mixture))


def _check_disk(schedule, out_dir: Path) -> None:
    """The schedule's rows fit the free space of ``out_dir``'s disk (``data_gen.generate.schedule_bytes``, a floor)."""
    import shutil

    from data_gen.generate import schedule_bytes

    there = next((p for p in (out_dir, *out_dir.parents) if p.exists()), Path("."))
    need, free = schedule_bytes(schedule), shutil.disk_usage(there).free
    if need > free:
        rows = sum(job.count for job in schedule.jobs)
        raise RecallmError(
            f"the mixture makes {rows:,} rows, at least {need / 2**30:,.1f} GiB, and {there} has {free / 2**30:,.1f} GiB "
            "free: lower the counts (data.train.entries[*].count, data.val.per_cell, data.sft.count) or choose another out_dir"
        )


@cli_errors
def run(cfg: DictConfig) -> dict:
    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.tokens import RecallTokenIds, load_tokenizer

    check(cfg)
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    schedule = schedule_from_config(data_cfg)  # every check happens here, before any generation
    out_dir = Path(cfg.out_dir)
    with lock_dir(out_dir, "recallm-data"):  # from before the tiny tokenizer is built into it
        tokenizer_dir = resolve_tokenizer(str(cfg.tokenizer), out_dir)
        if any(job.split == "sft" for job in schedule.jobs):
            RecallTokenIds.from_tokenizer(load_tokenizer(tokenizer_dir))  # traces need the recall tokens
        n_rows = sum(job.count for job in schedule.jobs)
        print(f"generating {n_rows} rows ({len(schedule.jobs)} jobs) into {out_dir} with tokenizer {tokenizer_dir}")
        result = run_schedule(schedule, out_dir, tokenizer_dir, workers=cfg.workers, progress=cfg.progress)
    print((out_dir / "summary.md").read_text())
    for name, path in result["files"].items():
        print(f"{name}: {path}")
    return result


main = hydra_command("data", run, check=check, quiet_level=logging.ERROR)


if __name__ == "__main__":
    sys.exit(main())
