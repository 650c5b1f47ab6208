"""Masked model classes ``recallm_<base>`` and the conversion of a base checkpoint.

Rollouts sample from the masked distribution, so training must compute log-probs under the
same mask (DESIGN.md, "Masked log-probs in training"). ``RecallMaskMixin`` does that in
``forward``: when the model sees whole sequences (no cached prefix), the logits of every
position inside a recall span are masked to the allowed set (``recallm.recall.mask``), for
padded and for packed batches, and the loss is computed from the masked logits. During
cached decoding the forward cannot see the context; ``generate`` therefore adds a
``RecallLogitsProcessor`` itself.

One mixin, one config factory; each supported base architecture gets a config class
``Recall<Base>Config`` (``model_type = "recallm_<base>"``, the base fields plus the RecaLLM
token ids) and a model class ``Recall<Base>ForCausalLM``, registered with ``AutoConfig`` and
``AutoModelForCausalLM`` when ``recallm`` is imported. A plain base checkpoint loads into
them (same parameter names); ``create_recallm_model`` turns one into a RecaLLM directory.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from pathlib import Path

import torch
from huggingface_hub.dataclasses import strict
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessorList,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from recallm.errors import RecallmError
from recallm.recall.hf import RecallLogitsProcessor
from recallm.recall.mask import apply_recall_mask
from recallm.tokens import DEFAULT_MAX_RECALL_TOKENS, RecallTokenIds, check_left_padded

__all__ = [
    "RecallMaskMixin",
    "RECALL_CLASSES",
    "recall_classes_for",
    "base_model_type",
    "vllm_hf_overrides",
    "served_hf_overrides",
    "create_recallm_model",
    "check_recallm_model",
    "read_model_config",
    "WEIGHT_FILES",
    "nonfinite_tensor",
    "check_finite",
    "safetensors_problem",
    "weights_problem",
    "check_weights",
    "load_causal_lm",
    "save_model_dir",
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "adapter_base",
    "adapter_problem",
    "check_adapter",
    "lora_rank_problem",
    "load_recallm_model",
    "merge_adapter",
    "vllm_lora_rank",
    "VLLM_LORA_RANKS",
]

log = logging.getLogger(__name__)
MAX_YARN_FACTOR = 64  # YaRN's context multiplier (the paper: 4); more is a typo, not a setting

# Fields every Recall*Config adds to its base config (name -> (type, default)).
_RECALL_FIELDS: dict[str, tuple[object, object]] = {
    "recall_start_token_id": (int | None, None),
    "recall_end_token_id": (int | None, None),
    "think_start_token_id": (int | None, None),
    "think_end_token_id": (int | None, None),
    "max_recall_tokens": (int, DEFAULT_MAX_RECALL_TOKENS),
    "recall_constrained": (bool, True),
}


class RecallMaskMixin:
    """Apply the recall mask in ``forward`` (logits and loss); constrain ``generate``.

    ``config.recall_constrained = False`` turns both off (the paper's "no logit masking"
    ablation) without changing the checkpoint format.
    """

    _recall_forward_mask = True

    def _recall_ids(self) -> RecallTokenIds:
        return RecallTokenIds.from_config(self.config)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        logits_to_keep=0,
        **kwargs,
    ):
        return_dict = kwargs.pop("return_dict", None)
        cached = past_key_values is not None and past_key_values.get_seq_length() > 0
        mask = bool(self.config.recall_constrained) and self._recall_forward_mask and not cached
        if labels is not None and self.__dict__.get("_label_logits_only") and input_ids is not None:
            out = self._label_positions_loss(input_ids, attention_mask, position_ids, labels, mask, kwargs)
            return out if return_dict is not False else out.to_tuple()
        if mask and input_ids is None:
            raise RecallmError("the recall mask needs input_ids; got only inputs_embeds")
        if mask and not isinstance(logits_to_keep, int):
            raise RecallmError("the recall mask supports an integer logits_to_keep only")
        out = super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            labels=None,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            return_dict=True,
            **kwargs,
        )
        fields = dict(out.items())
        if mask:
            ids = self._recall_ids()
            fields["logits"] = apply_recall_mask(
                out.logits,
                input_ids,
                ids.start,
                ids.end,
                attention_mask=attention_mask,
                position_ids=position_ids,
                max_recall_tokens=self.config.max_recall_tokens,
            )
        if labels is not None:
            fields["loss"] = self.loss_function(
                logits=fields["logits"], labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        out = type(out)(**fields)  # rebuilt so that loss comes first in the tuple form
        return out if return_dict is not False else out.to_tuple()

    def label_logits_only(self, enabled: bool = True) -> None:
        """With labels, compute logits (and the recall mask) only at the positions that have a
        label, and return the loss without logits. SFT's loss is on the completion only, so this
        skips the ``lm_head`` product over the prompt — most of a long-context example — and the
        ``(batch, length, vocab)`` logits tensor (about 10 GB in float32 for one 16K-token example
        with a 152K vocabulary). The loss is the same as the full forward's."""
        self._label_logits_only = bool(enabled)

    def _label_positions_loss(self, input_ids, attention_mask, position_ids, labels, mask: bool, kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        from recallm.recall.mask import allowed_positions, apply_recall_mask_rows

        num_items = kwargs.pop("num_items_in_batch", None)
        body = self.get_decoder()(
            input_ids=input_ids,
            attention_mask=_causal_only_mask(attention_mask, labels),
            position_ids=position_ids,
            use_cache=False,
            **kwargs,
        )
        hidden = body.last_hidden_state
        targets = labels[:, 1:].to(hidden.device)
        b_idx, t_idx = torch.nonzero(targets != -100, as_tuple=True)
        logits = self.lm_head(hidden[b_idx, t_idx]).float()
        if mask:
            ids = self._recall_ids()
            allowed = allowed_positions(
                input_ids,
                ids.start,
                ids.end,
                attention_mask=attention_mask,
                position_ids=position_ids,
                max_recall_tokens=self.config.max_recall_tokens,
                vocab_size=logits.shape[-1],
            )
            logits = apply_recall_mask_rows(logits, b_idx.cpu().numpy(), t_idx.cpu().numpy(), allowed)
        loss = torch.nn.functional.cross_entropy(
            logits, targets[b_idx, t_idx], reduction="sum" if num_items is not None else "mean"
        )
        if num_items is not None:
            loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
        return CausalLMOutputWithPast(
            loss=loss, logits=None, hidden_states=body.hidden_states, attentions=body.attentions
        )

    @contextlib.contextmanager
    def recall_mask_in_forward(self, enabled: bool):
        """Temporarily switch the forward mask on or off (``generate`` switches it off)."""
        previous = self.__dict__.get("_recall_forward_mask")
        self._recall_forward_mask = enabled
        try:
            yield
        finally:
            if previous is None:
                del self._recall_forward_mask
            else:
                self._recall_forward_mask = previous

    def generate(self, *args, recall_constrained: bool | None = None, **kwargs):
        """``GenerationMixin.generate`` with a ``RecallLogitsProcessor`` added (unless one is
        passed in ``logits_processor`` or ``recall_constrained=False``). Beam search is refused, and
        so is a right-padded batch (``recallm.tokens.check_left_padded``: it would generate noise)."""
        check_left_padded(kwargs.get("attention_mask"))
        constrained = self.config.recall_constrained if recall_constrained is None else recall_constrained
        if constrained:
            gen_config = kwargs.get("generation_config") or self.generation_config
            beams = kwargs.get("num_beams", getattr(gen_config, "num_beams", 1)) or 1
            if beams > 1:
                raise RecallmError(f"constrained recall does not support beam search (num_beams={beams})")
            processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
            if not any(isinstance(p, RecallLogitsProcessor) for p in processors):
                processors.insert(
                    0,
                    RecallLogitsProcessor.from_config(self.config, prompt_attention_mask=kwargs.get("attention_mask")),
                )
            kwargs["logits_processor"] = processors
        with self.recall_mask_in_forward(False):
            return super().generate(*args, **kwargs)


def _causal_only_mask(attention_mask, labels):
    """The attention mask a labelled forward needs: an all-ones mask for a right-padded batch whose
    padding carries no label (SFT's collator), else ``attention_mask`` itself.

    In a causal model a position attends only to earlier ones, so the padding at a row's end changes
    nothing at the row's real positions; the hidden states there are the same without the padding
    mask, and with an all-ones mask the attention runs as plain causal attention (``is_causal``, no
    ``(batch, 1, T, T)`` mask built and read). All ones rather than ``None``: without a mask,
    transformers reads non-consecutive position ids (PoSE's skips) as packed sequences and would cut
    the attention at each skip."""
    if attention_mask is None or attention_mask.dim() != 2 or bool(attention_mask.all()):
        return attention_mask
    keep = attention_mask.bool()
    right_padded = bool((keep[:, :-1] | ~keep[:, 1:]).all())  # no real token after a padded one
    if not right_padded or bool(((labels != -100) & ~keep.to(labels.device)).any()):
        return attention_mask
    return torch.ones_like(attention_mask)


def _make_config_class(base: type) -> type:
    name = "Recall" + base.__name__
    namespace: dict[str, object] = {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"{base.__name__} plus the RecaLLM token ids (model_type ``recallm_{base.model_type}``).",
        "model_type": f"recallm_{base.model_type}",
        "base_model_type": base.model_type,
        "__annotations__": {key: typ for key, (typ, _) in _RECALL_FIELDS.items()},
    }
    namespace.update({key: default for key, (_, default) in _RECALL_FIELDS.items()})
    return strict(type(name, (base,), namespace))


def _make_model_class(base: type, config_class: type) -> type:
    name = "Recall" + base.__name__
    return type(
        name,
        (RecallMaskMixin, base),
        {
            "__module__": __name__,
            "__qualname__": name,
            "__doc__": f"{base.__name__} whose forward applies the recall mask.",
            "config_class": config_class,
        },
    )


#: base model_type -> (RecaLLM config class, RecaLLM model class, base model class)
RECALL_CLASSES: dict[str, tuple[type, type, type]] = {}

for _base_config, _base_model in (
    (Qwen2Config, Qwen2ForCausalLM),
    (Qwen3Config, Qwen3ForCausalLM),
    (LlamaConfig, LlamaForCausalLM),
    (MistralConfig, MistralForCausalLM),
):
    _config_cls = _make_config_class(_base_config)
    _model_cls = _make_model_class(_base_model, _config_cls)
    globals()[_config_cls.__name__] = _config_cls
    globals()[_model_cls.__name__] = _model_cls
    __all__ += [_config_cls.__name__, _model_cls.__name__]
    RECALL_CLASSES[_base_config.model_type] = (_config_cls, _model_cls, _base_model)
    AutoConfig.register(_config_cls.model_type, _config_cls, exist_ok=True)
    AutoModelForCausalLM.register(_config_cls, _model_cls, exist_ok=True)


def base_model_type(model_type: str) -> str:
    """``recallm_qwen2`` -> ``qwen2``; a base type is returned as is."""
    return model_type[len("recallm_") :] if model_type.startswith("recallm_") else model_type


def recall_classes_for(model_type: str) -> tuple[type, type, type]:
    """(config class, model class, base model class) for a base or RecaLLM ``model_type``."""
    base = base_model_type(model_type)
    if base not in RECALL_CLASSES:
        raise RecallmError(
            f"unsupported architecture model_type={model_type!r}; supported: {', '.join(sorted(RECALL_CLASSES))}"
        )
    return RECALL_CLASSES[base]


def vllm_hf_overrides(config) -> dict[str, object]:
    """``hf_overrides`` that make vLLM serve a RecaLLM checkpoint as its base architecture."""
    _, _, base_model = recall_classes_for(config.model_type)
    return {"architectures": [base_model.__name__], "model_type": base_model_type(config.model_type)}


def _as_mapping(value, where: str) -> dict[str, object]:
    if value in (None, "", {}):
        return {}
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RecallmError(f"{where} is not valid JSON: {exc.msg}") from exc
    elif not isinstance(value, Mapping) and hasattr(value, "items"):  # an OmegaConf DictConfig
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value, resolve=True)
    if not isinstance(value, Mapping):
        raise RecallmError(f"{where} must be a mapping, got {type(value).__name__}")
    return dict(value)


