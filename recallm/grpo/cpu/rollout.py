"""The ``hf_cpu`` rollout: verl's server-based rollout API served by Hugging Face ``generate``.

verl 0.9.1 generates through rollout *servers*: a ``RolloutReplica`` (registered by name in
``RolloutReplicaRegistry``) launches one Ray actor per replica, the agent loop sends it
token-in/token-out ``generate`` requests (one per response: a prompt with ``rollout.n=4`` is
four requests), and a ``BaseRollout`` adapter inside each training worker (registered in
``_ROLLOUT_REGISTRY[(name, "async")]``) pushes the actor's weights to it after every step. This
module provides the three pieces for ``actor_rollout_ref.rollout.name=hf_cpu``:

* :class:`HFCPUServer` — the Ray actor: holds the model (``AutoModelForCausalLM`` after
  ``import recallm.modeling``), queues the requests that arrive together and generates them as batches
  (:class:`~recallm.grpo.cpu.hf_generate.HFGenerator`), returns verl's ``TokenOutput`` with the
  processed log-prob of every token; ``sleep``/``wake_up``/``abort`` are no-ops (a CPU has no
  memory to free for the trainer, and the synchronous trainer never aborts);
* :class:`HFCPUReplica` — starts the server next to the training workers (hybrid mode);
* :class:`HFCPUServerAdapter` — streams the actor's state dict to the server, in buckets of
  ``checkpoint_engine.update_weights_bucket_megabytes``, then checks that every weight arrived.

Settings: ``actor_rollout_ref.rollout.engine_kwargs.hf_cpu`` (``HFCPUSettings``). The rollout
ignores ``rollout.dtype``, ``gpu_memory_utilization`` and the other vLLM knobs.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from collections.abc import AsyncIterable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

from recallm.grpo.cpu.hf_generate import HFCPUSettings, HFGenerator, default_threads, request_seeds

__all__ = ["ROLLOUT_NAME", "HFCPUServer", "HFCPUReplica", "HFCPUServerAdapter", "server_actor_name"]

log = logging.getLogger(__name__)
ROLLOUT_NAME = "hf_cpu"


def server_actor_name(replica_rank: int, node_rank: int = 0, role: str = "") -> str:
    """The Ray actor name of a replica's server (the adapter finds the policy's by name);
    ``role`` is ``""`` for the policy, ``"reward_"``/``"teacher_"`` for verl's other rollouts."""
    return f"{ROLLOUT_NAME}_server_{role}{replica_rank}_{node_rank}"


def _settings(config) -> HFCPUSettings:
    engine_kwargs = getattr(config, "engine_kwargs", None) or {}
    return HFCPUSettings.from_engine_kwargs(engine_kwargs.get(ROLLOUT_NAME))


