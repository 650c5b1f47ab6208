"""GRPO launcher: every recipe composes with verl's config and passes validation; clear errors; metrics.

Composing verl's config takes seconds: each recipe is composed once per module and the error cases
are variants of it (:func:`_variant`, a dotted update on a copy, as a command-line override would
set it); the cases that need Hydra's own parsing compose.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf, open_dict

pytest.importorskip("verl")

from recallm.errors import Problems, RecallmError  # noqa: E402
from recallm.grpo.app import compose, prepare, validate  # noqa: E402

GPU_RECIPES = ["qwen2.5_7b", "llama3.1_8b"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory, tiny_dir):
    from data_gen.generate import run_schedule, schedule_from_config

    out = tmp_path_factory.mktemp("grpo-data")
    mix = {
        "train": {
            "lengths": [256, 320],
            "entries": [{"task": "kv_retrieval", "count": 8, "params": {"key_type": "toy", "value_type": "toy"}}],
        },
        "val": {"lengths": [320], "per_cell": 2},
    }
    run_schedule(schedule_from_config(mix), out, tiny_dir, workers=1, progress=False)
    return out / "train.parquet", out / "val" / "retrieval_320.parquet"


def _overrides(recipe, tiny_dir, tiny_data, *extra):
    return [
        f"grpo={recipe}",
        f"actor_rollout_ref.model.path={tiny_dir}",
        f"data.train_files={tiny_data[0]}",
        f"data.val_files={tiny_data[1]}",
        f"trainer.default_local_dir={tiny_data[0].parent / 'checkpoints'}",  # the paper recipes leave it to the user
        *extra,
    ]


@pytest.fixture(scope="module")
def composed(tiny_dir, tiny_data):
    """recipe -> its composed (not yet prepared) config; copy before changing."""
    cache = {}

    def get(recipe):
        if recipe not in cache:
            cache[recipe] = compose(_overrides(recipe, tiny_dir, tiny_data))
        return cache[recipe]

    return get


def _variant(base, *items):
    """A copy of ``base`` with ``key=value`` items applied (values parsed as YAML, like Hydra's)."""
    cfg = copy.deepcopy(base)
    with open_dict(cfg):
        for item in items:
            key, value = item.lstrip("+").split("=", 1)
            OmegaConf.update(cfg, key, yaml.safe_load(value), merge=False, force_add=True)
    return cfg


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_recipes_compose_and_validate(recipe, composed):
    from recallm.grpo.app import HF_OVERRIDES_ENV

    cfg = copy.deepcopy(composed(recipe))
    env = prepare(cfg)
    validate(cfg)  # ours, then verl's validate_config
    arr = cfg.actor_rollout_ref
    assert arr.rollout.name == "vllm" and arr.rollout.n == 16 and cfg.data.train_batch_size == 128
    assert "recallm.recall.vllm:RecallLogitsProcessorV1" in arr.rollout.engine_kwargs.vllm.logits_processors
    # the architecture overrides travel to the server through the environment (merged there into
    # verl's own hf_overrides), not as an engine kwarg that would replace verl's
    assert arr.rollout.engine_kwargs.vllm.hf_overrides is None
    assert json.loads(env[HF_OVERRIDES_ENV]) == {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "recall_constrained": True,  # the recall constraint, for the processor in the server (recall_constraint)
    }
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars[HF_OVERRIDES_ENV] == env[HF_OVERRIDES_ENV]
    assert arr.model.external_lib == "recallm.modeling" and not arr.model.use_fused_kernels
    assert cfg.reward.reward_manager.name == "RecallRewardManager"
    # the overlong penalty starts 1,024 tokens before the generation cap (DAPO), at 4,096
    from rewards import load_reward_config

    assert load_reward_config(cfg.reward.reward_kwargs.recallm).overlong.onset == 4096
    assert cfg.data.max_response_length == 4096 + 1024 == cfg.reward.reward_kwargs.recallm.overlong.max_response_length
    assert arr.actor.optim.lr == 2e-6 and arr.actor.kl_loss_type == "low_var_kl"
    assert env["VERL_USE_EXTERNAL_MODULES"] == "recallm.grpo.worker_hooks"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.RECALLM_RECALL_TOKEN_IDS == env["RECALLM_RECALL_TOKEN_IDS"]
    # App. D.3: both runs are 150 steps (the cosine schedule spans 150); Llama is evaluated at step 60
    assert cfg.trainer.total_training_steps == 150
    assert cfg.recallm.get("eval_step") == (60 if "llama" in recipe else None)
    # memory on 80 GB: vLLM's context capped at the longest sequence, dynamic batching with a token cap
    # that holds one worst-case sequence, chunked entropy, flash attention over packed sequences
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    assert arr.rollout.max_model_len == longest == 21120
    assert arr.actor.use_dynamic_bsz and arr.ref.log_prob_use_dynamic_bsz and arr.rollout.log_prob_use_dynamic_bsz
    for cap in (
        arr.actor.ppo_max_token_len_per_gpu,
        arr.ref.log_prob_max_token_len_per_gpu,
        arr.rollout.log_prob_max_token_len_per_gpu,
    ):
        assert longest <= cap <= 32768
    assert arr.actor.entropy_from_logits_with_chunking and arr.actor.fsdp_config.entropy_from_logits_with_chunking
    assert arr.model.use_remove_padding and arr.model.override_config.attn_implementation == "flash_attention_2"
    assert arr.actor.strategy == arr.ref.strategy == "fsdp2"
    assert arr.rollout.logprobs_mode == "processed_logprobs"
    assert cfg.trainer.esi_redundant_time > 0  # verl saves before the job's end (see slurm/)
    for key in ("actor_rollout_ref.model.path", "data.train_files", "data.val_files", "trainer.default_local_dir"):
        assert OmegaConf.select(cfg, key).startswith("/"), key


def test_eval_step_checkpoint_is_saved_and_kept(composed):
    cfg = copy.deepcopy(composed("llama3.1_8b"))
    prepare(cfg)
    validate(cfg)
    from recallm.grpo.app import describe

    described = describe(cfg)
    assert "global_step_60" in described
    assert f"recallm-export --checkpoint {cfg.trainer.default_local_dir} --step 60 --out DIR" in described
    for extra, message in [
        (["trainer.save_freq=25"], "recallm.eval_step=60 is not saved with trainer.save_freq=25"),
        (["trainer.max_actor_ckpt_to_keep=3", "recallm.keep_checkpoints=null"], "would delete the step-60 checkpoint"),
        (["trainer.max_actor_ckpt_to_keep=10"], "with recallm.keep_checkpoints=3: choose one"),
        (["trainer.total_training_steps=50"], "must be within trainer.total_training_steps=50"),
    ]:
        cfg = _variant(composed("llama3.1_8b"), *extra)
        prepare(cfg)
        with pytest.raises(RecallmError, match=message):
            validate(cfg)
    cfg = _variant(composed("llama3.1_8b"), "trainer.max_actor_ckpt_to_keep=10", "recallm.keep_checkpoints=null")
    prepare(cfg)
    validate(cfg)  # 9 checkpoints come after step 60: 10 keeps it
    # the recipe's own retention: the newest 3 and step 60's weights, across requeues (recallm.grpo.retention)
    cfg = copy.deepcopy(composed("llama3.1_8b"))
    env = prepare(cfg)
    assert env["RECALLM_KEEP_CHECKPOINTS"] == "3" and env["RECALLM_EVAL_STEP"] == "60"
    assert env["RECALLM_COLLECTIVE_TIMEOUT"] == "3600"
    assert "the newest 3 kept" in describe(cfg)


def test_pinned_cpu_kernels_reach_every_ray_worker(composed, monkeypatch):
    # the toy demo's experiment.env pins torch's, MKL's and oneDNN's kernels; workers on any node get the pins
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    cfg = copy.deepcopy(composed("llama3.1_8b"))
    prepare(cfg)
    env_vars = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert (env_vars.ATEN_CPU_CAPABILITY, env_vars.MKL_CBWR, env_vars.ONEDNN_MAX_CPU_ISA) == ("avx2", "AVX2", "AVX2")
    assert "MKL_ENABLE_INSTRUCTIONS" not in env_vars  # only what the caller set


def test_checkpoints_outside_the_checkout_and_wandb_mode(composed, monkeypatch, tmp_path):
    from recallm.grpo.app import describe
    from recallm.paths import CONFIG_DIR

    inside = CONFIG_DIR.parent / "outputs" / "grpo"
    cfg = _variant(composed("qwen2.5_7b"), f"trainer.default_local_dir={inside}")
    prepare(cfg)
    with pytest.raises(RecallmError, match="is inside the source checkout"):
        validate(cfg)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    cfg = copy.deepcopy(composed("qwen2.5_7b"))
    env = prepare(cfg)
    assert env["WANDB_MODE"] == "offline" and "W&B offline: no credentials" in describe(cfg)
    monkeypatch.setenv("WANDB_API_KEY", "k")
    cfg = copy.deepcopy(composed("qwen2.5_7b"))
    prepare(cfg)
    assert "W&B online (credentials in WANDB_API_KEY)" in describe(cfg)


@pytest.mark.parametrize("recipe", ["qwen2.5_7b", "llama3.1_8b", "qwen2.5_7b_lora_1gpu", "qwen2.5_1.5b_lora_24gb"])
def test_a_recipes_required_run_directory_is_required(recipe, tiny_dir, tiny_data, tmp_path, capsys, monkeypatch):
    """The recipes' ``default_local_dir: ???`` merged over verl's default kept verl's (``checkpoints/...``):
    the run directory was silently not required. Now it is, in one line; set, it is kept."""
    from recallm.cli.grpo import main

    assert OmegaConf.is_missing(compose([f"grpo={recipe}"]).trainer, "default_local_dir")
    assert compose([f"grpo={recipe}", "trainer.default_local_dir=/runs/x"]).trainer.default_local_dir == "/runs/x"
    assert not OmegaConf.is_missing(compose(["grpo=tiny_cpu"]).trainer, "default_local_dir")  # set by the recipe
    monkeypatch.chdir(tmp_path)
    train, val = tiny_data
    args = [f"grpo={recipe}", f"actor_rollout_ref.model.path={tiny_dir}", f"data.train_files={train}",
            f"data.val_files={val}", "--print-config"]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert (
        "error: config value trainer.default_local_dir is required: set it on the command line "
        "(trainer.default_local_dir=...)"
    ) in capsys.readouterr().err.strip().splitlines()  # among the launch's other problems, if any


def test_export_picks_the_evaluated_step(tmp_path, capsys):
    # the Llama recipe evaluates step 60 of 150: recallm-export takes it by name, not the newest
    from recallm.cli.export import main
    from recallm.grpo.export import find_actor_dir

    run = tmp_path / "grpo-llama"
    for step in (30, 60, 90, 150):
        (run / f"global_step_{step}" / "actor" / "huggingface").mkdir(parents=True)
    (run / "latest_checkpointed_iteration.txt").write_text("150")
    assert find_actor_dir(run) == run / "global_step_150" / "actor"
    assert find_actor_dir(run, 60) == find_actor_dir(run / "global_step_60") == run / "global_step_60" / "actor"
    with pytest.raises(RecallmError, match=r"no checkpoint of step 61 under .*; saved steps: 30, 60, 90, 150"):
        find_actor_dir(run, 61)
    with pytest.raises(SystemExit) as exc:  # the CLI: one line, exit 2, nothing written
        main(["--checkpoint", str(run), "--step", "61", "--out", str(tmp_path / "hf")])
    assert exc.value.code == 2 and not (tmp_path / "hf").exists()
    assert "saved steps: 30, 60, 90, 150" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(run), "--step", "0", "--out", str(tmp_path / "hf")])
    assert "--step must be a positive step number" in capsys.readouterr().err


