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
  optimizer, scheduler, RNG, data position) that verifies (``recallm.sft.checkpoints``: every file
  against the manifest written when it was saved); newer partial or damaged ones are moved aside
  with a warning, never silently used; ``resume=never`` starts over; ``resume=<dir>`` picks one
  (an error if it does not verify). One run writes a stage directory at a time (its lock);
* SIGTERM or SIGUSR1 (preemption, SLURM's warning before the time limit): the current step ends, a
  checkpoint is saved, the run stops (``recallm.sft.preemption``); the next run resumes from it;
* console logs always — the loss every ``logging_steps``, at least every ``logging_seconds`` (30 s)
  and at the last step (``recallm.sft.progress``) — W&B with ``logger=wandb`` (``WANDB_MODE=offline``
  works without network);
  train/eval loss, learning rate, tokens/s; at every evaluation, constrained generation on a few
  validation prompts: recall spans per answer, fraction of spans that are verbatim (1.0 by
  construction), answer accuracy with the reward's own metric;
* recipe options (``configs/sft/*.yaml``): ``label_logits_only`` (default on: logits and the
  recall mask only where the loss is, see ``RecallMaskMixin.label_logits_only``), a stage's
  ``steps`` instead of ``epochs``, ``warmup_steps``, and the data options of
  ``recallm.sft.data``: ``strip_spans`` (the no-recall ablation), ``curriculum`` and
  ``length_group`` (batches of similar lengths), ``position_skip`` (PoSE length extension);
* ``sft.lora.rank`` > 0: stage ``full`` trains a LoRA adapter (PEFT) instead of every weight
  (``recallm.sft.lora``: the same masked loss, resume and checkpoints; ``final`` is the merged model
  with the adapter alone under ``final/adapter``); the embedding stage is unchanged;
* output: ``<out_dir>/<stage>/final``, a Hugging Face directory (model, tokenizer, chat template)
  that ``AutoModelForCausalLM`` loads after ``import recallm.modeling``, written whole or not at all
  (temporary directory, fsync, rename); ``stage=full`` verifies it before starting from it.

Errors (one line each, exit code 2 from the CLI; ``check_config`` runs before anything is
written; the settings' schema is ``recallm.sft.settings``): unknown stage, an unknown key, a value
of the wrong type or range, missing model or data file (or a parquet file
where JSONL is read), an output directory that is a file, data tokenised with another tokenizer,
batch sizes that do not divide, non-positive learning rate or epochs, a stage directory another
run is writing, no intact checkpoint to resume from, a damaged model to start from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from recallm.config import typed
from recallm.errors import RecallmError, collect, raise_problems
from recallm.io import check_in_file, check_out_dir, iter_jsonl, lock_dir
from recallm.sft.checkpoints import (
    CollatorStateCallback,
    ManifestCallback,
    agreed,
    check_checkpoint,
    final_from_checkpoint,
    find_checkpoint,
    model_dir_problem,
    restore_collator_state,
    save_final,
)
from recallm.sft.preemption import SaveOnSignal, Stopped
from recallm.sft.progress import LogEverySeconds
from recallm.sft.settings import STAGES, SFTRun

__all__ = ["RecallTrainer", "run_sft", "check_config", "find_checkpoint", "check_checkpoint", "STAGES"]

log = logging.getLogger(__name__)


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


def recall_metrics(
    model, tokenizer, records: list[dict], *, max_new_tokens: int, batch_size: int = 1
) -> dict[str, float]:
    """Greedy constrained generation on validation prompts (``recallm.generation.generate``,
    ``batch_size`` prompts at a time): spans per answer, the spans checked, their verbatim fraction
    (absent when there are none), answer accuracy (the reward's answer metric)."""
    from recallm.generation import GenRequest, generate, generated_spans
    from recallm.tokens import RecallTokenIds, eos_token_ids
    from rewards import score_response

    ids = RecallTokenIds.from_config(model.config)
    was_training = model.training
    model.eval()
    spans = verbatim = 0
    correct = 0.0
    eos = eos_token_ids(
        tokenizer=tokenizer, config=model.config, generation_config=getattr(model, "generation_config", None)
    )
    requests = [GenRequest(tuple(record["prompt_ids"]), max_new_tokens) for record in records]
    try:
        outputs = generate(model, requests, tokenizer=tokenizer, eos_token_ids=eos, batch_size=batch_size)
    finally:
        if was_training:
            model.train()
    for record, output in zip(records, outputs, strict=True):
        generated = output.token_ids
        found = generated_spans(record["prompt_ids"], generated, ids.start, ids.end)
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
    n = len(records)
    metrics = {"recall_spans": spans / n, "recall_spans_checked": spans, "answer_accuracy": correct / n}
    if spans:  # no spans, no verbatim rate (never a perfect 1.0 that measured nothing)
        metrics["recall_verbatim"] = verbatim / spans
    return metrics


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


def _batch_problems(run: SFTRun):
    recipe = run.sft
    per_device, global_batch, world = recipe.per_device_batch_size, recipe.global_batch_size, _world_size()
    if global_batch % (per_device * world):
        step = per_device * world
        lower, upper = max(step, global_batch // step * step), (global_batch // step + 1) * step
        divisors = [d for d in range(1, global_batch // world + 1) if global_batch % (d * world) == 0]
        nearest = max((d for d in divisors if d <= per_device), default=1)
        yield (
            f"sft.global_batch_size={global_batch} is not a multiple of sft.per_device_batch_size={per_device} x "
            f"{world} process(es): use sft.global_batch_size={lower if lower != upper else upper} (or {upper}), or "
            f"sft.per_device_batch_size={nearest}"
        )


def _default_data_file(run: SFTRun, key: str, path: str) -> str:
    """The hint for a missing data file: a default of another data group (the tiny mixture's, with a model
    of one's own) says what to set."""
    from recallm.paths import model_name

    data_name = (run.data or {}).get("name")
    own = run.model.get("path")
    if own and data_name and f"/data/{data_name}/" in str(path) and model_name(own) != data_name:
        return (
            f"; it is the default of data={data_name} (the {data_name} mixture), not data for model.path={own}: "
            f"set {key}=<your traces> (recallm-data ... tokenizer=<model>), or use sft=own_cpu "
            "(docs/tutorial-own-model.md)"
        )
    return ""


def _stage_steps(run: SFTRun) -> int | None:
    """The optimizer steps of the stage that runs: ``steps``, or epochs over the training file's records."""
    settings = run.sft.stage(run.stage)
    if settings.steps is not None:
        return settings.steps
    if not Path(run.train_file).is_file():  # (missing, or a FIFO that would block: the data check says which)
        return None
    try:
        with open(run.train_file, "rb") as f:
            records = sum(1 for line in f if line.strip())
    except OSError:
        return None
    return math.ceil(records / run.sft.global_batch_size) * math.ceil(settings.num_epochs or 1)


def _warmup_problems(run: SFTRun):
    settings = run.sft.stage(run.stage)
    steps = _stage_steps(run)
    if settings.warmup_steps is not None and steps is not None and settings.warmup_steps >= steps:
        fix = max(0, min(steps - 1, math.ceil(0.1 * steps)))
        yield (
            f"sft.{run.stage}.warmup_steps={settings.warmup_steps} is not below the stage's {steps} steps: the peak "
            f"learning rate sft.{run.stage}.lr would never be reached; use sft.{run.stage}.warmup_steps={fix}"
        )


def _model_config(run: SFTRun) -> dict[str, Any]:
    """The ``config.json`` of the model the stage starts from, as written ({}: unknown, or the tiny default)."""
    path = run.model.get("path") if run.stage == "embed" or run.init_from is None else run.init_from
    try:
        config = json.loads((Path(str(path)) / "config.json").read_text()) if path else {}
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _model_positions(run: SFTRun) -> int | None:
    """``max_position_embeddings`` of the model the stage starts from (None: unknown, or the tiny default)."""
    value = _model_config(run).get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def _lora_problems(run: SFTRun):
    """``sft.lora.rank`` within the model's width (``recallm.modeling.lora_rank_problem``), before the
    adapter is allocated."""
    if run.stage != "full" or not run.sft.lora.enabled:
        return
    import types

    from recallm.modeling import lora_rank_problem

    config = types.SimpleNamespace(**(_model_config(run) or run.model))  # (the tiny default: its spec)
    problem = lora_rank_problem(run.sft.lora.rank, config, "sft.lora.rank")
    if problem:
        yield problem


def resolve_max_length(run: SFTRun) -> SFTRun:
    """``sft.max_length`` null: the longest trace of ``train_file`` and ``val_file``; either way within the
    model's positions."""
    from recallm.sft.data import trace_lengths

    length = run.sft.max_length
    positions = _model_positions(run)
    if length is None:
        lengths = [n for path in (run.train_file, run.val_file) if path for n in trace_lengths(path)]
        if not lengths:
            raise RecallmError(f"sft.max_length is null and {run.train_file} has no traces to take it from: set sft.max_length=<tokens>")
        length = max(lengths)
        run = dataclasses.replace(run, sft=dataclasses.replace(run.sft, max_length=length))
    if positions is not None and length > positions and run.sft.position_skip is None:
        raise RecallmError(
            f"sft.max_length={length} is longer than the model's {positions} positions (max_position_embeddings): "
            f"use sft.max_length={positions} (longer traces are dropped), or shorter data"
        )
    return run


def check_config(cfg: Any) -> SFTRun:
    """Everything about a run's config that can be checked before anything is written — the
    settings' types and ranges, the kinds of path (output directories that are files, data files
    that are missing, empty, directories or parquet), batch sizes that divide, a warm-up shorter than
    the stage, ``sft.max_length`` (null: the data's longest trace) within the model's positions — every
    problem at once (``recallm.errors.Problems``, one line each, naming the key and a value that would
    work); returns the typed settings. ``recallm-sft`` runs it before Hydra starts."""
    run = typed(SFTRun, cfg, "")
    hint = "create it with `recallm-data` (programmatic traces) or `recallm-annotate` (annotated traces)"

    def data_file(key: str, path: str | None, optional: bool):
        def check() -> None:
            if path is None:
                return
            try:
                check_in_file(path, key, kind="jsonl", hint=hint + (f", or {key}=null for none" if optional else ""))
            except RecallmError as exc:
                raise RecallmError(str(exc) + _default_data_file(run, key, path)) from None
            if not any(line.strip() for line in open(path, "rb")):
                raise RecallmError(
                    f"{key} {path} has no traces" + (f": {key}=null trains without validation" if optional else "")
                )

        return check

    def model_dirs():
        for key, path in (("init_from", run.init_from), ("model.path", run.model.get("path"))):
            if path is not None and not Path(str(path)).is_dir():
                yield f"{key} {path} is not a model directory"

    def resume():
        if run.resume not in ("auto", "never") and not Path(run.resume).is_dir():
            yield f"resume must be auto, never or a checkpoint directory; {run.resume} is not a directory"

    found = collect(
        lambda: _batch_problems(run),
        lambda: check_out_dir(run.out_dir, "out_dir") and None,
        lambda: check_out_dir(run.models_dir, "models_dir") and None,
        data_file("train_file", run.train_file, False),
        data_file("val_file", run.val_file, True),
        model_dirs,
        resume,
        lambda: _warmup_problems(run),
        lambda: _lora_problems(run),
    )
    if not found:  # the data files are there and readable: the lengths can be read from them
        sized: list[SFTRun] = []
        found = collect(lambda: sized.append(resolve_max_length(run)))
        run = sized[0] if sized else run
    raise_problems(found)
    return run


def _init_dir(run: SFTRun, out_dir: Path) -> Path:
    """The model directory stage=full starts from, verified (every file intact)."""
    init = Path(run.init_from or out_dir / "embed" / "final")
    if not (init / "config.json").is_file():
        raise RecallmError(
            f"stage=full starts from {init}, which is not a model directory: run stage=embed first or pass "
            "init_from=<model dir>"
        )
    problem = model_dir_problem(init)
    if problem:
        raise RecallmError(
            f"stage=full starts from {init}, which is incomplete or damaged ({problem}): run stage=embed again "
            "(it resumes from its last checkpoint) or pass init_from=<model dir>"
        )
    return init


def _model_dir(run: SFTRun, out_dir: Path) -> Path:
    if run.stage == "full":
        return Path(run.init_from or out_dir / "embed" / "final")  # verified by run_sft (_init_dir)
    model = run.model  # the model group (recallm.tiny reads the tiny default's spec)
    if model.get("path"):
        return Path(model["path"])
    if model.get("name") == "tiny":
        from recallm.tiny import create_tiny_from_config

        path = Path(run.models_dir) / f"tiny-seed{model['seed']}-{'tied' if model['tied'] else 'untied'}"
        if not (path / "config.json").is_file() and int(os.environ.get("RANK", "0")) == 0:
            create_tiny_from_config(model, path)
        if _world_size() > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()
        return path
    raise RecallmError(f"model.path is required for model {model.get('name')!r}")


def _last_step_of(checkpoint: Path, trainer: Trainer) -> int | None:
    """The checkpoint's step if it is the run's last one (or past it), else None."""
    step = int(json.loads((checkpoint / "trainer_state.json").read_text()).get("global_step", 0))
    *_, max_steps = trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())
    return step if step >= max_steps else None


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
    import recallm.modeling  # noqa: F401  (the masked model classes)

    run = check_config(cfg)
    if (cfg.get("sft") or {}).get("max_length") is None and int(os.environ.get("RANK", "0")) == 0:
        print(f"sft.max_length={run.sft.max_length}: the longest trace of the data", flush=True)
    stage = run.stage
    stage_dir = Path(run.out_dir) / stage
    deepspeed = deepspeed_file(run.deepspeed)
    resume = run.resume
    if resume not in ("auto", "never"):
        check_checkpoint(Path(resume))
    if stage == "full":
        _init_dir(run, Path(run.out_dir))  # before anything is written (each process loads it next anyway)
    with contextlib.ExitStack() as stack:
        if int(os.environ.get("RANK", "0")) == 0:  # one run writes a stage directory at a time
            stack.enter_context(lock_dir(stage_dir, f"recallm-sft stage={stage}"))
        return _run_stage(run, stage_dir, deepspeed, resume)


def _run_stage(run: SFTRun, stage_dir: Path, deepspeed, resume: str) -> Path:
    """One stage, in its steps: the model and tokenizer, the data, what trains (the token rows, all weights or
    a LoRA adapter), the schedule (a curriculum's order), the Trainer, where it resumes, then the training
    and the final model (:func:`_train_and_save`)."""
    from recallm.modeling import check_recallm_model, load_causal_lm
    from recallm.sft.data import SFTCollator
    from recallm.tokens import RecallTokenIds, load_tokenizer, pad_token_id

    stage, recipe = run.stage, run.sft
    extra_args = _prepare_cpu_distributed(bool(deepspeed))
    model_dir = _model_dir(run, Path(run.out_dir))
    check_recallm_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    dtype = torch.bfloat16 if recipe.bf16 and torch.cuda.is_available() else torch.float32
    model = load_causal_lm(model_dir, dtype=dtype)
    ids = RecallTokenIds.from_pretrained(model.config, tokenizer)
    train_set, train_stats, val_set, val_records = _stage_data(run, tokenizer, model, ids)
    model, weight_decay, lora = _trainable(run, model, ids, model_dir)
    train_set, settings, epochs, total_steps, sampling = _schedule(run, train_set)
    _set_wandb_mode(run)
    args = _training_args(
        run,
        settings,
        stage_dir,
        deepspeed,
        epochs=epochs,
        total_steps=total_steps,
        sampling=sampling,
        weight_decay=weight_decay,
        dtype=dtype,
        evaluate=val_set is not None,
        extra_args=extra_args,
    )
    stop = SaveOnSignal()  # SIGTERM / SIGUSR1 (preemption, the time limit's warning): save, stop, raise Stopped
    collator = SFTCollator(
        pad_token_id(tokenizer=tokenizer, config=model.config), position_skip=recipe.position_skip or None, seed=recipe.seed
    )
    trainer = RecallTrainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=val_set,
        data_collator=collator,
        processing_class=tokenizer,
        recall_eval={"records": val_records, "max_new_tokens": recipe.eval.max_new_tokens},
        callbacks=[
            CollatorStateCallback(collator),  # before the manifest, which then covers it
            ManifestCallback(),
            LogEverySeconds(recipe.logging_seconds),
            stop,
            *(run._callbacks or []),
        ],
    )
    checkpoint = None
    if resume == "auto":
        checkpoint = agreed(lambda: find_checkpoint(stage_dir))
    elif resume != "never":
        checkpoint = Path(resume)
    if checkpoint is not None:
        log.info("resuming from %s", checkpoint)
        restore_collator_state(collator, checkpoint)
    if trainer.is_world_process_zero():
        print(
            f"SFT stage={stage}: {train_stats['examples']} examples ({train_stats['dropped_too_long']} dropped as longer "
            f"than sft.max_length={recipe.max_length}), model "
            f"{model_dir}, output {stage_dir}" + (f", resuming from {checkpoint}" if checkpoint else "")
        )
    info = {"stage": stage, "init": str(model_dir), "steps": None, **train_stats}
    if lora:
        info["lora"] = dataclasses.asdict(recipe.lora)
    final = _train_and_save(trainer, model, tokenizer, stop, checkpoint, stage_dir, info, lora=lora)
    if trainer.is_world_process_zero():
        print(f"wrote {final}")
    return final


def _stage_data(run: SFTRun, tokenizer, model, ids):
    """The training and validation sets (traces longer than ``sft.max_length`` dropped; spans stripped from a
    share of them with ``sft.strip_spans``), the training set's statistics, and the validation records whose
    prompts the recall evaluation generates from."""
    from recallm.sft.data import load_sft_file

    recipe = run.sft
    vocab = model.get_input_embeddings().weight.shape[0]
    max_length = recipe.max_length
    strip = (ids.start, ids.end) if recipe.strip_spans else None
    strip_args = dict(strip_spans=strip, strip_fraction=recipe.strip_spans_fraction, seed=recipe.seed)
    train_set, train_stats = load_sft_file(run.train_file, tokenizer, max_length=max_length, vocab_size=vocab, **strip_args)
    val_set, val_records = None, []
    if run.val_file:
        val_set, _ = load_sft_file(run.val_file, tokenizer, max_length=max_length, vocab_size=vocab, **strip_args)
        n_prompts = recipe.eval.recall_prompts
        if n_prompts:
            val_records = [record for _, record in itertools.islice(iter_jsonl(run.val_file), n_prompts)]
    return train_set, train_stats, val_set, val_records


def _trainable(run: SFTRun, model, ids, model_dir: Path):
    """What trains: the four token rows (stage ``embed``, no weight decay), every weight (``full``) or a LoRA
    adapter (``full`` with ``sft.lora.rank`` > 0); the model, the weight decay, whether it is LoRA."""
    from recallm.sft.freeze import freeze_all_but_token_rows

    recipe = run.sft
    lora = run.stage == "full" and recipe.lora.enabled
    if run.stage == "embed":
        freeze_all_but_token_rows(model, list(ids.as_config().values()))
        weight_decay = 0.0
    else:
        weight_decay = recipe.stage(run.stage).weight_decay
    if recipe.gradient_checkpointing:
        model.config.use_cache = False
    if recipe.label_logits_only:
        model.label_logits_only(True)
    if lora:
        from recallm.sft.lora import apply_lora, describe

        if int(os.environ.get("RANK", "0")) == 0:
            print(f"[recallm] {describe(recipe.lora)}", flush=True)
        model = apply_lora(
            model,
            recipe.lora,
            list(ids.as_config().values()),
            base_dir=model_dir,
            gradient_checkpointing=recipe.gradient_checkpointing,
            seed=recipe.seed,
        )
    return model, weight_decay, lora


def _schedule(run: SFTRun, train_set):
    """The stage's epochs and steps, and the order the examples are drawn in: random, or with a curriculum
    (``sft.curriculum``) every draw of the stage in order, as one epoch of that many steps. Returns the
    training set (reordered for a curriculum), the stage's settings, epochs, steps and sampling."""
    recipe = run.sft
    settings = recipe.stage(run.stage)
    global_batch = recipe.global_batch_size
    epochs, total_steps = settings.num_epochs, settings.steps
    if total_steps is None:
        total_steps = math.ceil(len(train_set) / global_batch) * epochs
    sampling = "random"
    if recipe.curriculum is not None:  # the draws, in order, for the whole stage
        from recallm.sft.data import SFTDataset, curriculum_order, group_by_length

        draws = int(math.ceil(total_steps)) * global_batch
        lengths = [len(e["input_ids"]) for e in train_set.records]
        order = curriculum_order(lengths, draws, recipe.curriculum, seed=recipe.seed)
        order = group_by_length(order, lengths, global_batch, recipe.length_group, seed=recipe.seed)
        train_set = SFTDataset([train_set.records[i] for i in order])
        sampling = "sequential"
        epochs, total_steps = 1, int(math.ceil(total_steps))
        settings = dataclasses.replace(settings, epochs=1, steps=total_steps)
    return train_set, settings, epochs, total_steps, sampling


def _set_wandb_mode(run: SFTRun) -> None:
    """With ``logger=wandb``: W&B online or offline (``recallm.tracking``), said in one line."""
    if run.logger == "wandb":
        from recallm.tracking import wandb_mode

        mode, line = wandb_mode()
        os.environ["WANDB_MODE"] = mode
        print(f"[recallm] {line}", flush=True)


def _training_args(
    run: SFTRun,
    settings,
    stage_dir: Path,
    deepspeed,
    *,
    epochs,
    total_steps,
    sampling: str,
    weight_decay: float,
    dtype,
    evaluate: bool,
    extra_args: dict[str, Any],
) -> TrainingArguments:
    """The Trainer's arguments of the stage: the recipe's optimiser, schedule, batches, saves and evaluation."""
    recipe, logger = run.sft, run.logger
    return TrainingArguments(
        output_dir=str(stage_dir),
        num_train_epochs=float(epochs),
        learning_rate=settings.lr,
        warmup_steps=int(
            settings.warmup_steps
            if settings.warmup_steps is not None
            else math.ceil(settings.warmup_ratio * total_steps)
        ),
        train_sampling_strategy=sampling,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": recipe.min_lr_ratio},
        per_device_train_batch_size=recipe.per_device_batch_size,
        per_device_eval_batch_size=recipe.per_device_batch_size,
        gradient_accumulation_steps=recipe.global_batch_size // (recipe.per_device_batch_size * _world_size()),
        adam_beta1=recipe.adam.beta1,
        adam_beta2=recipe.adam.beta2,
        adam_epsilon=recipe.adam.eps,
        weight_decay=weight_decay,
        max_grad_norm=recipe.grad_clip,
        gradient_checkpointing=recipe.gradient_checkpointing,
        bf16=dtype == torch.bfloat16,
        logging_steps=recipe.logging_steps,
        save_strategy="steps",
        save_steps=recipe.save_steps,
        save_total_limit=recipe.save_total_limit,
        eval_strategy="steps" if evaluate else "no",
        eval_steps=recipe.eval.steps,
        seed=recipe.seed,
        data_seed=recipe.seed,
        report_to=["wandb"] if logger == "wandb" else [],
        run_name=f"{recipe.name}-{run.stage}",
        deepspeed=str(deepspeed) if deepspeed else None,
        use_cpu=not torch.cuda.is_available(),
        remove_unused_columns=False,
        prediction_loss_only=True,
        include_num_input_tokens_seen=True,
        dataloader_num_workers=0,
        max_steps=int(run.max_steps or settings.steps or -1),
        **extra_args,
    )


def _train_and_save(
    trainer, model, tokenizer, stop: SaveOnSignal, checkpoint: Path | None, stage_dir: Path, info, *, lora: bool
) -> Path:
    """Train from ``checkpoint`` (None: from the start) and write ``<stage_dir>/final``; a checkpoint of a
    finished stage (a rerun after a kill while ``final`` was written) is the result without training. A stop
    request (:class:`SaveOnSignal`) before the last step raises :class:`Stopped` after its save."""
    done = _last_step_of(checkpoint, trainer) if checkpoint is not None else None
    info["steps"] = done
    if done is not None and lora:  # a rerun after a kill while `final` was written: the adapter is the result
        from recallm.sft.lora import load_adapter_weights

        load_adapter_weights(model, checkpoint)
        return save_final(trainer, tokenizer, stage_dir / "final", info, lora=True)
    if done is not None:  # the same with full weights: the checkpoint is the result
        final = final_from_checkpoint(
            checkpoint, tokenizer, stage_dir / "final", info, main=trainer.is_world_process_zero()
        )
        if final is not None:
            return final
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    step = trainer.state.global_step
    if stop.stopped and step < trainer.state.max_steps:  # saved at this step; the next run resumes there
        raise Stopped(stop.stopped, step, str(stage_dir / f"checkpoint-{step}"))
    info["steps"] = step
    return save_final(trainer, tokenizer, stage_dir / "final", info, lora=lora)
