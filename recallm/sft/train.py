"""The SFT cold start recipe (paper App. C.1), one stage per run.

``stage=embed``: only the rows of the four RecaLLM tokens train (input embeddings and, for
untied models, lm_head), weight decay 0 — 5 epochs at 5e-5 in the paper. ``stage=full``: every
weight trains, starting from the embed stage's output — 1 epoch at 2e-6. Both: AdamW
(0.9, 0.999, 1e-8), cosine schedule with a floor of 10% of the peak, global batch 32, examples up
to 16,000 tokens, optional gradient checkpointing, DeepSpeed ZeRO-2 with CPU optimizer offload.

Features:
* ``transformers.Trainer`` with our collator (loss on completion tokens only); the loss is the
  masked model's — computed under the recall mask, the distribution decoding samples from;
* DeepSpeed through the Trainer's integration, with ``deepspeed``/``torchrun``/``accelerate`` on
  GPU nodes, and on CPUs too (1 or 2 processes: gloo, fp32, the accelerate state set up first);
* ``resume=auto`` continues from the newest checkpoint of the stage's directory (model,
  optimizer, scheduler, RNG, data position); a partial or corrupt checkpoint is an error, never
  silently used; ``resume=never`` starts over; ``resume=<dir>`` picks one;
* console logs always, W&B with ``logger=wandb`` (``WANDB_MODE=offline`` works without network);
  train/eval loss, learning rate, tokens/s; at every evaluation, constrained generation on a few
  validation prompts: recall spans per answer, fraction of spans that are verbatim (1.0 by
  construction), answer accuracy with the reward's own metric;
* recipe options (``configs/sft/*.yaml``): ``label_logits_only`` (default on: logits and the
  recall mask only where the loss is, see ``RecallMaskMixin.label_logits_only``), a stage's
  ``steps`` instead of ``epochs``, ``warmup_steps``, and the data options of
  ``recallm.sft.data``: ``strip_spans`` (the no-recall ablation), ``curriculum``,
  ``position_skip`` (PoSE length extension);
* output: ``<out_dir>/<stage>/final``, a Hugging Face directory (model, tokenizer, chat template)
  that ``AutoModelForCausalLM`` loads after ``import recallm``.

Errors (one line each, exit code 2 from the CLI): unknown stage, missing model or data file,
data tokenised with another tokenizer, batch sizes that do not divide, non-positive learning
rate or epochs, a corrupt or partial checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from recallm.errors import RecallmError

__all__ = ["RecallTrainer", "run_sft", "find_checkpoint", "check_checkpoint", "STAGES"]

log = logging.getLogger(__name__)
STAGES = ("embed", "full")


# --------------------------------------------------------------------------- checkpoints
def check_checkpoint(path: Path) -> Path:
    """Raise ``RecallmError`` unless ``path`` is a complete, readable Trainer checkpoint."""
    path = Path(path)
    if not path.is_dir():
        raise RecallmError(f"checkpoint {path} does not exist")
    state = path / "trainer_state.json"
    try:
        json.loads(state.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RecallmError(f"checkpoint {path} is partial or corrupt: trainer_state.json unreadable ({exc})") from exc
    weights = [path / "model.safetensors", path / "model.safetensors.index.json", path / "pytorch_model.bin"]
    if not any(w.is_file() for w in weights):
        raise RecallmError(f"checkpoint {path} is partial: no model weights")
    if (path / "model.safetensors").is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(path / "model.safetensors"), framework="pt") as f:
                f.keys()
        except Exception as exc:  # safetensors raises its own error types
            raise RecallmError(f"checkpoint {path} is corrupt: model.safetensors unreadable ({exc})") from exc
    deepspeed_dirs = [d for d in path.glob("global_step*") if d.is_dir()]
    if not (path / "optimizer.pt").is_file() and not deepspeed_dirs:
        raise RecallmError(f"checkpoint {path} is partial: no optimizer state (optimizer.pt or global_step*/)")
    if not deepspeed_dirs and not (path / "scheduler.pt").is_file():
        raise RecallmError(f"checkpoint {path} is partial: no scheduler.pt")
    return path


def find_checkpoint(stage_dir: Path) -> Path | None:
    """The newest ``checkpoint-<step>`` of a stage directory (checked), or None if there is none."""
    candidates = []
    for d in Path(stage_dir).glob("checkpoint-*"):
        try:
            candidates.append((int(d.name.split("-")[-1]), d))
        except ValueError:
            continue
    if not candidates:
        return None
    return check_checkpoint(max(candidates)[1])


# ------------------------------------------------------------------------------- trainer
class RecallTrainer(Trainer):
    """``Trainer`` plus tokens/s in the training logs and recall metrics at evaluation."""

    def __init__(self, *args, recall_eval: dict | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.recall_eval = recall_eval or {}
        self._last_log = (time.perf_counter(), 0)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            now, seen = time.perf_counter(), int(self.state.num_input_tokens_seen or 0)
            then, before = self._last_log
            if now > then and seen > before:
                logs["tokens_per_second"] = round((seen - before) / (now - then), 1)
            self._last_log = (now, seen)
        super().log(logs, *args, **kwargs)

    def evaluate(self, *args, **kwargs):
        metrics = super().evaluate(*args, **kwargs)
        records = self.recall_eval.get("records") or []
        if records and self.is_world_process_zero():
            recall = recall_metrics(
                self.model,
                self.processing_class,
                records,
                max_new_tokens=int(self.recall_eval.get("max_new_tokens", 64)),
            )
            self.log({f"eval_{k}": v for k, v in recall.items()})
            metrics.update({f"eval_{k}": v for k, v in recall.items()})
        return metrics


@torch.no_grad()
def recall_metrics(model, tokenizer, records: list[dict], *, max_new_tokens: int) -> dict[str, float]:
    """Greedy constrained generation on validation prompts: spans per answer, verbatim fraction,
    answer accuracy (the reward's answer metric)."""
    from recallm.recall import find_spans
    from recallm.tokens import RecallTokenIds
    from rewards import score_response

    ids = RecallTokenIds.from_config(model.config)
    was_training = model.training
    model.eval()
    spans = verbatim = 0
    correct = 0.0
    device = next(model.parameters()).device
    from recallm.tokens import eos_token_ids, pad_token_id

    gen_config = getattr(model, "generation_config", None)
    eos = eos_token_ids(tokenizer=tokenizer, config=model.config, generation_config=gen_config)
    pad = pad_token_id(tokenizer=tokenizer, config=model.config, generation_config=gen_config)
    for record in records:
        prompt = torch.tensor([record["prompt_ids"]], device=device)
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=eos or None,
        )[0].tolist()
        generated = out[len(record["prompt_ids"]) :]
        found = [s for s in find_spans(out, ids.start, ids.end) if s.start >= len(record["prompt_ids"])]
        spans += len(found)
        verbatim += sum(s.verbatim for s in found)
        text = tokenizer.decode([t for t in generated if t not in eos], skip_special_tokens=False)
        score = score_response(
            text,
            record["ground_truth"],
            prompt_text=record.get("prompt_text"),
            data_source=record.get("data_source"),
            n_tokens=len(generated),
        )
        correct += score.answer
    if was_training:
        model.train()
    n = len(records)
    return {
        "recall_spans": spans / n,
        "recall_verbatim": verbatim / spans if spans else 1.0,
        "answer_accuracy": correct / n,
    }


