"""verl's own GRPO trainer on a CPU (``recallm.grpo.cpu``): the ``hf_cpu`` rollout's generation,
the overrides and environment, and (slow) four real ``verl.trainer.main_ppo`` runs in one test: three
steps with a checkpoint after each, the same run stopped by SIGTERM and resumed to the same weights, and a
resume past a damaged checkpoint; then the export."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recallm.errors import RecallmError
from recallm.grpo.cpu import PLUGIN_MODULE, cpu_env
from recallm.grpo.cpu.hf_generate import HFCPUSettings, HFGenerator
from recallm.recall import find_spans
from recallm.tokens import RecallTokenIds, load_tokenizer
from tests.grpo_runs import MIX, check_spans, grpo_command, run_grpo, run_grpo_stopped, step_metrics

PROMPTS = [
    "find the value of key 2 in the list below\n1: bazo\n2: kelu\n3: mifa\n4: zuno",
    "what is the value of key 7\n7: lomi\n8: rade\n9: sepa\nthe answer is",
    "key value table\n11: dafo 12: kise 13: muvo",
]


def _is_subsequence(span: list[int], context: list[int]) -> bool:
    n = len(span)
    return n == 0 or any(context[i : i + n] == span for i in range(len(context) - n + 1))


def _masked_log_probs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """What verl's actor computes: the masked model's forward on prompt + response, logits / T."""
    seq = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0].float()
    log_probs = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    return log_probs.gather(1, torch.tensor(response)[:, None]).squeeze(1)


@pytest.fixture(scope="module")
def generator(tiny_dir):
    return HFGenerator.from_pretrained(tiny_dir, HFCPUSettings(force_every=6, force_length=4))


def test_generation_spans_verbatim_and_processed_log_probs(generator, tiny_dir):
    """Batched, left-padded, sampled generation with forced spans: every span is a verbatim copy
    of its context, and the log-probs equal the masked model's forward log-probs (verl's actor)."""
    tokenizer = load_tokenizer(tiny_dir)
    ids = RecallTokenIds.from_config(generator.model.config)
    assert generator.recall  # a RecaLLM model: recall constrained by default
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    temperature = 0.7
    requests = [
        generator.make_request(p, {"max_tokens": 40, "temperature": temperature, "top_p": 1.0, "top_k": -1})
        for p in prompts
        for _ in range(2)  # n=2, as verl sends it: the same prompt twice
    ]
    torch.manual_seed(0)
    results = generator.generate(requests)
    n_spans = 0
    for request, result in zip(requests, results, strict=True):
        prompt, response = list(request.prompt_ids), result.token_ids
        assert 1 <= len(response) <= 40 and len(result.log_probs) == len(response)
        assert all(t not in generator.eos_token_ids for t in response[:-1])
        seq = prompt + response
        spans = [s for s in find_spans(seq, ids.start, ids.end) if s.start >= len(prompt)]
        n_spans += len(spans)
        for span in spans:
            assert span.verbatim
            assert _is_subsequence(list(span.tokens), seq[: span.start])
        expected = _masked_log_probs(generator.model, prompt, response, temperature)
        assert torch.allclose(torch.tensor(result.log_probs), expected, atol=1e-4), (result.log_probs, expected)
    assert n_spans >= len(requests)  # forced every 6 tokens outside spans


def test_greedy_top_k_and_plain_decoding(tiny_dir):
    """Greedy is deterministic and equals batch-of-one decoding; top-k log-probs are renormalised
    over the k best (vLLM's processed log-probs), and stay finite for forced tokens; ``recall=false``
    decodes without the mask."""
    tokenizer = load_tokenizer(tiny_dir)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    forced = HFGenerator.from_pretrained(tiny_dir, HFCPUSettings(force_every=5, force_length=3))
    greedy = [forced.make_request(p, {"max_tokens": 24, "temperature": 0}) for p in prompts]
    batched = forced.generate(greedy)
    single = [forced.generate([r])[0] for r in greedy]
    for a, b in zip(batched, single, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs, strict=True)) < 1e-4
    top_k = forced.generate([forced.make_request(prompts[0], {"max_tokens": 24, "temperature": 1.0, "top_k": 3})])[0]
    assert all(math.isfinite(lp) for lp in top_k.log_probs)

    free = HFGenerator.from_pretrained(tiny_dir, HFCPUSettings())
    request = free.make_request(prompts[1], {"max_tokens": 16, "temperature": 0.9, "top_k": 3})
    out = free.generate([request])[0]
    seq = torch.tensor([list(request.prompt_ids) + out.token_ids])
    with torch.no_grad():
        logits = free.model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0].float() / 0.9
    logits = logits[len(request.prompt_ids) - 1 : -1]
    kth = logits.topk(3, dim=-1).values[:, -1:]
    expected = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), -1)
    expected = expected.gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-4)

    # the rollout follows the model config's recall_constrained (override_config, from recallm.recall_constrained)
    from transformers import AutoConfig

    import recallm.modeling  # noqa: F401

    config = AutoConfig.from_pretrained(tiny_dir)
    config.recall_constrained = False
    plain = HFGenerator.from_pretrained(tiny_dir, HFCPUSettings(), config=config)
    assert free.recall and not plain.recall
    out = plain.generate([plain.make_request(prompts[0], {"max_tokens": 12, "temperature": 1.0})])[0]
    assert len(out.token_ids) == len(out.log_probs) >= 1


def test_weight_update(tiny_dir):
    """``load_weights`` + ``finish_weight_update`` (what the adapter sends each step) replace every
    weight; a partial or foreign update is refused."""
    from transformers import AutoModelForCausalLM

    gen = HFGenerator.from_pretrained(tiny_dir, HFCPUSettings())
    other = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    state = list(other.state_dict().items())
    gen.load_weights(state[: len(state) // 2])
    gen.load_weights(state[len(state) // 2 :])
    gen.finish_weight_update()
    for name, tensor in other.state_dict().items():
        assert torch.equal(gen.model.state_dict()[name], tensor), name
    gen.load_weights(state[:3])
    with pytest.raises(RuntimeError, match="were not sent"):
        gen.finish_weight_update()
    with pytest.raises(RuntimeError, match="does not have"):
        gen.load_weights([("model.nope.weight", torch.zeros(1))])


def test_seed_per_request_makes_a_response_independent_of_its_batch(generator, tiny_dir):
    """``seed_per_request`` (on by default): a request's seed comes from the step, its prompt, its index
    in the step's batch and its rank among that prompt's requests, not from arrival order or batch-mates;
    alone or batched in any order, the same request gives the same tokens (what makes a stopped and
    resumed GRPO run sample as an uninterrupted one)."""
    from recallm.grpo.cpu.hf_generate import request_seeds

    tokenizer = load_tokenizer(tiny_dir)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    params = {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    requests = [generator.make_request(p, params) for p in prompts for _ in range(2)]  # n=2
    seeded = request_seeds(requests, 7, 3, {})
    seeds = [r.seed for r in seeded]
    assert len(set(seeds)) == len(seeds)  # the two requests of one prompt differ too
    assert sorted(r.seed for r in request_seeds(list(reversed(requests)), 7, 3, {})) == sorted(seeds)
    assert request_seeds(requests, 7, 4, {})[0].seed != seeds[0]  # the next step samples anew
    first = [generator.generate([r])[0].token_ids for r in seeded]
    assert first == [generator.generate([r])[0].token_ids for r in seeded]
    assert first[0] != first[1]  # two samples of one prompt, not one twice
    # batched (the default: one random stream per row), in any order: the same tokens as alone
    assert [r.token_ids for r in generator.generate(seeded)] == first
    backwards = generator.generate(list(reversed(seeded)))
    assert [r.token_ids for r in reversed(backwards)] == first
    # verl's priority (the response's index in the step's batch) is part of the key: unique per response
    indexed = [r.seed for r in request_seeds(requests, 7, 3, {}, samples=range(len(requests)))]
    assert len(set(indexed)) == len(indexed) and set(indexed[1:]).isdisjoint(seeds)
    assert indexed[0] == seeds[0]  # index 0 is what a caller without one gets
    assert [r.seed for r in request_seeds(requests[::-1], 7, 3, {}, samples=range(len(requests))[::-1])] == indexed[::-1]
    assert HFCPUSettings().seed_per_request  # on by default


def test_settings_and_requests(generator):
    with pytest.raises(RecallmError, match="unknown key.*force_evry"):
        HFCPUSettings.from_engine_kwargs({"force_evry": 3})
    with pytest.raises(RecallmError, match="force_every must be an integer >= 1"):
        HFCPUSettings.from_engine_kwargs({"force_every": 0})
    with pytest.raises(RecallmError, match="dtype"):
        HFCPUSettings(dtype="float16")
    assert HFCPUSettings.from_engine_kwargs(None) == HFCPUSettings()
    r = generator.make_request([5, 6, 7], {"temperature": 1.0, "top_p": 1, "top_k": -1, "logprobs": True})
    assert r.max_new_tokens == generator.max_model_len - 3  # no budget given: up to the context length
    r = generator.make_request([5, 6, 7], {"max_new_tokens": 9}, default_max_tokens=20)
    assert r.max_new_tokens == 9
    assert generator.make_request([5], {}, default_max_tokens=20).max_new_tokens == 20


def _compose(*overrides: str):
    """verl's own ``ppo_trainer`` config with our CPU platform group added (how ``verl.trainer.main_ppo``
    runs the plugin without recallm-grpo), then the user's overrides."""
    import verl.trainer.config
    from hydra import compose, initialize_config_dir

    from recallm.paths import CONFIG_DIR

    platform = [f"hydra.searchpath=[file://{CONFIG_DIR}]", "+grpo/platform=cpu"]
    with initialize_config_dir(config_dir=os.path.dirname(verl.trainer.config.__file__), version_base=None):
        return compose(config_name="ppo_trainer", overrides=[*platform, *overrides])


