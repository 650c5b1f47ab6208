"""The schema of ``recallm-sft``'s config: ``configs/sft.yaml`` (``SFTRun``) and its ``sft`` group
(``SFTRecipe``, ``configs/sft/*.yaml``). Read with ``recallm.config.typed``: unknown keys and values
of the wrong kind or range are one line naming the key; a default lives here once (the recipe
files set what they choose, the trainer reads attributes). ``model``, ``data`` and ``deepspeed``
are other groups' sections, read by their own code (``recallm.tiny``, ``deepspeed_file``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recallm.config import MAX_BATCH, MAX_COUNT, MAX_SECONDS, MAX_SEED, MAX_TOKENS
from recallm.errors import RecallmError

__all__ = ["STAGES", "StageRecipe", "AdamSettings", "EvalCadence", "LoraSettings", "SFTRecipe", "SFTRun"]

STAGES = ("embed", "full")


@dataclass(frozen=True)
class StageRecipe:
    """``sft.embed`` / ``sft.full``: one stage's optimisation (App. C.1)."""

    lr: float | None = field(default=None, metadata={"max": 10})
    """peak learning rate (> 0; required)"""
    epochs: float | None = field(default=None, metadata={"max": MAX_COUNT})
    """passes over the data (> 0); with ``steps``, 1"""
    steps: int | None = field(default=None, metadata={"max": MAX_COUNT})
    """fixed optimizer steps instead of epochs (> 0)"""
    warmup_steps: int | None = field(default=None, metadata={"min": 0, "max": MAX_COUNT})
    """warm-up in steps; None: ``warmup_ratio`` of the stage's steps"""
    warmup_ratio: float = field(default=0.0, metadata={"min": 0, "max": 1})
    weight_decay: float = field(default=0.0, metadata={"min": 0, "max": 1})
    """the full stage's (the embed stage trains token rows without decay)"""

    def __post_init__(self) -> None:
        if self.steps is not None and not self.steps > 0:
            raise RecallmError(f"steps must be > 0, got {self.steps}")
        if not (self.num_epochs or 0) > 0:
            raise RecallmError(f"epochs must be > 0, got {self.epochs}")
        if not (self.lr or 0) > 0:
            raise RecallmError(f"lr must be > 0, got {self.lr}")

    @property
    def num_epochs(self) -> float | None:
        return 1.0 if self.epochs is None and self.steps is not None else self.epochs


@dataclass(frozen=True)
class AdamSettings:
    """``sft.adam``: AdamW's betas and epsilon."""

    beta1: float = field(default=0.9, metadata={"min": 0, "max": 1})
    beta2: float = field(default=0.999, metadata={"min": 0, "max": 1})
    eps: float = field(default=1e-8, metadata={"min": 0, "max": 1})


@dataclass(frozen=True)
class EvalCadence:
    """``sft.eval``: validation loss and the recall metrics on ``val_file``."""

    steps: int = field(default=100, metadata={"min": 1, "max": MAX_COUNT})
    """evaluate every this many optimizer steps"""
    recall_prompts: int = field(default=0, metadata={"min": 0, "max": MAX_COUNT})
    """validation prompts generated with constrained recall for the recall metrics (0: none)"""
    max_new_tokens: int = field(default=64, metadata={"min": 1, "max": MAX_TOKENS})


