"""The algorithm and rollout groups of ``recallm-grpo`` (``algorithm=grpo|dapo|gspo``,
``rollout=sync|one_step_off``) and the training-health checks: every combination composes, prepares and
passes verl's validation, or is refused in one line before Ray starts; and (slow) real runs of verl's
trainers on the CPU — DAPO's dynamic sampling refilling from the data loader, GSPO with one-step-off-policy
rollouts in workers of their own (one run), and a rollout that never receives the weights caught by the
liveness probe and stopped by ``recallm.health.strict``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("verl")

from recallm.errors import Problems, RecallmError  # noqa: E402
from recallm.grpo.app import compose, describe, prepare, validate  # noqa: E402
from tests.grpo_runs import MIX, check_spans, file_metrics, grpo_command, run_grpo, step_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory, tiny_dir):
    from data_gen.generate import run_schedule, schedule_from_config

    out = tmp_path_factory.mktemp("grpo-algorithms-data")
    run_schedule(schedule_from_config(MIX), out, tiny_dir, workers=1, progress=False)
    return out / "train.parquet"


def _compose(tiny_dir, data, *extra):
    return compose([f"actor_rollout_ref.model.path={tiny_dir}", f"data.train_files={data}", f"data.val_files={data}", *extra])


@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "gspo"])
@pytest.mark.parametrize("rollout", ["sync", "one_step_off"])
@pytest.mark.parametrize("platform", ["cpu", "vllm_cpu"])
def test_each_combination_composes_prepares_and_validates_or_is_refused(algorithm, rollout, platform, tiny_dir, tiny_data):
    cfg = _compose(tiny_dir, tiny_data, f"algorithm={algorithm}", f"rollout={rollout}", f"grpo/platform={platform}")
    env = prepare(cfg)
    if algorithm == "dapo" and rollout == "one_step_off":
        with pytest.raises(Problems) as refused:
            validate(cfg)
        assert refused.value.problems == [
            "algorithm.filter_groups.enable=true with rollout=one_step_off: verl's one-step-off trainer generates the "
            "next batch while this one trains, so it cannot refill a batch; use rollout=sync (or algorithm=grpo)"
        ]
        return
    validate(cfg)
    actor, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.algorithm.filter_groups.enable is (algorithm == "dapo")
    assert actor.policy_loss.loss_mode == ("gspo" if algorithm == "gspo" else "vanilla")
    if algorithm == "gspo":
        assert (actor.loss_agg_mode, actor.clip_ratio_low, actor.clip_ratio_high) == ("seq-mean-token-mean", 3e-4, 4e-4)
    if algorithm == "dapo":
        assert (actor.loss_agg_mode, actor.clip_ratio_high, cfg.algorithm.filter_groups.max_num_gen_batches) == ("token-mean", 0.28, 4)
    # the recall constraint reaches both sides, whatever the rollout
    assert cfg.actor_rollout_ref.model.override_config.recall_constrained is True
    if platform == "vllm_cpu":
        assert "recallm.recall.vllm:RecallLogitsProcessorV1" in r.engine_kwargs.vllm.logits_processors
    line = describe(cfg).splitlines()[2]
    assert line.startswith("algorithm:    grpo advantages, ")
    if rollout == "one_step_off":
        assert cfg.actor_rollout_ref.hybrid_engine is False and r.free_cache_engine is False and r.calculate_log_probs
        assert r.checkpoint_engine.backend == "object_store"
        assert r.checkpoint_engine.custom_backend_module == "recallm.grpo.cpu.weight_transfer"
        assert cfg.ray_kwargs.ray_init.num_gpus == 2 and cfg.ray_kwargs.ray_init.num_cpus == 26
        assert cfg.algorithm.rollout_correction.rollout_is == "token" and cfg.algorithm.rollout_correction.bypass_mode is False
        assert "one-step-off rollouts (one update behind; importance weights token <= 2.0)" in line
        from recallm.grpo.off_policy import task_runner

        assert "OneStepTaskRunner" in repr(task_runner(cfg))
    else:
        assert cfg.actor_rollout_ref.hybrid_engine is True and cfg.ray_kwargs.ray_init.num_gpus == 1
        assert r.checkpoint_engine.backend == "naive"
    assert "recallm.grpo.worker_hooks" in env["VERL_USE_EXTERNAL_MODULES"].split(",")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["rollout=one_step_off", "actor_rollout_ref.rollout.nnodes=0"],
         "rollout=one_step_off puts the rollout on devices of its own: actor_rollout_ref.rollout.nnodes=0"),
        (["rollout=one_step_off", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
         "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl needs GPUs; on the cpu platform use object_store"),
        (["algorithm=dapo", "algorithm.adv_estimator=gae"],
         "algorithm.filter_groups.enable=true with algorithm.adv_estimator=gae: dynamic sampling drops"),
        (["algorithm=dapo", "algorithm.filter_groups.metric=acc"],
         "algorithm.filter_groups.metric=acc: the RecaLLM reward returns no such value; use reward (the score) or one "
         "of score, format, answer"),
        (["algorithm=dapo", "algorithm.filter_groups.max_num_gen_batches=1"],
         "algorithm.filter_groups.max_num_gen_batches=1 allows no refill"),
        (["algorithm=dapo", "algorithm.filter_groups.max_inflight_gen_batches=2"],
         "algorithm.filter_groups.max_inflight_gen_batches=2: verl's v1 trainer's setting"),
        (["actor_rollout_ref.actor.loss_agg_mode=seq-mean"],
         "actor_rollout_ref.actor.loss_agg_mode=seq-mean: verl aggregates with one of token-mean, token-sum"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=gspo2"],
         "actor_rollout_ref.actor.policy_loss.loss_mode=gspo2: verl has no such policy loss"),
        (["grpo/platform=vllm_cpu", "recallm.recall_constrained=false",
          "+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors=[recallm.recall.vllm:RecallLogitsProcessorV1]"],
         "has recallm.recall.vllm:RecallLogitsProcessorV1 with recallm.recall_constrained=false: the rollout would "
         "sample masked spans while the actor computes unmasked log-probs"),
    ],
)  # fmt: skip
def test_combinations_that_cannot_work_are_refused_in_one_line(extra, message, tiny_dir, tiny_data):
    cfg = _compose(tiny_dir, tiny_data, *extra)
    prepare(cfg)
    with pytest.raises(Problems) as refused:
        validate(cfg)
    assert any(p.startswith(message) or message in p for p in refused.value.problems), refused.value.problems
    assert all("\n" not in p for p in refused.value.problems)


def test_a_constraint_split_between_trainer_and_rollout_is_refused(tiny_dir, tiny_data):
    cfg = _compose(tiny_dir, tiny_data, "+actor_rollout_ref.model.override_config.recall_constrained=false")
    with pytest.raises(RecallmError, match=r"^actor_rollout_ref.model.override_config.recall_constrained=False with "
                       r"recallm.recall_constrained=true: the trainer's log-probs and the rollout would follow different"):  # fmt: skip
        prepare(cfg)
    lora = _compose(tiny_dir, tiny_data, "rollout=one_step_off", "grpo/platform=vllm_cpu",
                    "actor_rollout_ref.model.lora_rank=8")  # fmt: skip
    prepare(lora)
    with pytest.raises(Problems, match="rollout=one_step_off with a LoRA adapter sent unmerged"):
        validate(lora)


def test_health_settings_and_the_exhausted_resume_check(tiny_dir, tiny_data, tmp_path, capsys):
    from recallm.grpo.health import check_resume
    from recallm.grpo.settings import settings_of

    with pytest.raises(RecallmError, match="recallm.health.zero_variance_share must be <= 1.0, got 2"):
        settings_of(_compose(tiny_dir, tiny_data, "recallm.health.zero_variance_share=2"))
    rows = len(pd.read_parquet(tiny_data))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(rows // 4))  # one epoch of batches of 4
    args = ("data.train_batch_size=4", f"trainer.default_local_dir={ckpt}", "trainer.total_epochs=1")
    check_resume(_compose(tiny_dir, tiny_data, *args))
    assert capsys.readouterr().err.startswith(f"warning: resumed at step {rows // 4}: the data is used up")
    with pytest.raises(RecallmError, match=r"trains zero steps .* \(recallm.health.strict=true refuses it\)"):
        check_resume(_compose(tiny_dir, tiny_data, *args, "recallm.health.strict=true"))
    check_resume(_compose(tiny_dir, tiny_data, *args[:2], "trainer.total_epochs=2"))  # a second epoch to train
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(rows // 4 - 1))
    check_resume(_compose(tiny_dir, tiny_data, *args))
    assert capsys.readouterr().err == ""


# --- real runs of verl's trainers on the CPU ------------------------------------------------------
def _rows(rollouts: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (rollouts / f"{step}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_dapo_dynamic_sampling_refills_from_the_data_loader(tiny_dir, tiny_data, tmp_path):
    """``algorithm=dapo`` on the ``hf_cpu`` rollout. Filtering on a reward component that is the same for every
    response (the overlong factor, with the penalty off) drops every group, so each step refills up to the bound
    (2 generation rounds) and completes the batch with dropped groups: the counts are exact, the batch keeps its
    shape, and the refill consumed the data loader's next batch (the second step starts two batches on)."""
    ckpt, rollouts = tmp_path / "ckpt", tmp_path / "rollouts"
    cmd = grpo_command(tiny_dir, tiny_data, ckpt, rollouts, "algorithm=dapo", "algorithm.filter_groups.metric=overlong_penalty",
                       "algorithm.filter_groups.max_num_gen_batches=2", "recallm.reward.overlong.enable=false")  # fmt: skip
    result = run_grpo(cmd, tmp_path, timeout=1500)
    assert result.returncode == 0, result.stdout[-8000:]
    assert "dynamic sampling on overlong_penalty (up to 2 generation rounds a step)" in result.stdout
    metrics = step_metrics(result.stdout)
    assert sorted(metrics) == [1, 2], result.stdout[-4000:]
    truths = [rm["ground_truth"] for rm in pd.read_parquet(tiny_data)["reward_model"]]
    for step, m in metrics.items():
        assert m["dynamic_sampling/gen_batches"] == 2 and m["dynamic_sampling/generated_groups"] == 8
        assert m["dynamic_sampling/dropped_groups"] == 4 and m["dynamic_sampling/padded_groups"] == 4
        assert m["dynamic_sampling/refill_s"] > 0
        assert 0 <= m["recallm/health/zero_variance_share"] <= 1 and m["recallm/health/generated_groups"] == 8
        assert "recallm/health/warnings" in m
        rows = _rows(rollouts, step)
        assert len(rows) == 4 * 4  # data.train_batch_size x rollout.n
        # the trained groups are the step's own first batch (padding takes the first dropped groups); step 2's is the
        # data's third batch: the refill of step 1 consumed the second
        first = (step - 1) * 8
        assert {row["gts"] for row in rows} == set(truths[first : first + 4]), step
        assert check_spans(rollouts, step) >= 4 and m["recallm/spans_verbatim"] == 1.0
        assert m["recallm/logprob_gap_in_spans"] <= 1e-3