def test_overrides_compose_and_user_overrides_win():
    cfg = _compose(
        "trainer.n_gpus_per_node=1",
        "ray_kwargs.ray_init.num_cpus=4",
        "+actor_rollout_ref.rollout.engine_kwargs.hf_cpu.force_every=8",
    )
    assert cfg.actor_rollout_ref.rollout.name == "hf_cpu" and cfg.trainer.use_v1 is False
    assert cfg.ray_kwargs.ray_init.num_gpus == 1 and cfg.ray_kwargs.ray_init.num_cpus == 4
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert cfg.actor_rollout_ref.ref.strategy == "fsdp2"  # follows the actor's
    assert HFCPUSettings.from_engine_kwargs(cfg.actor_rollout_ref.rollout.engine_kwargs.hf_cpu).force_every == 8
    # two workers: two logical Ray GPUs (the platform declares as many as trainer.n_gpus_per_node)
    assert _compose("trainer.n_gpus_per_node=2").ray_kwargs.ray_init.num_gpus == 2
    env = cpu_env({"VERL_USE_EXTERNAL_MODULES": "a.b,recallm.grpo.cpu.plugin", "OMP_NUM_THREADS": "3"})
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"{PLUGIN_MODULE},a.b"
    assert env["OMP_NUM_THREADS"] == "3" and env["VERL_PLATFORM"] == "cpu"
    assert env["RAY_worker_register_timeout_seconds"] == "600"  # slow worker starts are waited for
    assert cpu_env({"RAY_worker_register_timeout_seconds": "90"})["RAY_worker_register_timeout_seconds"] == "90"
    assert env["RAY_worker_niceness"] == "0"  # Ray's default 15 lets anything beside the run starve it
    assert cpu_env({"RAY_worker_niceness": "10"})["RAY_worker_niceness"] == "10"


