"""The four RecaLLM tokens: adding them to a model and tokenizer, and finding them again.

``add_recall_tokens`` (App. C.1, Hewitt 2021):

* adds ``<|start_recall|>``, ``<|end_recall|>``, ``<think>``, ``</think>`` as *non-special*
  added tokens (so ``skip_special_tokens=True`` decoding keeps them), only those missing;
* grows the embedding matrix when the tokenizer outgrows it and never shrinks it (a padded
  vocabulary such as Qwen2.5's keeps its size; the new ids then fall on unused padded rows);
* initialises the rows of the newly added tokens to the mean of the rows of the tokens that
  existed before, in the input embeddings and, for untied models, in ``lm_head``;
* makes the chat template's generation prompt open ``<think>\\n``;
* records the ids in the model config (``recall_start_token_id``, ``recall_end_token_id``,
  ``think_start_token_id``, ``think_end_token_id``, ``max_recall_tokens``);
* gives the model a pad token if it has none (``ensure_pad_token``, the one pad-token rule).

Calling it again changes nothing.

The pad-token rule (one rule, one place; every consumer calls ``pad_token_id``): the tokenizer's
pad token if it has one, else the pad id recorded in the generation config or the model config,
else the first end-of-sequence id. Padding is always masked out (attention mask, labels of -100),
so reusing the end-of-sequence token costs nothing; it is what Qwen2.5 and SmolLM2 ship, and what
a tokenizer without a pad token (Llama 3.1) gets. ``recallm-create-model`` records the result in
the tokenizer, the model config and the generation config, so a created model never needs the
fallback.

Padding is on the left (``PADDING_SIDE``), wherever a batch of prompts is padded for generation:
a decoder continues each row from its last position, so a right-padded row would continue after
its padding. ``ensure_pad_token`` records it in the tokenizer (a created model's
``tokenizer_config.json``), ``load_tokenizer`` applies it to every tokenizer it loads (a
directory saved without it, e.g. a GGUF conversion, comes back ``right``-padded from
transformers), ``recallm.generation.generate`` pads on the left itself, and
``RecallMaskMixin.generate`` refuses a right-padded batch (``check_left_padded``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from recallm.errors import RecallmError

__all__ = [
    "START_RECALL",
    "END_RECALL",
    "THINK_START",
    "THINK_END",
    "RECALLM_TOKENS",
    "CONFIG_KEYS",
    "DEFAULT_MAX_RECALL_TOKENS",
    "DEFAULT_SPAN_DRAFT_TOKENS",
    "RecallTokenIds",
    "add_recall_tokens",
    "ensure_think_generation_prompt",
    "load_tokenizer",
    "eos_token_ids",
    "pad_token_id",
    "ensure_pad_token",
    "PADDING_SIDE",
    "check_left_padded",
]

log = logging.getLogger(__name__)

START_RECALL = "<|start_recall|>"
END_RECALL = "<|end_recall|>"
THINK_START = "<think>"
THINK_END = "</think>"
RECALLM_TOKENS = (START_RECALL, END_RECALL, THINK_START, THINK_END)
PADDING_SIDE = "left"  # the padding rule (module doc)
CONFIG_KEYS = {
    START_RECALL: "recall_start_token_id",
    END_RECALL: "recall_end_token_id",
    THINK_START: "think_start_token_id",
    THINK_END: "think_end_token_id",
}
DEFAULT_MAX_RECALL_TOKENS = 128
#: most tokens drafted and verified in one forward pass inside a recall span (speculative in-span
#: decoding, ``recallm.decoding``): the default of ``recallm.generation.generate`` and of the settings
#: that pass it on (eval's ``backend.span_draft_tokens``, the CPU rollout's ``hf_cpu.span_draft_tokens``)
DEFAULT_SPAN_DRAFT_TOKENS = 8

# Appended to a chat template whose generation prompt does not already open the think block.
_TEMPLATE_MARK = "{#- recallm: the generation prompt opens the think block #}"
_TEMPLATE_SUFFIX = _TEMPLATE_MARK + "{%- if add_generation_prompt %}{{- '<think>\\n' }}{%- endif %}"
# Used when a tokenizer has no chat template at all.
_CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_PROBE_MESSAGES = [{"role": "user", "content": "probe"}]


@dataclass(frozen=True)
class RecallTokenIds:
    """Token ids of the four RecaLLM tokens in one model/tokenizer."""

    start: int
    end: int
    think_start: int
    think_end: int

    def as_config(self) -> dict[str, int]:
        return {
            CONFIG_KEYS[START_RECALL]: self.start,
            CONFIG_KEYS[END_RECALL]: self.end,
            CONFIG_KEYS[THINK_START]: self.think_start,
            CONFIG_KEYS[THINK_END]: self.think_end,
        }

    def validate(self, vocab_size: int) -> RecallTokenIds:
        """Raise if an id falls outside a vocabulary (embedding matrix) of ``vocab_size`` rows."""
        for name, value in self.as_config().items():
            if not 0 <= value < vocab_size:
                raise RecallmError(f"{name}={value} is out of range for a vocabulary of {vocab_size} rows")
        if len(set(self.as_config().values())) != 4:
            raise RecallmError(f"the four RecaLLM token ids must be distinct, got {self.as_config()}")
        return self

    @classmethod
    def from_config(cls, config) -> RecallTokenIds:
        """Read the ids recorded by ``add_recall_tokens`` from a model config."""
        values = {key: getattr(config, key, None) for key in CONFIG_KEYS.values()}
        missing = [key for key, value in values.items() if value is None]
        if missing:
            kind = getattr(config, "model_type", type(config).__name__)
            raise RecallmError(
                f"model config ({kind}) has no recall tokens ({', '.join(missing)} missing); "
                "convert the model first with `recallm-create-model --base PATH --out PATH`"
            )
        ids = cls(*(int(values[CONFIG_KEYS[tok]]) for tok in RECALLM_TOKENS))
        vocab_size = getattr(config, "vocab_size", None)
        return ids.validate(vocab_size) if vocab_size is not None else ids

    @classmethod
    def from_tokenizer(cls, tokenizer) -> RecallTokenIds:
        """Look the four tokens up in a tokenizer; raise if any is missing."""
        vocab = tokenizer.get_vocab()
        missing = [tok for tok in RECALLM_TOKENS if tok not in vocab]
        if missing:
            raise RecallmError(
                f"tokenizer has no {', '.join(missing)} token(s); "
                "convert the model first with `recallm-create-model --base PATH --out PATH`"
            )
        return cls(*(int(vocab[tok]) for tok in RECALLM_TOKENS))

    @classmethod
    def from_pretrained(cls, config, tokenizer) -> RecallTokenIds:
        """The ids of a model and its tokenizer, checked to agree."""
        from_cfg, from_tok = cls.from_config(config), cls.from_tokenizer(tokenizer)
        if from_cfg != from_tok:
            raise RecallmError(
                f"model config and tokenizer disagree on the RecaLLM token ids: "
                f"config {from_cfg.as_config()} vs tokenizer {from_tok.as_config()}"
            )
        return from_cfg


def load_tokenizer(path):
    """Load a tokenizer directory as it was saved, padding on the left (the padding rule, module doc).

    ``AutoTokenizer`` rebuilds the tokenizer pipeline of some model types (``qwen2`` among
    them) from the class it maps the model type to, even when ``tokenizer_config.json`` names
    the generic ``TokenizersBackend``; a tokenizer saved as generic (the tiny default) is
    therefore loaded with ``TokenizersBackend`` directly. Anything else goes to ``AutoTokenizer``.
    """
    import json
    from pathlib import Path

    from transformers import AutoTokenizer, TokenizersBackend

    path = Path(path)
    config_file = path / "tokenizer_config.json"
    if not path.is_dir():
        raise RecallmError(f"tokenizer directory {path} does not exist")
    try:
        declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.is_file() else None
        if declared in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            tokenizer = TokenizersBackend.from_pretrained(path)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path)
    except (ValueError, OSError, json.JSONDecodeError) as exc:
        raise RecallmError(f"cannot load a tokenizer from {path}: {str(exc).splitlines()[0]}") from exc
    tokenizer.padding_side = PADDING_SIDE  # the padding rule (module doc)
    return tokenizer


def _ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def eos_token_ids(*, tokenizer=None, config=None, generation_config=None) -> list[int]:
    """The end-of-sequence ids generation stops at: the generation config's (it may list several,
    as Llama 3.1's does), else the model config's, else the tokenizer's; ``[]`` when none is set."""
    for source in (generation_config, config):
        ids = _ids(getattr(source, "eos_token_id", None)) if source is not None else []
        if ids:
            return ids
    return _ids(getattr(tokenizer, "eos_token_id", None)) if tokenizer is not None else []


