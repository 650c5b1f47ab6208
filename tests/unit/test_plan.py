"""recallm.plan's formulas against hand-computed cases; the checkpoint retention; W&B's mode; the
collective timeout reaching verl's process group."""

from __future__ import annotations

import os
import types

import pytest

from recallm.errors import RecallmError
from recallm.plan import (
    GB,
    PAPER_MODELS,
    Cluster,
    GiB,
    ModelShape,
    actor_update_bytes,
    checkpoint_bytes,
    mean_step_seconds,
    model_shape,
    vllm_budget,
    vllm_lora_rank,
)

# a shape small enough to compute by hand: V=100, h=8, L=2, H=2, K=1, d=4, I=16, untied, no bias
SMALL = ModelShape("small", vocab=100, hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, tied=False)


def test_parameter_counts_match_the_published_totals():
    # q 8*8 + k 8*4 + v 8*4 + o 8*8 = 192; mlp 3*8*16 = 384; norms 16 -> 592 per layer
    assert SMALL.layer_params == 592
    # embeddings 2*100*8 = 1600; 2 layers 1184; final norm 8
    assert SMALL.params == 1600 + 1184 + 8 == 2792
    # the published totals (config.json of each base); Llama's 4 recall-token rows in embed and lm_head
    assert PAPER_MODELS["qwen2.5_7b"].params == 7_615_616_512
    assert PAPER_MODELS["llama3.1_8b"].params == 8_030_261_248 + 4 * 4096 * 2


def test_kv_cache_bytes_per_token():
    assert PAPER_MODELS["qwen2.5_7b"].kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57_344
    assert PAPER_MODELS["llama3.1_8b"].kv_bytes_per_token == 131_072
    assert SMALL.kv_bytes_per_token == 2 * 2 * 1 * 4 * 2


def test_actor_update_by_hand():
    parts = actor_update_bytes(SMALL, 2, 10, checkpointing=True)
    p = 2792
    assert parts["parameters (fp32 shard)"] == 4 * p // 2
    assert parts["gradients (fp32 shard)"] == 4 * p // 2
    assert parts["AdamW state (fp32 shard)"] == 8 * p // 2
    assert parts["gathered layers (bf16)"] == 2 * 2 * 592 + 2 * 1600
    # layer inputs 2*10*8*2 = 320; one layer's set 10*(12*8 + 4*4 + 8*16)*2 = 4800
    assert parts["activations"] == 320 + 4800
    assert parts["logits"] == 3 * 2 * 10 * 100
    unsharded = actor_update_bytes(SMALL, 2, 10, defer_grad_sync=True, checkpointing=False)
    assert unsharded["gradients (fp32 unsharded)"] == 4 * p
    assert unsharded["activations"] == 2 * 4800
    # eager attention over one padded sequence adds the H*T^2 score matrix (bf16) of the recomputed layer
    eager = actor_update_bytes(SMALL, 2, 10, attn="eager", longest_sequence=10)
    assert eager["activations"] - parts["activations"] == 2 * 10 * 10 * 2


def test_vllm_budget_by_hand():
    v = vllm_budget(SMALL, 1000 * GiB, 0.5, batched_tokens=10, max_seqs=2)
    assert v["budget"] == 500 * GiB
    assert v["weights"] == 2 * 2792
    assert v["activations"] == 10 * (4 * 8 + 2 * 16) * 2 + 2 * 100 * 4
    assert v["kv cache"] == v["budget"] - v["weights"] - v["activations"] - v["cuda graphs"]
    assert vllm_budget(SMALL, 1000, 0.5, eager=True)["cuda graphs"] == 0


def test_checkpoint_bytes():
    qwen = PAPER_MODELS["qwen2.5_7b"]
    assert checkpoint_bytes(qwen, ["model", "optimizer", "extra"]) == 12 * qwen.params  # ~91 GB
    assert round(checkpoint_bytes(qwen, ["model", "optimizer", "extra"]) / GB) == 91
    assert checkpoint_bytes(qwen, ["model"]) == 4 * qwen.params
    assert checkpoint_bytes(qwen, ["model", "hf_model"], model_dtype_bytes=2) == 4 * qwen.params