# -------------------------------------------------------------------------------- recipe
def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _prepare_cpu_distributed(deepspeed: bool) -> dict[str, Any]:
    """On CPUs, DeepSpeed with several processes needs the accelerate state set up first (accelerate
    does not recognise DeepSpeed without a GPU and would size the global batch for one process)."""
    if torch.cuda.is_available() or _world_size() == 1 or not deepspeed:
        return {}
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    try:
        PartialState(backend="gloo")
    finally:
        os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
    return {"accelerator_config": {"use_configured_state": True}}


def stage_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The recipe values of the run's stage, validated."""
    stage = cfg["stage"]
    if stage not in STAGES:
        raise RecallmError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    recipe = cfg["sft"]
    values = dict(recipe[stage])
    if values.get("steps") is not None:  # a fixed number of optimizer steps instead of epochs
        if not int(values["steps"]) > 0:
            raise RecallmError(f"sft.{stage}.steps must be > 0, got {values['steps']}")
        values.setdefault("epochs", 1)
    for key in ("epochs", "lr"):
        if not float(values.get(key, 0)) > 0:
            raise RecallmError(f"sft.{stage}.{key} must be > 0, got {values.get(key)}")
    if recipe.get("curriculum") is not None:
        from recallm.sft.data import check_curriculum

        check_curriculum(recipe["curriculum"])
    skip = recipe.get("position_skip")
    if skip is not None and not int(skip) > int(recipe["max_length"]):
        raise RecallmError(f"sft.position_skip must exceed sft.max_length={recipe['max_length']}, got {skip}")
    world = _world_size()
    per_device, global_batch = int(recipe["per_device_batch_size"]), int(recipe["global_batch_size"])
    if per_device < 1 or global_batch % (per_device * world):
        raise RecallmError(
            f"sft.global_batch_size={global_batch} is not a multiple of per_device_batch_size={per_device} x "
            f"{world} process(es)"
        )
    values["grad_accum"] = global_batch // (per_device * world)
    return values


