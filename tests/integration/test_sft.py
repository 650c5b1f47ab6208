"""SFT: data and collator, the embedding-stage freeze, training, resume, DeepSpeed ZeRO-2 on CPU."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recallm.errors import RecallmError
from recallm.paths import config_dir
from recallm.sft.data import IGNORE_INDEX, SFTCollator, load_sft_file
from recallm.sft.train import check_checkpoint, find_checkpoint, run_sft
from tests.deepspeed_ops import cpp_build_missing, torch_extensions_dir

TINY_MIX = {
    "seed": 0,
    "tolerance": 0.05,
    "train": {
        "lengths": [256, 384],
        "entries": [
            {
                "task": "kv_retrieval",
                "count": 48,
                "params": {"key_type": "toy", "value_type": "toy", "formats": ["lines"]},
            },
            {
                "task": "math_retrieval",
                "count": 16,
                "params": {"key_type": "toy", "value_type": "toy", "formats": ["lines"]},
            },
        ],
    },
    "sft": {"count": 72, "val_fraction": 0.12},
}


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory, tiny_dir):
    from data_gen.generate import run_schedule, schedule_from_config

    out = tmp_path_factory.mktemp("sftdata")
    run_schedule(schedule_from_config(TINY_MIX), out, tiny_dir, workers=1, progress=False)
    return out / "sft" / "train.jsonl", out / "sft" / "val.jsonl"


def _cfg(tmp_path, sft_data, tiny_dir, *overrides):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(
            "sft",
            overrides=[
                f"train_file={sft_data[0]}",
                f"val_file={sft_data[1]}",
                f"out_dir={tmp_path}/run",
                f"model.path={tiny_dir}",
                "sft.logging_steps=1",
                "sft.eval.recall_prompts=2",
                "sft.eval.max_new_tokens=8",
                *overrides,
            ],
        )
    return OmegaConf.to_container(cfg, resolve=True)


def test_collator_and_data(sft_data, tiny_dir, tmp_path):
    from recallm.tokens import load_tokenizer

    tok = load_tokenizer(tiny_dir)
    ds, stats = load_sft_file(sft_data[0], tok, max_length=4096, vocab_size=4096)
    assert stats["examples"] == len(ds) > 0 and stats["dropped_too_long"] == 0
    batch = SFTCollator(tok.pad_token_id)([ds[0], ds[1]])
    record = json.loads(Path(sft_data[0]).read_text().splitlines()[0])
    n_prompt = len(record["prompt_ids"])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    assert (batch["labels"][0, :n_prompt] == IGNORE_INDEX).all()
    assert batch["labels"][0, n_prompt : n_prompt + len(record["completion_ids"])].tolist() == record["completion_ids"]
    padded = batch["attention_mask"] == 0
    assert (batch["labels"][padded] == IGNORE_INDEX).all() and (batch["input_ids"][padded] == tok.pad_token_id).all()
    lengths = sorted(len(e["input_ids"]) for e in ds.records)
    limit = lengths[len(lengths) // 2]
    short, stats = load_sft_file(sft_data[0], tok, max_length=limit, vocab_size=4096)
    assert stats["dropped_too_long"] > 0 and all(len(e["input_ids"]) <= limit for e in short.records)
    with pytest.raises(RecallmError, match="does not exist; create it with `recallm-data`"):
        load_sft_file(tmp_path / "nope.jsonl", tok, max_length=10, vocab_size=10)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_ids": [1]}\n')
    with pytest.raises(RecallmError, match=r"bad.jsonl:1: not an SFT record"):
        load_sft_file(bad, tok, max_length=10, vocab_size=10)
    foreign = tmp_path / "foreign.jsonl"
    rec = dict(record, prompt_ids=[5] * len(record["prompt_ids"]))
    foreign.write_text(json.dumps(rec) + "\n")
    with pytest.raises(RecallmError, match="tokenised with another tokenizer"):
        load_sft_file(foreign, tok, max_length=4096, vocab_size=4096)


@pytest.mark.parametrize("tied", [True, False])
def test_freeze_keeps_everything_but_the_token_rows(tied, tiny_dir, tiny_untied_dir):
    from transformers import AutoModelForCausalLM

    from recallm.sft.freeze import changed_outside_rows, freeze_all_but_token_rows, frozen_snapshot
    from recallm.tokens import RecallTokenIds

    model = AutoModelForCausalLM.from_pretrained(tiny_dir if tied else tiny_untied_dir)
    rows = list(RecallTokenIds.from_config(model.config).as_config().values())
    before = frozen_snapshot(model)
    trainable = freeze_all_but_token_rows(model, rows)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    for _ in range(3):
        ids = torch.randint(0, 2260, (2, 24))
        ids[:, 5] = rows[0]
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    assert len(trainable) == (1 if tied else 2)
    assert changed_outside_rows(before, model, rows) == []
    emb = model.get_input_embeddings().weight.detach()
    assert not torch.equal(emb[rows], before["model.embed_tokens.weight"][rows])


def test_embed_then_full_stage(tmp_path, sft_data, tiny_dir):
    from transformers import AutoModelForCausalLM

    import recallm.modeling  # noqa: F401
    from recallm.sft.freeze import changed_outside_rows, frozen_snapshot
    from recallm.tokens import RecallTokenIds, load_tokenizer

    initial = AutoModelForCausalLM.from_pretrained(tiny_dir)
    rows = list(RecallTokenIds.from_config(initial.config).as_config().values())
    final = run_sft(_cfg(tmp_path, sft_data, tiny_dir, "stage=embed", "max_steps=4", "sft.eval.steps=4"))
    embedded = AutoModelForCausalLM.from_pretrained(final)
    assert type(embedded).__name__ == "RecallQwen2ForCausalLM"
    assert changed_outside_rows(frozen_snapshot(initial), embedded, rows) == []  # bit-identical elsewhere
    assert not torch.equal(embedded.get_input_embeddings().weight[rows], initial.get_input_embeddings().weight[rows])
    tok = load_tokenizer(final)
    assert tok.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    ).endswith("<think>\n")
    state = json.loads((final.parent / "checkpoint-4" / "trainer_state.json").read_text())
    evals = [h for h in state["log_history"] if "eval_recall_spans_checked" in h]
    assert evals and "eval_answer_accuracy" in evals[-1]
    if evals[-1]["eval_recall_spans_checked"]:  # spans generated under the constraint: all verbatim
        assert evals[-1]["eval_recall_verbatim"] == 1.0
    else:  # none: no rate at all, never a perfect score that measured nothing
        assert "eval_recall_verbatim" not in evals[-1]
    assert any("tokens_per_second" in h for h in state["log_history"])
    # stage 2 from the embed stage's output: the loss goes down on this data
    full = run_sft(
        _cfg(
            tmp_path,
            sft_data,
            tiny_dir,
            "stage=full",
            "max_steps=24",
            "sft.full.lr=3e-3",
            "sft.eval.steps=1000",
            "sft.save_steps=1000",
        )
    )
    assert json.loads((full / "recallm_sft.json").read_text())["init"] == str(final)
    history = json.loads((full.parent / "checkpoint-24" / "trainer_state.json").read_text())["log_history"]
    losses = [h["loss"] for h in history if "loss" in h]
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:4]) / 4, losses


class _Kill(Exception):
    pass


def _six_full_steps(tiny_dir, save_steps: int) -> list[str]:
    return ["stage=full", f"init_from={tiny_dir}", "max_steps=6", f"sft.save_steps={save_steps}", "sft.eval.steps=1000"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, sft_data, tiny_dir):
    """The final model of six full-stage steps never interrupted (and saved only at the end), which the resumed
    runs below must end with whatever their checkpoints: one run for the module, not one per test."""
    return run_sft(_cfg(tmp_path_factory.mktemp("uninterrupted"), sft_data, tiny_dir, *_six_full_steps(tiny_dir, 1000)))


@pytest.mark.parametrize("pose", [False, True], ids=["plain", "pose"])
def test_resume_gives_the_same_weights(tmp_path, sft_data, tiny_dir, pose, request):
    """Killed after step 4 and resumed from checkpoint-4: the weights of the run never killed. With PoSE
    (``sft.position_skip``) the skips of the batches after the resume are the uninterrupted run's too: the collator's
    batch counter, which seeds them, is saved with each checkpoint and restored (an evaluation in between
    advances it, as in the uninterrupted run)."""
    from transformers import AutoModelForCausalLM, TrainerCallback

    from recallm.sft.checkpoints import COLLATOR_STATE

    class KillAfter(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 4:
                raise _Kill

    common = _six_full_steps(tiny_dir, 2)
    if pose:
        common += ["sft.position_skip=2048", "sft.eval.steps=3"]
        whole = run_sft(_cfg(tmp_path / "a", sft_data, tiny_dir, *common))
    else:
        whole = request.getfixturevalue("uninterrupted")
    cfg = _cfg(tmp_path / "b", sft_data, tiny_dir, *common)
    with pytest.raises(_Kill):
        run_sft({**cfg, "_callbacks": [KillAfter()]})
    assert find_checkpoint(tmp_path / "b" / "run" / "full").name == "checkpoint-4"
    saved = json.loads((tmp_path / "b" / "run" / "full" / "checkpoint-4" / COLLATOR_STATE).read_text())["calls"]
    assert saved >= 4  # four training batches, and with pose the evaluation's after step 3
    resumed = run_sft(cfg)  # resume=auto
    a, b = AutoModelForCausalLM.from_pretrained(whole), AutoModelForCausalLM.from_pretrained(resumed)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_saves_stops_and_the_rerun_ends_with_the_same_weights(tmp_path, sft_data, tiny_dir, sig, uninterrupted):
    """SIGTERM / SIGUSR1 during step 3 (save_steps=4): step 3 ends, checkpoint-3 is saved, no final, Stopped; the
    rerun resumes from checkpoint-3 and ends with the weights of a run never stopped (tests/cluster: under SLURM)."""
    from transformers import AutoModelForCausalLM, TrainerCallback

    from recallm.sft.preemption import Stopped

    class SignalDuringStep3(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 2:
                os.kill(os.getpid(), sig)

    cfg = _cfg(tmp_path / "b", sft_data, tiny_dir, *_six_full_steps(tiny_dir, 4))
    before = signal.getsignal(sig)
    with pytest.raises(Stopped, match=f"stopped by {sig.name} after step 3") as stopped:
        run_sft({**cfg, "_callbacks": [SignalDuringStep3()]})
    assert signal.getsignal(sig) == before  # the handler is the run's only
    stage = tmp_path / "b" / "run" / "full"
    assert stopped.value.step == 3 and stopped.value.checkpoint == str(stage / "checkpoint-3")
    assert find_checkpoint(stage).name == "checkpoint-3" and not (stage / "final").exists()
    resumed = run_sft(cfg)  # resume=auto
    assert json.loads((stage / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6
    a, b = AutoModelForCausalLM.from_pretrained(uninterrupted), AutoModelForCausalLM.from_pretrained(resumed)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)


def test_partial_and_corrupt_checkpoints(tmp_path, sft_data, tiny_dir, caplog):
    """A partial or corrupt newer checkpoint is moved aside with a warning and the newest intact one is
    used (tests/integration/adversarial/test_checkpoints.py has every kind of damage); resume=<dir> of a damaged
    one is an error."""
    run_sft(
        _cfg(
            tmp_path,
            sft_data,
            tiny_dir,
            "stage=full",
            f"init_from={tiny_dir}",
            "max_steps=2",
            "sft.save_steps=2",
            "sft.eval.steps=1000",
        )
    )
    stage = tmp_path / "run" / "full"
    good = stage / "checkpoint-2"
    assert check_checkpoint(good) == good
    partial = shutil.copytree(good, stage / "checkpoint-3")
    (partial / "optimizer.pt").unlink()
    corrupt = shutil.copytree(good, stage / "checkpoint-5")
    (corrupt / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(RecallmError, match="checkpoint-3 is partial: no optimizer state"):
        check_checkpoint(partial)
    with pytest.raises(RecallmError, match="checkpoint-5 is corrupt: model.safetensors has 7 bytes"):
        run_sft(_cfg(tmp_path, sft_data, tiny_dir, "stage=full", f"init_from={tiny_dir}", f"resume={corrupt}"))
    with caplog.at_level("WARNING", logger="recallm.sft"):
        assert find_checkpoint(stage) == good
    assert "checkpoint-5 is corrupt" in caplog.text and "checkpoint-3 is partial" in caplog.text
    assert sorted(p.name for p in stage.glob("*checkpoint-*")) == [
        "checkpoint-2",
        "corrupt-checkpoint-3",
        "corrupt-checkpoint-5",
    ]
    (good / "trainer_state.json").write_text("{")
    with pytest.raises(RecallmError, match="trainer_state.json unreadable"):
        check_checkpoint(good)


def test_config_errors(tmp_path, sft_data, tiny_dir):
    with pytest.raises(RecallmError, match="stage must be one of embed, full"):
        run_sft(_cfg(tmp_path, sft_data, tiny_dir, "stage=middle"))
    with pytest.raises(RecallmError, match="not a multiple of sft.per_device_batch_size"):
        run_sft(_cfg(tmp_path, sft_data, tiny_dir, "sft.global_batch_size=12"))
    with pytest.raises(RecallmError, match=r"sft.full.lr must be > 0"):
        run_sft(_cfg(tmp_path, sft_data, tiny_dir, "stage=full", "sft.full.lr=0"))
    with pytest.raises(RecallmError, match="stage=full starts from .* run stage=embed first"):
        run_sft(_cfg(tmp_path, sft_data, tiny_dir, "stage=full"))


def _cli(tmp_path, *args, nproc=None, env=None, timeout=1800):  # the first run on a machine builds DeepSpeed's C++ ops
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)] if nproc else [sys.executable]
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "DS_ACCELERATOR": "cpu",
        "TORCH_EXTENSIONS_DIR": str(torch_extensions_dir()),
        **(env or {}),
    }
    return subprocess.run(
        [*launcher, "-m", "recallm.cli.sft", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=timeout,
    )


def test_cli_errors_and_wandb_offline(tmp_path, sft_data, tiny_dir):
    base = [
        f"train_file={sft_data[0]}",
        f"val_file={sft_data[1]}",
        f"out_dir={tmp_path}/run",
        f"model.path={tiny_dir}",
        "sft.eval.recall_prompts=0",
    ]
    proc = _cli(tmp_path, *base, "train_file=/nope.jsonl")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: train_file /nope.jsonl does not exist")
    proc = _cli(
        tmp_path,
        *base,
        "stage=full",
        f"init_from={tiny_dir}",
        "max_steps=2",
        "logger=wandb",
        env={"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and any(p.suffix == ".wandb" for p in runs[0].iterdir())
    # 2 steps with logging_steps=5 (tiny_cpu): the loss of the last step is still on the console
    assert "'loss'" in proc.stdout + proc.stderr, proc.stdout[-2000:]


def test_the_loss_is_logged_at_least_every_logging_seconds_and_at_the_last_step(monkeypatch):
    from transformers import TrainerControl, TrainerState

    from recallm.sft import progress

    clock = {"now": 100.0}
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock["now"])
    callback = progress.LogEverySeconds(30)
    state, control = TrainerState(max_steps=10), TrainerControl()
    callback.on_train_begin(None, state, control)

    def step(seconds: float) -> bool:
        clock["now"] += seconds
        state.global_step += 1
        control.should_log = False
        callback.on_step_end(None, state, control)
        if control.should_log:
            callback.on_log(None, state, control, logs={"loss": 1.0})
        return control.should_log

    assert [step(10), step(10), step(10), step(29), step(2), step(1)] == [False, False, True, False, True, False]
    callback.on_log(None, state, control, logs={"eval_loss": 1.0})  # an evaluation is not a loss log
    assert [step(1) for _ in range(4)] == [False, False, False, True]  # step 10 of 10: the last one
    quiet = progress.LogEverySeconds(None)
    state, control = TrainerState(max_steps=2), TrainerControl()
    clock["now"] += 1000
    quiet.on_step_end(None, state, control)
    assert not control.should_log
    state.global_step = 2
    quiet.on_step_end(None, state, control)
    assert control.should_log


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("nproc", [1, 2])
def test_deepspeed_zero2_on_cpu(tmp_path, sft_data, tiny_dir, nproc):
    """ZeRO-2 on two ranks (torchrun): the embedding stage, the optimizer's state partitioned, the frozen rows
    bit-identical; on one rank (``recallm-sft`` alone: DeepSpeed's process group of one): the full stage. (The
    embedding stage on one rank tested the freeze a second time; the full stage on two ranks is
    ``test_deepspeed_offload_resume_gives_the_same_weights``'s.)"""
    pytest.importorskip("deepspeed")
    if cpp_build_missing():
        pytest.skip(cpp_build_missing())
    from transformers import AutoModelForCausalLM

    import recallm.modeling  # noqa: F401
    from recallm.sft.freeze import changed_outside_rows, frozen_snapshot
    from recallm.tokens import RecallTokenIds

    common = [
        f"train_file={sft_data[0]}",
        f"val_file={sft_data[1]}",
        f"out_dir={tmp_path}/run",
        f"model.path={tiny_dir}",
        "deepspeed=zero2_cpu",
        "max_steps=3",
        "sft.eval.steps=1000",
        "sft.save_steps=3",
        "sft.eval.recall_prompts=0",
        "sft.logging_seconds=1",  # the processes agree on each time-based log (the loss is gathered from all)
    ]
    initial = AutoModelForCausalLM.from_pretrained(tiny_dir)
    if nproc == 2:
        embed = _cli(tmp_path, "stage=embed", *common, nproc=nproc)
        assert embed.returncode == 0, embed.stderr[-4000:]
        assert (tmp_path / "run" / "embed" / "checkpoint-3" / "global_step3").is_dir()  # DeepSpeed's own state
        after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "embed" / "final")
        rows = list(RecallTokenIds.from_config(initial.config).as_config().values())
        assert changed_outside_rows(frozen_snapshot(initial), after, rows) == []
        assert not torch.equal(after.get_input_embeddings().weight[rows], initial.get_input_embeddings().weight[rows])
        return
    full = _cli(tmp_path, "stage=full", f"init_from={tiny_dir}", *common, nproc=nproc)
    assert full.returncode == 0, full.stderr[-4000:]
    assert (tmp_path / "run" / "full" / "checkpoint-3" / "global_step3").is_dir()  # DeepSpeed's own state
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "full" / "final")
    assert not torch.equal(trained.model.layers[0].mlp.up_proj.weight, initial.model.layers[0].mlp.up_proj.weight)
    state = json.loads((tmp_path / "run" / "full" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    seen = state["log_history"][-1]["num_input_tokens_seen"]
    assert seen > 0


@pytest.mark.slow
@pytest.mark.heavy
def test_deepspeed_offload_resume_gives_the_same_weights(tmp_path, sft_data, tiny_dir):
    """zero2_cpu.json (the GPU file's structure: optimizer offloaded, DeepSpeed's CPU Adam) with 2 ranks through
    torchrun: a run whose last save and final model are gone (as a job killed after step 4 leaves it)
    resumes from checkpoint-4 to the same weights as the run that was never interrupted."""
    pytest.importorskip("deepspeed")
    if cpp_build_missing():
        pytest.skip(cpp_build_missing())
    from transformers import AutoModelForCausalLM

    import recallm.modeling  # noqa: F401

    common = [
        f"train_file={sft_data[0]}",
        f"val_file={sft_data[1]}",
        f"model.path={tiny_dir}",
        f"init_from={tiny_dir}",
        "stage=full",
        "deepspeed=zero2_cpu",
        "max_steps=6",
        "sft.save_steps=2",
        "sft.save_total_limit=3",
        "sft.eval.steps=1000",
        "sft.eval.recall_prompts=0",
        "sft.logging_seconds=1",
    ]
    whole = _cli(tmp_path, f"out_dir={tmp_path}/a", *common, nproc=2)
    assert whole.returncode == 0, whole.stderr[-4000:]
    stage = tmp_path / "a" / "full"
    assert (stage / "checkpoint-4" / "global_step4").is_dir()  # DeepSpeed's partitioned optimizer state
    assert list((stage / "checkpoint-4" / "global_step4").glob("*optim_states.pt"))
    # the state a job killed after step 4's save leaves behind
    shutil.copytree(stage, tmp_path / "b" / "full", ignore=shutil.ignore_patterns("checkpoint-6", "final"))
    resumed = _cli(tmp_path, f"out_dir={tmp_path}/b", *common, nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "checkpoint-4" in resumed.stdout + resumed.stderr
    a = AutoModelForCausalLM.from_pretrained(stage / "final")
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "b" / "full" / "final")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)