def test_model_shape_reads_a_directory_or_names_a_base(tmp_path, tiny_dir):
    tiny = model_shape(str(tiny_dir))
    assert (tiny.hidden, tiny.layers, tiny.tied) == (128, 4, True)
    assert model_shape("???", "qwen2.5_7b") is PAPER_MODELS["qwen2.5_7b"]
    with pytest.raises(RecallmError, match="model path is not set"):
        model_shape(None, None)
    with pytest.raises(RecallmError, match="has no config.json"):
        model_shape(str(tmp_path), "nope")


def test_mean_step_seconds(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text(
        '{"step": 1, "data": {"timing_s/step": 100}}\n{"step": 2, "data": {"timing_s/step": 300}}\n'
        '{"step": 2, "data": {"timing_s/step": 200}}\n'  # a resumed run logs step 2 again: the last wins
    )
    assert mean_step_seconds(log) == 150
    assert mean_step_seconds(tmp_path) == 150  # a checkpoint directory holding metrics.jsonl
    log.write_text("not json\n")
    with pytest.raises(RecallmError, match="line 1 is not JSON"):
        mean_step_seconds(log)


def _grpo_cfg(**changes):
    from omegaconf import OmegaConf

    cfg = {
        "data": {"max_prompt_length": 16000, "max_response_length": 5120, "train_batch_size": 128},
        "actor_rollout_ref": {
            "nccl_timeout": 3600,
            "model": {"use_remove_padding": True, "enable_gradient_checkpointing": True, "override_config": {}},
            "actor": {
                "use_dynamic_bsz": True,
                "ppo_max_token_len_per_gpu": 24576,
                "use_kl_loss": True,
                "fsdp_config": {"param_offload": True, "optimizer_offload": True},
                "checkpoint": {"save_contents": ["model", "optimizer", "extra"]},
            },
            "rollout": {"name": "vllm", "n": 16, "gpu_memory_utilization": 0.6, "tensor_model_parallel_size": 1},
        },
        "trainer": {"total_training_steps": 150, "save_freq": 10, "esi_redundant_time": 600},
        "recallm": {"keep_checkpoints": 3},
    }
    cfg = OmegaConf.create(cfg)
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


def _cluster(**kw):
    values = dict(
        gpus_per_node=4,
        nodes=1,
        gpu_memory=int(79.2 * GiB),
        host_ram=1000 * GiB,
        disk_free=1000 * GB,
        write_bandwidth=1 * GB,
    )
    return Cluster(**{**values, **kw})


def test_grpo_plan_disk_and_save_time_lines():
    from recallm.plan import grpo_plan

    qwen = PAPER_MODELS["qwen2.5_7b"]
    plan = grpo_plan(_grpo_cfg(), _cluster(), qwen)
    lines = {line.what: line for line in plan.lines}
    one = 12 * qwen.params
    assert lines["checkpoints"].need == 4 * one  # 3 kept + 1 being written
    assert lines["checkpoints"].fits
    assert lines["deadline save"].need == pytest.approx(2 * one / GB * 1.5)  # the save and its checksum pass
    assert lines["deadline save"].have == 60 + 600
    # every save kept (no retention) on a 1 TB disk: 15 saves of 91 GB do not fit, the fix says what to set
    plan = grpo_plan(_grpo_cfg(recallm__keep_checkpoints=None), _cluster(), qwen)
    disk = next(line for line in plan.lines if line.what == "checkpoints")
    assert disk.need == 15 * one and disk.fits is False and "recallm.keep_checkpoints" in disk.fix
    # a slow disk: the deadline save does not fit, and the fix names the esi_redundant_time that would
    plan = grpo_plan(_grpo_cfg(), _cluster(write_bandwidth=0.1 * GB), qwen)
    save = next(line for line in plan.lines if line.what == "deadline save")
    assert save.fits is False and f"trainer.esi_redundant_time={int(2 * one / (0.1 * GB) * 1.5 - 60) + 1}" in save.fix
    # the rollout's KV cache: how many longest sequences fit at once
    kv = next(line for line in plan.lines if line.what == "vLLM KV cache")
    v = vllm_budget(qwen, int(79.2 * GiB), 0.6)
    assert kv.have == v["kv cache"] // qwen.kv_bytes_per_token and kv.need == 21120


def test_grpo_plan_flash_attn_missing_and_unpacked_cost():
    from recallm.plan import grpo_plan

    qwen = PAPER_MODELS["qwen2.5_7b"]
    plan = grpo_plan(_grpo_cfg(), _cluster(), qwen, flash_attn_installed=False, mean_tokens=10560)
    flash = next(line for line in plan.lines if line.what == "flash-attn for packed sequences")
    assert flash.fits is False and "use_remove_padding=false" in flash.fix
    cost = next(line for line in plan.lines if "unpacked" in line.what)
    assert cost.need == pytest.approx(2.0)
    assert "DOES NOT FIT" in plan.render() and not plan.fits
    assert grpo_plan(_grpo_cfg(), _cluster(), qwen, flash_attn_installed=True).fits


def test_lora_adapter_size_by_hand_and_as_peft_counts_it(tiny_dir):
    # SMALL: q 8x8, k 8x4, v 8x4, o 8x8, gate/up 8x16, down 16x8 -> r * (16 + 12 + 12 + 16 + 24 + 24 + 24) per layer
    assert SMALL.lora_params(2) == 2 * 2 * 128
    assert SMALL.lora_params(2, ["q_proj", "v_proj"]) == 2 * 2 * (16 + 12)
    assert SMALL.lora_params(0) == 0
    with pytest.raises(RecallmError, match="LoRA targets"):
        SMALL.lora_params(2, ["lm_head"])
    # the published size of verl's rank-64 adapter on Qwen2.5-7B (its LoRA examples): 161M
    assert PAPER_MODELS["qwen2.5_7b"].lora_params(64) == 161_480_704
    # and what PEFT builds on a real (tiny) model: the trainable parameters it reports
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in peft.parameters() if p.requires_grad)
    assert model_shape(str(tiny_dir)).lora_params(8) == trainable


