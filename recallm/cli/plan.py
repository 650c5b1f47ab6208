"""`recallm-plan`: will a GRPO or SFT run fit the cluster (GPU memory, host RAM, disk, save time) before launch?

recallm-plan grpo grpo=qwen2.5_7b --gpus 4 --gpu-mem-gib 80 --disk-free-gb 1000 --write-gbps 1
recallm-plan sft sft=qwen2.5_7b model=qwen2.5_7b deepspeed=zero2 stage=full --gpus 4 --gpu-mem-gib 80
recallm-plan grpo grpo=llama3.1_8b trainer.default_local_dir=/scratch/me/grpo --metrics old/metrics.jsonl
recallm-plan ... --require-fit     # exit 2 with one line when something does not fit (job scripts)
recallm-grpo --plan ... / recallm-sft --plan ...   # the same with this node's values

The overrides after the flags are the command's own (``recallm-grpo`` / ``recallm-sft``); the plan is
computed from the composed config (``recallm.plan`` holds every formula, with its sources). A value
the flags do not give is read from this node when it can be (GPUs and their memory from torch, RAM,
free space and a 256 MiB write at the checkpoint directory), else assumed, and the plan says which.

argparse for the cluster's flags (their numbers ranged: :class:`PlanFlags`), then the command's Hydra overrides
composed and checked as the command itself does (``recallm.config.check_overrides``; verl's keys in the ranges of
``recallm.grpo.ranges``, SFT's settings typed by ``recallm.sft.settings.SFTRun``; lengths left null set from the
data as the command sets them); nothing runs, nothing is written. A run on the CPU (GRPO's ``cpu``/``vllm_cpu``
platforms; SFT where this machine has no GPU and no flag describes one, or with ``deepspeed=zero2_cpu``) is planned
on this machine (:func:`cpu_cluster_from`: its RAM, disk and write bandwidth; no GPU assumed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from recallm.config import MAX_SECONDS, MAX_TOKENS, MAX_WORKERS
from recallm.errors import RecallmError, cli_errors

#: what the plan assumes for a value neither given nor readable here: the paper's node (4xA100-80GB)
ASSUMED = {
    "gpus_per_node": 4,
    "gpu_memory": int(79.2 * 2**30),  # an A100-80GB as torch reports it (81,920 MiB less what the driver keeps)
    "host_ram": 512 * 2**30,
    "disk_free": 1000 * 10**9,
    "write_bandwidth": 0.5 * 10**9,
}


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("app", choices=["grpo", "sft"], help="the command whose config is planned")
    p.add_argument("--gpus", type=int, help="GPUs per node (default: this node's, else 4)")
    p.add_argument("--nodes", type=int, help="nodes (default: the config's trainer.nnodes, or 1)")
    p.add_argument("--gpu-mem-gib", type=float, help="memory per GPU in GiB (default: this node's)")
    p.add_argument("--host-ram-gib", type=float, help="host RAM per node in GiB (default: this node's)")
    p.add_argument("--disk-free-gb", type=float, help="free disk at the checkpoint directory in GB (default: measured)")
    p.add_argument("--write-gbps", type=float, help="write bandwidth there in GB/s (default: a 256 MiB write)")
    p.add_argument("--no-measure", action="store_true", help="do not write the 256 MiB probe file")
    p.add_argument(
        "--model",
        help="a known shape (qwen2.5_7b, llama3.1_8b: the paper bases; qwen2.5_1.5b) when the model path is not set",
    )
    p.add_argument("--step-seconds", type=float, help="seconds per training step (for steps per hour)")
    p.add_argument("--metrics", help="a previous run's metrics.jsonl: its mean timing_s/step")
    p.add_argument("--time-limit-hours", type=float, help="the job's time limit: how many jobs the run takes")
    p.add_argument("--mean-tokens", type=int, default=11000, help="a typical sequence (prompt + response)")
    p.add_argument("--require-fit", action="store_true", help="exit 2 when something does not fit")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


#: GiB of memory per GPU or per node a flag may give (16 TiB)
MAX_GIB = 16 * 1024


@dataclass(frozen=True)
class PlanFlags:
    """The numbers recallm-plan's flags give, with their ranges (``--gpu-mem-gib`` is ``gpu_mem_gib``; None: not
    given), checked by ``recallm.config.typed`` (:func:`checked_flags`): finite, positive, at most the bound."""

    gpus: int | None = field(default=None, metadata={"above": 0, "max": MAX_WORKERS})
    nodes: int | None = field(default=None, metadata={"above": 0, "max": 1 << 16})
    gpu_mem_gib: float | None = field(default=None, metadata={"above": 0, "max": MAX_GIB})
    host_ram_gib: float | None = field(default=None, metadata={"above": 0, "max": MAX_GIB})
    disk_free_gb: float | None = field(default=None, metadata={"above": 0, "max": 1e9})  # (an exabyte)
    write_gbps: float | None = field(default=None, metadata={"above": 0, "max": 1e4})
    step_seconds: float | None = field(default=None, metadata={"above": 0, "max": MAX_SECONDS})
    time_limit_hours: float | None = field(default=None, metadata={"above": 0, "max": MAX_SECONDS / 3600})
    mean_tokens: int = field(default=11000, metadata={"above": 0, "max": MAX_TOKENS})


def checked_flags(args: argparse.Namespace) -> PlanFlags:
    """The flags' numbers in their ranges (:class:`PlanFlags`), or one line naming the flag: ``--mean-tokens must
    be positive, got 0``, ``--gpu-mem-gib must be a finite number, got inf``."""
    from recallm.config import typed

    names = [f.name for f in dataclasses.fields(PlanFlags)]
    given = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    try:
        return typed(PlanFlags, given, "")
    except RecallmError as exc:
        name, _, rest = str(exc).partition(" ")
        raise RecallmError(f"--{name.replace('_', '-')} {rest}" if name in names else str(exc)) from None


def cluster_from(args: argparse.Namespace, checkpoint_dir: str | None, nnodes: int) -> Any:
    from recallm.plan import GB, Cluster, GiB, node_cluster

    given: dict[str, Any] = {}
    for flag, key, scale in (
        ("gpus", "gpus_per_node", 1),
        ("gpu_mem_gib", "gpu_memory", GiB),
        ("host_ram_gib", "host_ram", GiB),
        ("disk_free_gb", "disk_free", GB),
        ("write_gbps", "write_bandwidth", GB),
    ):
        value = getattr(args, flag)  # (in range: checked_flags)
        if value is not None:
            given[key] = (value * scale if scale != 1 else int(value), "given")
    measure = not args.no_measure and "write_bandwidth" not in given
    gpus_given = "gpus_per_node" in given and "gpu_memory" in given
    node = node_cluster(checkpoint_dir, measure_write=measure, gpus=not gpus_given)
    values, source = {}, {}
    for key, assumed in ASSUMED.items():
        value, where = given.get(key) or node.get(key) or (assumed, "assumed (the paper's node)")
        values[key], source[key] = value, where
    return Cluster(
        gpus_per_node=int(values["gpus_per_node"]),
        nodes=int(args.nodes or nnodes or 1),
        gpu_memory=int(values["gpu_memory"]),
        host_ram=int(values["host_ram"]),
        disk_free=int(values["disk_free"]),
        write_bandwidth=float(values["write_bandwidth"]),
        source=source,
    )


def cpu_cluster_from(args: argparse.Namespace, checkpoint_dir: str | None, processes: int, nnodes: int = 1) -> Any:
    """This machine as a run on the CPU uses it: ``processes`` training processes per node, its RAM
    (``recallm.plan.host_memory``: the total, and what is available now said beside it; or ``--host-ram-gib``), the
    free disk and the write bandwidth at the checkpoint directory (given, measured, or not known: then the plan
    shows no save time). Nothing is assumed."""
    from recallm.plan import GB, Cluster, GiB, gib, host_memory, node_cluster

    total, available = host_memory()
    if args.host_ram_gib is not None:
        host = (args.host_ram_gib * GiB, "given")
    else:
        now = f"; {gib(available)} available now" if available is not None else ""
        host = (total, f"this machine (/proc/meminfo MemTotal{now})")
    given_bw = args.write_gbps * GB if args.write_gbps is not None else None
    node = node_cluster(checkpoint_dir or ".", measure_write=not args.no_measure and given_bw is None, gpus=False)
    disk = (args.disk_free_gb * GB, "given") if args.disk_free_gb is not None else node["disk_free"]
    write = (given_bw, "given") if given_bw is not None else node.get("write_bandwidth")
    source = {"host_ram": host[1], "disk_free": disk[1]}
    source["write_bandwidth"] = write[1] if write else "not measured (--no-measure): no save time"
    return Cluster(
        gpus_per_node=processes,
        nodes=nnodes,
        gpu_memory=0,
        host_ram=int(host[0]),
        disk_free=int(disk[0]),
        write_bandwidth=float(write[0]) if write else 0.0,
        source=source,
    )


def _sources(cluster: Any, cpu: bool = False) -> str:
    return ("this machine: " if cpu else "cluster: ") + "; ".join(
        f"{k.replace('_', ' ')} {v}" for k, v in cluster.source.items()
    )


def _cpu_notes(args: argparse.Namespace) -> list[str]:
    given = [flag for flag in ("gpus", "gpu_mem_gib") if getattr(args, flag) is not None]
    return [f"the run trains on the CPU: --{', --'.join(g.replace('_', '-') for g in given)} not used"] if given else []


def _flash_attn_installed() -> bool | None:
    """Whether flash-attn imports here; None on a node without a GPU (a login node plans for others)."""
    import importlib.util

    if not _cuda_here():
        return None
    return importlib.util.find_spec("flash_attn") is not None


def _cuda_here() -> bool:
    from recallm.plan import gpu_driver_loaded

    if not gpu_driver_loaded():
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _grpo_checked(cfg: Any) -> None:
    """What the launch checks of the keys the plan reads, before anything is planned: the data's own lengths set
    where the recipe leaves them null (``recallm.grpo.prepare.data_lengths``, as the launch does), then verl's
    keys in their ranges (``recallm.grpo.ranges``: the one table) and lengths that could not be derived
    (``recallm.grpo.checks``): one line each."""
    from recallm.errors import collect, raise_problems
    from recallm.grpo.checks import _check_data_lengths
    from recallm.grpo.prepare import Prepared, data_lengths
    from recallm.grpo.ranges import check_ranges

    data_lengths(cfg, Prepared())
    raise_problems(collect(lambda: check_ranges(cfg), lambda: _check_data_lengths(cfg)))


def plan_grpo(cfg: Any, args: argparse.Namespace) -> Any:
    from omegaconf import OmegaConf

    from recallm.grpo.settings import settings_of
    from recallm.plan import CPU_PLATFORMS, grpo_plan, mean_step_seconds, model_shape

    def sel(key: str) -> Any:
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        return None if value == "???" else value

    rm = settings_of(cfg)
    _grpo_checked(cfg)
    cpu = rm.platform in CPU_PLATFORMS
    nnodes = int(sel("trainer.nnodes") or 1)
    if cpu:
        cluster = cpu_cluster_from(
            args, sel("trainer.default_local_dir"), int(sel("trainer.n_gpus_per_node") or 1), nnodes
        )
    else:
        cluster = cluster_from(args, sel("trainer.default_local_dir"), nnodes)
    shape = model_shape(sel("actor_rollout_ref.model.path"), args.model or rm.model_name)
    step = args.step_seconds or (mean_step_seconds(args.metrics) if args.metrics else None)
    plan = grpo_plan(
        cfg,
        cluster,
        shape,
        step_seconds=step,
        time_limit_h=args.time_limit_hours,
        flash_attn_installed=_flash_attn_installed() if rm.platform == "gpu" else None,
        mean_tokens=args.mean_tokens,
    )
    plan.notes[:0] = [_sources(cluster, cpu), *(_cpu_notes(args) if cpu else [])]
    return plan


def _sft_on_cpu(cfg: dict[str, Any], args: argparse.Namespace) -> bool:
    """Where ``recallm-sft`` runs the stage: on the CPU with ``deepspeed=zero2_cpu``, on GPUs with ``zero2``; without
    DeepSpeed where this machine has no GPU (``recallm.sft.train``: ``use_cpu``), unless the flags describe GPUs
    (a plan made on a login node for a GPU node)."""
    from pathlib import Path

    from recallm.sft.deepspeed_config import FILES

    file = (cfg.get("deepspeed") or {}).get("file")
    if file:
        return FILES.get(Path(str(file)).name) == "cpu"
    return args.gpus is None and args.gpu_mem_gib is None and not _cuda_here()


def _sft_checked(cfg: dict[str, Any]) -> Any:
    """The stage's settings, typed and in their ranges (``recallm.sft.settings.SFTRun``, as ``recallm-sft`` reads
    them), and ``sft.max_length`` null set as the command sets it: the longest trace of the data (one line when
    the data is not there to say it)."""
    from recallm.config import typed
    from recallm.io import check_in_file
    from recallm.sft.settings import SFTRun

    run = typed(SFTRun, cfg, "")
    if run.sft.max_length is None:
        for key, path in (("train_file", run.train_file), ("val_file", run.val_file)):
            if path is None:
                continue
            try:
                check_in_file(path, key, kind="jsonl")
            except RecallmError as exc:
                raise RecallmError(
                    f"sft.max_length is null (the longest trace of the data) and {exc}: create the data first, or "
                    "plan with sft.max_length=<tokens>"
                ) from None
        from recallm.sft.train import resolve_max_length  # (loads torch and transformers: only here)

        run = resolve_max_length(run)
        cfg["sft"]["max_length"] = run.sft.max_length
    return run


def plan_sft(cfg: dict[str, Any], args: argparse.Namespace) -> Any:
    from recallm.plan import mean_step_seconds, model_shape, sft_plan

    _sft_checked(cfg)
    model = cfg.get("model") or {}
    path = model.get("path")
    cpu = _sft_on_cpu(cfg, args)
    cluster = cpu_cluster_from(args, cfg.get("out_dir"), 1) if cpu else cluster_from(args, cfg.get("out_dir"), 1)
    shape = model_shape(path, args.model or model.get("name"))
    step = args.step_seconds or (mean_step_seconds(args.metrics) if args.metrics else None)
    plan = sft_plan(cfg, cluster, shape, step_seconds=step, time_limit_h=args.time_limit_hours, cpu=cpu)
    plan.notes[:0] = [_sources(cluster, cpu), *(_cpu_notes(args) if cpu else [])]
    return plan


def compose(app: str, overrides: list[str]) -> Any:
    """The command's config, composed and checked as the command does (no check of paths that do not
    exist yet: a plan is made before the data and the model are there)."""
    from recallm.cli.schemas import register

    register()
    if app == "grpo":
        from recallm.grpo.app import compose as compose_grpo

        return compose_grpo(overrides)
    from omegaconf import OmegaConf

    from recallm.config import check_overrides

    cfg = check_overrides("sft", overrides)
    return OmegaConf.to_container(cfg, resolve=True)


def show(app: str, cfg: Any, args: argparse.Namespace) -> int:
    """Print the plan of a composed config; 2 with one line under ``--require-fit`` when it does not fit."""
    plan = plan_grpo(cfg, args) if app == "grpo" else plan_sft(cfg, args)
    print(json.dumps(plan.as_dict(), indent=2) if args.json else plan.render(), flush=True)
    if args.require_fit and not plan.fits:
        first = plan.misfits[0]
        raise RecallmError(
            f"the plan does not fit: {first.section.split(' (')[0]}: {first.what}"
            + (f" ({first.fix})" if first.fix else "")
        )
    return 0


@cli_errors
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser("recallm-plan")
    args, overrides = parser.parse_known_args(argv)
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        raise RecallmError(f"unknown flag {bad[0]} (recallm-plan --help lists them)")
    checked_flags(args)
    return show(args.app, compose(args.app, overrides), args)


if __name__ == "__main__":
    sys.exit(main())