def pad_token_id(*, tokenizer=None, config=None, generation_config=None) -> int:
    """The pad id of a model, by the one pad-token rule (module doc). Pass what the caller has: a
    tokenizer, a model config and/or a generation config. Raises ``RecallmError`` when none of them
    names a pad or end-of-sequence token."""
    if tokenizer is not None and getattr(tokenizer, "pad_token_id", None) is not None:
        return int(tokenizer.pad_token_id)
    for source in (generation_config, config):
        value = getattr(source, "pad_token_id", None) if source is not None else None
        if value is not None:
            return int(value)
    eos = eos_token_ids(tokenizer=tokenizer, config=config, generation_config=generation_config)
    if eos:
        return eos[0]
    raise RecallmError(
        "the model has no pad token and no end-of-sequence token to pad with; "
        "set tokenizer.pad_token (or convert the model with `recallm-create-model`)"
    )


def ensure_pad_token(model, tokenizer) -> int:
    """Apply the pad-token rule to ``model`` and ``tokenizer`` and record the result in the
    tokenizer, the model config and the generation config; set the tokenizer's padding side to the
    padding rule's. Returns the pad id."""
    gen = getattr(model, "generation_config", None)
    pad = pad_token_id(tokenizer=tokenizer, config=model.config, generation_config=gen)
    reserved = {getattr(model.config, key, None) for key in CONFIG_KEYS.values()}
    if pad in reserved:
        raise RecallmError(f"pad token id {pad} is one of the RecaLLM tokens; give the tokenizer another pad token")
    if not 0 <= pad < len(tokenizer):
        raise RecallmError(f"pad token id {pad} is outside the tokenizer's {len(tokenizer)} tokens")
    if tokenizer.pad_token_id != pad:
        log.warning("pad token: %r (id %d) by the pad-token rule", tokenizer.convert_ids_to_tokens(pad), pad)
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
    model.config.pad_token_id = pad
    if gen is not None:
        gen.pad_token_id = pad
    tokenizer.padding_side = PADDING_SIDE
    tokenizer.init_kwargs["padding_side"] = PADDING_SIDE  # (save_pretrained writes the init_kwargs' keys)
    return pad


