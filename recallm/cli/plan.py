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

argparse for the cluster's flags, then the command's Hydra overrides composed and checked as the
command itself does (``recallm.config.check_overrides``); nothing runs, nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

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


def _positive(name: str, value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise RecallmError(f"{name} must be positive, got {value:g}")
    return value


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
        value = _positive("--" + flag.replace("_", "-"), getattr(args, flag))
        if value is not None:
            given[key] = (value * scale if scale != 1 else int(value), "given")
    _positive("--nodes", args.nodes)
    measure = not args.no_measure and "write_bandwidth" not in given
    node = node_cluster(checkpoint_dir, measure_write=measure)
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


def _sources(cluster: Any) -> str:
    return "cluster: " + "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in cluster.source.items())


def _flash_attn_installed() -> bool | None:
    """Whether flash-attn imports here; None on a node without a GPU (a login node plans for others)."""
    import importlib.util

    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return importlib.util.find_spec("flash_attn") is not None


def plan_grpo(cfg: Any, args: argparse.Namespace) -> Any:
    from omegaconf import OmegaConf

    from recallm.grpo.settings import settings_of
    from recallm.plan import grpo_plan, mean_step_seconds, model_shape

    def sel(key: str) -> Any:
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        return None if value == "???" else value

    rm = settings_of(cfg)
    cluster = cluster_from(args, sel("trainer.default_local_dir"), int(sel("trainer.nnodes") or 1))
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
    plan.notes.insert(0, _sources(cluster))
    return plan


def plan_sft(cfg: dict[str, Any], args: argparse.Namespace) -> Any:
    from recallm.plan import mean_step_seconds, model_shape, sft_plan

    model = cfg.get("model") or {}
    path = model.get("path")
    cluster = cluster_from(args, cfg.get("out_dir"), 1)
    shape = model_shape(path, args.model or model.get("name"))
    step = args.step_seconds or (mean_step_seconds(args.metrics) if args.metrics else None)
    plan = sft_plan(cfg, cluster, shape, step_seconds=step, time_limit_h=args.time_limit_hours)
    plan.notes.insert(0, _sources(cluster))
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
    return show(args.app, compose(args.app, overrides), args)


if __name__ == "__main__":
    sys.exit(main())