def test_vllm_lora_rank_rounds_up_as_verl_does():
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(RecallmError, match="largest max_lora_rank"):
        vllm_lora_rank(1024)


def test_actor_update_and_checkpoint_under_lora_by_hand():
    p, a = SMALL.params, SMALL.lora_params(2)
    parts = actor_update_bytes(SMALL, 2, 10, checkpointing=True, lora_params=a, lora_width=2 * 7)
    # the frozen base: parameters only; the adapter: parameters, gradients and two moments, all sharded
    assert parts["base parameters (frozen, fp32 shard)"] == 4 * p // 2
    assert parts["adapter (fp32 shard)"] == parts["adapter gradients (fp32 shard)"] == 4 * a // 2
    assert parts["adapter AdamW state (fp32 shard)"] == 8 * a // 2
    plain = actor_update_bytes(SMALL, 2, 10, checkpointing=True)
    assert parts["activations"] == plain["activations"] + 10 * 14 * 2  # A's rank-wide outputs, one layer
    bf16 = actor_update_bytes(SMALL, 2, 10, lora_params=a, lora_width=14, param_bytes=2)
    assert bf16["base parameters (frozen, bf16 shard)"] == 2 * p // 2
    # a save: base and adapter in the model shards, the adapter's moments in the optimizer's
    assert checkpoint_bytes(SMALL, ["model", "optimizer", "extra"], lora_params=a) == 4 * (p + a) + 8 * a
    assert checkpoint_bytes(SMALL, ["model"], model_dtype_bytes=2, lora_params=a) == 2 * (p + a)


def test_grpo_plan_under_lora_on_one_gpu():
    from recallm.plan import grpo_plan

    qwen = PAPER_MODELS["qwen2.5_7b"]
    lora = {
        "actor_rollout_ref__model__lora_rank": 64,
        "actor_rollout_ref__model__target_modules": "all-linear",
        "actor_rollout_ref__actor__ppo_max_token_len_per_gpu": 21120,
        "data__train_batch_size": 32,
    }
    one_gpu = _cluster(gpus_per_node=1, gpu_memory=80 * GiB, host_ram=256 * GiB)
    plan = grpo_plan(_grpo_cfg(**lora), one_gpu, qwen, flash_attn_installed=True)
    lines = {line.what: line for line in plan.lines}
    assert plan.fits, plan.render()
    assert "LoRA rank 64 (161M adapter parameters)" in plan.render()
    # the reference is the actor with its adapter off: no bf16 copy in host RAM; the offloaded actor is the
    # fp32 base and the adapter's parameters, gradients and moments
    assert "reference" not in lines["host RAM"].why
    assert "actor state offloaded 30.8 GiB" in lines["host RAM"].why
    # the same without offloading: the fp32 base stays on the GPU next to vLLM's 48 GiB and does not fit
    kept = grpo_plan(_grpo_cfg(**lora, actor_rollout_ref__actor__fsdp_config__param_offload=False), one_gpu, qwen)
    awake = next(line for line in kept.lines if line.what == "vLLM awake (rollout)")
    assert awake.fits is False and awake.need > 4 * qwen.params + 48 * GiB
    # a full finetune of the same model on this GPU does not fit its update (16 bytes per parameter)
    full = grpo_plan(_grpo_cfg(**{**lora, "actor_rollout_ref__model__lora_rank": 0}), one_gpu, qwen)
    assert next(line for line in full.lines if line.what == "actor update (FSDP2)").fits is False


