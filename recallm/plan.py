"""``recallm-plan``: will a run fit (GPU memory, host RAM, disk, the time a save takes) before it starts?

Every formula of the plan lives here, each with where it comes from. The plan is an estimate from
the composed config and a description of the cluster; it never loads a model. Units: bytes and
seconds; ``GiB`` = 2**30 bytes, ``GB`` = 1e9 bytes (disks and bandwidths are sold in GB).

The model
---------
``P`` parameters of a decoder-only transformer (:class:`ModelShape`): embeddings ``V*h`` (and a
separate ``lm_head`` ``V*h`` unless tied), per layer ``q`` ``h*(H*d)``, ``k``/``v`` ``h*(K*d)`` each
(plus biases for Qwen2), ``o`` ``(H*d)*h``, the gated MLP ``3*h*I``, two RMSNorms ``2*h``; a final norm
``h``. Checked against the published totals: Qwen2.5-7B 7,615,616,512; Llama-3.1-8B 8,030,261,248
(+4 recall-token rows: ``recallm.tokens`` grows Llama's 128,256 rows to 128,260 and keeps Qwen's
padded 152,064). The shapes of the two paper bases and of Qwen2.5-1.5B-Instruct (:data:`PAPER_MODELS`) are their published
``config.json``; a model directory's own ``config.json`` is read when it exists.

GRPO: the actor under verl 0.9.1's FSDP2 engine (per GPU, world size ``N``)
-----------------------------------------------------------------------
``verl/workers/engine/fsdp/transformer_impl.py`` and ``verl/trainer/config/engine/fsdp.yaml``:

* training loads the actor in fp32 (``model_dtype: fp32``: ``torch_dtype = float32`` when not
  forward-only) and computes in bf16 (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``);
* ``param_offload`` / ``optimizer_offload`` move the sharded parameters and AdamW state to the host
  *between* phases (``BaseEngineCtx._context_switch`` -> ``FSDPEngine.to``): while the actor trains both
  are on the GPU. So the update holds ``4P/N`` (fp32 shard) + ``4P/N`` (fp32 gradient shard; unsharded
  ``4P`` when ``use_no_sync_for_gradient_accumulation`` defers the reduce-scatter, ``_gradient_sync_context``)
  + ``8P/N`` (AdamW's two fp32 moments), whatever the offload flags say;
* FSDP2 all-gathers one decoder layer at a time in bf16, prefetching the next: ``2 * 2 * layer``
  bytes, plus the root module's embeddings and ``lm_head`` (``2 * V*h`` each) while they compute;
* activations of the longest micro-batch, ``T`` tokens (with ``use_dynamic_bsz`` the token cap
  ``ppo_max_token_len_per_gpu``, else ``micro_batch * (prompt + response)``): with gradient
  checkpointing each layer keeps its bf16 input (``L*T*h*2``) and one layer is recomputed at a time,
  whose saved set is ``T*(12h + 4*K*d + 8I) * 2`` bytes (q/k/v/o and their rotated copies, norms and
  residuals, the MLP's gate/up/act/product and what autograd keeps of them: the per-layer set measured
  on the CPU, ``tests/unit/test_plan.py``). Without checkpointing every layer keeps that set;
* the logits: ``logits_copies`` tensors of ``T*V``: on GPUs 3 in bf16 (the logits, the recall-masked
  copy of ``recallm.modeling``, one gradient: flash-attn's cross-entropy kernel, which verl's
  ``logprobs_from_logits`` uses, writes its gradient in place and never materialises the log-softmax);
  on the CPU test 5 in fp32 (plus the log-softmax and its gradient). Flash attention keeps attention O(T); eager attention over an unpacked
  (padded) micro-batch would add ``H*T^2*2`` bytes per layer recomputed (:func:`attention_bytes`);
* CUDA context and allocator slack: :data:`CUDA_CONTEXT` per process on the GPU (trainer, vLLM) and
  :data:`FRAGMENTATION` of what the allocator holds.

The reference (``use_kl_loss``) is forward-only: verl 0.9.1 gives it ``CPUOffloadPolicy`` (parameters on
the host, bf16); its peak is the gathered layers and one layer's forward plus the logits at
``log_prob_max_token_len_per_gpu``: below the actor's update, so the update is what is checked.

GRPO: the vLLM rollout (vLLM 0.24.0, colocated, ``free_cache_engine``)
-----------------------------------------------------------------
``vllm/v1/worker/gpu_worker.py`` (``determine_available_memory``): the engine may use
``gpu_memory_utilization * total`` bytes; from them it takes its weights (bf16 ``2P / TP``), the peak
activations of its profiling run at ``max_num_batched_tokens`` (we take ``tokens*(4h + 2I)*2 +
max_num_seqs*V*4``: the widest MLP intermediate and the sampler's fp32 logits) and the CUDA graphs
(:data:`CUDA_GRAPHS`, none with ``enforce_eager``); the rest is the KV cache, ``2 * L * K * d * 2``
bytes per token in bf16 (``vllm/v1/kv_cache_interface.py``, ``FullAttentionSpec.page_size_bytes``).
While vLLM is awake the actor is offloaded only if both offload flags are set; otherwise its fp32
shards (``12P/N``) stay on the GPU next to vLLM's budget. The engine sleeps at level 1 while the actor
trains (``vllm_async_server.py``: ``engine.sleep(level=1)`` for the hybrid engine): its weights go to
host RAM (pinned), its KV cache is freed.

LoRA (``actor_rollout_ref.model.lora_rank`` > 0)
-----------------------------------------------
verl wraps the actor in PEFT (``transformer_impl.py``, ``_build_lora_module``): ``A`` and ``B`` of rank ``r``
on each targeted linear layer, ``r*(in+out)`` parameters each (:meth:`ModelShape.lora_params`; PEFT's
``all-linear`` leaves the output head out). The base is frozen: it keeps its parameters (in the dtype verl
loads a training actor in, ``fsdp_config.model_dtype``, fp32 by default; the adapter is cast to it) but has
no gradient and no optimizer state; the adapter ``a`` has both. Each adapted layer also keeps the rank-wide
output of its ``A`` for the backward. The reference is the actor with its adapter off (``ray_trainer.py``:
``ref_in_actor``), so no reference copy exists. vLLM holds one adapter slot (``max_loras=1``) at
``max_lora_rank``, the rank rounded up to one vLLM allows (``recallm.modeling.vllm_lora_rank``), in bf16. A save holds the
base and the adapter in the model shards and the adapter's two moments. SFT's stage ``full`` with
``sft.lora.rank`` > 0 (PEFT in ``recallm.sft``): the adapter, and the four recall rows when
``sft.lora.token_rows``, is what trains and what a checkpoint holds; the final model is merged.

Host RAM (per node)
-------------------
What the node's ranks offload: the actor's fp32 parameters, gradients and AdamW state (``16P`` in all,
when offloaded), the reference's bf16 parameters (``2P``), the sleeping vLLM engines' weights
(``2P`` per engine), the staging of one save (each rank's shard of model and optimizer state,
``12P`` in all), and :data:`PROCESS_RAM` per GPU (Python, torch, CUDA libraries, Ray, vLLM).

Checkpoints (verl 0.9.1 ``utils/checkpoint/fsdp_checkpoint_manager.py``)
-----------------------------------------------------------------------
One save of ``save_contents=[model, optimizer, extra]``: the fp32 model shards ``4P`` and the AdamW
state ``8P``; ``hf_model`` adds a bf16 copy ``2P``. verl keeps ``trainer.max_actor_ckpt_to_keep`` (all
when null; ``checkpoint_manager.py``: ``ensure_checkpoint_capacity`` removes old ones before a save, so
no more than that many exist at once) -- but only those saved by the running process, so a requeued
job leaves the earlier ones behind. RecaLLM's own retention (``recallm.keep_checkpoints``,
``recallm.grpo.retention``) scans the directory after every save instead, keeps the newest ones and
the evaluated step (``recallm.eval_step``) as weights only (``4P``: model shards, no optimizer).

One save is written at ``write_bandwidth`` (the node's ranks share it), then read back once for its
checksums (``recallm.grpo.checkpoints``; a step without them is not resumed from), taken at the same
rate. verl's deadline save
(``utils/checkpoint/checkpoint_manager.py``: ``should_save_ckpt_esi``) starts once the time left before
the deadline is at most ``60 + longest step + trainer.esi_redundant_time``: the save then has at least
``60 + esi_redundant_time`` seconds before the deadline (``slurm/grpo*.sbatch`` set the deadline to the
moment SLURM's USR1 arrives, ``--signal=B:USR1@N`` before the time limit, after which the job
requeues). Each rank then waits for the others in a collective: the slowest rank's write must finish
within the process group's timeout (torch's NCCL default is 10 minutes; verl 0.9.1's engine workers
pass none, ``actor_rollout_ref.nccl_timeout`` reaches them through ``recallm.grpo.runtime``).

SFT (``recallm-sft deepspeed=zero2``: DeepSpeed ZeRO-2, optimizer offloaded to the host)
---------------------------------------------------------------------------------------
``deepspeed/runtime/zero/stage_1_and_2.py``: every rank holds the whole bf16 model (``2P``), its
partition of the bf16 gradients (``2P/N``) and the reduce bucket; the fp32 master weights and Adam
moments live on the host (``12P`` per node, plus the fp32 gradient partition ``4P``). Activations as
above at ``per_device_batch_size * max_length`` tokens. A save of the Trainer writes the bf16 model
(``2P``) and DeepSpeed's optimizer state (``12P``), ``save_total_limit`` of them kept.

Throughput
----------
Steps per hour from a step time you give or one measured by a previous run (the mean of verl's
``timing_s/step`` in its metrics log).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError

__all__ = [
    "ModelShape",
    "PAPER_MODELS",
    "Cluster",
    "Line",
    "Plan",
    "model_shape",
    "node_cluster",
    "measure_write_bandwidth",
    "grpo_plan",
    "sft_plan",
    "actor_update_bytes",
    "vllm_budget",
    "attention_bytes",
    "checkpoint_bytes",
    "mean_step_seconds",
    "GiB",
    "GB",
]

GiB = 2**30
GB = 10**9
#: per process on a GPU: the CUDA context and the libraries' workspaces (cuBLAS, NCCL)
CUDA_CONTEXT = 1 * GiB
#: what the caching allocator holds beyond what tensors use (fragmentation): a share of the peak
FRAGMENTATION = 0.10
#: vLLM's captured CUDA graphs (verl's default ``enforce_eager: false``)
CUDA_GRAPHS = 1 * GiB
#: host memory per GPU besides the offloaded state: the Python processes (trainer, vLLM, Ray workers)
PROCESS_RAM = 8 * GiB
#: verl's fixed part of the deadline-save lead (``should_save_ckpt_esi(save_ckpt_duration=60)``)
VERL_SAVE_LEAD = 60
#: torch's default timeout of an NCCL process group (``torch.distributed.constants.default_pg_nccl_timeout``)
TORCH_NCCL_TIMEOUT = 600
#: what a save may take of the time it has (slack for a slow shared file system)
SAVE_SAFETY = 1.5


# ------------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that the memory depends on."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool = False

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        return attn + 3 * h * self.intermediate + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def params(self) -> int:
        return self.embedding_params + self.layers * self.layer_params + self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 K and V of every layer (vLLM's ``FullAttentionSpec.page_size_bytes`` per token)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def linear_layers(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer, by its module name."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def lora_targets(self, target_modules: Any = "all-linear") -> list[str]:
        """The linear layers (of each decoder layer) a LoRA config adapts; ``all-linear`` (or unset: None, "")
        is every one of them (PEFT leaves the output head out); a list may be any sequence (a ListConfig)."""
        linear = self.linear_layers
        target_modules = target_modules or "all-linear"
        if isinstance(target_modules, str):
            targets = list(linear) if target_modules == "all-linear" else [target_modules]
        else:
            targets = list(dict.fromkeys(str(t) for t in target_modules))
        unknown = [t for t in targets if t not in linear]
        if unknown or not targets:
            raise RecallmError(
                f"the plan knows the LoRA targets all-linear and {', '.join(linear)}; got {target_modules!r}"
            )
        return targets

    def lora_params(self, rank: int, target_modules: Any = "all-linear") -> int:
        """A LoRA adapter's parameters: ``rank * (in + out)`` (PEFT's A and B) for each targeted linear layer of
        every decoder layer."""
        if rank <= 0:
            return 0
        linear = self.linear_layers
        return self.layers * sum(rank * sum(linear[t]) for t in self.lora_targets(target_modules))

    def lora_width(self, rank: int, target_modules: Any = "all-linear") -> int:
        """Per token and decoder layer, the width of what the adapted layers' ``A`` output (kept for the
        backward): the rank times the number of adapted linear layers."""
        return rank * len(self.lora_targets(target_modules)) if rank > 0 else 0

    def layer_activation_bytes(self, tokens: int, dtype_bytes: int = 2) -> int:
        """One layer's forward working set at ``tokens`` (module doc; bf16: 2 bytes)."""
        h = self.hidden
        return tokens * (12 * h + 4 * self.kv_heads * self.head_dim + 8 * self.intermediate) * dtype_bytes