def test_any_verl_key_can_be_overridden(tiny_dir, tiny_data):
    cfg = compose(
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
        # Ulysses sequence parallelism: the deprecated keys and the ones the engine reads, actor and ref
        (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"], r"actor\.ulysses_sequence_parallel_size=2: "),
        (["actor_rollout_ref.ref.ulysses_sequence_parallel_size=2"], r"ref\.ulysses_sequence_parallel_size=2: "),
        (
            ["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4"],
            r"actor\.fsdp_config\.ulysses_sequence_parallel_size=4: a sequence split across ranks",
        ),
        (
            ["actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size=2"],
            r"ref\.fsdp_config\.ulysses_sequence_parallel_size=2: a sequence split across ranks",
        ),
        # packed sequences need flash attention's varlen kernels
        (
            ["actor_rollout_ref.model.override_config.attn_implementation=sdpa"],
            "use_remove_padding=true with attn_implementation=sdpa: packed sequences would attend to each other",
        ),
        (
            ["actor_rollout_ref.model.override_config.attn_implementation=eager"],
            "attn_implementation=eager: packed sequences",
        ),
        # other training backends build models that know nothing of the mask
        (["actor_rollout_ref.actor.strategy=megatron"], "actor.strategy=megatron: only fsdp / fsdp2"),
        (["actor_rollout_ref.actor.strategy=veomni"], "actor.strategy=veomni: only fsdp / fsdp2"),
        (["actor_rollout_ref.actor.strategy=torchtitan"], "actor.strategy=torchtitan"),
        (["actor_rollout_ref.actor.strategy=automodel"], "actor.strategy=automodel"),
        (["actor_rollout_ref.actor.strategy=fsdp_turbo"], "actor.strategy=fsdp_turbo"),
        (["actor_rollout_ref.ref.strategy=megatron"], "ref.strategy=megatron: only fsdp / fsdp2"),
        (["actor_rollout_ref.rollout.logprobs_mode=raw_logprobs"], "logprobs_mode=raw_logprobs: the rollout's"),
        (["actor_rollout_ref.rollout.logprobs_mode=processed_logits"], "logprobs_mode=processed_logits"),
        # lengths
        (["actor_rollout_ref.rollout.max_model_len=16000"], "max_model_len=16000 is shorter than"),
        (["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384"], r"ppo_max_token_len_per_gpu=16384 is below"),
        (
            ["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=8192"],
            r"ref\.log_prob_max_token_len_per_gpu=8192 is below the longest sequence",
        ),
        (
            ["+actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides={model_type: llama}"],
            "hf_overrides sets model_type='llama', but this RecaLLM model is served by vLLM as model_type='qwen2'",
        ),
        (
            ["+actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides='{not json'"],
            "hf_overrides is not valid JSON",
        ),
        (["actor_rollout_ref.rollout.name=sglang"], "has no recall logits processor"),
        (
            ["+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config={method: ngram, num_speculative_tokens: 4}"],
            r"engine_kwargs\.vllm\.speculative_config: vLLM 0\.24 refuses custom logits processors with speculative",
        ),
        (["actor_rollout_ref.rollout.n=1"], "at least 2 rollouts per prompt"),
        (
            ["data.train_batch_size=96"],
            r"actor_rollout_ref\.actor\.ppo_mini_batch_size=128 must divide data\.train_batch_size=96: use "
            r"actor_rollout_ref\.actor\.ppo_mini_batch_size=96",
        ),
        (
            ["actor_rollout_ref.actor.use_dynamic_bsz=false", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
            r"actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu=3: .* does not split into micro batches of 3; "
            r"use actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu=\d+",
        ),
        (
            [
                "actor_rollout_ref.actor.use_dynamic_bsz=false",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=7",
            ],
            r"actor_rollout_ref\.rollout\.log_prob_micro_batch_size_per_gpu=7: \d+ responses per device .* do not "
            r"split into micro batches of 7; use actor_rollout_ref\.rollout\.log_prob_micro_batch_size_per_gpu=\d+",
        ),
        (["data.val_files=/nope.parquet"], "data file /nope.parquet does not exist"),
        # the overlong penalty: DAPO's, ending at the generation cap and starting `buffer` tokens before it
        (
            ["recallm.reward.overlong.buffer=0"],
            r"recallm\.reward\.overlong\.buffer=0: the overlong penalty would start at the generation cap "
            r"data\.max_response_length=5120, which no response passes; use 1 to 5120",
        ),
        (["recallm.reward.overlong.buffer=6000"], "buffer=6000: longer than the generation cap"),
        (
            ["recallm.reward.overlong.max_response_length=4096"],
            r"overlong\.max_response_length=4096: in a GRPO run the overlong penalty ends at the generation cap, "
            r"data\.max_response_length=5120",
        ),
        (["recallm.reward.weights.format=0.5"], r"^recallm\.reward\.weights: reward weights must be >= 0 and sum to 1"),
        # the platform: its rollout and device stay as its config group sets them
        (["actor_rollout_ref.rollout.name=hf_cpu"], "rollout.name=hf_cpu needs the CPU plugin: use grpo/platform=cpu"),
        (
            ["recallm.platform=cpu"],
            "rollout.name=vllm on the cpu platform, whose rollout is hf_cpu: use grpo/platform=vllm_cpu",
        ),
        (["trainer.device=cpu"], "trainer.device=cpu needs the CPU plugin: use grpo/platform=cpu"),
    ],
)
def test_config_errors_before_ray(extra, message, composed):
    cfg = _variant(composed("qwen2.5_7b"), *extra)
    with pytest.raises(RecallmError, match=message):
        prepare(cfg)
        validate(cfg)


def test_every_problem_is_listed(composed):
    """The checks report every problem they find (``problems``); ``validate`` raises them all (``Problems``:
    the CLI prints one ``error:`` line each)."""
    from recallm.grpo.app import problems

    cfg = _variant(
        composed("qwen2.5_7b"), "actor_rollout_ref.model.use_fused_kernels=true", "actor_rollout_ref.rollout.n=1"
    )
    prepare(cfg)
    found = problems(cfg)
    assert len(found) == 2 and "use_fused_kernels=true" in found[0] and "at least 2 rollouts" in found[1]
    with pytest.raises(Problems, match="use_fused_kernels=true") as raised:
        validate(cfg)
    assert raised.value.problems == found
    cfg = copy.deepcopy(composed("qwen2.5_7b"))
    prepare(cfg)
    assert problems(cfg) == []


def test_bad_override_is_one_line_error(tiny_dir, tiny_data):
    with pytest.raises(RecallmError, match="^bad override: Could not override .no_such_group."):
        compose(_overrides("qwen2.5_7b", tiny_dir, tiny_data, "no_such_group=1"))


def test_packed_sequences_without_flash_attention_pass_unpacked(composed):
    cfg = _variant(
        composed("qwen2.5_7b"),
        "actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.actor.strategy=fsdp",
    )
    prepare(cfg)
    validate(cfg)  # sdpa is fine on padded batches; FSDP1 builds the HF model too
    cfg = copy.deepcopy(composed("qwen2.5_7b"))
    with open_dict(cfg):
        del cfg.actor_rollout_ref.model.override_config["attn_implementation"]
    prepare(cfg)
    validate(cfg)  # unset: verl's default, flash_attention_2


def test_user_hf_overrides_are_merged_not_replaced(tiny_dir, tiny_data):
    from recallm.grpo.app import HF_OVERRIDES_ENV

    # Hydra's own parsing: a dict, and a quoted JSON string
    for value in ("{max_position_embeddings: 65536}", "'{\"max_position_embeddings\": 65536}'"):
        cfg = compose(
            _overrides(
                "qwen2.5_7b", tiny_dir, tiny_data, f"+actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides={value}"
            )
        )
        env = prepare(cfg)
        validate(cfg)
        assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides is None
        assert json.loads(env[HF_OVERRIDES_ENV]) == {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "max_position_embeddings": 65536,
            "recall_constrained": True,
        }


def test_vllm_server_hf_overrides_merge_into_verls():
    """The patch the runtime installs in every verl process: verl's own dict (FP8 here) survives."""
    from recallm.grpo.vllm_rollout import install, merge_hf_overrides, patch_server_class

    class FakeServer:  # verl's vLLMHttpServer._apply_quantization returns (quantization, hf_overrides)
        def _apply_quantization(self):
            return "fp8", {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}

    ours = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "quantization_config": {"fmt": "e5m2"}}
    patch_server_class(FakeServer, ours)
    patch_server_class(FakeServer, ours)  # idempotent: wrapped once
    quantization, merged = FakeServer()._apply_quantization()
    assert quantization == "fp8"
    assert merged == {
        "quantization_config": {"quant_method": "fp8", "fmt": "e5m2"},
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
    }
    assert not hasattr(FakeServer._apply_quantization.__wrapped__, "__wrapped__")
    assert merge_hf_overrides(None, {"a": 1}) == {"a": 1}
    assert install({}) is False  # nothing to merge: no patch


