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