def served_hf_overrides(user, base: Mapping[str, object], where: str = "hf_overrides") -> dict[str, object]:
    """The user's ``hf_overrides`` (JSON string or mapping) plus ``base`` (what vLLM must serve: the base
    architecture, :func:`vllm_hf_overrides`; the GRPO launcher adds the recall constraint). A user value
    that contradicts one of ``base`` is refused: vLLM would refuse ``Recall*ForCausalLM``, build the
    wrong model, or follow another constraint. The one merge, for ``recallm-serve`` and ``recallm-grpo``."""
    merged = _as_mapping(user, where)
    for key, value in base.items():
        if key in merged and merged[key] != value:
            raise RecallmError(
                f"{where} sets {key}={merged[key]!r}, but this RecaLLM model is served by vLLM as {key}={value!r}"
            )
        merged[key] = value
    return merged


def recall_config_from(config, **overrides):
    """A RecaLLM config with every field of ``config`` (a base or RecaLLM config)."""
    config_cls, _, _ = recall_classes_for(config.model_type)
    values = config.to_dict()
    for key in ("model_type", "architectures", "transformers_version", "base_model_type"):
        values.pop(key, None)
    values.update(overrides)
    return config_cls.from_dict(values)


def create_recallm_model(
    base: str | Path,
    out: str | Path,
    *,
    max_recall_tokens: int | None = None,
    yarn_factor: float | None = None,
    dtype: str = "auto",
) -> Path:
    """Turn a local base model into a RecaLLM model directory at ``out``.

    ``base`` is a Hugging Face causal-LM directory or a GGUF file (dequantised through
    ``transformers``, ``recallm.gguf``; ``dtype`` float32 by default, or bfloat16). Loads the base
    weights into ``Recall<Base>ForCausalLM``, adds the four tokens and a pad token if the base has
    none (``recallm.tokens.add_recall_tokens``), optionally sets YaRN rope scaling (``yarn_factor``,
    over the base ``max_position_embeddings``), and saves model and tokenizer. The directory is
    written next to ``out`` and renamed into place, so a failed conversion leaves ``out`` as it
    was. Converting a RecaLLM directory again changes nothing but what is asked.
    """
    import tempfile

    from recallm.gguf import check_base_path, gguf_to_hf, is_gguf
    from recallm.io import atomic_dir
    from recallm.tokens import add_recall_tokens, load_tokenizer

    base, out = Path(base), Path(out)
    if out.exists() and not out.is_dir():
        raise RecallmError(f"--out {out} is an existing file; give a directory")
    if out.resolve() == base.resolve():
        raise RecallmError(f"--out must differ from --base ({base}); the base is never overwritten")
    if is_gguf(base):
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.gguf-") as tmp:
            gguf_to_hf(base, tmp, dtype=dtype)
            return create_recallm_model(tmp, out, max_recall_tokens=max_recall_tokens, yarn_factor=yarn_factor)
    check_base_path(base)
    base_config = read_model_config(base, "--base")
    _, model_cls, _ = recall_classes_for(base_config.model_type)
    overrides: dict[str, object] = {}
    if yarn_factor is not None:
        if not (math.isfinite(yarn_factor) and 1 < yarn_factor <= MAX_YARN_FACTOR):
            raise RecallmError(f"yarn_factor must be a number in (1, {MAX_YARN_FACTOR}], got {yarn_factor}")
        original = base_config.max_position_embeddings
        theta = (base_config.rope_parameters or {}).get("rope_theta", 10000.0)
        overrides["rope_parameters"] = {
            "rope_type": "yarn",
            "rope_theta": theta,
            "factor": float(yarn_factor),
            "original_max_position_embeddings": original,
        }
        overrides["max_position_embeddings"] = int(original * yarn_factor)
    config = recall_config_from(base_config, **overrides)
    tokenizer = load_tokenizer(base)
    model = load_causal_lm(base, model_cls=model_cls, config=config, dtype=dtype)
    add_recall_tokens(model, tokenizer, max_recall_tokens=max_recall_tokens)
    with atomic_dir(out) as staging:
        save_model_dir(model, tokenizer, staging, f"the model converted from {base}")
    log.info("wrote RecaLLM model %s (%s) to %s", config.model_type, model_cls.__name__, out)
    return out