def test_step_speedups_and_their_baseline(monkeypatch):
    """The CPU step's speed-ups (no gradient checkpointing, Ray's 5 s pollers relaxed, vectorised
    log-probs) are on by default and all off with RECALLM_CPU_BASELINE=1 (bench/grpo_step.py)."""
    from verl.utils.torch_functional import logprobs_from_logits_v2

    from recallm.grpo.cpu import patches

    monkeypatch.delenv("RECALLM_CPU_BASELINE", raising=False)
    # the platform turns gradient checkpointing off; bench/grpo_step.py's baseline turns it back on
    assert _compose().actor_rollout_ref.model.enable_gradient_checkpointing is False
    env = cpu_env({"AUTOSCALER_UPDATE_INTERVAL_S": "7"})
    assert env["REPORTER_UPDATE_INTERVAL_MS"] == "60000" and env["AUTOSCALER_UPDATE_INTERVAL_S"] == "7"
    monkeypatch.setenv("RECALLM_CPU_BASELINE", "1")
    assert patches.baseline()
    assert "REPORTER_UPDATE_INTERVAL_MS" not in cpu_env({})
    # the vectorised log-probs equal verl's per-token loop exactly, values and gradients, in chunks too
    logits = torch.randn(3, 37, 50, dtype=torch.float32, requires_grad=True)
    labels = torch.randint(0, 50, (3, 37))
    expected = logprobs_from_logits_v2(logits, labels)
    (grad_expected,) = torch.autograd.grad(expected.sum(), logits)
    monkeypatch.setattr(patches, "_LOGPROB_CHUNK_ELEMENTS", 50 * 8)  # 8 rows a chunk
    got = patches.cpu_logprobs_from_logits(logits, labels)
    (grad_got,) = torch.autograd.grad(got.sum(), logits)
    assert got.shape == (3, 37) and torch.equal(got, expected) and torch.allclose(grad_got, grad_expected)
    low = logits.detach().to(torch.bfloat16)
    assert torch.equal(patches.cpu_logprobs_from_logits(low, labels), logprobs_from_logits_v2(low, labels))