def test_paths_become_absolute_and_environment_is_forwarded(composed, tiny_dir, tiny_data, monkeypatch, tmp_path):
    import os

    monkeypatch.chdir(tmp_path)
    os.symlink(tiny_dir, tmp_path / "model")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP", "1900000000")
    monkeypatch.setenv("SOME_SECRET", "x")
    cfg = _variant(
        composed("qwen2.5_7b"),
        "actor_rollout_ref.model.path=model",
        f"data.val_files=[{tiny_data[1]}]",
        "trainer.default_local_dir=runs/x",
        "trainer.rollout_data_dir=runs/x/rollouts",
    )
    prepare(cfg)
    validate(cfg)
    assert cfg.actor_rollout_ref.model.path == str(tmp_path / "model")
    assert cfg.trainer.default_local_dir == str(tmp_path / "runs/x")
    assert cfg.trainer.rollout_data_dir == str(tmp_path / "runs/x/rollouts")
    assert list(cfg.data.val_files) == [str(tiny_data[1])]
    env_vars = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars.WANDB_MODE == "offline" and env_vars.NCCL_SOCKET_IFNAME == "ib0"
    assert env_vars.MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP == "1900000000"
    assert "SOME_SECRET" not in env_vars


def test_model_without_recall_tokens_and_bad_ground_truth(composed, tmp_path, tiny_base_dir, tiny_data):
    cfg = _variant(composed("qwen2.5_7b"), f"actor_rollout_ref.model.path={tiny_base_dir}")
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
    cfg = _variant(composed("qwen2.5_7b"), f"data.train_files={bad}")
    prepare(cfg)
    with pytest.raises(RecallmError, match=r"bad.parquet: row 3: .*has no 'gold'"):
        validate(cfg)