def test_sft_plan_under_lora():
    from recallm.plan import sft_plan

    qwen = PAPER_MODELS["qwen2.5_7b"]
    sft = {"per_device_batch_size": 1, "max_length": 16000, "gradient_checkpointing": True, "save_total_limit": 2}
    one_gpu = _cluster(gpus_per_node=1, gpu_memory=80 * GiB, host_ram=128 * GiB)
    full = sft_plan({"stage": "full", "sft": sft}, one_gpu, qwen)
    lora = sft_plan(
        {"stage": "full", "sft": {**sft, "lora": {"rank": 64, "target_modules": "all-linear"}}}, one_gpu, qwen
    )
    step_full, step_lora = (
        next(line for line in plan.lines if line.what.startswith("training step")) for plan in (full, lora)
    )
    assert step_full.fits is False and step_lora.fits  # 16 bytes a parameter vs the adapter's
    a = qwen.lora_params(64)
    assert "LoRA rank 64 (161M adapter parameters)" in lora.title
    assert step_full.need - step_lora.need == pytest.approx(1.1 * 14 * (qwen.params - a), rel=0.01)
    disk = next(line for line in lora.lines if line.what == "checkpoints")
    assert disk.need == 3 * (4 * a + 12 * a) + 2 * qwen.params  # 2 kept + 1 written (adapter + optimizer), final
    # token rows trained next to the adapter: four rows of the embeddings and of the untied lm_head
    rows = sft_plan({"stage": "full", "sft": {**sft, "lora": {"rank": 64, "token_rows": True}}}, one_gpu, qwen)
    assert next(line for line in rows.lines if line.what == "checkpoints").need - disk.need == 3 * 16 * 8 * qwen.hidden
    # the embedding stage is not LoRA whatever sft.lora says
    embed = sft_plan({"stage": "embed", "sft": {**sft, "lora": {"rank": 64}}}, one_gpu, qwen)
    assert "LoRA" not in embed.title


def test_retention_keeps_the_newest_the_latest_and_the_eval_weights(tmp_path):
    from recallm.grpo.retention import prune, saved_steps

    for step in (10, 20, 30, 40, 50, 60, 70):
        actor = tmp_path / f"global_step_{step}" / "actor"
        actor.mkdir(parents=True)
        (actor / "model_world_size_2_rank_0.pt").write_bytes(b"m")
        (actor / "optim_world_size_2_rank_0.pt").write_bytes(b"o")
        (actor / "extra_state_world_size_2_rank_0.pt").write_bytes(b"e")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("70")
    (tmp_path / "metrics.jsonl").write_text("{}")
    removed = prune(tmp_path, keep=2, eval_step=30)
    assert sorted(saved_steps(tmp_path)) == [30, 60, 70]
    eval_actor = tmp_path / "global_step_30" / "actor"
    assert sorted(p.name for p in eval_actor.iterdir()) == [
        "extra_state_world_size_2_rank_0.pt",
        "model_world_size_2_rank_0.pt",
    ]
    assert (tmp_path / "metrics.jsonl").exists() and len(removed) == 5  # 4 directories + 1 optimizer file
    # the step verl resumes from is never touched, even when older than the kept ones
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("30")
    (tmp_path / "global_step_80").mkdir()
    prune(tmp_path, keep=1)
    assert sorted(saved_steps(tmp_path)) == [30, 80]


