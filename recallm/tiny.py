"""The embedded tiny default: a ~1M-parameter Qwen2 model and a locally trained tokenizer.

Nothing is downloaded. The tokenizer is a BPE model trained with the ``tokenizers`` library
on text generated here; its pre-tokenizer isolates whitespace runs, letter runs, digit runs
and single punctuation marks, so every word of the toy vocabulary (keys ``TOY_KEYS`` and
values ``TOY_VALUES``) is one token wherever it stands in a line, and decoding is an exact
concatenation (``decode(encode(text)) == text`` for ASCII text). The model is a Qwen2
causal LM (hidden 128, 4 layers, 4 heads of 32, head_dim >= 32 as vLLM's CPU backend needs)
initialised from a seed; the embedding matrix is padded to a multiple of 64 rows, like real
checkpoints, so the RecaLLM tokens land on unused padded rows. Tied and untied variants.

The tokenizer is the same for every seed; the seed only sets the model's weights.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from recallm.errors import RecallmError

__all__ = [
    "TinySpec",
    "TOY_KEYS",
    "TOY_VALUES",
    "TOY_WORDS",
    "build_tiny_tokenizer",
    "build_tiny_model",
    "create_tiny",
    "create_tiny_from_config",
    "resolve_model",
]

PAD, EOS, IM_START, UNK = "<|endoftext|>", "<|im_end|>", "<|im_start|>", "<unk>"
SPECIAL_TOKENS = [UNK, PAD, IM_START, EOS]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PRE_TOKENIZER_PATTERN = r"\s+|[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]"

N_KEYS = 1000
N_VALUES = 600
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"

#: Keys of the toy dictionaries: the numbers 0..999, each one token.
TOY_KEYS: tuple[str, ...] = tuple(str(i) for i in range(N_KEYS))


def _make_values() -> tuple[str, ...]:
    rng = random.Random(1234)
    words: set[str] = set()
    while len(words) < N_VALUES:
        n_syll = rng.choice((2, 3))
        words.add("".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(n_syll)))
    return tuple(sorted(words))


#: Values of the toy dictionaries: invented consonant-vowel words, each one token.
TOY_VALUES: tuple[str, ...] = _make_values()

#: Plain words for instructions and reasoning text, each one token.
TOY_WORDS: tuple[str, ...] = tuple(
    """
    a an the of to in on at by for from with and or not no yes is are was be it this that these
    what which who where when how why if then so as than all each every any some one two three
    key keys value values answer question dictionary list line lines entry entries table below
    above following given find look up lookup retrieve return recall copy output give write state
    solve compute calculate math problem equation result number numbers sum plus minus times
    total x y z q n k v think step first next last final use using need we i you your my our
    text document documents passage passages context read search match correct wrong true false
    user assistant system json csv format note item items label labels count most frequent vote Answer
    """.split()
)


@dataclass(frozen=True)
class TinySpec:
    """Shape of the tiny model (defaults: the toy-calibration model, ~1M parameters)."""

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    intermediate_size: int = 256
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    vocab_multiple: int = 64

    def __post_init__(self) -> None:
        head_dim = self.hidden_size // self.num_attention_heads
        if head_dim * self.num_attention_heads != self.hidden_size or head_dim < 32:
            raise ValueError(
                f"hidden_size={self.hidden_size} with {self.num_attention_heads} heads gives head_dim={head_dim}; "
                "need an integer head_dim >= 32"
            )


def _training_corpus() -> list[str]:
    rng = random.Random(0)
    keys, values, words = list(TOY_KEYS), list(TOY_VALUES), list(TOY_WORDS)
    corpus = []
    for _ in range(8):
        corpus.append(" ".join(keys))
        corpus.append(" ".join(values))
        corpus.append(" ".join(words))
        corpus.append("\n".join(f"{k}: {v}" for k, v in zip(rng.sample(keys, 64), rng.sample(values, 64), strict=True)))
        corpus.append(" ".join(rng.choice(words) for _ in range(200)) + ".")
    return corpus


@lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERN), behavior="isolated")
    tok.decoder = decoders.Fuse()
    alphabet = sorted(set(string.ascii_letters + string.digits + string.punctuation + " \n\t"))
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer)
    vocab = tok.get_vocab()
    not_single = [w for w in (*TOY_KEYS, *TOY_VALUES, *TOY_WORDS) if w not in vocab]
    if not_single:  # pragma: no cover - guards the construction above
        raise RuntimeError(f"tiny tokenizer failed to learn {len(not_single)} words, e.g. {not_single[:5]}")
    return tok.to_str()


def build_tiny_tokenizer():
    """The tiny tokenizer (a ``PreTrainedTokenizerFast``) with a ChatML chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        unk_token=UNK,
        pad_token=PAD,
        eos_token=EOS,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(tokenizer, *, tied: bool = True, seed: int = 0, spec: TinySpec | None = None):
    """A randomly initialised Qwen2 causal LM sized for ``tokenizer`` (deterministic in ``seed``)."""
    import torch  # (here: data_gen reads the toy vocabulary of this module without torch)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = spec or TinySpec()
    rows = -(-len(tokenizer) // spec.vocab_multiple) * spec.vocab_multiple
    config = Qwen2Config(
        vocab_size=rows,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config._attn_implementation = "sdpa"
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model.eval()


def create_tiny(
    out_dir: str | Path,
    *,
    tied: bool = True,
    seed: int = 0,
    recall_tokens: bool = True,
    spec: TinySpec | None = None,
    max_recall_tokens: int | None = None,
    yarn_factor: float | None = None,
) -> Path:
    """Write the tiny model and tokenizer to ``out_dir`` with ``save_pretrained``.

    With ``recall_tokens`` (the default) the directory is a RecaLLM model (model_type
    ``recallm_qwen2``, the four tokens added); without, a plain Qwen2 base checkpoint.
    """
    out = Path(out_dir)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, tied=tied, seed=seed, spec=spec)
    if not recall_tokens:
        if yarn_factor is not None:
            raise RecallmError("yarn_factor applies to a RecaLLM model (recall_tokens=True)")
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        return out
    import tempfile

    from recallm.modeling import create_recallm_model

    with tempfile.TemporaryDirectory(prefix="recallm-tiny-base-") as base:
        model.save_pretrained(base)
        tokenizer.save_pretrained(base)
        return create_recallm_model(base, out, max_recall_tokens=max_recall_tokens, yarn_factor=yarn_factor)


def create_tiny_from_config(model_cfg, out_dir: str | Path) -> Path:
    """``create_tiny`` from a ``configs/model/tiny.yaml``-shaped mapping."""
    from dataclasses import fields

    spec = TinySpec(**{f.name: model_cfg[f.name] for f in fields(TinySpec) if f.name in model_cfg})
    return create_tiny(
        out_dir,
        tied=bool(model_cfg.get("tied", True)),
        seed=int(model_cfg.get("seed", 0)),
        spec=spec,
        max_recall_tokens=model_cfg.get("max_recall_tokens"),
    )


def resolve_model(spec: str, models_dir: Path) -> Path:
    """A model directory: ``tiny`` is the embedded tiny default (seed 0, tied), built under ``models_dir``
    where ``recallm-sft`` builds it too; anything else is a path."""
    if spec == "tiny":
        path = models_dir / "tiny-seed0-tied"
        if not (path / "config.json").is_file():
            create_tiny(path, tied=True, seed=0)
        return path
    return Path(spec)