def test_unconstrained_ablation(composed):
    from recallm.grpo.app import HF_OVERRIDES_ENV

    cfg = _variant(composed("qwen2.5_7b"), "recallm.recall_constrained=false", "actor_rollout_ref.rollout.name=sglang")
    env = prepare(cfg)
    validate(cfg)  # no processor needed
    assert cfg.actor_rollout_ref.model.override_config.recall_constrained is False
    assert "logits_processors" not in (cfg.actor_rollout_ref.rollout.engine_kwargs.get("vllm") or {})
    assert HF_OVERRIDES_ENV not in env
    # on vLLM the ablation still needs the base architecture (vLLM refuses Recall*ForCausalLM)
    cfg = _variant(composed("qwen2.5_7b"), "recallm.recall_constrained=false")
    env = prepare(cfg)
    validate(cfg)
    assert "logits_processors" not in cfg.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert json.loads(env[HF_OVERRIDES_ENV])["architectures"] == ["Qwen2ForCausalLM"]
    assert json.loads(env[HF_OVERRIDES_ENV])["recall_constrained"] is False  # what the server's processor reads


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
    assert m["recallm/response_length"] == 7.5 and m["recallm/spans_checked"] == 3
    # no span at all: the span metrics are not logged (never a perfect 1.0 verbatim share or a 0.000 gap)
    plain = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": torch.where((responses == S) | (responses == E), torch.full_like(responses, 5), responses),
            "response_mask": response_mask,
            "attention_mask": attention,
            "rollout_log_probs": rollout,
            "old_log_probs": actor,
        },
        non_tensors={"score": np.array([1.0, 0.5])},
    )
    m = recall_batch_metrics(plain, S, E)
    assert m["recallm/spans_checked"] == 0 and m["recallm/spans_per_response"] == 0
    assert "recallm/spans_verbatim" not in m and "recallm/logprob_gap_in_spans" not in m
    assert m["recallm/logprob_gap_outside_spans"] > 0