def read_model_config(path: str | Path, name: str | None = None):
    """The config of a Hugging Face model directory (RecaLLM or a plain base; no weights are loaded),
    or a one-line ``RecallmError``: no ``config.json`` there, or a config transformers cannot read.
    ``name`` (the setting, e.g. ``--base``) starts the first message. The one reading of a model
    directory's config for every command that takes a model (callers add their own checks)."""
    path = Path(path)
    base = adapter_base(path)
    if base is not None:  # a LoRA adapter directory: its base model's config
        path = base
    if not (path / "config.json").is_file():
        where = f"{name} {path}" if name else str(path)
        raise RecallmError(f"{where} is not a Hugging Face model directory (no config.json)")
    try:
        return AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as exc:
        raise RecallmError(f"cannot read the model config in {path}: {str(exc).splitlines()[0]}") from None


def check_recallm_model(path: str | Path, *, weights: bool = False) -> dict[str, object]:
    """Validate a RecaLLM model directory; its weights too with ``weights`` (``check_weights``:
    the checksums of its manifest, every tensor read whole and finite; ``--check`` does this).

    Checks: a supported architecture; the four token ids recorded in the config, distinct and
    inside the vocabulary; the tokenizer has the same four tokens; a pad token recorded in the
    tokenizer and the config alike; the chat template's generation prompt opens ``<think>\\n``.
    Returns a summary; raises ``RecallmError`` naming the first problem.
    """
    from recallm.tokens import THINK_START, load_tokenizer

    path = Path(path)
    config = read_model_config(path)
    recall_classes_for(config.model_type)
    if not config.model_type.startswith("recallm_"):
        raise RecallmError(
            f"{path} is a plain {config.model_type} model without recall tokens; "
            "convert it with `recallm-create-model --base PATH --out PATH`"
        )
    tokenizer = load_tokenizer(path)
    ids = RecallTokenIds.from_pretrained(config, tokenizer)
    if weights:
        base = adapter_base(path)
        check_weights(base or path)  # a LoRA adapter: its base's weights, and the adapter itself
        if base is not None:
            check_adapter(path)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "probe"}], tokenize=False, add_generation_prompt=True
    )
    if not rendered.endswith(THINK_START + "\n"):
        raise RecallmError(f"the chat template of {path} does not open {THINK_START!r} in its generation prompt")
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id != getattr(config, "pad_token_id", None):
        raise RecallmError(
            f"{path} has no consistent pad token (tokenizer {tokenizer.pad_token_id}, config "
            f"{getattr(config, 'pad_token_id', None)}); convert it again with `recallm-create-model`"
        )
    return {
        "path": str(path),
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "tokenizer_size": len(tokenizer),
        "max_recall_tokens": config.max_recall_tokens,
        "pad_token": f"{tokenizer.pad_token} ({tokenizer.pad_token_id})",
        "eos_token": f"{tokenizer.eos_token} ({tokenizer.eos_token_id})",
        **ids.as_config(),
    }


