"""Export a verl FSDP checkpoint as a Hugging Face RecaLLM model directory.

verl's own merger (``verl.model_merger``, FSDP backend) gathers the sharded weights; this module
finds the actor checkpoint, registers the RecaLLM classes first (so the merger builds a
``recallm_<base>`` model and keeps its config: recall token ids, ``max_recall_tokens``), saves
the tokenizer with its chat template, and checks the result (``check_recallm_model``). The
directory loads with ``AutoModelForCausalLM`` after ``import recallm``, and with vLLM through
``recallm.modeling.vllm_hf_overrides``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from recallm.errors import RecallmError

__all__ = ["find_actor_dir", "export_checkpoint"]


def find_actor_dir(path: str | Path) -> Path:
    """The ``actor`` directory of a run directory (its latest step), a ``global_step_N`` directory,
    or an ``actor`` directory itself."""
    path = Path(path)
    if (path / "huggingface").is_dir():
        return path
    if (path / "actor" / "huggingface").is_dir():
        return path / "actor"
    latest = path / "latest_checkpointed_iteration.txt"
    if latest.is_file():
        step = latest.read_text().strip()
        actor = path / f"global_step_{step}" / "actor"
        if (actor / "huggingface").is_dir():
            return actor
        raise RecallmError(f"{latest} names step {step}, but {actor} is not a complete actor checkpoint")
    steps = sorted(path.glob("global_step_*/actor/huggingface"), key=lambda p: int(p.parent.parent.name.split("_")[-1]))
    if steps:
        return steps[-1].parent
    raise RecallmError(f"no verl actor checkpoint under {path} (expected global_step_N/actor/huggingface)")


def export_checkpoint(path: str | Path, out: str | Path) -> Path:
    import recallm  # noqa: F401  (the merger builds the model through AutoModelForCausalLM)
    from recallm.modeling import check_recallm_model
    from recallm.tokens import load_tokenizer

    actor = find_actor_dir(path)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise RecallmError(f"output directory {out} is not empty")
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    config = ModelMergerConfig(
        operation="merge",
        backend="fsdp",
        target_dir=str(out),
        local_dir=str(actor),
        hf_model_config_path=str(actor / "huggingface"),
    )
    out.mkdir(parents=True, exist_ok=True)
    merger = FSDPModelMerger(config)
    try:
        merger.merge_and_save()
    except Exception:
        shutil.rmtree(out, ignore_errors=True)  # never leave a half-written model behind
        raise
    finally:
        merger.cleanup()
    load_tokenizer(actor / "huggingface").save_pretrained(out)  # exactly as trained, chat template included
    check_recallm_model(out)
    return out