def test_tiny_cpu_recipe_composes_and_validates(tiny_dir, tiny_data):
    cfg = compose(
        [
            f"actor_rollout_ref.model.path={tiny_dir}",
            f"data.train_files={tiny_data[0]}",
            f"data.val_files={tiny_data[1]}",
        ]
    )
    env = prepare(cfg)
    validate(cfg)
    assert cfg.recallm.platform == "cpu" and cfg.actor_rollout_ref.rollout.name == "hf_cpu"
    # the hf_cpu rollout loads the model with override_config: it follows recallm.recall_constrained
    assert cfg.actor_rollout_ref.model.override_config.recall_constrained is True
    assert "recall" not in (cfg.actor_rollout_ref.rollout.engine_kwargs.get("hf_cpu") or {})
    assert cfg.trainer.device == "cpu" and cfg.trainer.use_v1 is False
    modules = env["VERL_USE_EXTERNAL_MODULES"].split(",")
    assert modules.index("recallm.grpo.cpu.plugin") < modules.index("recallm.grpo.worker_hooks")
    assert env["VERL_PLATFORM"] == "cpu" and env["RECALLM_GRPO_CPU"] == "1"
    # a user's override still wins over the CPU plugin's
    cfg = compose(
        [f"actor_rollout_ref.model.path={tiny_dir}", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=3"]
    )
    assert cfg.data.train_batch_size == 8 and cfg.actor_rollout_ref.rollout.n == 3
    # a platform is a config group: any recipe takes another one from the command line
    cfg = compose(["grpo=qwen2.5_7b", "grpo/platform=cpu", f"actor_rollout_ref.model.path={tiny_dir}"])
    assert (cfg.recallm.platform, cfg.trainer.device, cfg.actor_rollout_ref.rollout.name) == ("cpu", "cpu", "hf_cpu")
    assert cfg.ray_kwargs.ray_init.num_gpus == cfg.trainer.n_gpus_per_node == 1


def test_joining_a_running_ray_cluster_drops_the_node_resources(tiny_dir, tiny_data, monkeypatch):
    """The sbatch scripts start Ray and set RAY_ADDRESS: ray.init refuses num_cpus/num_gpus when it joins (seen
    under a real SLURM, tests/cluster), so the CPU platform's logical resources are left to the nodes."""
    overrides = [f"actor_rollout_ref.model.path={tiny_dir}", f"data.train_files={tiny_data[0]}", f"data.val_files={tiny_data[1]}"]
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = compose(overrides)
    prepare(cfg)
    assert cfg.ray_kwargs.ray_init.num_gpus == 1 and cfg.ray_kwargs.ray_init.num_cpus == 16  # a Ray of its own
    monkeypatch.setenv("RAY_ADDRESS", "192.0.2.5:10000")
    cfg = compose(overrides)
    prepare(cfg)
    validate(cfg)
    assert cfg.ray_kwargs.ray_init.num_gpus is None and cfg.ray_kwargs.ray_init.num_cpus is None
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM == "cpu"  # the workers still get the plugin


@pytest.mark.parametrize("platform", ["cpu", "vllm_cpu"])
def test_the_command_composes_once(platform, tiny_dir, tiny_data, monkeypatch, capsys):
    """``recallm-grpo --print-config``: Hydra composes the config one time (checked, prepared, printed), the
    CPU platforms included (they are a config group, not a second composition with their overrides)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from recallm.cli.grpo import main

    calls = []
    original = ConfigLoaderImpl.load_configuration

    def counted(self, *args, **kwargs):
        calls.append(kwargs.get("config_name", args[0] if args else None))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counted)
    main([f"grpo/platform={platform}", f"actor_rollout_ref.model.path={tiny_dir}",
          f"data.train_files={tiny_data[0]}", f"data.val_files={tiny_data[1]}", "--print-config"])  # fmt: skip
    assert calls == ["grpo"]
    assert f"platform: {platform}" in capsys.readouterr().out


def test_vllm_rollout_on_cpu_composes(tiny_dir, tiny_data):
    """grpo/platform=vllm_cpu: verl's own vLLM rollout on vLLM's CPU build (the vLLM tier runs it)."""
    from recallm.grpo.app import HF_OVERRIDES_ENV, VLLM_PROCESSOR

    cfg = compose(
        [
            f"actor_rollout_ref.model.path={tiny_dir}",
            f"data.train_files={tiny_data[0]}",
            f"data.val_files={tiny_data[1]}",
            "grpo/platform=vllm_cpu",
            "actor_rollout_ref.rollout.dtype=bfloat16",  # the user's override still wins
        ]
    )
    env = prepare(cfg)
    validate(cfg)
    r = cfg.actor_rollout_ref.rollout
    assert r.name == "vllm" and r.free_cache_engine is False and r.enable_sleep_mode is False
    assert r.enforce_eager is True and r.dtype == "bfloat16" and r.load_format == "dummy"
    assert cfg.trainer.device == "cpu" and VLLM_PROCESSOR in r.engine_kwargs.vllm.logits_processors
    assert env["RECALLM_VLLM_CPU"] == "1" and HF_OVERRIDES_ENV in env
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.RECALLM_VLLM_CPU == "1"


def test_vllm_cpu_weight_patch_keeps_live_weights():
    """vLLM's CPU backend drops a linear layer's weight after packing it; the patch keeps it live."""
    import types

    from recallm.grpo.vllm_cpu import _patch_gemm

    calls = []

    def original(layer, remove_weight):  # what vLLM 0.24 does: a packed copy, the parameter removed
        calls.append(remove_weight)
        packed = layer.weight.detach().clone()
        layer.cpu_linear = lambda x, w, b: torch.nn.functional.linear(x, packed, b)
        if remove_weight:
            layer.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)

    utils = types.SimpleNamespace(dispatch_cpu_unquantized_gemm=original)
    _patch_gemm(utils)
    _patch_gemm(utils)  # once only
    layer = torch.nn.Linear(4, 3)
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.weight.shape == (3, 4) and not calls
    x = torch.randn(2, 4)
    with torch.no_grad():
        layer.weight.copy_(torch.ones(3, 4))  # a weight update from the actor
    assert torch.allclose(layer.cpu_linear(x, layer.weight, layer.bias), x.sum(1, keepdim=True) + layer.bias)
    conv = types.SimpleNamespace(weight=torch.zeros(2, 1, 3))  # not a linear layer: vLLM's own handling
    utils.dispatch_cpu_unquantized_gemm(conv, remove_weight=False)
    assert calls == [False]