def check_left_padded(attention_mask) -> None:
    """Refuse a batch of prompts padded anywhere but on the left (the padding rule, module doc):
    a row of ``attention_mask`` (``(B, L)``) where a masked position follows an attended one."""
    import torch

    if attention_mask is None or attention_mask.dim() != 2 or attention_mask.shape[1] < 2:
        return
    attended = attention_mask != 0
    bad = (attended[:, :-1] & ~attended[:, 1:]).any(dim=1)
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten().tolist()
        raise RecallmError(
            f"prompt rows {rows[:5]} are padded on the right: a decoder would continue them after their "
            "padding and generate noise; pad on the left (tokenizer.padding_side = 'left', which "
            "recallm.tokens.load_tokenizer sets)"
        )


def _render_generation_prompt(tokenizer) -> str:
    return tokenizer.apply_chat_template(_PROBE_MESSAGES, tokenize=False, add_generation_prompt=True)


def ensure_think_generation_prompt(tokenizer) -> bool:
    """Make ``apply_chat_template(..., add_generation_prompt=True)`` end with ``<think>\\n``.

    Returns True if the template was changed. A tokenizer without a chat template gets a
    ChatML one. Templates that already open the think block are left alone.
    """
    template = tokenizer.chat_template
    if isinstance(template, dict):
        raise RecallmError(
            "tokenizer has several named chat templates; keep one (tokenizer.chat_template = <str>) first"
        )
    changed = False
    if not template:
        log.warning("tokenizer has no chat template; using a ChatML template")
        tokenizer.chat_template = _CHATML_TEMPLATE
        changed = True
    if _render_generation_prompt(tokenizer).endswith(THINK_START + "\n"):
        return changed
    tokenizer.chat_template = tokenizer.chat_template + _TEMPLATE_SUFFIX
    rendered = _render_generation_prompt(tokenizer)
    if not rendered.endswith(THINK_START + "\n"):
        raise RecallmError(
            f"could not make the chat template's generation prompt open {THINK_START!r}: "
            f"it renders as {rendered[-80:]!r}"
        )
    return True