def test_server_batches_concurrent_requests_and_takes_weights(tiny_dir):
    """The Ray actor class called directly: requests that arrive together are generated in one
    batch, answered as verl's ``TokenOutput``; the adapter's weight messages replace the model."""
    from verl.workers.rollout.replica import RolloutMode

    from recallm.grpo.cpu.rollout import HFCPUServer

    cfg = _compose(
        f"actor_rollout_ref.model.path={tiny_dir}",
        "data.max_response_length=20",
        "+actor_rollout_ref.rollout.engine_kwargs.hf_cpu.force_every=5",
    )
    threads = torch.get_num_threads()
    with torch.random.fork_rng():  # the server seeds torch and sets its thread count
        server = HFCPUServer(cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model, RolloutMode.HYBRID, 0)
        try:
            _exercise_server(server, tiny_dir)
        finally:
            server._executor.shutdown()
            torch.set_num_threads(threads)


def _exercise_server(server, tiny_dir):
    import asyncio

    from transformers import AutoModelForCausalLM
    from verl.workers.rollout.replica import TokenOutput

    assert server.generator.recall and server.settings.force_every == 5
    batches = []
    generate = server.generator.generate
    server.generator.generate = lambda requests: batches.append(len(requests)) or generate(requests)
    tokenizer = load_tokenizer(tiny_dir)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}

    async def run():
        outs = await asyncio.gather(
            *[server.generate(p, dict(params), f"r{i}") for i, p in enumerate(prompts * 2)],
            server.generate(prompts[0], {**params, "logprobs": False, "temperature": 0}, "greedy"),
        )
        await server.wait_for_requests_to_drain()
        return outs

    outs = asyncio.run(run())
    assert batches == [7]  # one batch, generated as two groups (sampled, greedy)
    for out in outs[:-1]:
        assert isinstance(out, TokenOutput) and 1 <= len(out.token_ids) <= 20
        assert len(out.log_probs) == len(out.token_ids) and out.stop_reason == "completed"
    assert outs[-1].log_probs is None

    other = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)

    async def sync():
        await server.sleep()
        await server.load_weights(list(other.state_dict().items()))
        await server.finish_weight_update(global_steps=7)
        await server.wake_up(tags=["weights"])
        return await server.generate(prompts[0], dict(params), "after")

    out = asyncio.run(sync())
    assert out.extra_fields["global_steps"] == 7
    assert torch.equal(server.generator.model.model.embed_tokens.weight, other.model.embed_tokens.weight)


@pytest.mark.slow
def test_activate_registers_platform_patches_and_rollout():
    """In a fresh process (as a Ray worker would): the plugin is imported with verl."""
    code = """
import sys, verl
from verl.utils.device import get_device_name, get_device_id, get_torch_device
assert (get_device_name(), get_device_id(), get_torch_device().get_device_name()) == ("cpu", "cpu", "CPU")
assert "verl.workers.engine.fsdp.transformer_impl" not in sys.modules  # patches wait for their module
import verl.workers.engine.fsdp.transformer_impl as ti, verl.workers.engine_workers as ew, verl.utils.distributed as d
from torch.distributed.fsdp import CPUOffloadPolicy
assert ti.CPUOffloadPolicy(pin_memory=True).pin_memory is False and issubclass(ti.CPUOffloadPolicy, CPUOffloadPolicy)
assert ew.initialize_global_process_group_ray is d.initialize_global_process_group_ray
assert ew.initialize_global_process_group_ray._recallm_cpu
from verl.workers.rollout.replica import get_rollout_replica_class
from verl.workers.rollout.base import get_rollout_class
assert ti.logprobs_from_logits._recallm_cpu  # the vectorised log-probs (patch 3)
assert get_rollout_replica_class("hf_cpu").__name__ == "HFCPUReplica"
assert get_rollout_class("hf_cpu").__name__ == "HFCPUServerAdapter"
from recallm.grpo.cpu import activate; activate(); activate()
from recallm.grpo.worker_hooks import install_collective_timeout; install_collective_timeout(); install_collective_timeout()
pg = d.initialize_global_process_group_ray  # the timeout wraps the CPU patch, each once, everywhere
assert pg._recallm_timeout and pg.__wrapped__._recallm_cpu and not hasattr(pg.__wrapped__.__wrapped__, "_recallm_cpu")
assert ew.initialize_global_process_group_ray is pg
print("ok")
"""
    env = {**os.environ, **cpu_env()}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# --- two real runs of verl.trainer.main_ppo -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.heavy
