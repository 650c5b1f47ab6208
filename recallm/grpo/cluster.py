"""Wait until a Ray cluster shows every node and every GPU (``slurm/grpo_multinode.sbatch``).

``python -m recallm.grpo.cluster --address HEAD_IP:PORT --nodes N --gpus G [--timeout S]`` polls
the cluster (connecting as a Ray client of the GCS, retrying while the head is still starting)
until ``N`` nodes are alive and they hold ``G`` GPUs in all, then exits 0; after ``S`` seconds it
exits 2 with one line saying what it saw. It replaces fixed sleeps: workers that take long to
join delay the driver instead of leaving it with a partial cluster.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from recallm.errors import RecallmError, cli_errors

__all__ = ["ClusterView", "wait_for_cluster", "main"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterView:
    nodes: int
    gpus: float

    def __str__(self) -> str:
        return f"{self.nodes} node(s), {self.gpus:g} GPU(s)"


def _view(ray: Any) -> ClusterView:
    alive = [n for n in ray.nodes() if n.get("Alive", n.get("alive", False))]
    gpus = sum(float((n.get("Resources") or {}).get("GPU", 0)) for n in alive)
    return ClusterView(nodes=len(alive), gpus=gpus)


def wait_for_cluster(
    address: str,
    nodes: int,
    gpus: int,
    *,
    timeout: float = 600.0,
    poll: float = 5.0,
    ray_module: Any = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ClusterView:
    """Poll until ``nodes`` alive nodes with ``gpus`` GPUs in all; ``RecallmError`` after ``timeout``."""
    if nodes < 1 or gpus < 0:
        raise RecallmError(f"need nodes >= 1 and gpus >= 0, got nodes={nodes} gpus={gpus}")
    if ray_module is None:
        import ray as ray_module
    deadline = clock() + timeout
    connected = False
    seen: ClusterView | str = "no connection"
    while True:
        try:
            if not connected:
                ray_module.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
                connected = True
            seen = _view(ray_module)
            if seen.nodes >= nodes and seen.gpus >= gpus:
                log.info("Ray cluster at %s is up: %s", address, seen)
                return seen
        except Exception as exc:  # the head is not up yet (Ray raises ConnectionError, RuntimeError, ...)
            seen = f"not reachable ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
            connected = False
        if clock() >= deadline:
            raise RecallmError(
                f"the Ray cluster at {address} did not reach {nodes} node(s) and {gpus} GPU(s) within "
                f"{timeout:g} s; last seen: {seen}"
            )
        sleep(poll)


@cli_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recallm.grpo.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="HEAD_IP:PORT of the Ray GCS")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=int, required=True, help="GPUs in the whole cluster")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--poll", type=float, default=5.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[recallm] %(message)s")
    try:
        wait_for_cluster(args.address, args.nodes, args.gpus, timeout=args.timeout, poll=args.poll)
    finally:
        if "ray" in sys.modules:
            sys.modules["ray"].shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