def _model_dir(cfg: dict[str, Any], out_dir: Path) -> Path:
    stage = cfg["stage"]
    if stage == "full":
        init = Path(cfg.get("init_from") or out_dir / "embed" / "final")
        if not (init / "config.json").is_file():
            raise RecallmError(
                f"stage=full starts from {init}, which is not a model directory: run stage=embed first or pass "
                "init_from=<model dir>"
            )
        return init
    model = cfg["model"]
    if model.get("path"):
        return Path(model["path"])
    if model.get("name") == "tiny":
        from recallm.tiny import create_tiny_from_config

        path = (
            Path(cfg.get("models_dir") or "outputs/models")
            / f"tiny-seed{model['seed']}-{'tied' if model['tied'] else 'untied'}"
        )
        if not (path / "config.json").is_file() and int(os.environ.get("RANK", "0")) == 0:
            create_tiny_from_config(model, path)
        if _world_size() > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()
        return path
    raise RecallmError(f"model.path is required for model {model.get('name')!r}")


def deepspeed_file(spec) -> Path | None:
    """The DeepSpeed JSON of the ``deepspeed`` config group (``file``: relative to configs/deepspeed/)."""
    file = spec.get("file") if isinstance(spec, dict) else spec
    if not file:
        return None
    from recallm.paths import CONFIG_DIR

    path = Path(file)
    if not path.is_absolute() and not path.is_file():
        path = CONFIG_DIR / "deepspeed" / path
    if not path.is_file():
        raise RecallmError(f"DeepSpeed config {file} does not exist")
    return path