def test_grpo_on_cpu_trains_saves_stops_and_resumes_to_the_uninterrupted_weights(tiny_dir, tmp_path, capsys):
    """Three real runs of verl's trainer on the CPU (one test: each run costs a Ray cluster's start-up).

    1. ``whole``: three steps with a checkpoint after each (checksummed), the step metrics and verbatim spans.
    2. ``stopped``: the same run stopped by SIGTERM once step 1 is logged (it saves the step under way, 2, and
       exits, as under SLURM's warning); then one byte of that newest save's weights is flipped.
    3. ``stopped`` run again: the resume takes the newest intact step (1) instead, keeps the damaged one aside,
       redoes steps 2 and 3 and ends with the final weights of ``whole``, with no flag: every response samples
       from its own stream (``seed_per_request``, on by default), so what the rollout's batches hold, and when
       each request arrived, changes nothing.
    Then the export of the checkpoint to a Hugging Face directory that generates with constrained recall.
    (A finished run continued for more steps: ``test_rlm_train.py``'s resume.)"""
    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.grpo.checkpoints import check_step

    data_dir = tmp_path / "data"
    run_schedule(schedule_from_config(MIX), data_dir, tiny_dir, workers=1, progress=False)

    def command(name: str, *extra: str) -> list[str]:
        ckpt = tmp_path / name / "ckpt"
        return grpo_command(tiny_dir, data_dir / "train.parquet", ckpt, ckpt.with_name("rollouts"), *extra, steps=3)

    ckpt, rollouts = tmp_path / "whole" / "ckpt", tmp_path / "whole" / "rollouts"
    first = run_grpo(command("whole", "trainer.save_freq=1"), tmp_path)
    assert first.returncode == 0, first.stdout[-8000:]
    assert (ckpt / "global_step_3" / "actor").is_dir()
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert all(check_step(ckpt / f"global_step_{n}") for n in (1, 2, 3))  # checksummed when saved
    metrics = step_metrics(first.stdout)
    assert sorted(metrics) == [1, 2, 3], first.stdout[-4000:]
    for step, m in metrics.items():
        assert math.isfinite(m["critic/score/mean"])
        assert m["training/rollout_probs_diff_valid"] == 1
        # the rollout's processed log-probs and the masked actor's agree
        assert m["training/rollout_probs_diff_max"] < 1e-3, (step, m["training/rollout_probs_diff_max"])
        assert m["training/rollout_actor_probs_pearson_corr"] > 0.999
        assert m["actor/grad_norm"] > 0
        assert check_spans(rollouts, step) >= 4  # forced every 8 tokens: spans in every step
        # the RecaLLM metrics: reward breakdown, verbatim spans, log-prob agreement inside spans
        assert m["recallm/spans_verbatim"] == 1.0 and m["recallm/spans_per_response"] > 0
        assert m["recallm/logprob_gap_in_spans"] <= 1e-3 and m["recallm/logprob_gap_outside_spans"] <= 1e-3
        for key in (
            "score",
            "format",
            "answer",
            "recall",
            "recall_overlap",
            "density_penalty",
            "correctness_penalty",
            "n_spans",
            "used_recall",
        ):
            assert math.isfinite(m[f"recallm/reward/{key}"]), key

    # stopped once step 1 is logged (step 1 saved as every step is, and the step under way saved by the stop)
    stopped_ckpt = tmp_path / "stopped" / "ckpt"
    stopped = run_grpo_stopped(command("stopped", "trainer.save_freq=1"), tmp_path, after_step=1)
    saved = re.findall(r"stopped by SIGTERM after step (\d+): checkpoint \S+ saved", stopped.stdout)
    assert stopped.returncode == 128 + 15 and len(saved) == 1, stopped.stdout[-8000:]
    step = int(saved[0])
    assert step == 2 and check_step(stopped_ckpt / "global_step_2") and check_step(stopped_ckpt / "global_step_1")
    assert sorted(step_metrics(stopped.stdout)) == [1, 2]
    # one flipped byte in the newest save's weights: the resume takes the newest intact step instead
    shard = Path("actor") / "model_world_size_1_rank_0.pt"
    damaged = bytearray((stopped_ckpt / "global_step_2" / shard).read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    (stopped_ckpt / "global_step_2" / shard).write_bytes(bytes(damaged))
    resumed = run_grpo(command("stopped", "trainer.save_freq=1"), tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-8000:]
    assert "warning: checkpoint global_step_2 is damaged: actor/model_world_size_1_rank_0.pt changed" in resumed.stdout
    assert "resume:       global_step_1 (checksums verified)" in resumed.stdout
    assert f"Resuming from {stopped_ckpt / 'global_step_1'}" in resumed.stdout
    assert (stopped_ckpt / "corrupt-global_step_2").is_dir()  # kept aside, not deleted
    redone = step_metrics(resumed.stdout)
    assert sorted(redone) == [2, 3], resumed.stdout[-4000:]  # step 1 not redone
    assert redone[2]["training/rollout_probs_diff_max"] < 1e-3  # the resumed weights reached the rollout
    ours, theirs = (
        torch.load(tmp_path / name / "ckpt" / "global_step_3" / shard, weights_only=False)
        for name in ("stopped", "whole")
    )
    assert ours.keys() == theirs.keys()
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    moved = 0.0
    for name, tensor in ours.items():
        local = getattr(tensor, "to_local", lambda t=tensor: t)()
        other = getattr(theirs[name], "to_local", lambda t=theirs[name]: t)()
        torch.testing.assert_close(local, other, rtol=0, atol=1e-6, msg=name)
        if name in initial:
            moved = max(moved, (local.float() - initial[name].float()).abs().max().item())
    assert moved > 1e-4  # three steps moved the weights: the agreement is not that of untrained weights

    # export: a Hugging Face RecaLLM directory that generates with constrained recall
    from recallm.grpo.export import export_checkpoint
    from recallm.modeling import vllm_hf_overrides
    from recallm.recall import ForceRecallSpans

    out = export_checkpoint(ckpt, tmp_path / "hf")
    from recallm.io import verify_manifest

    assert verify_manifest(out)  # every exported file's size and CRC-32 recorded (and checked here)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "RecallQwen2ForCausalLM"
    # the tiny model trains in float32 and is exported in float32 (verl's merger alone makes bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32" and model.dtype == torch.float32
    weights = model.get_input_embeddings().weight.detach()
    assert not torch.equal(weights, weights.to(torch.bfloat16).float())  # more precision than bfloat16 holds
    from recallm.cli.export import main as export_main

    assert export_main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "hf16"), "--dtype", "bfloat16"]) == 0
    said = capsys.readouterr().out
    assert "in bfloat16 (converted from the trained float32 by --dtype)" in said and " parameters, " in said
    half = AutoModelForCausalLM.from_pretrained(tmp_path / "hf16", dtype="auto")
    assert half.dtype == torch.bfloat16
    assert torch.equal(half.get_input_embeddings().weight.detach(), weights.to(torch.bfloat16))
    assert vllm_hf_overrides(model.config) == {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    tokenizer = load_tokenizer(out)
    ids = RecallTokenIds.from_pretrained(model.config, tokenizer)
    enc = tokenizer(PROMPTS[0], return_tensors="pt")
    generated = model.generate(
        **enc,
        logits_processor=[ForceRecallSpans(ids.start, ids.end, every=3, length=4)],
        max_new_tokens=20,
        do_sample=True,
        top_k=0,
    )[0].tolist()
    spans = find_spans(generated, ids.start, ids.end)
    assert spans and all(span.verbatim for span in spans)
    from recallm.errors import RecallmError as _Err

    with pytest.raises(_Err, match="is not empty"):
        export_checkpoint(ckpt, out)