#: the published ``config.json`` of the paper's two bases, with the recall tokens' rows (module doc)
PAPER_MODELS: dict[str, ModelShape] = {
    "qwen2.5_7b": ModelShape(
        name="Qwen2.5-7B-Instruct",
        vocab=152064,
        hidden=3584,
        layers=28,
        heads=28,
        kv_heads=4,
        head_dim=128,
        intermediate=18944,
        tied=False,
        qkv_bias=True,
    ),
    # not a paper base: the one-GPU recipe's model (configs/grpo/qwen2.5_1.5b_lora_24gb.yaml), its published
    # config.json (151,936 rows hold the recall tokens in Qwen's padding; tied embeddings)
    "qwen2.5_1.5b": ModelShape(
        name="Qwen2.5-1.5B-Instruct",
        vocab=151936,
        hidden=1536,
        layers=28,
        heads=12,
        kv_heads=2,
        head_dim=128,
        intermediate=8960,
        tied=True,
        qkv_bias=True,
    ),
    "llama3.1_8b": ModelShape(
        name="Llama-3.1-8B-Instruct",
        vocab=128260,
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate=14336,
        tied=False,
    ),
}


def model_shape(path: str | None, name: str | None = None) -> ModelShape:
    """The shape of the model at ``path`` (its ``config.json``), else of the paper base ``name``."""
    if path not in (None, "", "???") and (Path(str(path)) / "config.json").is_file():
        from recallm.modeling import read_model_config

        c = read_model_config(path)
        text = getattr(c, "text_config", None) or c
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        return ModelShape(
            name=str(path),
            vocab=int(text.vocab_size),
            hidden=int(text.hidden_size),
            layers=int(text.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            head_dim=head_dim,
            intermediate=int(text.intermediate_size),
            tied=bool(getattr(c, "tie_word_embeddings", False)),
            qkv_bias=str(getattr(c, "model_type", "")).removeprefix("recallm_") == "qwen2",
        )
    if name in PAPER_MODELS:
        return PAPER_MODELS[name]
    known = ", ".join(PAPER_MODELS)
    where = f"{path} has no config.json" if path not in (None, "", "???") else "the model path is not set"
    raise RecallmError(f"{where}: give a model directory or --model NAME (one of {known})")


# ----------------------------------------------------------------------------------------- cluster
@dataclass(frozen=True)
class Cluster:
    """What the plan is checked against; ``source`` says where each value came from."""

    gpus_per_node: int
    nodes: int
    gpu_memory: int  # bytes per GPU
    host_ram: int  # bytes per node
    disk_free: int  # bytes at the checkpoint directory
    write_bandwidth: float  # bytes per second, one node's ranks together
    source: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def _existing_parent(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def measure_write_bandwidth(directory: Path, size: int = 256 * 2**20) -> float:
    """Bytes per second of one ``size``-byte file written and fsynced in ``directory`` (removed after)."""
    target = _existing_parent(directory)
    probe = target / f".recallm-plan-probe-{os.getpid()}"
    block = os.urandom(min(size, 16 * 2**20))
    start = time.perf_counter()
    try:
        with open(probe, "wb") as fh:
            written = 0
            while written < size:
                fh.write(block)
                written += len(block)
            fh.flush()
            os.fsync(fh.fileno())
        elapsed = time.perf_counter() - start
    finally:
        probe.unlink(missing_ok=True)
    return written / max(elapsed, 1e-6)


def node_cluster(checkpoint_dir: str | None, *, measure_write: bool = True) -> dict[str, tuple[Any, str]]:
    """What this node says about itself: value and source per :class:`Cluster` field (missing: unknown)."""
    found: dict[str, tuple[Any, str]] = {}
    try:
        import torch

        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            found["gpus_per_node"] = (count, "this node (torch.cuda)")
            found["gpu_memory"] = (torch.cuda.get_device_properties(0).total_memory, "this node (torch.cuda)")
    except ImportError:
        pass
    try:
        found["host_ram"] = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this node (sysconf)")
    except (ValueError, OSError, AttributeError):
        pass
    if checkpoint_dir not in (None, "", "???"):
        where = _existing_parent(Path(str(checkpoint_dir)))
        found["disk_free"] = (shutil.disk_usage(where).free, f"free space at {where}")
        if measure_write:
            try:
                found["write_bandwidth"] = (measure_write_bandwidth(where), f"measured at {where} (256 MiB, fsync)")
            except OSError:
                pass
    return found


# ------------------------------------------------------------------------------------------- lines
@dataclass(frozen=True)
class Line:
    """One checked quantity: ``need`` against ``have`` (None: shown, not checked)."""

    section: str
    what: str
    need: float
    have: float | None
    unit: str  # "GiB" | "GB" | "s" | "x" | ""
    why: str
    fix: str = ""

    @property
    def fits(self) -> bool | None:
        return None if self.have is None else self.need <= self.have

    def render(self) -> str:
        def fmt(value: float) -> str:
            if self.unit == "GiB":
                return f"{value / GiB:,.1f} GiB"
            if self.unit == "GB":
                return f"{value / GB:,.0f} GB"
            if self.unit == "s":
                return f"{value:,.0f} s"
            if self.unit == "x":
                return f"{value:.2f}x"
            if self.unit == "h":
                return f"{value / 3600:,.1f} h"
            if self.unit == "/h":
                return f"{value:,.2f} per hour"
            return f"{value:,.0f}"

        verdict = {True: "fits", False: "DOES NOT FIT", None: "info"}[self.fits]
        if self.unit == "flag":
            amount = "needed, " + ("present" if self.fits else "missing")
        else:
            amount = fmt(self.need) if self.have is None else f"{fmt(self.need)} of {fmt(self.have)}"
        text = f"  {self.what:<34} {amount:<26} {verdict}: {self.why}"
        if self.fits is False and self.fix:
            text += f"\n  {'':<34} {'':<26} fix: {self.fix}"
        return text


@dataclass
class Plan:
    title: str
    lines: list[Line] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *args: Any, **kwargs: Any) -> Line:
        line = Line(*args, **kwargs)
        self.lines.append(line)
        return line

    @property
    def misfits(self) -> list[Line]:
        return [line for line in self.lines if line.fits is False]

    @property
    def fits(self) -> bool:
        return not self.misfits

    def render(self) -> str:
        out = [self.title]
        section = None
        for line in self.lines:
            if line.section != section:
                section = line.section
                out.append(section)
            out.append(line.render())
        out += [f"note: {n}" for n in self.notes]
        verdict = "everything fits" if self.fits else f"{len(self.misfits)} thing(s) do not fit"
        out.append(f"verdict: {verdict}")
        return "\n".join(out)

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "fits": self.fits,
            "lines": [{**asdict(line), "fits": line.fits} for line in self.lines],
            "notes": self.notes,
        }