def test_collective_timeout_reaches_the_process_group(monkeypatch):
    from recallm.grpo import worker_hooks

    seen = []

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        seen.append((timeout_second, backend))

    distributed = types.SimpleNamespace(initialize_global_process_group_ray=initialize_global_process_group_ray)
    worker_hooks._timeout_process_group(distributed)
    monkeypatch.setenv(worker_hooks.TIMEOUT_ENV, "3600")
    distributed.initialize_global_process_group_ray(timeout_second=None)
    distributed.initialize_global_process_group_ray(timeout_second=5, backend="gloo")
    assert seen == [(3600, None), (5, "gloo")]


def test_wandb_mode(tmp_path):
    from recallm.tracking import wandb_mode

    home = {"HOME": str(tmp_path)}
    assert wandb_mode(home)[0] == "offline" and "no credentials" in wandb_mode(home)[1]
    assert wandb_mode({**home, "WANDB_API_KEY": "k"}) == ("online", "W&B online (credentials in WANDB_API_KEY)")
    assert wandb_mode({**home, "WANDB_MODE": "disabled"})[0] == "disabled"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_mode(home)[0] == "online"


# ----------------------------------------------------------------------------------- the CPU platform (issue 38)
def _cpu_grpo_cfg(**changes):
    """A run of the CPU platform (configs/grpo/platform/cpu.yaml's keys): fp32, unpacked sdpa, no offload, the
    hf_cpu rollout, micro batches of 2 over 6 + 10 tokens, a batch of 4 prompts x 4 rollouts."""
    from omegaconf import OmegaConf

    cfg = {
        "recallm": {"platform": "cpu"},
        "data": {"max_prompt_length": 6, "max_response_length": 10, "train_batch_size": 4},
        "actor_rollout_ref": {
            "model": {"use_remove_padding": False, "enable_gradient_checkpointing": False,
                      "override_config": {"attn_implementation": "sdpa"}},
            "actor": {"use_dynamic_bsz": False, "ppo_micro_batch_size_per_gpu": 2, "use_kl_loss": True,
                      "fsdp_config": {}, "checkpoint": {"save_contents": ["model", "optimizer", "extra"]}},
            "rollout": {"name": "hf_cpu", "n": 4, "tensor_model_parallel_size": 1},
        },
        "trainer": {"total_training_steps": 10, "save_freq": 5},
    }  # fmt: skip
    cfg = OmegaConf.create(cfg)
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


def test_grpo_plan_on_the_cpu_platform_by_hand():
    """What the CPU platform runs, all in this machine's RAM (no GPU line, no vLLM, no SLURM deadline)."""
    from recallm.plan import CPU_PROCESS_RAM, grpo_plan

    p = SMALL.params  # 2792
    machine = _cluster(gpus_per_node=1, gpu_memory=0, host_ram=24 * GiB, write_bandwidth=0.0)
    plan = grpo_plan(_cpu_grpo_cfg(), machine, SMALL)
    assert "on the CPU platform: 1 training process(es), the hf_cpu rollout" in plan.title
    assert [line.what for line in plan.lines] == ["host RAM", "checkpoints"]  # (no bandwidth: no save time)
    host = plan.lines[0]
    assert host.section == "host RAM (this machine)" and host.have == 24 * GiB and host.fits
    # micro batch 2 x 16 tokens = 32, fp32: each layer keeps 32 x (12h + 4Kd + 8I) = 32 x 240 floats (no
    # checkpointing), the logits 5 fp32 copies of 32 x V
    update = 2 * 32 * 240 * 4 + 5 * 4 * 32 * 100
    # the rollout: 16 rollouts at once (max_batch_size 64), 16 tokens each, fp32 K and V of 2 layers x 1 head x 4
    kv = 16 * 16 * (2 * 2 * 1 * 4 * 4)
    state, reference, rollout_weights = 16 * p, 4 * p, 4 * p  # fp32 actor + AdamW; fp32 reference and rollout
    processes = 1 + 1 + 1 + 1 + 2  # the training process, the rollout server, the agent and reward workers, driver, Ray
    assert host.need == state + reference + rollout_weights + processes * CPU_PROCESS_RAM + max(update, kv)
    # a save: fp32 model shards and AdamW state, two saves kept (every save)
    assert plan.lines[1].need == 2 * 12 * p
    # a known bandwidth: the save and its checksum pass; LoRA: no reference copy
    plan = grpo_plan(_cpu_grpo_cfg(actor_rollout_ref__model__lora_rank=2), _cluster(gpus_per_node=1), SMALL)
    assert plan.lines[-1].what == "one save" and "reference" not in plan.lines[0].why
    # two training processes: the update's working set twice, the state once (sharded); vLLM's CPU build
    two = grpo_plan(_cpu_grpo_cfg(recallm__platform="vllm_cpu", actor_rollout_ref__rollout__name="vllm",
                                  actor_rollout_ref__rollout__max_num_seqs=8),
                    _cluster(gpus_per_node=2, host_ram=24 * GiB, write_bandwidth=0.0), SMALL)  # fmt: skip
    assert "2 vLLM (CPU build) engine(s) in float32, 8 of 16 rollouts at once each" in two.lines[0].why
    assert "GPU" not in two.render() and "DOES NOT FIT" not in two.render()
    # a machine too small: the line names the micro batches to lower
    small = grpo_plan(_cpu_grpo_cfg(), _cluster(gpus_per_node=1, host_ram=1 * GiB, write_bandwidth=0.0), SMALL)
    assert not small.fits and "ppo_micro_batch_size_per_gpu" in small.lines[0].fix