@dataclass(frozen=True)
class LoraSettings:
    """``sft.lora``: stage ``full`` as a LoRA finetune (PEFT) instead of a full one; ``rank: 0`` (the
    default) is the full finetune. The embedding stage ignores it (it trains the token rows only)."""

    rank: int = field(default=0, metadata={"min": 0, "max": 65536})
    """LoRA rank r (0: off, every weight trains); at most the model's width (``hidden_size``: checked against
    the model before the adapter is allocated)"""
    alpha: float = field(default=32.0, metadata={"min": 0, "max": 1e6})
    """scaling: the update is alpha / rank times the low-rank product (> 0: at 0 the adapter changes nothing)"""
    dropout: float = field(default=0.0, metadata={"min": 0, "max": 1})
    target_modules: Any = "all-linear"
    """PEFT's ``target_modules``: ``all-linear`` (every linear layer but the output head) or a list of names"""
    token_rows: bool = False
    """also train the four RecaLLM tokens' embedding rows next to the adapter (PEFT's
    ``trainable_token_indices``; untied models: their lm_head rows too); false: they stay as the embedding
    stage left them"""

    def __post_init__(self) -> None:
        if not self.alpha > 0:
            raise RecallmError(f"alpha must be > 0 (at 0 the adapter's update is scaled to nothing), got {self.alpha}")
        modules = self.target_modules
        if not (isinstance(modules, str) and modules) and not (
            isinstance(modules, (list, tuple)) and modules and all(isinstance(m, str) and m for m in modules)
        ):
            raise RecallmError(f"target_modules must be all-linear or a list of module names, got {modules!r}")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class SFTRecipe:
    """The ``sft`` group: the recipe of both stages (``configs/sft/*.yaml``)."""

    max_length: int | None = field(metadata={"min": 1, "max": MAX_TOKENS})
    """the longest example (prompt + completion) trained on; null: the longest trace of the run's data
    (``recallm.sft.train.check_config`` sets it, within the model's positions)"""
    per_device_batch_size: int = field(metadata={"min": 1, "max": MAX_BATCH})
    global_batch_size: int = field(metadata={"min": 1, "max": MAX_BATCH})
    embed: StageRecipe
    full: StageRecipe
    name: str = "sft"
    min_lr_ratio: float = field(default=0.1, metadata={"min": 0, "max": 1})
    """the cosine schedule ends at this share of the peak learning rate"""
    adam: AdamSettings = field(default_factory=AdamSettings)
    lora: LoraSettings = field(default_factory=LoraSettings)
    """stage ``full`` as a LoRA finetune (``rank`` > 0)"""
    grad_clip: float = field(default=1.0, metadata={"min": 0, "max": 1e6})
    gradient_checkpointing: bool = False
    bf16: bool = False
    """bfloat16 weights where a GPU is present"""
    logging_steps: int = field(default=10, metadata={"min": 1, "max": MAX_COUNT})
    logging_seconds: float | None = field(default=30.0, metadata={"min": 1, "max": MAX_SECONDS})
    """also log the loss once this many seconds have passed since the last log (and at the last step
    always); null: every logging_steps only (``recallm.sft.progress``)"""
    save_steps: int = field(default=100, metadata={"min": 1, "max": MAX_COUNT})
    save_total_limit: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    seed: int = field(default=0, metadata={"min": 0, "max": MAX_SEED})
    eval: EvalCadence = field(default_factory=EvalCadence)
    label_logits_only: bool = True
    """logits only where the loss is (the completion): skips lm_head over the prompt"""
    strip_spans: bool = False
    """train on the traces without their recall spans (the no-recall ablation)"""
    strip_spans_fraction: float = field(default=1.0, metadata={"min": 0, "max": 1})
    """with ``strip_spans``: the share of examples stripped (a seeded draw per record; 1.0: all)"""
    curriculum: Any = None
    """[{at, lo, hi}, ...]: order draws by prompt length (``recallm.sft.data.check_curriculum``)"""
    position_skip: int | None = field(default=None, metadata={"min": 1, "max": MAX_TOKENS})
    """PoSE length extension: position ids spread over this many tokens (> max_length)"""
    length_group: int = field(default=1, metadata={"min": 1, "max": MAX_COUNT})
    """with ``curriculum``: the draws of this many consecutive steps are sorted by length into the
    steps' batches (then the steps shuffled among themselves), so a batch pads little
    (``recallm.sft.data.group_by_length``); 1: the draws as drawn"""

    def __post_init__(self) -> None:
        if self.length_group > 1 and self.curriculum is None:
            raise RecallmError(
                f"sft.length_group={self.length_group} groups the draws of a curriculum; set sft.curriculum or "
                "sft.length_group=1"
            )
        if self.position_skip is not None and self.max_length is not None and not self.position_skip > self.max_length:
            raise RecallmError(f"position_skip must exceed sft.max_length={self.max_length}, got {self.position_skip}")
        if self.curriculum is not None:
            from recallm.sft.data import check_curriculum

            check_curriculum(self.curriculum)

    def stage(self, name: str) -> StageRecipe:
        return self.embed if name == "embed" else self.full


@dataclass(frozen=True)
class SFTRun:
    """``configs/sft.yaml``: one stage's run."""

    stage: str = field(metadata={"choices": STAGES})
    train_file: str
    out_dir: str
    sft: SFTRecipe
    model: dict[str, Any] = field(default_factory=dict)
    """the ``model`` group: ``path``, or the tiny default's spec (``recallm.tiny``)"""
    data: dict[str, Any] = field(default_factory=dict)
    """the ``data`` group (names the default train/val files)"""
    val_file: str | None = None
    models_dir: str = "outputs/models"
    """where the tiny default is built"""
    init_from: str | None = None
    """stage=full: default <out_dir>/embed/final"""
    resume: str = "auto"
    """auto (newest checkpoint of the stage) | never | <checkpoint dir>"""
    logger: str = field(default="console", metadata={"choices": ("console", "wandb")})
    max_steps: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    """stop after this many optimizer steps (smoke tests)"""
    deepspeed: Any = None
    """the ``deepspeed`` group (``deepspeed_file``)"""
    _callbacks: Any = None
    """extra ``transformers`` callbacks (tests; not a YAML key)"""