# ---------------------------------------------------------------------------------------- formulas
def attention_bytes(shape: ModelShape, tokens: int, attn: str) -> int:
    """Extra memory of one layer's attention at ``tokens`` in one sequence: none for flash / sdpa's
    memory-efficient kernels (O(T)), the ``H*T^2`` bf16 score matrix for eager attention."""
    return shape.heads * tokens * tokens * 2 if attn == "eager" else 0


def actor_update_bytes(
    shape: ModelShape,
    gpus: int,
    tokens: int,
    *,
    checkpointing: bool = True,
    defer_grad_sync: bool = False,
    attn: str = "flash_attention_2",
    longest_sequence: int | None = None,
    compute_bytes: int = 2,
    sharded: bool = True,
    logits_copies: int = 3,
    lora_params: int = 0,
    lora_width: int = 0,
    param_bytes: int = 4,
) -> dict[str, int]:
    """Per-GPU bytes of the actor's update under verl's FSDP2 engine (module doc), by part. ``compute_bytes``
    4 and ``sharded=False``: the same step of a plain fp32 model in one process (the CPU's; the test that
    measures it, ``tests/unit/test_plan.py``). ``lora_params`` > 0: verl's LoRA (module doc, "LoRA"): the base
    is frozen (no gradient, no optimizer state), the adapter (cast to the base's dtype, ``param_bytes``) has
    both; ``lora_width``: the rank times the adapted linear layers of one decoder layer (what their A's outputs
    keep per token). ``param_bytes``: the dtype verl loads the actor in (``fsdp_config.model_dtype``: fp32 by default)."""
    p, n = shape.params, gpus
    layer_act = shape.layer_activation_bytes(tokens, compute_bytes)
    if checkpointing:
        activations = shape.layers * tokens * shape.hidden * compute_bytes + layer_act
    else:
        activations = shape.layers * layer_act
    activations += attention_bytes(shape, longest_sequence or tokens, attn) * (1 if checkpointing else shape.layers)
    gathered = (2 * 2 * shape.layer_params + 2 * shape.embedding_params) if sharded else 0
    logits = logits_copies * compute_bytes * tokens * shape.vocab
    if lora_params > 0:
        a = lora_params
        dtype = "fp32" if param_bytes == 4 else "bf16"
        # each adapted linear layer keeps its A's rank-wide output too (the recomputed layer, or every layer)
        activations += (1 if checkpointing else shape.layers) * tokens * lora_width * compute_bytes
        return {
            f"base parameters (frozen, {dtype} shard)": param_bytes * p // n,
            f"adapter ({dtype} shard)": param_bytes * a // n,
            f"adapter gradients ({dtype} " + ("unsharded)" if defer_grad_sync else "shard)"): (
                param_bytes * a if defer_grad_sync else param_bytes * a // n
            ),
            f"adapter AdamW state ({dtype} shard)": 2 * param_bytes * a // n,
            "gathered layers (bf16)": gathered,
            "activations": activations,
            "logits": logits,
        }
    return {
        "parameters (fp32 shard)": 4 * p // n,
        "gradients (fp32 " + ("unsharded)" if defer_grad_sync else "shard)"): 4 * p if defer_grad_sync else 4 * p // n,
        "AdamW state (fp32 shard)": 8 * p // n,
        "gathered layers (bf16)": gathered,
        "activations": activations,
        "logits": logits,
    }


