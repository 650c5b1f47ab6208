"""``object_store``: a verl checkpoint engine that moves the actor's weights to standalone rollout workers
through Ray's object store — the weight sync of ``rollout=one_step_off`` on the CPU platforms.

verl 0.9.1 syncs a standalone rollout (``actor_rollout_ref.hybrid_engine=false``: one-step-off, fully async)
through a *checkpoint engine* (``verl.checkpoint_engine``): ``nccl``, ``nixl``, ``hccl``, ``mooncake``,
``kimi`` — every one needs an accelerator. This one needs Ray only: verl imports it in the actor and
rollout workers from ``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module`` (its extension
point for engines; ``recallm.grpo.off_policy`` sets it), and it registers itself as ``object_store``.

* :meth:`ObjectStoreEngine.build_topology` (in the trainer's process, before each sync) gives every rollout
  worker a queue of its own (a ``ray.util.queue.Queue`` actor holding at most two buckets: the sender waits
  for the receiver), and the actor's rank 0 every queue; the queues are made once and reused.
* :meth:`ObjectStoreEngine.send_weights` (actor ranks): rank 0 puts the weights into the object store in
  buckets of ``checkpoint_engine.update_weights_bucket_megabytes`` and each bucket's reference into every
  queue, then an end mark; the other ranks walk the weight generator without sending (gathering a sharded
  weight is a collective over the actor's ranks).
* :meth:`ObjectStoreEngine.receive_weights` (rollout workers) yields ``(name, tensor)`` from its queue until
  the end mark; verl hands them to the rollout's server adapter (``hf_cpu``: ``HFCPUServerAdapter``, which
  loads them into its server and checks that every weight arrived).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

__all__ = ["BACKEND", "ObjectStoreEngine"]

BACKEND = "object_store"
_DONE = "done"
_BUCKET = "bucket"
#: buckets a queue holds before the sender waits
_QUEUE_DEPTH = 2
_queues: dict[int, list[Any]] = {}  # rollout world size -> its queues (the trainer's process)


async def _aiter(items: Iterable | AsyncIterator) -> AsyncIterator:
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


@CheckpointEngineRegistry.register(BACKEND)
class ObjectStoreEngine(CheckpointEngine):
    """Weights from the actor's rank 0 to each rollout worker through Ray's object store (module doc)."""

    def __init__(self, bucket_size: int, is_master: bool = False, **kwargs: Any) -> None:
        self.bucket_size = int(bucket_size)
        self.is_master = is_master
        self.queues: list[Any] | None = None  # rank 0 of the actor: every rollout worker's
        self.queue: Any = None  # a rollout worker: its own

    def prepare(self) -> dict[str, Any]:
        return {"is_master": self.is_master}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        from ray.util.queue import Queue

        queues = _queues.get(rollout_world_size)
        if queues is None:
            queues = [Queue(maxsize=_QUEUE_DEPTH, actor_options={"num_cpus": 0}) for _ in range(rollout_world_size)]
            _queues[rollout_world_size] = queues
        masters = [bool(m.get("is_master")) for m in metadata[:actor_wg_world_size]]
        if not any(masters):
            masters[0] = True
        actor_kwargs = {"queues": [queues if master else None for master in masters], "queue": [None] * actor_wg_world_size}
        rollout_kwargs = {"queues": [None] * rollout_world_size, "queue": list(queues)}
        return actor_kwargs, rollout_kwargs

    def init_process_group(self, queues: list[Any] | None = None, queue: Any = None) -> None:
        self.queues, self.queue = queues, queue

    def finalize(self) -> None:
        return None  # the queues stay for the next sync

    async def _send(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        ref = ray.put(bucket)
        for queue in self.queues:
            await queue.put_async((_BUCKET, [ref]))  # (in a list: Ray passes the reference, not the object)

    @torch.no_grad()
    async def send_weights(self, weights, global_steps: int | None = None) -> dict:
        if not self.queues:  # not rank 0: take part in each weight's gather, send nothing
            async for _ in _aiter(weights):
                pass
            return {}
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        async for name, tensor in _aiter(weights):
            tensor = tensor.detach().to("cpu").contiguous()
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= self.bucket_size:
                await self._send(bucket)
                bucket, size = [], 0
        if bucket:
            await self._send(bucket)
        for queue in self.queues:
            await queue.put_async((_DONE, global_steps))
        return {}

    async def receive_weights(self, global_steps: int | None = None):
        if self.queue is None:
            raise RuntimeError("object_store checkpoint engine: receive_weights before init_process_group")
        while True:
            kind, payload = await self.queue.get_async()
            if kind == _DONE:
                return
            for name, tensor in await payload[0]:
                yield name, tensor
