"""Tiny plain base checkpoints of several architectures, built locally for the tests."""

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
