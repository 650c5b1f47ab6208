"""GRPO's checkpoints: one save's size, how many stay on disk, and the time a save takes against the
deadline and the process group's timeout.

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
pass none, ``actor_rollout_ref.nccl_timeout`` reaches them through ``recallm.grpo.worker_hooks``).
"""

from __future__ import annotations

from recallm.plan.model import ModelShape

__all__ = ["VERL_SAVE_LEAD", "TORCH_NCCL_TIMEOUT", "SAVE_SAFETY", "checkpoint_bytes", "kept_saves"]

#: verl's fixed part of the deadline-save lead (``should_save_ckpt_esi(save_ckpt_duration=60)``)
VERL_SAVE_LEAD = 60
#: torch's default timeout of an NCCL process group (``torch.distributed.constants.default_pg_nccl_timeout``)
TORCH_NCCL_TIMEOUT = 600
#: what a save may take of the time it has (slack for a slow shared file system)
SAVE_SAFETY = 1.5


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


def kept_saves(total: int, freq: int, keep: int | None) -> int:
    saves = (total // freq + (0 if total % freq == 0 else 1)) if freq > 0 and total > 0 else 0
    return min(saves, keep) if keep else saves
