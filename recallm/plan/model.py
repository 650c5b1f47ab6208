"""The model's shape, whose sizes every memory and disk term depends on.

``P`` parameters of a decoder-only transformer (:class:`ModelShape`): embeddings ``V*h`` (and a
separate ``lm_head`` ``V*h`` unless tied), per layer ``q`` ``h*(H*d)``, ``k``/``v`` ``h*(K*d)`` each
(plus biases for Qwen2), ``o`` ``(H*d)*h``, the gated MLP ``3*h*I``, two RMSNorms ``2*h``; a final norm
``h``. Checked against the published totals: Qwen2.5-7B 7,615,616,512; Llama-3.1-8B 8,030,261,248
(+4 recall-token rows: ``recallm.tokens`` grows Llama's 128,256 rows to 128,260 and keeps Qwen's
padded 152,064). The shapes of the two paper bases and of Qwen2.5-1.5B-Instruct (:data:`PAPER_MODELS`) are their published
``config.json``; a model directory's own ``config.json`` is read when it exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError

__all__ = ["ModelShape", "PAPER_MODELS", "model_shape"]


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
