"""Export a verl FSDP checkpoint as a Hugging Face RecaLLM model directory.

verl's own merger (``verl.model_merger``, FSDP backend) gathers the sharded weights; this module
finds the actor checkpoint, verifies it against the checksums written when it was saved
(``recallm.grpo.checkpoints``), registers the RecaLLM classes first (so the merger builds a
``recallm_<base>`` model and keeps its config: recall token ids, ``max_recall_tokens``), saves
the tokenizer with its chat template, and checks the result (``check_recallm_model``). The
directory loads with ``AutoModelForCausalLM`` after ``import recallm.modeling``, and with vLLM through
``recallm.modeling.vllm_hf_overrides``. A LoRA run is exported merged (a plain model directory), or with
``keep_adapter`` as its base plus the adapter alone in ``out/adapter``.

The weights keep the dtype the model was trained from — the one its checkpoint's
``huggingface/config.json`` records (float32 for the tiny model and a float32 SmolLM2, bfloat16 for
the paper's Qwen2.5 and Llama) — unless ``dtype`` says otherwise. verl 0.9.1's merger casts every
shard to bfloat16 (``FSDPModelMerger._load_and_merge_state_dicts``), which turned a float32 model into
a bfloat16 one silently; ``_Merger`` overrides that one step (the shards are read the same way,
merged with verl's own ``_merge_by_placement`` and ``merge_non_dtensor_shards``, cast to the dtype
asked for) and the saved ``config.json`` records the dtype of the weights.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

from recallm.errors import RecallmError
from recallm.paths import TRACKER, saved_steps, step_dir, step_of, tracked_step

__all__ = ["find_actor_dir", "export_checkpoint", "check_source", "trained_dtype", "DTYPES", "ADAPTER_SUBDIR"]

DTYPES = ("float32", "bfloat16", "float16")


def _saved_steps(path: Path) -> list[int]:
    """The steps under ``path`` whose actor checkpoint has its Hugging Face config."""
    return sorted(step for step, saved in saved_steps(path).items() if (saved / "actor" / "huggingface").is_dir())


def find_actor_dir(path: str | Path, step: int | None = None) -> Path:
    """The ``actor`` directory of a run directory (its latest step, or ``step``), a
    ``global_step_N`` directory, or an ``actor`` directory itself. A tracker that does not read as a
    step (``recallm.paths.tracked_step``: a kill while verl rewrote it) counts as naming none: the newest
    saved step is taken, as a resume takes it (``recallm.grpo.checkpoints``)."""
    path = Path(path)
    if step is not None:
        actor = step_dir(path, step) / "actor"
        if (actor / "huggingface").is_dir():
            return actor
        saved = _saved_steps(path)
        raise RecallmError(
            f"no checkpoint of step {step} under {path} (expected {actor}/huggingface); "
            + (f"saved steps: {', '.join(map(str, saved))}" if saved else "no saved steps there")
        )
    if (path / "huggingface").is_dir():
        return path
    if (path / "actor" / "huggingface").is_dir():
        return path / "actor"
    tracked = tracked_step(path)
    if tracked is not None and tracked >= 0:
        actor = step_dir(path, tracked) / "actor"
        if (actor / "huggingface").is_dir():
            return actor
        raise RecallmError(f"{path / TRACKER} names step {tracked}, but {actor} is not a complete actor checkpoint")
    steps = _saved_steps(path)
    if steps:
        return step_dir(path, steps[-1]) / "actor"
    if tracked == -1:  # (a binary, empty or half-written tracker, and no step saved to fall back on)
        raise RecallmError(f"{path / TRACKER} does not name a step, and no global_step_N/actor/huggingface is saved under {path}")
    raise RecallmError(f"no verl actor checkpoint under {path} (expected global_step_N/actor/huggingface)")


def trained_dtype(actor: Path) -> str:
    """The dtype the model was trained from: its checkpoint's ``huggingface/config.json``'s
    ``dtype`` (``torch_dtype`` in older files), else float32."""
    config = actor / "huggingface" / "config.json"
    try:
        saved = json.loads(config.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # (not UTF-8, not JSON)
        raise RecallmError(f"cannot read {config}: {str(exc).splitlines()[0]}") from None
    if not isinstance(saved, dict):
        raise RecallmError(f"{config} must be a JSON object (a model config), got a {type(saved).__name__}")
    dtype = saved.get("dtype") or saved.get("torch_dtype") or "float32"
    return dtype if dtype in DTYPES else "float32"


def _merger(config, dtype):
    """verl's FSDP merger with the merged weights in ``dtype`` (module doc)."""
    import torch
    from torch.distributed.tensor import DTensor
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger, merge_non_dtensor_shards

    target = getattr(torch, dtype)

    def cast(tensor):
        return tensor.to(target) if tensor.is_floating_point() else tensor

    class _Merger(FSDPModelMerger):
        def _load_and_merge_state_dicts(self, world_size, total_shards, mesh_shape, mesh_dim_names):
            if len(mesh_shape) != 1:
                raise RecallmError(f"cannot export a checkpoint sharded over a {len(mesh_shape)}-D mesh (FSDP only)")
            local = Path(self.config.local_dir)
            shards = [
                torch.load(local / f"model_world_size_{world_size}_rank_{rank}.pt", map_location="cpu", weights_only=False)
                for rank in range(total_shards)
            ]
            merged = {}
            for key in sorted(shards[0]):
                pieces = [shard.pop(key) for shard in shards]
                if isinstance(pieces[0], DTensor):
                    placements = tuple(pieces[0].placements)
                    if mesh_dim_names[0] in ("dp", "ddp"):  # replicated over data parallelism: one copy
                        placements = placements[1:]
                    merged[key] = self._merge_by_placement([cast(p._local_tensor) for p in pieces], placements[0])
                else:
                    merged[key] = merge_non_dtensor_shards(key, [cast(p) for p in pieces])
            return merged

    return _Merger(config)