def vllm_budget(
    shape: ModelShape,
    gpu_memory: int,
    utilization: float,
    *,
    tp: int = 1,
    batched_tokens: int = 8192,
    max_seqs: int = 256,
    eager: bool = False,
    lora_params: int = 0,
) -> dict[str, int]:
    """vLLM's budget ``utilization * gpu_memory`` split as vLLM 0.24.0 does (module doc); the KV cache is
    what is left (negative: the engine cannot start). ``lora_params``: one adapter slot at the engine's
    ``max_lora_rank`` (verl starts it with ``max_loras=1``), in bf16 next to the weights."""
    budget = int(utilization * gpu_memory)
    weights = 2 * (shape.params + lora_params) // tp
    activations = batched_tokens * (4 * shape.hidden + 2 * shape.intermediate) * 2 // tp + max_seqs * shape.vocab * 4
    graphs = 0 if eager else CUDA_GRAPHS
    return {
        "budget": budget,
        "weights": weights,
        "activations": activations,
        "cuda graphs": graphs,
        "kv cache": budget - weights - activations - graphs,
    }


def __getattr__(name: str) -> Any:
    """``recallm.plan.vllm_lora_rank`` is ``recallm.modeling``'s (imported on first use: it loads torch)."""
    if name == "vllm_lora_rank":
        from recallm.modeling import vllm_lora_rank

        return vllm_lora_rank
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def checkpoint_bytes(
    shape: ModelShape, contents: list[str], *, model_dtype_bytes: int = 4, lora_params: int = 0
) -> int:
    """One verl FSDP save of ``save_contents`` (module doc). With LoRA (``lora_params`` > 0) the model shards
    hold the frozen base and the adapter, the optimizer state only the adapter's two moments."""
    p, a = shape.params, lora_params
    size = 0
    if "model" in contents:
        size += model_dtype_bytes * (p + a)
    if "optimizer" in contents:
        size += 2 * model_dtype_bytes * a if a else 8 * p
    if "hf_model" in contents:
        size += 2 * (p + a)
    return size


