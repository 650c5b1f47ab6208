"""The one source of SFT's DeepSpeed configs: ZeRO-2 with the optimizer offloaded to the host (the paper's
SFT setting, App. C.1), for GPUs and for the CPU test of the same structure.

``configs/deepspeed/zero2.json`` (GPUs) and ``configs/deepspeed/zero2_cpu.json`` (the CPU: 1 or 2
processes on gloo) are generated from :func:`zero2` and committed; ``python -m
recallm.sft.deepspeed_config`` rewrites them, and ``tests/unit/test_deepspeed_config.py`` fails when a
file differs from what this module generates, or when the two differ in anything but
:data:`DEVICE_KEYS`. So the CPU tests run what the GPU file says: the optimizer offloaded to the host
with DeepSpeed's CPU Adam (``"optimizer": AdamW`` with ``offload_optimizer``: DeepSpeed builds its
``cpu_adam`` C++ op on first use), gradients partitioned and reduce-scattered, bf16 where the device
has it (``"auto"``: the Trainer's ``bf16``, off on a CPU).

What depends on the device, and why:

* ``offload_optimizer.pin_memory``: page-locked host memory speeds up the copies between GPU and host;
  a CPU-only torch cannot pin (there is no accelerator to pin for);
* ``overlap_comm``: overlapping the gradient reduction with the backward pass needs separate CUDA
  streams; on the CPU it only doubles the bucket memory (each rank allocates the bucket twice);
* ``reduce_bucket_size`` / ``allgather_bucket_size``: every rank allocates these buckets; DeepSpeed's
  5e8 elements cost GBs of RAM per rank on a CPU, where the tiny test models need 5e6.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["zero2", "DEVICE_KEYS", "FILES", "render", "write"]

#: the keys whose values differ between the GPU and the CPU file (module doc), as paths into the config
DEVICE_KEYS = (
    ("zero_optimization", "offload_optimizer", "pin_memory"),
    ("zero_optimization", "overlap_comm"),
    ("zero_optimization", "reduce_bucket_size"),
    ("zero_optimization", "allgather_bucket_size"),
)
#: file name (under configs/deepspeed/) -> device
FILES = {"zero2.json": "gpu", "zero2_cpu.json": "cpu"}


def zero2(device: str) -> dict[str, Any]:
    """ZeRO-2 with the optimizer offloaded to the host, for ``device`` (``gpu`` or ``cpu``)."""
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device must be gpu or cpu, got {device!r}")
    gpu = device == "gpu"
    return {
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": gpu},
            "overlap_comm": gpu,
            "contiguous_gradients": True,
            "reduce_scatter": True,
            "reduce_bucket_size": "auto" if gpu else 5_000_000,
            "allgather_bucket_size": 500_000_000 if gpu else 5_000_000,
        },
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        },
        "bf16": {"enabled": "auto"},
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }


def render(device: str) -> str:
    """The file's text: JSON, two-space indent, a final newline."""
    return json.dumps(zero2(device), indent=2) + "\n"


def write(directory: Path | None = None) -> list[Path]:
    """(Re)write the generated files under ``configs/deepspeed/``."""
    from recallm.paths import CONFIG_DIR

    directory = Path(directory or CONFIG_DIR / "deepspeed")
    written = []
    for name, device in FILES.items():
        path = directory / name
        path.write_text(render(device))
        written.append(path)
    return written


if __name__ == "__main__":  # python -m recallm.sft.deepspeed_config
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else None):
        print(f"wrote {path}")
