"""Stage ``full`` as a LoRA finetune (``sft.lora.rank`` > 0): PEFT adapters on the masked model.

* :func:`apply_lora` wraps the stage's model (a ``Recall<Base>ForCausalLM``) in PEFT's
  ``PeftModelForCausalLM``; the forward PEFT calls is still the masked model's (``RecallMaskMixin``),
  so the loss is computed under the recall mask exactly as in the full finetune, and
  ``label_logits_only`` still skips the prompt's logits. ``lora.token_rows``: the four RecaLLM token
  rows of the embeddings (and of an untied ``lm_head``) train next to the adapter (PEFT's
  ``trainable_token_indices``); otherwise they stay as the embedding stage left them.
* Checkpoints hold the adapter (``adapter_model.safetensors``) with the optimizer, scheduler and RNG
  states; ``resume`` works as for the full finetune (the Trainer loads the adapter).
* :func:`save_merged` writes the stage's ``final``: the adapter merged into a plain RecaLLM model
  directory (what GRPO, eval, serve and export take, as after a full finetune), and the adapter alone
  under ``final/adapter`` (``adapter_config.json`` naming the base directory, the tokenizer), which
  eval and serve also load (``recallm.modeling.load_recallm_model``).
"""

from __future__ import annotations

from pathlib import Path

from recallm.sft.settings import LoraSettings

__all__ = ["apply_lora", "describe", "save_merged", "load_adapter_weights", "ADAPTER_SUBDIR"]

ADAPTER_SUBDIR = "adapter"


def apply_lora(
    model,
    lora: LoraSettings,
    token_ids: list[int],
    *,
    base_dir: str | Path,
    gradient_checkpointing: bool,
    seed: int = 0,
):
    """``model`` wrapped in a PEFT LoRA adapter (module doc); only the adapter (and with ``token_rows``
    the token rows) require gradients. The adapter's random init (A) is drawn from ``seed``: the same
    recipe starts from the same adapter."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import set_seed

    modules = lora.target_modules
    if not isinstance(modules, str):
        modules = [str(m) for m in modules]
    if gradient_checkpointing:  # frozen embeddings: the checkpointed blocks need an input that requires grad
        model.enable_input_require_grads()
    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=modules,
        bias="none",
        trainable_token_indices=_token_rows(model, token_ids) if lora.token_rows else None,
    )
    set_seed(seed)
    peft_model = get_peft_model(model, config)
    # the adapter names its base by an absolute path (loaders find it from anywhere)
    peft_model.peft_config["default"].base_model_name_or_path = str(Path(base_dir).resolve())
    return peft_model


def describe(lora: LoraSettings) -> str:
    """The console line of a LoRA stage: that LoRA is on, and its settings."""
    rows = "the recall token rows train too" if lora.token_rows else "the recall token rows stay frozen"
    return (
        f"LoRA on (sft.lora.rank={lora.rank}, alpha={lora.alpha:g}, dropout={lora.dropout:g}, "
        f"target_modules={lora.target_modules}): stage full trains an adapter, {rows}; final/ is the merged model, "
        "final/adapter the adapter alone"
    )


def _token_rows(model, token_ids: list[int]) -> dict[str, list[int]]:
    """PEFT's ``trainable_token_indices``: the rows on the input embeddings, and on an untied output
    head too (a tied one follows its input embeddings in PEFT)."""
    rows = sorted(set(token_ids))
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    names = {id(module): name for name, module in model.named_modules()}
    targets = {names[id(inputs)]: rows}
    if outputs is not None and outputs.weight is not inputs.weight:
        targets[names[id(outputs)]] = rows
    return targets


def load_adapter_weights(model, checkpoint: str | Path) -> None:
    """Load a checkpoint's adapter weights into the PEFT ``model`` (a rerun after a kill during the save)."""
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    set_peft_model_state_dict(model, load_peft_weights(str(checkpoint), device="cpu"))


def save_merged(model, tokenizer, out: Path) -> None:
    """The adapter alone into ``out/adapter`` (with the tokenizer), then the merged model into ``out``.
    Merging changes ``model`` in place: call it once, at the end."""
    adapter = out / ADAPTER_SUBDIR
    model.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    merged = model.merge_and_unload()
    merged.save_pretrained(out)