ADAPTER_SUBDIR = "adapter"


def _lora_export(out: Path, tokenizer_dir: Path, *, keep_adapter: bool) -> None:
    """After verl's merger wrote a LoRA run as its base weights plus ``out/lora_adapter`` (PEFT format):
    merge the adapter into ``out`` (the default), or keep it separate as ``out/adapter``, a LoRA adapter
    directory naming ``out`` as its base (``recallm.modeling.adapter_base``) with the tokenizer."""
    from recallm.io import write_json_atomic
    from recallm.modeling import check_adapter
    from recallm.tokens import load_tokenizer

    verl_dir = out / "lora_adapter"
    config_path = verl_dir / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = ".."  # relative: the export stays movable
    write_json_atomic(config_path, adapter_config)
    check_adapter(verl_dir)  # whole, finite, its rank and shapes its base's (before it is merged or kept)
    if keep_adapter:
        verl_dir.rename(out / ADAPTER_SUBDIR)
        load_tokenizer(tokenizer_dir).save_pretrained(out / ADAPTER_SUBDIR)
        return
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    dtype = json.loads((out / "config.json").read_text()).get("dtype") or "float32"
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=getattr(torch, dtype))
    merged = PeftModel.from_pretrained(model, str(verl_dir)).merge_and_unload()
    for old in out.glob("model*.safetensors*"):
        old.unlink()
    merged.save_pretrained(out)
    shutil.rmtree(verl_dir)


def export_checkpoint(
    path: str | Path,
    out: str | Path,
    step: int | None = None,
    dtype: str | None = None,
    *,
    keep_adapter: bool = False,
    checked: bool = False,
) -> Path:
    """Merge the actor checkpoint :func:`find_actor_dir` picks (``step``: that one of a run
    directory) into the Hugging Face directory ``out``, its weights in ``dtype`` (default: the
    trained one, :func:`trained_dtype`). A LoRA run (``actor_rollout_ref.model.lora_rank`` > 0): the
    adapter merged in, or with ``keep_adapter`` the base in ``out`` and the adapter alone in
    ``out/adapter`` (:func:`_lora_export`). Everything is written into a directory of this run's own
    beside ``out`` and renamed to ``out`` at the end (``recallm.io.atomic_dir``, ``overwrite=False``): a
    failed export leaves nothing, and two exports to one new ``out`` never remove each other's files
    (the second is refused). Shards that do not read are one line. The step is verified first
    (:func:`check_source`) unless the caller did (``checked``)."""
    import recallm.modeling  # noqa: F401  (the merger builds the model through AutoModelForCausalLM)
    from recallm.io import atomic_dir, write_json_atomic, write_manifest
    from recallm.modeling import check_recallm_model
    from recallm.tokens import load_tokenizer

    if dtype is not None and dtype not in DTYPES:
        raise RecallmError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    actor = find_actor_dir(path, step)
    if not checked:
        check_source(actor)
    dtype = dtype or trained_dtype(actor)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise RecallmError(f"output directory {out} is not empty")
    from verl.model_merger.base_model_merger import ModelMergerConfig

    with atomic_dir(out, overwrite=False) as tmp:
        config = ModelMergerConfig(
            operation="merge",
            backend="fsdp",
            target_dir=str(tmp),
            local_dir=str(actor),
            hf_model_config_path=str(actor / "huggingface"),
        )
        merger = _merger(config, dtype)
        try:
            merger.merge_and_save()
        except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, pickle.UnpicklingError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RecallmError(f"cannot read the checkpoint shards in {actor} (damaged or not verl's): {first}") from None
        finally:
            merger.cleanup()
        saved = json.loads((tmp / "config.json").read_text())
        saved["dtype"] = dtype  # (verl builds the model in bfloat16 and says so; the weights are `dtype`)
        saved.pop("torch_dtype", None)
        write_json_atomic(tmp / "config.json", saved)
        if (tmp / "lora_adapter").is_dir():
            _lora_export(tmp, actor / "huggingface", keep_adapter=keep_adapter)
        elif keep_adapter:
            raise RecallmError(f"{actor} is not a LoRA checkpoint: there is no adapter to keep separate")
        load_tokenizer(actor / "huggingface").save_pretrained(tmp)  # exactly as trained, chat template included
        check_recallm_model(tmp, weights=True)  # every tensor read whole and finite: verl's merger checks neither
        write_manifest(tmp)  # the size and CRC-32 of every file, verified where the model is loaded
    return out


def check_source(actor: Path) -> bool:
    """Verify the checkpoint step an export reads (``recallm.grpo.checkpoints.check_step``: one line for a
    damaged one). True when its checksums were verified, False when it has none to verify (saved before
    they existed, or an ``actor`` directory outside a run): ``recallm-export`` says the source was unverified."""
    if step_of(actor.parent) is None:
        return False
    from recallm.grpo.checkpoints import check_step

    return check_step(actor.parent)