@pytest.mark.slow
def test_gspo_with_one_step_off_rollouts_in_workers_of_their_own(tiny_dir, tiny_data, tmp_path):
    """Two things in one run of verl's one-step-off trainer (each run costs a Ray cluster's start-up):

    ``algorithm=gspo``: verl's sequence-level ratio on the masked log-probs of both sides (the rollout's processed
    ones, the masked actor's: equal inside spans) trains end to end. (The random tiny model scores 0 on every
    response, so the ratio's clipping does not show here: tests/unit/test_grpo_algorithms.py checks the loss.)

    ``rollout=one_step_off``: the ``hf_cpu`` server on a logical device of its own (a standalone replica behind
    verl's ``CheckpointEngineWorker``), the weights moved by the ``object_store`` engine, importance weights from
    the masked log-probs of both sides. The updates are small (lr 1e-7) but real: the rollout's greedy probe
    changes after every sync, so each batch is generated one update behind the trainer. Inside spans the
    rollout's log-probs stay at the synchronous run's bound (1e-3, tests/integration/test_grpo_cpu.py) on every
    step: across the lag, rollout and trainer mask alike."""
    ckpt, rollouts = tmp_path / "ckpt", tmp_path / "rollouts"
    cmd = grpo_command(tiny_dir, tiny_data, ckpt, rollouts, "algorithm=gspo", "rollout=one_step_off",
                       "actor_rollout_ref.actor.optim.lr=1e-7", "recallm.health.probe=always", "trainer.logger=[console,file]",
                       steps=3)  # fmt: skip
    result = run_grpo(cmd, tmp_path, timeout=1800)
    assert result.returncode == 0, result.stdout[-8000:]
    out = result.stdout
    assert "sequence-level ratio (policy_loss.loss_mode=gspo, clip 0.0003/0.0004), loss_agg_mode=seq-mean-token-mean" in out
    assert "one-step-off rollouts (one update behind; importance weights token <= 2.0)" in out
    assert "rollout_standalone_0" in out or "CheckpointEngineWorker" in out  # the rollout's own worker
    metrics = file_metrics(ckpt)  # (a step's console line has been seen missing once under load)
    assert sorted(metrics) == [1, 2, 3], out[-4000:]
    gaps = {step: (m["recallm/logprob_gap_in_spans"], m["recallm/logprob_gap_outside_spans"]) for step, m in metrics.items()}
    print("one-step-off log-prob gaps (in spans, outside):", gaps)
    for step, m in metrics.items():
        assert gaps[step][0] <= 1e-3 and gaps[step][1] <= 1e-3, (step, gaps)
        assert m["recallm/spans_verbatim"] == 1.0 and check_spans(rollouts, step) >= 4
        assert m["actor/grad_norm"] > 0 and m["recallm/health/logprob_gap"] == 0 and math.isfinite(m["actor/pg_loss"])
        assert math.isfinite(m["rollout_corr/rollout_is_mean"]), sorted(k for k in m if k.startswith("rollout_corr"))
    for step in (2, 3):  # each sync carried an update: the rollout's weights moved (the lag is real)
        assert metrics[step]["recallm/health/rollout_probe_change"] > 0 and metrics[step]["recallm/health/adapter_live"] == 0
    assert (ckpt / "global_step_2" / "actor").is_dir()
    assert check_spans(rollouts, 3) >= 4  # the last step's dump written before the run ended


