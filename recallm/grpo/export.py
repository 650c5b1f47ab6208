"""Export a verl FSDP checkpoint as a Hugging Face RecaLLM model directory.

verl's own merger (``verl.model_merger``, FSDP backend) gathers the sharded weights; this module
finds the actor checkpoint, registers the RecaLLM classes first (so the merger builds a
``recallm_<base>`` model and keeps its config: recall token ids, ``max_recall_tokens``), saves
the tokenizer with its chat template, and checks the result (``check_recallm_model``). The
directory loads with ``AutoModelForCausalLM`` after ``import recallm.modeling``, and with vLLM through
``recallm.modeling.vllm_hf_overrides``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from recallm.errors import RecallmError

__all__ = ["find_actor_dir", "export_checkpoint"]


def _saved_steps(path: Path) -> list[int]:
    steps = [p.parent.parent.name.split("_")[-1] for p in path.glob("global_step_*/actor/huggingface")]
    return sorted(int(s) for s in steps if s.isdigit())


def find_actor_dir(path: str | Path, step: int | None = None) -> Path:
    """The ``actor`` directory of a run directory (its latest step, or ``step``), a
    ``global_step_N`` directory, or an ``actor`` directory itself."""
    path = Path(path)
    if step is not None:
        actor = path / f"global_step_{step}" / "actor"
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
    latest = path / "latest_checkpointed_iteration.txt"
    if latest.is_file():
        step = latest.read_text().strip()
        actor = path / f"global_step_{step}" / "actor"
        if (actor / "huggingface").is_dir():
            return actor
        raise RecallmError(f"{latest} names step {step}, but {actor} is not a complete actor checkpoint")
    steps = _saved_steps(path)
    if steps:
        return path / f"global_step_{steps[-1]}" / "actor"
    raise RecallmError(f"no verl actor checkpoint under {path} (expected global_step_N/actor/huggingface)")


def export_checkpoint(path: str | Path, out: str | Path, step: int | None = None) -> Path:
    """Merge the actor checkpoint :func:`find_actor_dir` picks (``step``: that one of a run
    directory) into the Hugging Face directory ``out``."""
    import recallm.modeling  # noqa: F401  (the merger builds the model through AutoModelForCausalLM)
    from recallm.modeling import check_recallm_model
    from recallm.tokens import load_tokenizer

    actor = find_actor_dir(path, step)
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