def mean_step_seconds(metrics: str | Path) -> float:
    """The mean ``timing_s/step`` of a verl metrics log (JSONL, one record per step; the last record of
    a step logged twice wins, as ``recallm.eval.curves`` reads it)."""
    path = Path(metrics)
    if path.is_dir():
        from recallm.paths import METRICS_FILE

        path = path / METRICS_FILE
    if not path.is_file():
        raise RecallmError(f"--metrics {metrics}: no such metrics log")
    steps: dict[int, float] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            raise RecallmError(f"--metrics {path}: line {number} is not JSON") from None
        data = record.get("data", record) if isinstance(record, dict) else {}
        step = record.get("step") if isinstance(record, dict) else None
        value = data.get("timing_s/step") if isinstance(data, dict) else None
        if isinstance(step, int) and isinstance(value, (int, float)):
            steps[step] = float(value)
    if not steps:
        raise RecallmError(f"--metrics {path}: no step has timing_s/step")
    return sum(steps.values()) / len(steps)


def _gib(value: int) -> str:
    return f"{value / GiB:.1f} GiB"


def _kept_saves(total: int, freq: int, keep: int | None) -> int:
    saves = (total // freq + (0 if total % freq == 0 else 1)) if freq > 0 and total > 0 else 0
    return min(saves, keep) if keep else saves


def _time_lines(plan: Plan, steps: int | None, step_seconds: float | None, time_limit_h: float | None) -> None:
    if step_seconds is None:
        plan.notes.append("no step time given: --step-seconds S or --metrics <a previous run's metrics.jsonl>")
        return
    per_hour = 3600 / step_seconds
    plan.add("time", "steps per hour", per_hour, None, "/h", f"{step_seconds:,.0f} s per step")
    if not steps:
        return
    hours = steps * step_seconds / 3600
    why = f"{steps} steps x {step_seconds:,.0f} s = {hours:,.1f} h"
    if time_limit_h:
        jobs = math.ceil(hours / time_limit_h)
        why += f": {jobs} job(s) of {time_limit_h:g} h (each requeue resumes from the newest checkpoint)"
    plan.add("time", "whole run", hours * 3600, None, "h", why)


# ------------------------------------------------------------------------------------------- GRPO
def _sel(cfg: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(cfg, key, default=default, throw_on_missing=False)
    except Exception:  # an interpolation that cannot resolve yet (a ??? it depends on)
        return default
    return default if value == "???" else value


def grpo_plan(
    cfg: Any,
    cluster: Cluster,
    shape: ModelShape,
    *,
    step_seconds: float | None = None,
    time_limit_h: float | None = None,
    flash_attn_installed: bool | None = None,
    mean_tokens: int = 11000,
) -> Plan:
    """The plan of a composed GRPO config (``configs/grpo.yaml`` with a recipe) on ``cluster``."""
    n = cluster.gpus
    arr = "actor_rollout_ref"
    prompt, response = int(_sel(cfg, "data.max_prompt_length")), int(_sel(cfg, "data.max_response_length"))
    longest = prompt + response
    packed = bool(_sel(cfg, f"{arr}.model.use_remove_padding", False))
    attn = _sel(cfg, f"{arr}.model.override_config.attn_implementation") or "flash_attention_2"
    checkpointing = bool(_sel(cfg, f"{arr}.model.enable_gradient_checkpointing", False))
    if _sel(cfg, f"{arr}.actor.use_dynamic_bsz", False):
        tokens = max(int(_sel(cfg, f"{arr}.actor.ppo_max_token_len_per_gpu")), longest)
        how = f"token cap ppo_max_token_len_per_gpu={tokens:,}"
    else:
        micro = int(_sel(cfg, f"{arr}.actor.ppo_micro_batch_size_per_gpu") or 1)
        tokens = micro * longest
        how = f"{micro} x {longest:,} tokens"
    defer = bool(_sel(cfg, f"{arr}.actor.fsdp_config.use_no_sync_for_gradient_accumulation", False))
    param_off = bool(_sel(cfg, f"{arr}.actor.fsdp_config.param_offload", False))
    optim_off = bool(_sel(cfg, f"{arr}.actor.fsdp_config.optimizer_offload", False))
    model_dtype = str(_sel(cfg, f"{arr}.actor.fsdp_config.model_dtype", "fp32") or "fp32")
    param_bytes = 2 if model_dtype in ("bf16", "bfloat16") else 4
    rank = int(_sel(cfg, f"{arr}.model.lora_rank", 0) or 0)
    targets = _sel(cfg, f"{arr}.model.target_modules", "all-linear")
    lora = shape.lora_params(rank, targets)
    # under LoRA, what the actor keeps between phases: the frozen base, the adapter and its two moments
    lora_kept = param_bytes * (shape.params + 3 * lora)
    gpu = cluster.gpu_memory
    plan = Plan(
        f"plan: GRPO {shape.name} ({shape.params / 1e9:.2f}B parameters) on {cluster.nodes} node(s) x "
        f"{cluster.gpus_per_node} GPU(s) of {_gib(gpu)}"
        + (f", LoRA rank {rank} ({lora / 1e6:,.0f}M adapter parameters)" if lora else "")
    )

    # --- the actor's update
    parts = actor_update_bytes(
        shape,
        n,
        tokens,
        checkpointing=checkpointing,
        defer_grad_sync=defer,
        attn=attn if not packed else "flash_attention_2",
        longest_sequence=longest,
        lora_params=lora,
        lora_width=shape.lora_width(rank, targets),
        param_bytes=param_bytes if lora else 4,
    )
    tensors = sum(parts.values())
    update = int(tensors * (1 + FRAGMENTATION)) + 2 * CUDA_CONTEXT
    detail = ", ".join(f"{k} {_gib(v)}" for k, v in parts.items())
    plan.add(
        "GPU memory (per GPU)",
        "actor update (FSDP2)",
        update,
        gpu,
        "GiB",
        f"micro-batch of {how}; {detail}; +{FRAGMENTATION:.0%} allocator, 2 CUDA contexts",
        fix=f"lower {arr}.actor.ppo_max_token_len_per_gpu (not below {longest:,}), more GPUs, or "
        "enable_gradient_checkpointing=true",
    )

    # --- the rollout
    rollout = f"{arr}.rollout"
    if _sel(cfg, f"{rollout}.name") == "vllm":
        from recallm.modeling import vllm_lora_rank

        util = float(_sel(cfg, f"{rollout}.gpu_memory_utilization", 0.5))
        tp = int(_sel(cfg, f"{rollout}.tensor_model_parallel_size", 1) or 1)
        v = vllm_budget(
            shape,
            gpu,
            util,
            tp=tp,
            batched_tokens=int(_sel(cfg, f"{rollout}.max_num_batched_tokens", 8192) or 8192),
            max_seqs=int(_sel(cfg, f"{rollout}.max_num_seqs", 256) or 256),
            eager=bool(_sel(cfg, f"{rollout}.enforce_eager", False)),
            lora_params=shape.lora_params(vllm_lora_rank(rank), targets) if lora else 0,
        )
        if param_off and optim_off:
            resident = 0
        elif lora:  # the frozen base and the adapter with its two moments (its gradients are freed)
            resident = lora_kept // n
        else:
            resident = 12 * shape.params // n
        plan.add(
            "GPU memory (per GPU)",
            "vLLM awake (rollout)",
            v["budget"] + resident + 2 * CUDA_CONTEXT,
            gpu,
            "GiB",
            f"gpu_memory_utilization={util} of {_gib(gpu)} = {_gib(v['budget'])}"
            + (f"; the actor's unoffloaded shards {_gib(resident)}" if resident else "; the actor offloaded")
            + "; 2 CUDA contexts",
            fix=f"lower {rollout}.gpu_memory_utilization",
        )
        kv_tokens = max(v["kv cache"], 0) // shape.kv_bytes_per_token
        per_gpu_rollouts = int(_sel(cfg, "data.train_batch_size")) * int(_sel(cfg, f"{rollout}.n")) // max(n // tp, 1)
        plan.add(
            "GPU memory (per GPU)",
            "vLLM KV cache",
            longest,
            kv_tokens,
            "",
            f"{_gib(v['kv cache'])} after weights {_gib(v['weights'])}, activations {_gib(v['activations'])}, "
            f"graphs {_gib(v['cuda graphs'])}: {kv_tokens:,} tokens at {shape.kv_bytes_per_token:,} B/token hold "
            f"{kv_tokens // longest} longest ({longest:,}-token) sequences or {kv_tokens // mean_tokens} typical "
            f"({mean_tokens:,}-token) ones at once, of the {per_gpu_rollouts:,} rollouts per engine per step "
            "(need: one longest sequence)",
            fix=f"raise {rollout}.gpu_memory_utilization or {rollout}.tensor_model_parallel_size",
        )

    # --- attention: packed needs flash-attn
    if packed and attn.startswith("flash_attention") and flash_attn_installed is False:
        plan.add(
            "attention",
            "flash-attn for packed sequences",
            1,
            0,
            "flag",
            "use_remove_padding=true needs flash-attn's varlen kernels and flash-attn is not installed here",
            fix=f"install it (scripts/install_gpu.sh), or run unpacked: {arr}.model.use_remove_padding=false "
            f"{arr}.model.override_config.attn_implementation=sdpa (see the unpacked cost below)",
        )
    if packed:
        cost = longest / mean_tokens
        plan.add(
            "attention",
            "cost of running unpacked",
            cost,
            None,
            "x",
            f"use_remove_padding=false pads every sequence to {longest:,} tokens: {cost:.2f}x the token work of "
            f"packed {mean_tokens:,}-token sequences (--mean-tokens) in the actor's and reference's passes",
        )
    else:
        cost = longest / mean_tokens
        plan.add(
            "attention",
            "unpacked (use_remove_padding=false)",
            cost,
            None,
            "x",
            f"{attn}: every sequence padded to {longest:,} tokens, {cost:.2f}x the token work of packed "
            f"{mean_tokens:,}-token sequences in the actor's and reference's passes",
        )

    # --- host RAM (per node)
    share = cluster.gpus_per_node / n
    vllm = _sel(cfg, f"{rollout}.name") == "vllm"
    tp = int(_sel(cfg, f"{rollout}.tensor_model_parallel_size", 1) or 1)
    # with LoRA the reference is the actor with its adapter off (verl's ref_in_actor): no second copy
    state = lora_kept + param_bytes * lora if lora else 16 * shape.params  # + the adapter's gradients
    host_parts = {
        "actor state offloaded": int(state * share) if (param_off or optim_off) else 0,
        "reference (bf16)": int(2 * shape.params * share)
        if _sel(cfg, f"{arr}.actor.use_kl_loss", False) and not lora
        else 0,
        "sleeping vLLM weights": 2 * shape.params * cluster.gpus_per_node // tp if vllm else 0,
        "save staging": int((lora_kept if lora else 12 * shape.params) * share),
        "processes": PROCESS_RAM * cluster.gpus_per_node,
    }
    plan.add(
        "host RAM (per node)",
        "host RAM",
        sum(host_parts.values()),
        cluster.host_ram,
        "GiB",
        ", ".join(f"{k} {_gib(v)}" for k, v in host_parts.items() if v),
        fix="fewer GPUs per node share the node's RAM, or param_offload=false where the GPU has room",
    )

    # --- checkpoints
    contents = list(_sel(cfg, f"{arr}.actor.checkpoint.save_contents", ["model", "optimizer", "extra"]))
    one = checkpoint_bytes(shape, contents, model_dtype_bytes=param_bytes, lora_params=lora)
    total = int(_sel(cfg, "trainer.total_training_steps") or 0)
    freq = int(_sel(cfg, "trainer.save_freq", -1))
    keep = _sel(cfg, "recallm.keep_checkpoints")
    verl_keep = _sel(cfg, "trainer.max_actor_ckpt_to_keep")
    eval_step = _sel(cfg, "recallm.eval_step")
    kept = _kept_saves(total, freq, keep or verl_keep)
    extra_eval = 0
    if keep and eval_step:
        extra_eval = checkpoint_bytes(shape, ["model"], model_dtype_bytes=param_bytes, lora_params=lora)
    # one more full save exists while the next is written (verl removes the oldest before writing only
    # with max_actor_ckpt_to_keep >= 2; our retention removes after the save)
    in_flight = one if keep else 0
    disk = one * kept + extra_eval + in_flight
    if keep:
        keep_why = f"recallm.keep_checkpoints={keep} newest + 1 being written"
    elif verl_keep:
        keep_why = f"trainer.max_actor_ckpt_to_keep={verl_keep} (a requeued job leaves older ones behind)"
    else:
        keep_why = "every save kept (nothing removes them)"
    plan.add(
        "disk (checkpoint directory)",
        "checkpoints",
        disk,
        cluster.disk_free,
        "GB",
        f"{one / GB:,.0f} GB per save ({'+'.join(contents)}) x {kept} ({keep_why})"
        + (f" + the step-{eval_step} weights {extra_eval / GB:,.0f} GB (recallm.eval_step)" if extra_eval else ""),
        fix="recallm.keep_checkpoints=N (fewer kept), a larger trainer.save_freq, or a larger disk",
    )

    # --- the time of one save
    save_s = one / cluster.write_bandwidth
    check_s = one / cluster.write_bandwidth  # the checksum pass reads it back (recallm.grpo.checkpoints)
    redundant = float(_sel(cfg, "trainer.esi_redundant_time", 0) or 0)
    margin = VERL_SAVE_LEAD + redundant
    plan.add(
        "time",
        "deadline save",
        (save_s + check_s) * SAVE_SAFETY,
        margin,
        "s",
        f"one save {one / GB:,.0f} GB at {cluster.write_bandwidth / GB:.2f} GB/s = {save_s:,.0f} s, and its "
        f"checksums as long again (x{SAVE_SAFETY} slack), must end before SLURM's USR1: verl starts it at least "
        f"60 + trainer.esi_redundant_time={redundant:g} s before",
        fix=f"trainer.esi_redundant_time={math.ceil((save_s + check_s) * SAVE_SAFETY - VERL_SAVE_LEAD)} (or a faster disk)",
    )
    timeout = int(_sel(cfg, f"{arr}.nccl_timeout", TORCH_NCCL_TIMEOUT) or TORCH_NCCL_TIMEOUT)
    rank_s = (one / n) / (cluster.write_bandwidth / cluster.gpus_per_node)
    plan.add(
        "time",
        "collective timeout at a save",
        rank_s * SAVE_SAFETY,
        timeout,
        "s",
        f"each rank writes {one / n / GB:,.1f} GB at its share of the bandwidth ({rank_s:,.0f} s, x{SAVE_SAFETY}) "
        f"while the others wait in a collective: {arr}.nccl_timeout={timeout}",
        fix=f"{arr}.nccl_timeout={math.ceil(rank_s * SAVE_SAFETY * 2)}",
    )
    _time_lines(plan, total, step_seconds, time_limit_h)
    return plan


# -------------------------------------------------------------------------------------------- SFT
def sft_plan(
    cfg: Mapping[str, Any],
    cluster: Cluster,
    shape: ModelShape,
    *,
    step_seconds: float | None = None,
    time_limit_h: float | None = None,
) -> Plan:
    """The plan of a composed SFT config (``configs/sft.yaml``, a plain dict) on ``cluster``: one stage
    under DeepSpeed ZeRO-2 with the optimizer offloaded (``deepspeed=zero2``)."""
    sft = cfg["sft"]
    n = cluster.gpus
    p = shape.params
    stage = cfg.get("stage", "full")
    trainable = shape.embedding_params if stage == "embed" else p
    tokens = int(sft["per_device_batch_size"]) * int(sft["max_length"])
    checkpointing = bool(sft.get("gradient_checkpointing", True))
    if checkpointing:
        activations = shape.layers * tokens * shape.hidden * 2 + shape.layer_activation_bytes(tokens)
    else:
        activations = shape.layers * shape.layer_activation_bytes(tokens)
    # stage full as a LoRA finetune (sft.lora.rank > 0): the adapter (and, with token_rows, the four recall
    # rows of the embeddings, and of lm_head when untied) is what trains; each adapted layer keeps its A's output
    lora_cfg = sft.get("lora") or {}
    rank = int(lora_cfg.get("rank", 0) or 0) if stage == "full" else 0
    adapter = 0
    if rank > 0:
        targets = lora_cfg.get("target_modules", "all-linear")
        adapter = shape.lora_params(rank, targets)
        trainable = adapter + (4 * shape.hidden * (1 if shape.tied else 2) if lora_cfg.get("token_rows") else 0)
        activations += (1 if checkpointing else shape.layers) * tokens * shape.lora_width(rank, targets) * 2
    ds = (cfg.get("deepspeed") or {}).get("file")
    offload = False
    if ds:
        from recallm.paths import CONFIG_DIR

        path = Path(ds) if Path(ds).is_absolute() else CONFIG_DIR / "deepspeed" / ds
        try:
            zero = json.loads(path.read_text()).get("zero_optimization", {})
        except (OSError, ValueError):
            raise RecallmError(f"deepspeed.file {path}: not a readable DeepSpeed JSON") from None
        offload = (zero.get("offload_optimizer") or {}).get("device") == "cpu"
    parts = {
        "model (bf16)": 2 * p,
        "gradients (bf16 partition)": 2 * trainable // n,
        "optimizer": 0 if offload else 12 * trainable // n,
        "activations": activations,
        "logits": 3 * 2 * tokens * shape.vocab,
    }
    plan = Plan(
        f"plan: SFT stage {stage} {shape.name} ({p / 1e9:.2f}B parameters) on {cluster.nodes} node(s) x "
        f"{cluster.gpus_per_node} GPU(s) of {_gib(cluster.gpu_memory)}, DeepSpeed {ds or 'none'}"
        + (f", LoRA rank {rank} ({adapter / 1e6:,.0f}M adapter parameters)" if adapter else "")
    )
    plan.add(
        "GPU memory (per GPU)",
        "training step (ZeRO-2)" if ds else "training step",
        int(sum(parts.values()) * (1 + FRAGMENTATION)) + CUDA_CONTEXT,
        cluster.gpu_memory,
        "GiB",
        f"{tokens:,} tokens per device; " + ", ".join(f"{k} {_gib(v)}" for k, v in parts.items() if v),
        fix="sft.max_length or sft.per_device_batch_size lower, gradient_checkpointing=true, deepspeed=zero2",
    )
    share = cluster.gpus_per_node / n
    host = int((16 * trainable if offload else 0) * share) + PROCESS_RAM * cluster.gpus_per_node
    plan.add(
        "host RAM (per node)",
        "host RAM",
        host,
        cluster.host_ram,
        "GiB",
        "fp32 master weights, Adam moments and gradient partition (16 bytes per trainable parameter) + processes",
    )
    # a LoRA checkpoint holds the adapter (fp32 at most), not the model; the final model is merged
    one = (4 * trainable if adapter else 2 * p) + 12 * trainable
    keep = int(sft.get("save_total_limit") or 0)
    disk = one * ((keep + 1) if keep else 1)
    plan.add(
        "disk (checkpoint directory)",
        "checkpoints",
        disk + 2 * p,
        cluster.disk_free,
        "GB",
        f"{one / GB:,.0f} GB per save ({'adapter' if adapter else 'bf16 model'} + fp32 optimizer state) x "
        f"{keep or 'every'} kept + 1 being written + the final model {2 * p / GB:,.0f} GB",
        fix="sft.save_total_limit lower or a larger disk",
    )
    plan.add(
        "time",
        "one save",
        one / cluster.write_bandwidth,
        None,
        "s",
        f"{one / GB:,.0f} GB at {cluster.write_bandwidth / GB:.2f} GB/s; a requeue loses the steps since the "
        "last save (sft.save_steps)",
    )
    _time_lines(plan, None, step_seconds, time_limit_h)
    return plan
