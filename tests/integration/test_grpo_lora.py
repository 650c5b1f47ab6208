"""GRPO with verl's own LoRA (``actor_rollout_ref.model.lora_rank``) on the CPU plugin: the masked model
classes under PEFT, the recall processor in the ``hf_cpu`` rollout fed merged weights, the token rows
left frozen, and the export of the run merged or with its adapter kept separate."""

from __future__ import annotations

import json

import pytest
import torch

from tests.grpo_runs import MIX, check_spans, grpo_command, run_grpo, step_metrics

LORA_ARGS = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16")


def test_lora_sets_the_merged_weight_push_for_the_cpu_rollout():
    from omegaconf import OmegaConf

    from recallm.grpo.app import Prepared, compose, lora

    cfg = compose(["grpo=tiny_cpu", *LORA_ARGS])
    lora(cfg, Prepared())
    assert OmegaConf.select(cfg, "actor_rollout_ref.model.lora.merge") is True
    plain = compose(["grpo=tiny_cpu"])
    lora(plain, Prepared())
    assert OmegaConf.select(plain, "actor_rollout_ref.model.lora.merge") is False  # verl's default, untouched


@pytest.mark.slow
@pytest.mark.heavy
def test_lora_grpo_on_cpu_keeps_spans_verbatim_and_log_probs_agreed(tiny_dir, tmp_path, capsys):
    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.modeling import load_recallm_model
    from recallm.tokens import RecallTokenIds

    data_dir = tmp_path / "data"
    run_schedule(schedule_from_config(MIX), data_dir, tiny_dir, workers=1, progress=False)
    data, ckpt, rollouts = data_dir / "train.parquet", tmp_path / "ckpt", tmp_path / "rollouts"
    # a high learning rate: the adapter moves the model within two steps
    cmd = grpo_command(tiny_dir, data, ckpt, rollouts, *LORA_ARGS, "actor_rollout_ref.actor.optim.lr=3e-2")
    result = run_grpo(cmd, tmp_path)
    assert result.returncode == 0, result.stdout[-8000:]
    metrics = step_metrics(result.stdout)
    assert sorted(metrics) == [1, 2], result.stdout[-4000:]
    for step, m in metrics.items():
        assert m["actor/grad_norm"] > 0
        assert check_spans(rollouts, step) >= 4
        assert m["recallm/spans_verbatim"] == 1.0
        # the merged weights reached the rollout: its processed log-probs and the masked actor's agree,
        # inside spans as outside (as without LoRA, tests/integration/test_grpo_cpu.py)
        assert m["training/rollout_probs_diff_max"] < 1e-3, (step, m)
        assert m["recallm/logprob_gap_in_spans"] <= 1e-3 and m["recallm/logprob_gap_outside_spans"] <= 1e-3
    # the adapter-liveness probe (on by default with LoRA, recallm.grpo.health): after step 2's sync the rollout
    # answers its greedy probe differently, so the adapter reached it (tests/integration/test_grpo_algorithms.py
    # has the rollout that never gets it)
    assert metrics[2]["recallm/health/rollout_probe_change"] > 0 and metrics[2]["recallm/health/adapter_live"] == 0
    assert (ckpt / "global_step_2" / "actor" / "lora_train_meta.json").is_file()

    from recallm.cli.export import main as export_main

    merged_dir, kept_dir = tmp_path / "merged", tmp_path / "kept"
    assert export_main(["--checkpoint", str(ckpt), "--out", str(merged_dir)]) == 0
    assert export_main(["--checkpoint", str(ckpt), "--out", str(kept_dir), "--keep-adapter"]) == 0
    said = capsys.readouterr().out
    assert f"the adapter alone: {kept_dir / 'adapter'}" in said
    assert not (merged_dir / "lora_adapter").exists() and not (merged_dir / "adapter").exists()
    assert json.loads((kept_dir / "adapter" / "adapter_config.json").read_text())["r"] == 8
    initial, merged = load_recallm_model(tiny_dir), load_recallm_model(merged_dir)
    base, adapted = load_recallm_model(kept_dir), load_recallm_model(kept_dir / "adapter")
    assert type(merged).__name__ == type(adapted).__name__ == "RecallQwen2ForCausalLM"
    moved = []
    for name, value in merged.state_dict().items():
        torch.testing.assert_close(adapted.state_dict()[name], value, rtol=0, atol=1e-5, msg=name)
        torch.testing.assert_close(base.state_dict()[name], initial.state_dict()[name], rtol=0, atol=0, msg=name)
        if not torch.equal(value, initial.state_dict()[name]):
            moved.append(name)
    assert moved and all("proj" in n for n in moved), moved  # the adapted linear layers moved
    rows = list(RecallTokenIds.from_config(initial.config).as_config().values())
    # the token rows stay as the embedding stage left them (frozen under verl's LoRA)
    assert torch.equal(merged.get_input_embeddings().weight[rows], initial.get_input_embeddings().weight[rows])


@pytest.mark.parametrize(
    "recipe, rank, longest, cap_gb",
    [("qwen2.5_7b_lora_1gpu", 64, 21120, 80), ("qwen2.5_1.5b_lora_24gb", 32, 8704, 24)],
)
def test_single_gpu_recipes_compose_and_validate(recipe, rank, longest, cap_gb, tiny_dir, tmp_path):
    """The one-GPU LoRA recipes compose with verl's config, pass our checks, keep the vLLM rollout with the recall
    processor, and hold their memory arithmetic's premises (one GPU, the longest sequence fits the token caps and
    vLLM's context, vLLM's share of the card). verl's own validation of a LoRA config with the vLLM rollout
    needs vLLM installed (it checks vLLM's version for LoRA): the vLLM tier runs it
    (tests/vllm_tier/test_vllm_lora.py)."""
    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.grpo.app import compose, prepare, problems
    from rewards import load_reward_config

    mix = {
        "train": {
            "lengths": [256, 320],
            "entries": [{"task": "kv_retrieval", "count": 4, "params": {"key_type": "toy", "value_type": "toy"}}],
        }
    }
    run_schedule(schedule_from_config(mix), tmp_path, tiny_dir, workers=1, progress=False)
    data = tmp_path / "train.parquet"
    cfg = compose(
        [
            f"grpo={recipe}",
            f"actor_rollout_ref.model.path={tiny_dir}",
            f"data.train_files={data}",
            f"data.val_files={data}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",  # the recipes require a run directory
        ]
    )
    prepare(cfg)
    assert problems(cfg) == []
    arr = cfg.actor_rollout_ref
    assert arr.model.lora_rank == rank and arr.model.lora.merge is False  # vLLM loads the adapter itself
    assert cfg.trainer.n_gpus_per_node == 1 and cfg.trainer.nnodes == 1
    assert arr.rollout.name == "vllm" and "recallm.recall.vllm:RecallLogitsProcessorV1" in (
        arr.rollout.engine_kwargs.vllm.logits_processors
    )
    assert cfg.data.max_prompt_length + cfg.data.max_response_length == arr.rollout.max_model_len == longest
    for token_cap in (
        arr.actor.ppo_max_token_len_per_gpu,
        arr.ref.log_prob_max_token_len_per_gpu,
        arr.rollout.log_prob_max_token_len_per_gpu,
    ):
        assert token_cap >= longest
    overlong = load_reward_config(cfg.reward.reward_kwargs.recallm).overlong
    assert overlong.max_response_length == cfg.data.max_response_length
    assert arr.rollout.gpu_memory_utilization * cap_gb <= 0.6 * 80
