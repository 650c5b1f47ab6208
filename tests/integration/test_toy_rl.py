"""The toy_rl experiment (a measured RL gain): its plan, its RESULT line, and the "No Recall Reward"
control's reward (R_ret = 1). The experiment itself (~40 min) is not a test; its pieces are."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from recallm.errors import RecallmError
from recallm.pipeline import experiment_stages, result_line
from rewards import load_reward_config, score_response


def experiment(name: str = "toy_rl", **changes):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from recallm.paths import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="pipeline", overrides=[f"experiment={name}"])
    exp = OmegaConf.to_container(cfg.experiment, resolve=True)
    exp.update(changes)
    return exp


def test_toy_rl_stages(tmp_path):
    run = tmp_path.resolve()
    stages = experiment_stages(experiment(), tmp_path)
    assert [s.name for s in stages] == ["model", "data", "sft_embed", "sft_full", "grpo", "export", "eval", "report"]
    jobs = {j.name: j for s in stages for j in s.jobs}
    # the control shares the recall variant's SFT model: one SFT, two GRPO runs from the same start
    assert [j.name for j in stages[3].jobs] == ["sft_full/recall"]
    # the start: a short SFT on a mix of traces with and without their recall spans
    sft_argv = jobs["sft_full/recall"].argv
    assert {"sft.strip_spans=true", "sft.strip_spans_fraction=0.5", "sft.full.steps=2000"} <= set(sft_argv)
    sft_final = run / "sft" / "recall" / "full" / "final"
    for variant in ("recall", "no_recall_reward"):
        argv = jobs[f"grpo/{variant}"].argv
        assert f"actor_rollout_ref.model.path={sft_final}" in argv
        assert "trainer.logger=[console,file]" in argv
    assert "recallm.reward.recall_reward=false" in jobs["grpo/no_recall_reward"].argv
    assert not any("recall_reward" in a for a in jobs["grpo/recall"].argv)
    # the same GRPO recipe for both, apart from the reward
    common = [a for a in jobs["grpo/recall"].argv if not a.startswith("trainer.")]
    assert common == [
        a for a in jobs["grpo/no_recall_reward"].argv if not a.startswith("trainer.") and "recall_reward" not in a
    ]
    # before: the SFT model; after: the exported GRPO models; the same suite and prompts
    assert f"model_path={sft_final}" in jobs["eval/before"].argv
    assert f"model_path={run / 'models' / 'recall'}" in jobs["eval/after"].argv
    assert f"model_path={run / 'models' / 'no_recall_reward'}" in jobs["eval/after_no_recall_reward"].argv
    suite = [a for a in jobs["eval/before"].argv if a.startswith(("eval=", "eval.benchmarks."))]
    assert suite == [a for a in jobs["eval/after"].argv if a.startswith(("eval=", "eval.benchmarks."))]
    curves = next(a for a in jobs["report"].argv if a.startswith("curves="))
    assert curves == (
        f"curves={{recall:{run / 'grpo' / 'recall' / 'metrics.jsonl'},"
        f"no_recall_reward:{run / 'grpo' / 'no_recall_reward' / 'metrics.jsonl'}}}"
    )
    variants = experiment()["variants"]
    bad = dict(variants, no_recall_reward={"sft_from": "nope"})
    with pytest.raises(RecallmError, match="sft_from must name a variant with its own SFT"):
        experiment_stages(experiment(variants=bad), tmp_path)
    bad = dict(variants, no_recall_reward={"sft_from": "recall", "sft": ["sft.seed=1"]})
    with pytest.raises(RecallmError, match="sft_from and sft overrides exclude each other"):
        experiment_stages(experiment(variants=bad), tmp_path)
    ev = experiment()["eval"]
    with pytest.raises(RecallmError, match=r"runs.before.model must be final .* or sft"):
        experiment_stages(experiment(eval=dict(ev, runs={"before": {"variant": "recall", "model": "embed"}})), tmp_path)


def write_run(run, accs: dict[str, float], scores: list[float]) -> None:
    for name, acc in accs.items():
        (run / "eval" / name).mkdir(parents=True)
        summary = {"benchmarks": {"synthetic": {"by_length": {"360": {"all": {"correct": acc}}}}}}
        (run / "eval" / name / "summary.json").write_text(json.dumps(summary))
    (run / "grpo" / "recall").mkdir(parents=True)
    lines = [json.dumps({"step": s, "data": {"critic/score/mean": v}}) for s, v in enumerate(scores, 1)]
    (run / "grpo" / "recall" / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_toy_rl_result_line(tmp_path):
    exp = experiment()
    write_run(
        tmp_path, {"before": 0.25, "after": 0.5, "after_no_recall_reward": 0.375}, [0.2] * 10 + [0.5] * 10 + [0.8] * 10
    )
    line = result_line(exp, tmp_path, {"stage_seconds": {"sft": 600, "grpo": 1200}})
    assert line == (
        "RESULT acc_before=0.250 acc_after=0.500 acc_after_no_recall_reward=0.375 "
        "reward_first10=0.200 reward_last10=0.800 minutes=30.0"
    )
    (tmp_path / "grpo" / "recall" / "metrics.jsonl").write_text("")
    with pytest.raises(
        RecallmError, match=r"result reward_first10: metrics log .*metrics.jsonl holds no training step"
    ):
        result_line(exp, tmp_path, {})
    exp["result"]["metrics"]["reward_first10"] = {"grpo": "recall", "first": 10, "last": 10}
    with pytest.raises(RecallmError, match="exactly one of first"):
        result_line(exp, tmp_path, {})


def test_toy_rl_pipeline_cli_status(tmp_path):
    """The experiment composes through the CLI and lists its jobs (nothing runs)."""
    done = subprocess.run(
        [sys.executable, "-m", "recallm.cli.pipeline", "experiment=toy_rl", f"run_dir={tmp_path}", "--status"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    listed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("todo")]
    assert listed == [
        "model",
        "data",
        "sft_embed/recall",
        "sft_full/recall",
        "grpo/recall",
        "grpo/no_recall_reward",
        "export/recall",
        "export/no_recall_reward",
        "eval/before",
        "eval/after",
        "eval/after_no_recall_reward",
        "report",
    ]


def test_no_recall_reward_sets_r_ret_to_one():
    prompt = "find the value of the key\n\n12: kuri\n18: bako\n\nq = 17 ; key = q + 1"
    start = prompt.index("18: bako")
    gt = {
        "category": "reasoning_retrieval",
        "answers": ["bako"],
        "gold": [{"text": "18: bako", "start": start, "end": start + 8}],
    }
    wrong_span = "key = 18 <|start_recall|>12: kuri<|end_recall|></think>\nAnswer: bako"
    full = load_reward_config()
    ablated = load_reward_config(overrides=["recall_reward=false"])
    assert full.recall_reward and not ablated.recall_reward
    b = score_response(wrong_span, gt, prompt_text=prompt, n_tokens=12, config=full)
    a = score_response(wrong_span, gt, prompt_text=prompt, n_tokens=12, config=ablated)
    assert b.recall == 0.0 and a.recall == 1.0  # R_ret = 1 whatever the span
    assert a.recall_overlap == b.recall_overlap == 0.0  # still measured (the curves' gold overlap)
    assert a.score == pytest.approx(1.0) and b.score < 0.6
    no_span = score_response("</think>\nAnswer: kuri", gt, prompt_text=prompt, n_tokens=4, config=ablated)
    assert no_span.recall == 1.0 and no_span.answer == 0.0