@pytest.mark.slow
def test_a_rollout_that_never_gets_the_weights_is_caught_and_strict_stops(tiny_dir, tiny_data, tmp_path, monkeypatch):
    """A test-only fault makes the ``hf_cpu`` server ignore every weight update (as an adapter that never reaches
    the engine, verl#7495): the liveness probe sees the rollout answer exactly as before after step 2's sync
    although the actor moved, warns, and ``recallm.health.strict=true`` stops the run after that step (exit 3)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "tests.frozen_rollout")
    ckpt, rollouts = tmp_path / "ckpt", tmp_path / "rollouts"
    # (the other checks would stop the random tiny model at step 1: no group's rewards differ, most responses are cut)
    quiet = ("recallm.health.zero_variance_share=1", "recallm.health.clipped_share=1", "recallm.health.logprob_gap=100")
    cmd = grpo_command(tiny_dir, tiny_data, ckpt, rollouts, "recallm.health.probe=always", "recallm.health.strict=true",
                       *quiet, steps=3)  # fmt: skip
    result = run_grpo(cmd, tmp_path, timeout=1500)
    out = result.stdout
    assert result.returncode == 3, out[-8000:]
    assert "[recallm] test fault: the hf_cpu rollout ignores weight updates" in out
    metrics = step_metrics(out)
    assert sorted(metrics) == [1, 2], out[-4000:]  # step 2 logged, step 3 never ran
    assert metrics[2]["recallm/health/rollout_probe_change"] == 0 and metrics[2]["recallm/health/adapter_live"] == 1
    assert "recallm/health/rollout_probe_change" not in metrics[1]  # (the first probe: nothing to compare with)
    assert "[recallm health] warning: step 2: the rollout engine answers the liveness probe exactly as before" in out
    assert "error: training stopped by recallm.health.strict=true after step 2: step 2: the rollout engine answers" in out
