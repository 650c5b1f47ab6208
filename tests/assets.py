"""Tiny plain base checkpoints of several architectures, and LoRA adapters of a tiny model (sound and
damaged in every way the adapter checks name), built locally for the tests."""

from __future__ import annotations

from pathlib import Path

import torch


def save_base(path: Path, arch: str = "qwen2", *, tied: bool = True, pad_rows_to: int = 64, tokenizer=None) -> Path:
    """Write a tiny plain ``arch`` causal LM (random weights) with the tiny tokenizer to ``path``."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    from recallm.tiny import build_tiny_tokenizer

    classes = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
    }
    tokenizer = tokenizer or build_tiny_tokenizer()
    rows = -(-len(tokenizer) // pad_rows_to) * pad_rows_to
    config_cls, model_cls = classes[arch]
    config = config_cls(
        vocab_size=rows,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=tied,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = model_cls(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# Llama 3.1's special tokens and chat-template shape (no pad token in its tokenizer config, several
# end-of-sequence ids in its generation config), over the tiny tokenizer's vocabulary.
LLAMA31_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
LLAMA31_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def build_llama31_style_tokenizer():
    """The tiny vocabulary with Llama 3.1's specials: bos ``<|begin_of_text|>``, eos ``<|eot_id|>``,
    no pad token."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from recallm.tiny import _tokenizer_json

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(LLAMA31_SPECIALS)})
    tokenizer.pad_token = None
    tokenizer.chat_template = LLAMA31_TEMPLATE
    return tokenizer


def save_llama31_style_base(path: Path) -> Path:
    """A tiny Llama base whose tokenizer has no pad token and whose generation config lists two
    end-of-sequence ids (``<|end_of_text|>``, ``<|eot_id|>``), as Llama-3.1-8B-Instruct's do."""
    from transformers import GenerationConfig

    tokenizer = build_llama31_style_tokenizer()
    assert tokenizer.pad_token_id is None
    save_base(path, "llama", tied=False, tokenizer=tokenizer)
    eos = [tokenizer.convert_tokens_to_ids("<|end_of_text|>"), tokenizer.convert_tokens_to_ids("<|eot_id|>")]
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos).save_pretrained(path)
    return path


def save_adapter(base_dir: Path, out: Path, *, token_rows: bool = False, std: float = 0.05) -> Path:
    """A LoRA adapter of ``base_dir`` with non-zero weights, saved as recallm-sft saves one."""
    from recallm.modeling import load_recallm_model
    from recallm.sft.lora import apply_lora
    from recallm.sft.settings import LoraSettings
    from recallm.tokens import RecallTokenIds, load_tokenizer

    model = load_recallm_model(base_dir)
    rows = list(RecallTokenIds.from_config(model.config).as_config().values())
    peft = apply_lora(
        model, LoraSettings(rank=4, token_rows=token_rows), rows, base_dir=base_dir, gradient_checkpointing=False
    )
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(std=std)
    peft.save_pretrained(out)
    load_tokenizer(base_dir).save_pretrained(out)
    return out


#: damaged LoRA adapters (``damaged_adapters``): name -> what is wrong with it
DAMAGED_ADAPTERS = {
    "a_nan": "a NaN in its weights",
    "a_trunc": "its weights cut in half",
    "a_empty": "empty weights",
    "a_noweights": "no weights file",
    "a_shape": "a tensor whose shape is another model's",
    "a_rank": "r in its config not the rank of its weights",
    "a_basenum": "a base_model_name_or_path that is a number",
    "a_list": "a JSON list as its config",
    "a_notargets": "no target_modules",
    "a_alpha0": "lora_alpha 0 (an update scaled to nothing)",
    "a_binconfig": "a config that is not UTF-8",
    "a_deepconfig": "a config nested 100k deep",
    "f_flip/adapter": "a flipped byte in the weights its model's manifest lists (recallm-sft's final/adapter)",
}


def damaged_adapters(sound: Path, root: Path) -> dict[str, Path]:
    """Copies of the adapter ``sound`` under ``root``, each damaged as :data:`DAMAGED_ADAPTERS` says; none
    carries a manifest of its own (``f_flip/adapter``'s is its model directory's)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from recallm.io import write_manifest

    out = {}
    for name in DAMAGED_ADAPTERS:
        path = root / name
        shutil.copytree(sound, path)
        out[name] = path
    weights = "adapter_model.safetensors"

    def edit_weights(name, fn):
        tensors = load_file(str(root / name / weights))
        fn(tensors)
        save_file(tensors, str(root / name / weights), metadata={"format": "pt"})

    def edit_config(name, fn):
        file = root / name / "adapter_config.json"
        config = json.loads(file.read_text())
        file.write_text(json.dumps(fn(config)))

    def nan(tensors):
        key = sorted(k for k in tensors if "lora_B" in k)[0]
        tensors[key] = torch.full_like(tensors[key], float("nan"))

    def shape(tensors):
        key = sorted(k for k in tensors if "lora_A" in k)[0]
        tensors[key] = torch.zeros(tensors[key].shape[0], tensors[key].shape[1] // 2)

    edit_weights("a_nan", nan)
    data = (root / "a_trunc" / weights).read_bytes()
    (root / "a_trunc" / weights).write_bytes(data[: len(data) // 2])
    (root / "a_empty" / weights).write_bytes(b"")
    (root / "a_noweights" / weights).unlink()
    edit_weights("a_shape", shape)
    edit_config("a_rank", lambda c: {**c, "r": c["r"] * 2})
    edit_config("a_basenum", lambda c: {**c, "base_model_name_or_path": 5})
    edit_config("a_list", lambda c: [c])
    edit_config("a_notargets", lambda c: {k: v for k, v in c.items() if k != "target_modules"})
    edit_config("a_alpha0", lambda c: {**c, "lora_alpha": 0})
    (root / "a_binconfig" / "adapter_config.json").write_bytes(b"\xff\xfe{}")
    (root / "a_deepconfig" / "adapter_config.json").write_text("[" * 100000 + "]" * 100000)
    # recallm-sft's final: the merged model's files and adapter/, one manifest over both; then a flipped byte
    final = root / "f_flip"
    base = Path(json.loads((sound / "adapter_config.json").read_text())["base_model_name_or_path"])
    for file in base.iterdir():
        if file.is_file() and file.name != "recallm_files.json":
            shutil.copy(file, final / file.name)
    write_manifest(final)
    blob = bytearray((final / "adapter" / weights).read_bytes())
    blob[-7] ^= 0x01  # inside the last tensor's data: still a readable, finite float
    (final / "adapter" / weights).write_bytes(bytes(blob))
    return out