def run_sft(cfg: dict[str, Any]) -> Path:
    """Run one SFT stage from a resolved config mapping; returns the final model directory."""
    from transformers import AutoModelForCausalLM

    import recallm  # noqa: F401  (the masked model classes)
    from recallm.modeling import check_recallm_model
    from recallm.sft.data import SFTCollator, load_sft_file
    from recallm.sft.freeze import freeze_all_but_token_rows
    from recallm.tokens import RecallTokenIds, load_tokenizer, pad_token_id

    settings = stage_settings(cfg)
    stage = cfg["stage"]
    recipe = cfg["sft"]
    out_dir = Path(cfg["out_dir"])
    stage_dir = out_dir / stage
    deepspeed = deepspeed_file(cfg.get("deepspeed"))
    resume = str(cfg.get("resume", "auto"))
    if resume not in ("auto", "never"):
        check_checkpoint(Path(resume))
    extra_args = _prepare_cpu_distributed(bool(deepspeed))
    model_dir = _model_dir(cfg, out_dir)
    check_recallm_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    dtype = torch.bfloat16 if recipe.get("bf16") and torch.cuda.is_available() else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    ids = RecallTokenIds.from_pretrained(model.config, tokenizer)
    vocab = model.get_input_embeddings().weight.shape[0]
    max_length = int(recipe["max_length"])
    strip = (ids.start, ids.end) if recipe.get("strip_spans") else None
    train_set, train_stats = load_sft_file(
        cfg["train_file"], tokenizer, max_length=max_length, vocab_size=vocab, strip_spans=strip
    )
    val_set, val_records = None, []
    if cfg.get("val_file"):
        val_set, _ = load_sft_file(
            cfg["val_file"], tokenizer, max_length=max_length, vocab_size=vocab, strip_spans=strip
        )
        n_prompts = int(recipe["eval"].get("recall_prompts", 0))
        if n_prompts:
            for line in Path(cfg["val_file"]).read_text().splitlines()[:n_prompts]:
                val_records.append(json.loads(line))
    if stage == "embed":
        freeze_all_but_token_rows(model, list(ids.as_config().values()))
        weight_decay = 0.0
    else:
        weight_decay = float(settings.get("weight_decay", 0.0))
    if recipe.get("gradient_checkpointing"):
        model.config.use_cache = False
    if recipe.get("label_logits_only", True):
        model.label_logits_only(True)
    global_batch = int(recipe["global_batch_size"])
    total_steps = settings.get("steps")
    if total_steps is None:
        total_steps = math.ceil(len(train_set) / global_batch) * float(settings["epochs"])
    sampling = "random"
    if recipe.get("curriculum") is not None:  # the draws, in order, for the whole stage
        from recallm.sft.data import SFTDataset, curriculum_order

        draws = int(math.ceil(total_steps)) * global_batch
        lengths = [len(e["input_ids"]) for e in train_set.records]
        order = curriculum_order(lengths, draws, recipe["curriculum"], seed=int(recipe.get("seed", 0)))
        train_set = SFTDataset([train_set.records[i] for i in order])
        sampling = "sequential"
        settings = {**settings, "epochs": 1, "steps": int(math.ceil(total_steps))}
    eval_cfg = recipe["eval"]
    logger = cfg.get("logger", "console")
    if logger not in ("console", "wandb"):
        raise RecallmError(f"logger must be console or wandb, got {logger!r}")
    args = TrainingArguments(
        output_dir=str(stage_dir),
        num_train_epochs=float(settings["epochs"]),
        learning_rate=float(settings["lr"]),
        warmup_steps=int(
            settings["warmup_steps"]
            if settings.get("warmup_steps") is not None
            else math.ceil(float(settings.get("warmup_ratio", 0.0)) * total_steps)
        ),
        train_sampling_strategy=sampling,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": float(recipe.get("min_lr_ratio", 0.1))},
        per_device_train_batch_size=int(recipe["per_device_batch_size"]),
        per_device_eval_batch_size=int(recipe["per_device_batch_size"]),
        gradient_accumulation_steps=settings["grad_accum"],
        adam_beta1=float(recipe["adam"]["beta1"]),
        adam_beta2=float(recipe["adam"]["beta2"]),
        adam_epsilon=float(recipe["adam"]["eps"]),
        weight_decay=weight_decay,
        max_grad_norm=float(recipe.get("grad_clip", 1.0)),
        gradient_checkpointing=bool(recipe.get("gradient_checkpointing", False)),
        bf16=dtype == torch.bfloat16,
        logging_steps=int(recipe.get("logging_steps", 10)),
        save_strategy="steps",
        save_steps=int(recipe.get("save_steps", 100)),
        save_total_limit=recipe.get("save_total_limit"),
        eval_strategy="steps" if val_set is not None else "no",
        eval_steps=int(eval_cfg.get("steps", 100)),
        seed=int(recipe.get("seed", 0)),
        data_seed=int(recipe.get("seed", 0)),
        report_to=["wandb"] if logger == "wandb" else [],
        run_name=f"{cfg['sft'].get('name', 'sft')}-{stage}",
        deepspeed=str(deepspeed) if deepspeed else None,
        use_cpu=not torch.cuda.is_available(),
        remove_unused_columns=False,
        prediction_loss_only=True,
        include_num_input_tokens_seen=True,
        dataloader_num_workers=0,
        max_steps=int(cfg.get("max_steps") or settings.get("steps") or -1),
        **extra_args,
    )
    trainer = RecallTrainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=val_set,
        data_collator=SFTCollator(
            pad_token_id(tokenizer=tokenizer, config=model.config),
            position_skip=int(recipe["position_skip"]) if recipe.get("position_skip") else None,
            seed=int(recipe.get("seed", 0)),
        ),
        processing_class=tokenizer,
        recall_eval={"records": val_records, "max_new_tokens": eval_cfg.get("max_new_tokens", 64)},
        callbacks=cfg.get("_callbacks") or None,
    )
    checkpoint = None
    if resume == "auto":
        checkpoint = find_checkpoint(stage_dir)
    elif resume != "never":
        checkpoint = Path(resume)
    if checkpoint is not None:
        log.info("resuming from %s", checkpoint)
    if trainer.is_world_process_zero():
        print(
            f"SFT stage={stage}: {train_stats['examples']} examples ({train_stats['dropped_too_long']} dropped as too "
            f"long), model {model_dir}, output {stage_dir}" + (f", resuming from {checkpoint}" if checkpoint else "")
        )
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    final = stage_dir / "final"
    trainer.save_model(str(final))
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(final)
        (final / "recallm_sft.json").write_text(
            json.dumps(
                {"stage": stage, "init": str(model_dir), "steps": trainer.state.global_step, **train_stats}, indent=2
            )
        )
        print(f"wrote {final}")
    return final