def test_sft_plan_on_the_cpu_by_hand():
    from recallm.plan import CPU_PROCESS_RAM, sft_plan

    p = SMALL.params
    sft = {"per_device_batch_size": 2, "max_length": 16, "gradient_checkpointing": False, "save_total_limit": 1}
    machine = _cluster(gpus_per_node=1, gpu_memory=0, host_ram=24 * GiB, write_bandwidth=0.0)
    plan = sft_plan({"stage": "full", "sft": sft}, machine, SMALL, cpu=True)
    assert "on the CPU (one process, fp32)" in plan.title and "GPU" not in plan.render()
    step, disk = plan.lines
    assert step.section == "host RAM (this machine)" and step.fits
    # fp32 model, gradients, AdamW; activations of 32 tokens in fp32 (2 layers), 5 fp32 copies of the logits
    assert step.need == 16 * p + 2 * 32 * 240 * 4 + 5 * 4 * 32 * 100 + CPU_PROCESS_RAM
    assert disk.need == 2 * 12 * p + 4 * p  # (fp32 model + AdamW) x (1 kept + 1 being written), the fp32 final model
    # the embedding stage trains the embeddings only; LoRA the adapter
    embed = sft_plan({"stage": "embed", "sft": sft}, machine, SMALL, cpu=True).lines[0]
    assert step.need - embed.need == 12 * (p - SMALL.embedding_params)
    a = SMALL.lora_params(2)
    lora = sft_plan({"stage": "full", "sft": {**sft, "lora": {"rank": 2}}}, machine, SMALL, cpu=True).lines[0]
    assert step.need - lora.need == 12 * (p - a) - 32 * 2 * 7 * 4 * 2  # (+ A's outputs, every layer, fp32)


def test_host_memory_reads_meminfo(tmp_path):
    import os

    from recallm.plan import host_memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683784 kB\nMemFree:         1000000 kB\nMemAvailable:   17000000 kB\n")
    assert host_memory(meminfo) == (24683784 * 1024, 17000000 * 1024)
    sysconf = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert host_memory(tmp_path / "missing") == (sysconf, None)  # (no /proc: the total from sysconf, no figure now)
    total, available = host_memory()  # this machine's: the kernel's MemTotal is sysconf's physical pages
    assert total == sysconf and available is not None and 0 < available <= total


