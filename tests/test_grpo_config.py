"""GRPO launcher: every recipe composes with verl's config and passes validation; clear errors; metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from recallm.errors import RecallmError  # noqa: E402
from recallm.grpo.app import compose_config, prepare, validate  # noqa: E402

GPU_RECIPES = ["qwen2.5_7b", "llama3.1_8b"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory, tiny_dir):
    from data_gen.generate import plan_from_config, run_plan

    out = tmp_path_factory.mktemp("grpo-data")
    mix = {
        "train": {
            "lengths": [256, 320],
            "entries": [{"task": "kv_retrieval", "count": 8, "params": {"key_type": "toy", "value_type": "toy"}}],
        },
        "val": {"lengths": [320], "per_cell": 2},
    }
    run_plan(plan_from_config(mix), out, tiny_dir, workers=1, progress=False)
    return out / "train.parquet", out / "val" / "retrieval_320.parquet"


def _overrides(recipe, tiny_dir, tiny_data, *extra):
    return [
        f"grpo={recipe}",
        f"actor_rollout_ref.model.path={tiny_dir}",
        f"data.train_files={tiny_data[0]}",
        f"data.val_files={tiny_data[1]}",
        *extra,
    ]


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_recipes_compose_and_validate(recipe, tiny_dir, tiny_data):
    cfg = compose_config(_overrides(recipe, tiny_dir, tiny_data))
    env = prepare(cfg)
    validate(cfg)  # ours, then verl's validate_config
    arr = cfg.actor_rollout_ref
    assert arr.rollout.name == "vllm" and arr.rollout.n == 16 and cfg.data.train_batch_size == 128
    assert "recallm.recall.vllm:RecallLogitsProcessorV1" in arr.rollout.engine_kwargs.vllm.logits_processors
    assert json.loads(arr.rollout.engine_kwargs.vllm.hf_overrides) == {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
    }
    assert arr.model.external_lib == "recallm" and not arr.model.use_fused_kernels
    assert cfg.reward.reward_manager.name == "RecallRewardManager"
    assert cfg.reward.reward_kwargs.recallm.overlong.max_response_length == 4096
    assert cfg.data.max_response_length == 4096 + 1024
    assert arr.actor.optim.lr == 2e-6 and arr.actor.kl_loss_type == "low_var_kl"
    assert env["VERL_USE_EXTERNAL_MODULES"] == "recallm.grpo.runtime"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.RECALLM_RECALL_TOKEN_IDS == env["RECALLM_RECALL_TOKEN_IDS"]
    assert cfg.trainer.total_training_steps == (150 if "qwen" in recipe else 60)


def test_any_verl_key_can_be_overridden(tiny_dir, tiny_data):
    cfg = compose_config(
        _overrides(
            "qwen2.5_7b",
            tiny_dir,
            tiny_data,
            "trainer.total_training_steps=7",
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "algorithm.gamma=0.5",
        )
    )
    assert (cfg.trainer.total_training_steps, cfg.actor_rollout_ref.actor.optim.lr, cfg.algorithm.gamma) == (
        7,
        1e-6,
        0.5,
    )


@pytest.mark.parametrize(
    "extra, message",
    [
        (["actor_rollout_ref.model.use_fused_kernels=true"], "use_fused_kernels=true bypasses the logits"),
        (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"], "loses the searchable context"),
        (["actor_rollout_ref.rollout.name=sglang"], "has no recall logits processor"),
        (["actor_rollout_ref.rollout.n=1"], "at least 2 rollouts per prompt"),
        (["data.train_batch_size=96"], "must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size"),
        (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"], "must split into micro batches"),
        (["data.val_files=/nope.parquet"], "data file /nope.parquet does not exist"),
        (["no_such_group=1"], "bad GRPO config"),
    ],
)
def test_config_errors_before_ray(extra, message, tiny_dir, tiny_data):
    with pytest.raises(RecallmError, match=message):
        cfg = compose_config(_overrides("qwen2.5_7b", tiny_dir, tiny_data, *extra))
        prepare(cfg)
        validate(cfg)


def test_model_without_recall_tokens_and_bad_ground_truth(tmp_path, tiny_base_dir, tiny_dir, tiny_data):
    cfg = compose_config(_overrides("qwen2.5_7b", tiny_base_dir, tiny_data))
    with pytest.raises(RecallmError, match="without recall tokens"):
        prepare(cfg)
    import pyarrow.parquet as pq

    from data_gen.io import read_records, write_parquet

    records = read_records(tiny_data[0])
    gt = json.loads(records[3]["reward_model"]["ground_truth"])
    del gt["gold"]
    records[3]["reward_model"]["ground_truth"] = json.dumps(gt)
    bad = write_parquet(records, tmp_path / "bad.parquet")
    assert pq.read_table(bad).num_rows == len(records)
    cfg = compose_config(_overrides("qwen2.5_7b", tiny_dir, (bad, tiny_data[1])))
    prepare(cfg)
    with pytest.raises(RecallmError, match=r"bad.parquet: row 3: .*has no 'gold'"):
        validate(cfg)


def test_unconstrained_ablation(tiny_dir, tiny_data):
    cfg = compose_config(
        _overrides("qwen2.5_7b", tiny_dir, tiny_data, "recallm.recall=false", "actor_rollout_ref.rollout.name=sglang")
    )
    prepare(cfg)
    validate(cfg)  # no processor needed
    assert cfg.actor_rollout_ref.model.override_config.recall_constrained is False
    assert "logits_processors" not in (cfg.actor_rollout_ref.rollout.engine_kwargs.get("vllm") or {})


def test_recall_batch_metrics():
    from verl import DataProto

    from recallm.grpo.metrics import recall_batch_metrics, span_token_mask

    S, E = 90, 91
    prompts = torch.tensor([[0, 0, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5]])
    responses = torch.tensor([[9, S, 6, 7, E, 3, 2, 0], [S, 4, 5, E, S, 9, E, 1]])  # row 1: second span not verbatim
    response_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    attention = torch.cat([torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]), response_mask], dim=1)
    inside = span_token_mask(responses, S, E)
    assert inside.tolist() == [
        [False, False, True, True, True, False, False, False],
        [False, True, True, True, False, True, True, False],
    ]
    rollout = torch.zeros(2, 8)
    actor = torch.zeros(2, 8)
    actor[inside] = 0.01  # inside spans: gap 0.01; outside: 0.2
    actor[~inside] = 0.2
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "attention_mask": attention,
            "rollout_log_probs": rollout,
            "old_log_probs": actor,
        },
        non_tensors={
            "score": np.array([1.0, 0.5]),
            "recall_overlap": np.array([0.25, 0.75]),
            "uid": np.array(["a", "b"], dtype=object),
        },
    )
    m = recall_batch_metrics(batch, S, E)
    assert m["recallm/reward/score"] == pytest.approx(0.75) and m["recallm/reward/recall_overlap"] == 0.5
    assert "recallm/reward/uid" not in m
    assert m["recallm/spans_per_response"] == 1.5 and m["recallm/recall_usage"] == 1.0
    assert m["recallm/spans_verbatim"] == pytest.approx(2 / 3)
    assert m["recallm/logprob_gap_in_spans"] == pytest.approx(0.01)
    assert m["recallm/logprob_gap_outside_spans"] == pytest.approx(0.2)
    assert m["recallm/response_length"] == 7.5


def test_tiny_cpu_recipe_composes_and_validates(tiny_dir, tiny_data):
    cfg = compose_config(
        [
            f"actor_rollout_ref.model.path={tiny_dir}",
            f"data.train_files={tiny_data[0]}",
            f"data.val_files={tiny_data[1]}",
        ]
    )
    env = prepare(cfg)
    validate(cfg)
    assert cfg.recallm.cpu and cfg.actor_rollout_ref.rollout.name == "hf_cpu"
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.hf_cpu.recall is True
    assert cfg.trainer.device == "cpu" and cfg.trainer.use_v1 is False
    modules = env["VERL_USE_EXTERNAL_MODULES"].split(",")
    assert modules.index("recallm.grpo.cpu.plugin") < modules.index("recallm.grpo.runtime")
    assert env["VERL_PLATFORM"] == "cpu" and env["RECALLM_GRPO_CPU"] == "1"
    # a user's override still wins over the CPU plugin's
    cfg = compose_config(
        [f"actor_rollout_ref.model.path={tiny_dir}", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=3"]
    )
    assert cfg.data.train_batch_size == 8 and cfg.actor_rollout_ref.rollout.n == 3