def _tied(model) -> bool:
    out = model.get_output_embeddings()
    return out is None or out.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def add_recall_tokens(model, tokenizer, *, max_recall_tokens: int | None = None) -> RecallTokenIds:
    """Add the four RecaLLM tokens to ``model`` and ``tokenizer`` in place (see module doc)."""
    import torch  # (here, not at module level: data_gen imports the token names without torch)

    with torch.no_grad():
        return _add_recall_tokens(model, tokenizer, max_recall_tokens)


def _add_recall_tokens(model, tokenizer, max_recall_tokens: int | None) -> RecallTokenIds:
    import torch
    from tokenizers import AddedToken

    embeddings = model.get_input_embeddings()
    rows_before = embeddings.weight.shape[0]
    n_before = len(tokenizer)
    if n_before > rows_before:
        raise RecallmError(
            f"tokenizer has {n_before} tokens but the model's embedding matrix has only {rows_before} rows"
        )
    vocab = tokenizer.get_vocab()
    missing = [tok for tok in RECALLM_TOKENS if tok not in vocab]
    if missing:
        tokenizer.add_tokens(
            [
                AddedToken(tok, special=False, normalized=False, single_word=False, lstrip=False, rstrip=False)
                for tok in missing
            ]
        )
    ids = RecallTokenIds.from_tokenizer(tokenizer)
    new_ids = sorted(int(tokenizer.convert_tokens_to_ids(tok)) for tok in missing)
    if len(tokenizer) > rows_before:  # grow, never shrink
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    if new_ids:
        index = torch.tensor(new_ids, dtype=torch.long)
        matrices = [model.get_input_embeddings().weight]
        if not _tied(model):
            matrices.append(model.get_output_embeddings().weight)
        for weight in matrices:
            mean = weight[:n_before].float().mean(dim=0)
            weight[index] = mean.to(weight.dtype).expand(len(new_ids), -1)
        log.info("added %s with ids %s (rows initialised to the mean of %d rows)", missing, new_ids, n_before)
    ids.validate(model.get_input_embeddings().weight.shape[0])
    ensure_think_generation_prompt(tokenizer)
    config = model.config
    for key, value in ids.as_config().items():
        setattr(config, key, value)
    if max_recall_tokens is not None:
        config.max_recall_tokens = int(max_recall_tokens)
    elif getattr(config, "max_recall_tokens", None) is None:
        config.max_recall_tokens = DEFAULT_MAX_RECALL_TOKENS
    ensure_pad_token(model, tokenizer)
    return ids