def test_where_sft_runs_and_the_flags_ranges(monkeypatch):
    import argparse

    import recallm.cli.plan as cli

    def args(**kw):
        return argparse.Namespace(**{**{f: None for f in ("gpus", "gpu_mem_gib")}, **kw})

    monkeypatch.setattr(cli, "_cuda_here", lambda: False)
    assert cli._sft_on_cpu({"deepspeed": {"file": "zero2_cpu.json"}}, args(gpus=4))  # DeepSpeed's CPU file
    assert not cli._sft_on_cpu({"deepspeed": {"file": "zero2.json"}}, args())  # the GPU file: planned for GPUs
    assert cli._sft_on_cpu({"deepspeed": {"file": None}}, args())  # no GPU here, none described
    assert not cli._sft_on_cpu({"deepspeed": {"file": None}}, args(gpu_mem_gib=80.0))  # a plan for a GPU node
    monkeypatch.setattr(cli, "_cuda_here", lambda: True)
    assert not cli._sft_on_cpu({}, args())
    parser = cli._parser("recallm-plan")
    for flags, message in [
        (["--gpu-mem-gib", "inf"], "--gpu-mem-gib must be a finite number, got inf"),
        (["--write-gbps", "nan"], "--write-gbps must be a finite number, got nan"),
        (["--gpus", "0"], "--gpus must be positive, got 0"),
        (["--mean-tokens", "-5"], "--mean-tokens must be positive, got -5"),
        (["--time-limit-hours", "1e9"], "--time-limit-hours must be <= 720.0, got 1000000000.0"),
    ]:
        with pytest.raises(RecallmError) as exc:
            cli.checked_flags(parser.parse_args(["grpo", *flags]))
        assert str(exc.value) == message
    assert cli.checked_flags(parser.parse_args(["grpo", "--gpu-mem-gib", "80"])).gpu_mem_gib == 80.0


def test_a_port_taken_before_a_lone_rank_binds_it_is_replaced(monkeypatch):
    """verl's MASTER_PORT can be taken between its pick and the worker's bind: a process group of one rank
    retries on another free port; with more ranks (who would not learn the new port) the error stands."""
    from torch.distributed import DistNetworkError

    from recallm.grpo.cpu import patches

    ports = []

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        ports.append(os.environ["MASTER_PORT"])
        if len(ports) == 1:
            raise DistNetworkError("The server socket has failed to listen ... code: -98, name: EADDRINUSE")
        return backend

    distributed = types.SimpleNamespace(initialize_global_process_group_ray=initialize_global_process_group_ray)
    patches._patch_process_group(distributed)
    monkeypatch.setenv("MASTER_PORT", "36057")
    monkeypatch.setenv("WORLD_SIZE", "1")
    import verl.utils.device

    monkeypatch.setattr(verl.utils.device, "get_device_name", lambda: "cpu")
    assert distributed.initialize_global_process_group_ray() == "gloo"
    assert ports[0] == "36057" and ports[1] != "36057" and len(ports) == 2
    ports.clear()
    monkeypatch.setenv("MASTER_PORT", "36057")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistNetworkError, match="EADDRINUSE"):
        distributed.initialize_global_process_group_ray()
    assert ports == ["36057"]

    def always_taken(timeout_second=None, backend=None):
        ports.append(os.environ["MASTER_PORT"])
        raise DistNetworkError("EADDRINUSE")

    ports.clear()
    lone = types.SimpleNamespace(initialize_global_process_group_ray=always_taken)
    patches._patch_process_group(lone)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(DistNetworkError):
        lone.initialize_global_process_group_ray()
    assert len(ports) == patches.PORT_RETRIES


def test_a_plan_with_its_gpus_given_or_no_gpu_driver_does_not_load_torch(tmp_path):
    """torch is a second or two of imports: ``recallm-plan`` asks it about GPUs only where a GPU driver is loaded
    and the flags leave something to ask (the command below printed its plan in 4.2 s before, 0.7 s after)."""
    import subprocess
    import sys

    from recallm.plan import gpu_driver_loaded

    assert not gpu_driver_loaded((str(tmp_path / "none"),))
    (tmp_path / "nvidia").mkdir()
    assert gpu_driver_loaded((str(tmp_path / "none"), str(tmp_path / "nvidia")))
    code = (  # (as on a machine without a GPU driver, this one's or not: with one, flash-attn's question needs torch)
        "import sys, recallm.plan; recallm.plan.gpu_driver_loaded = lambda: False; from recallm.cli.plan import main; "
        f"code = main(['grpo', 'grpo=qwen2.5_7b', 'trainer.default_local_dir={tmp_path}/ckpt', '--gpus', '4', "
        "'--gpu-mem-gib', '79.2', '--host-ram-gib', '512', '--disk-free-gb', '1000', '--write-gbps', '1']); "
        "print('torch' in sys.modules, 'transformers' in sys.modules); sys.exit(code)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the actor's update" in proc.stdout.lower() or "fits" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "False False", proc.stdout[-500:]