class HFCPUServer:
    """Ray actor serving ``generate`` for one rollout replica (see module doc)."""

    def __init__(self, config, model_config, rollout_mode: RolloutMode, replica_rank: int, node_rank: int = 0):
        self.config = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.rollout_mode = rollout_mode
        self.replica_rank = replica_rank
        self.node_rank = node_rank
        self.settings = _settings(self.config)
        torch.set_num_threads(self.settings.threads or default_threads())
        seed = self.settings.seed if self.settings.seed is not None else int(self.config.seed)
        torch.manual_seed(seed + replica_rank)  # the stream of requests without a seed of their own
        self._seed = seed  # the base of the per-request seeds: the same on every replica
        self._seen: dict[tuple, int] = {}  # requests this step by prompt and sample (seed_per_request)

        hf_config = copy.deepcopy(self.model_config.hf_config)  # override_config applied (as for the actor)
        max_model_len = self.config.max_model_len or getattr(hf_config, "max_position_embeddings", None)
        started = time.perf_counter()
        self.generator = HFGenerator.from_pretrained(
            self.model_config.local_path, self.settings, config=hf_config, max_model_len=max_model_len
        )
        log.info(
            "hf_cpu server %s: %s loaded in %.1fs (recall=%s, force_every=%s, %d threads)",
            server_actor_name(replica_rank, node_rank),
            type(self.generator.model).__name__,
            time.perf_counter() - started,
            self.generator.recall,
            self.settings.force_every,
            torch.get_num_threads(),
        )
        self.global_steps = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf_cpu")  # one model user at a time
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._batcher: asyncio.Task | None = None

    def ready(self) -> bool:
        return True

    def _default_max_tokens(self, prompt_len: int) -> int:
        c = self.config
        return min(int(c.response_length), int(c.prompt_length) + int(c.response_length) - prompt_len)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: Any = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """Token-in/token-out generation of one response (batched with concurrent requests)."""
        if image_data is not None or video_data is not None or audio_data is not None:
            raise NotImplementedError("the hf_cpu rollout serves text-only models")
        params = dict(sampling_params)
        want_log_probs = bool(params.pop("logprobs", False))
        request = self.generator.make_request(
            prompt_ids, params, default_max_tokens=self._default_max_tokens(len(prompt_ids))
        )
        if self.settings.seed_per_request:  # its own random stream: the same tokens in any batch, at any time
            # verl's priority is the response's index in the step's batch, whichever replica serves it; a
            # caller without one (the RLM's loop) counts its requests per replica, so the replica tells them apart
            sample = priority if priority is not None else f"replica {self.replica_rank}"
            request = request_seeds([request], self._seed, self.global_steps, self._seen, samples=[sample])[0]
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        result = await future
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs if want_log_probs else None,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    async def _run_batches(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self.settings.batch_wait_ms / 1000.0
        limit = self.settings.max_batch_size
        while self._pending:
            while len(self._pending) < limit:  # until the requests that came together have all arrived
                seen = len(self._pending)
                await asyncio.sleep(wait)
                if len(self._pending) == seen:
                    break
            batch, self._pending = self._pending[:limit], self._pending[limit:]
            try:
                results = await loop.run_in_executor(self._executor, self.generator.generate, [r for r, _ in batch])
            except Exception as exc:  # the requests fail, the server stays up
                log.exception("hf_cpu generation failed for a batch of %d requests", len(batch))
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)

    # --- weights (called by HFCPUServerAdapter) ---------------------------------------------------

    async def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.generator.load_weights, named_tensors)

    async def finish_weight_update(self, global_steps: int | None = None) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.generator.finish_weight_update)
        if global_steps is not None:
            self._set_step(global_steps)

    async def set_global_steps(self, global_steps: int) -> None:
        self._set_step(global_steps)

    def _set_step(self, global_steps: int) -> None:
        if global_steps != self.global_steps:
            self._seen = {}
        self.global_steps = global_steps

    # --- the rest of verl's server interface: nothing to do on a CPU ------------------------------

    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        while self._pending or (self._batcher is not None and not self._batcher.done()):
            await asyncio.sleep(0.01)

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        # generation is not interruptible here: requests in flight complete normally
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        return {"aborted": False, "request_id": request_id, "error": "the hf_cpu rollout does not abort requests"}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class HFCPUReplica(RolloutReplica):
    """One ``hf_cpu`` server per replica, on the node of the replica's training workers."""

    async def launch_servers(self) -> None:
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(
                f"the hf_cpu rollout runs next to the trainer (hybrid mode) only, not {self.rollout_mode}"
            )
        node_id = await self.workers[0].__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id())
        role = "reward_" if self.is_reward_model else "teacher_" if self.is_teacher_model else ""
        name = server_actor_name(self.replica_rank, 0, role) + self.name_suffix
        server = (
            ray.remote(HFCPUServer)
            .options(
                name=name,
                num_cpus=0,  # shares the cores with the trainer; the two never compute at the same time
                max_concurrency=self.max_concurrency,
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_id, soft=False
                ),
            )
            .remote(
                config=self.config,
                model_config=self.model_config,
                rollout_mode=self.rollout_mode,
                replica_rank=self.replica_rank,
            )
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # the load balancer's key; there is no HTTP endpoint


async def _aiter(items: Iterable | AsyncIterable):
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


class HFCPUServerAdapter(BaseRollout):
    """Inside each training worker: sends the actor's weights to the replica's ``hf_cpu`` server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, *args, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self._has_server = self.rollout_rank == 0
        self._server = None
        self._bucket_bytes = int(self.config.checkpoint_engine.update_weights_bucket_megabytes) << 20

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank, 0))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None  # weights and caches never leave memory

    async def release(self) -> None:
        return None

    async def update_weights(
        self,
        weights,
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        peft_config=None,
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf_cpu rollout receives full weights only (wire_format={wire_format!r})")
        if peft_config is not None:
            raise NotImplementedError(
                "the hf_cpu rollout takes merged weights only: set actor_rollout_ref.model.lora.merge=true"
            )
        started = time.perf_counter()
        server = self._server_handle() if self._has_server else None
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        count = 0
        # every rank consumes the generator: gathering a sharded weight is a collective
        async for name, tensor in _aiter(weights):
            if server is None:
                continue
            tensor = tensor.detach().to("cpu").contiguous()
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            count += 1
            if size >= self._bucket_bytes:
                await server.load_weights.remote(bucket)
                bucket, size = [], 0
        if server is None:
            return
        if bucket:
            await server.load_weights.remote(bucket)
        await server.finish_weight_update.remote(global_steps)
        log.info(
            "hf_cpu: %d weights sent to replica %d in %.2fs", count, self.replica_rank, time.perf_counter() - started
        )

    def generate_sequences(self, prompts):
        raise NotImplementedError("the hf_cpu rollout generates through its server (async mode)")