# ------------------------------------------------------------------------------------ weights
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def nonfinite_tensor(named_tensors) -> str | None:
    """The name of the first floating tensor of ``(name, tensor)`` pairs holding a NaN or an inf."""
    for name, tensor in named_tensors:
        if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def check_finite(model, what: str) -> None:
    """A one-line ``RecallmError`` naming the first parameter of ``model`` that is not finite
    (``what`` says whose weights: "the trained model", ...). Weights are checked when saved and loaded."""
    with torch.no_grad():
        name = nonfinite_tensor(model.named_parameters())
    if name is not None:
        raise RecallmError(f"{what} has non-finite values (NaN or inf) in tensor {name}")


def safetensors_problem(path: str | Path) -> str | None:
    """What is wrong with one safetensors file (unreadable, truncated, empty, a non-finite tensor), or None."""
    from safetensors import safe_open

    path = Path(path)
    if path.stat().st_size == 0:
        return "is empty"
    try:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118  (safe_open is not a mapping)
                if nonfinite_tensor([(name, f.get_tensor(name))]):
                    return f"has non-finite values (NaN or inf) in tensor {name}"
    except Exception as exc:  # noqa: BLE001  (safetensors raises its own error types)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"is unreadable, truncated or not safetensors ({first})"
    return None


def weights_problem(path: str | Path) -> str | None:
    """What is wrong with the weights of the model directory ``path``, or None: none there; a file
    that differs from its checksum (``recallm.io.verify_manifest``, when the directory has a
    manifest); a safetensors file that cannot be read whole or holds a non-finite value."""
    from recallm.io import verify_manifest

    path = Path(path)
    if not any((path / w).is_file() for w in WEIGHT_FILES):
        return "no model weights (model.safetensors)"
    try:
        verify_manifest(path)
    except RecallmError as exc:
        return str(exc)
    for file in sorted(path.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem:
            return f"{file.name} {problem}"
    return None


def check_weights(path: str | Path) -> None:
    """``weights_problem`` as a one-line ``RecallmError``."""
    problem = weights_problem(path)
    if problem:
        raise RecallmError(f"model {path}: {problem}")


def load_causal_lm(path: str | Path, model_cls=None, **kwargs):
    """``AutoModelForCausalLM.from_pretrained`` of a model directory whose files are verified first
    (its manifest, when it has one) and whose loaded weights are checked finite; each problem is one
    ``RecallmError`` line naming the file or the tensor (a truncated or empty file, a NaN).
    ``model_cls``: the class to load into (default ``AutoModelForCausalLM``)."""
    from recallm.io import verify_manifest

    path = Path(path)
    if not any((path / w).is_file() for w in WEIGHT_FILES):
        raise RecallmError(f"model {path}: no model weights (model.safetensors)")
    try:
        verify_manifest(path)
    except RecallmError as exc:
        raise RecallmError(f"model {path}: {exc}") from None
    for file in sorted(path.glob("*.safetensors")):
        if file.stat().st_size == 0:
            raise RecallmError(f"model {path}: {file.name} is empty")
    try:
        model = (model_cls or AutoModelForCausalLM).from_pretrained(str(path), **kwargs)
    except (OSError, ValueError, RuntimeError, EOFError) as exc:
        raise RecallmError(f"cannot load model {path}: {_first_line(exc)}") from None
    except Exception as exc:  # safetensors' own errors (SafetensorError) are not OSError
        if type(exc).__module__.startswith("safetensors"):
            raise RecallmError(f"cannot load model {path}: {_first_line(exc)}") from None
        raise
    check_finite(model, f"model {path}")
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def save_model_dir(model, tokenizer, directory: str | Path, what: str = "the model") -> Path:
    """Save ``model`` and ``tokenizer`` into ``directory`` (a staging directory the caller renames
    into place), after checking every weight finite, and record the checksums of every file
    (``recallm.io.write_manifest``)."""
    from recallm.io import write_manifest

    check_finite(model, what)
    model.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    write_manifest(directory)
    return Path(directory)


# ------------------------------------------------------------------------------- LoRA adapters
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _adapter_config(path: Path) -> dict:
    """``adapter_config.json`` of an adapter directory: a JSON object, or a one-line ``RecallmError``."""
    import json

    file = path / ADAPTER_CONFIG
    try:
        config = json.loads(file.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # (not UTF-8, not JSON, nested too deeply)
        raise RecallmError(f"cannot read {file}: {_first_line(exc)}") from None
    if not isinstance(config, dict):
        raise RecallmError(f"{file} must be a JSON object (PEFT's LoRA config), got a {type(config).__name__}")
    return config


def adapter_base(path: str | Path) -> Path | None:
    """The base model directory of a PEFT LoRA adapter directory (``adapter_config.json`` without a
    ``config.json``: what ``recallm-sft`` writes to ``final/adapter``, ``recallm-export --keep-adapter``
    writes), or None for anything else. A config that does not read, or a base that is not a model
    directory, is a ``RecallmError``."""
    path = Path(path)
    if (path / "config.json").is_file() or not (path / ADAPTER_CONFIG).is_file():
        return None
    base = _adapter_config(path).get("base_model_name_or_path")
    if not base or not isinstance(base, str):
        raise RecallmError(
            f"{path / ADAPTER_CONFIG} names no base model (base_model_name_or_path must be a path, got {base!r})"
        )
    base_dir = Path(base) if Path(base).is_absolute() else path / base
    if not (base_dir / "config.json").is_file():
        raise RecallmError(
            f"the LoRA adapter {path} is for the base model {base}, which is not a model directory here: "
            "move it back, or edit base_model_name_or_path in its adapter_config.json"
        )
    return base_dir


def _shapes(directory: Path) -> dict[str, list[int]]:
    """Every tensor's shape in the safetensors files of ``directory`` (their headers: nothing is loaded)."""
    from safetensors import safe_open

    shapes: dict[str, list[int]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118  (safe_open is not a mapping)
                shapes[name] = list(f.get_slice(name).get_shape())
    return shapes


def _config_problem(config: dict) -> str | None:
    """What is wrong with a LoRA adapter's config (the values a merge uses), or None."""
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        return f"is a {config.get('peft_type')} adapter, not LoRA"
    rank, alpha = config.get("r"), config.get("lora_alpha", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        return f"has r={rank!r}: the LoRA rank must be a positive integer"
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        return f"has lora_alpha={alpha!r}: a positive number (0 scales the adapter to nothing)"
    targets = config.get("target_modules")
    if not (isinstance(targets, str) and targets) and not (
        isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)
    ):
        return f"has target_modules={targets!r}: the names of the modules the adapter changes"
    return None


def adapter_problem(path: str | Path) -> str | None:
    """What is wrong with the LoRA adapter directory ``path``, or None: a config that does not read or
    whose rank, scale or targets are not a LoRA adapter's (:func:`_config_problem`); files that differ from
    the manifest covering them (``recallm.io.verify_covered``: its own, or its model directory's, as
    ``recallm-sft``'s ``final`` lists ``adapter/...``); no weights, weights that do not read whole or hold a
    NaN or an inf (``safetensors_problem``); a rank of the weights other than the config's; a tensor whose
    module the base model lacks, or whose shape does not fit that module (an adapter of another model)."""
    import re

    from recallm.io import verify_covered

    path = Path(path)
    base = adapter_base(path)
    if base is None:
        return f"is not a LoRA adapter directory (no {ADAPTER_CONFIG} naming a base model)"
    config = _adapter_config(path)
    problem = _config_problem(config)
    if problem:
        return f"{ADAPTER_CONFIG} {problem}"
    try:
        verify_covered(path)
    except RecallmError as exc:
        return str(exc)
    weights = path / ADAPTER_WEIGHTS
    if not weights.is_file():
        return f"has no adapter weights ({ADAPTER_WEIGHTS})"
    problem = safetensors_problem(weights)
    if problem:
        return f"{ADAPTER_WEIGHTS} {problem}"
    pattern = re.compile(r"(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight")
    pairs: dict[str, dict[str, list[int]]] = {}
    for name, shape in _shapes(path).items():
        match = pattern.fullmatch(name)
        if match:
            pairs.setdefault(match.group(1), {})[match.group(2)] = shape
    if not pairs:
        return f"{ADAPTER_WEIGHTS} holds no LoRA tensors (lora_A, lora_B)"
    base_shapes = _shapes(base)
    patterned = bool(config.get("rank_pattern"))
    for module, ab in sorted(pairs.items()):
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None or len(a) != 2 or len(b) != 2 or a[0] != b[1]:
            return f"{ADAPTER_WEIGHTS}: {module} has lora_A {a} and lora_B {b}, not a low-rank pair [r, in], [out, r]"
        if not patterned and a[0] != config["r"]:
            return (
                f"{ADAPTER_CONFIG} says r={config['r']}, but its weights have rank {a[0]} ({module}): the config and "
                "the weights are not of one adapter"
            )
        weight = base_shapes.get(f"{module}.weight")
        if base_shapes and weight is None:
            return f"{ADAPTER_WEIGHTS} adapts {module}, which the base model {base} does not have: an adapter of another model"
        if weight is not None and [b[0], a[1]] != weight[:2]:
            return (
                f"{ADAPTER_WEIGHTS}: {module} is adapted as [out, in] = [{b[0]}, {a[1]}], but the base model's is "
                f"{weight}: an adapter of another model"
            )
    return None


def lora_rank_problem(rank: int, config, key: str) -> str | None:
    """A LoRA rank above the model's width (``hidden_size``), as one line naming ``key``, or None. Such a rank
    adds nothing (an update of a layer has at most the rank of its smaller side) and costs rank x (in + out)
    weights per adapted layer: ``sft.lora.rank=100000000`` asked for 51 GB before anything was checked."""
    width = getattr(config, "hidden_size", None)
    if isinstance(width, int) and not 1 <= rank <= width:
        return (
            f"{key}={rank} is above the model's width (hidden_size {width}): a LoRA update of a layer has at most the "
            f"rank of its smaller side, and each rank costs (in + out) weights per layer; use 1 to {width} (8 to 64 is usual)"
        )
    return None


def check_adapter(path: str | Path) -> None:
    """``adapter_problem`` as a one-line ``RecallmError`` (before a merge, a load, ``--check``, serving)."""
    problem = adapter_problem(path)
    if problem:
        raise RecallmError(f"LoRA adapter {path}: {problem}")


def load_recallm_model(path: str | Path, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(path, **kwargs)`` for a model directory; for a LoRA adapter
    directory (:func:`adapter_base`), its base with the adapter merged in (PEFT), a plain model again:
    the adapter checked first (:func:`check_adapter`), the merged weights checked finite.
    The one loader of "a model or an adapter" (eval's HF backend, export)."""
    base = adapter_base(path)
    if base is None:
        return load_causal_lm(path, **kwargs)
    from peft import PeftModel

    check_adapter(path)
    model = load_causal_lm(base, **kwargs)
    try:
        merged = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise RecallmError(f"cannot load the LoRA adapter {path}: {_first_line(exc)}") from None
    check_finite(merged, f"the model merged with the LoRA adapter {path}")
    return merged


def merge_adapter(adapter: str | Path, out: str | Path, *, dtype: str | None = None) -> Path:
    """Merge a LoRA adapter directory into its base and save a plain RecaLLM model directory at ``out``
    (written next to it and renamed into place; ``out`` must not exist or be empty: ``recallm.io.atomic_dir``
    with ``overwrite=False``), tokenizer included (the adapter's own when it has one), its checksums recorded.
    ``dtype``: of the written weights (default: the base's)."""
    from recallm.io import atomic_dir
    from recallm.tokens import load_tokenizer

    adapter = Path(adapter)
    base = adapter_base(adapter)
    if base is None:
        raise RecallmError(f"{adapter} is not a LoRA adapter directory (no {ADAPTER_CONFIG} naming a base model)")
    kwargs = {"dtype": getattr(torch, dtype)} if dtype else {"dtype": "auto"}
    model = load_recallm_model(adapter, **kwargs)
    tokenizer = load_tokenizer(adapter if (adapter / "tokenizer_config.json").is_file() else base)
    with atomic_dir(Path(out), overwrite=False) as tmp:
        save_model_dir(model, tokenizer, tmp, f"the model merged with the LoRA adapter {adapter}")
    return Path(out)


#: the ``max_lora_rank`` values vLLM 0.24 accepts (``vllm/config/lora.py``: ``MaxLoRARanks``); verl starts its
#: rollout at the ``lora_rank`` rounded up to one of them (``verl/workers/rollout/vllm_rollout/utils.py``:
#: ``get_vllm_max_lora_rank``)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _rounded_lora_rank(rank: int) -> int | None:
    return next((allowed for allowed in VLLM_LORA_RANKS if allowed >= rank), None)


def vllm_lora_rank(adapter: str | Path | int) -> int:
    """vLLM's ``max_lora_rank`` for a LoRA rank: the smallest of :data:`VLLM_LORA_RANKS` that holds it.
    ``adapter``: a rank (GRPO's ``actor_rollout_ref.model.lora_rank``, as verl rounds it; ``recallm.plan``),
    or a LoRA adapter directory to serve (its ``adapter_config.json``'s ``r``). vLLM cannot serve trained
    token rows (PEFT's ``trainable_token_indices``; vLLM 0.24's ``PEFTHelper`` takes no ``modules_to_save``):
    such an adapter is a ``RecallmError`` naming the merge."""

    if isinstance(adapter, int):
        rounded = _rounded_lora_rank(adapter)
        if rounded is None:
            raise RecallmError(f"lora_rank {adapter} is above vLLM's largest max_lora_rank, {VLLM_LORA_RANKS[-1]}")
        return rounded
    adapter = Path(adapter)
    config = _adapter_config(adapter)
    if config.get("trainable_token_indices") or config.get("modules_to_save"):
        raise RecallmError(
            f"{adapter} trains the recall token rows next to the adapter, which vLLM cannot serve: merge it "
            f"first (recallm-export --checkpoint {adapter} --out <dir>) and use that directory"
        )
    rank = int(config.get("r") or 8)  # (PEFT's default rank)
    rounded = _rounded_lora_rank(rank)
    if rounded is None:
        raise RecallmError(f"{adapter} has LoRA rank {rank}; vLLM serves ranks up to {VLLM_LORA_RANKS[-1]}")
    return rounded
