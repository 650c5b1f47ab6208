"""vLLM tier: LoRA adapters in vLLM's engine (the CPU build of vLLM 0.24.0) with the recall processor —
``recallm-eval``'s vLLM backend on a LoRA adapter directory (the base served with the adapter on every
request) generates what HF generates from the merged model; and ``recallm-grpo`` with verl's LoRA on verl's
vLLM rollout (the adapter loaded by vLLM, ``lora.merge=false``): spans verbatim, the rollout's log-probs
inside spans as close to the masked actor's as without LoRA. Run with ``scripts/test_vllm.sh``."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("verl")

from tests.grpo_runs import MIX, check_spans, grpo_command, step_metrics  # noqa: E402
from tests.integration.test_lora_adapters import _adapter  # noqa: E402
from tests.vllm_tier.test_grpo_vllm import _report, _run  # noqa: E402
from tests.vllm_tier.test_serve import serving  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_lora_rank_table_is_vllms_and_rounds_as_verl_does():
    """``recallm.modeling.VLLM_LORA_RANKS`` is vLLM's ``MaxLoRARanks``, and ``vllm_lora_rank`` gives every rank
    the ``max_lora_rank`` verl starts vLLM with (``get_vllm_max_lora_rank``, which reads vLLM's table here)."""
    from typing import get_args

    from verl.workers.rollout.vllm_rollout.utils import get_vllm_max_lora_rank
    from vllm.config.lora import MaxLoRARanks

    from recallm.modeling import VLLM_LORA_RANKS, vllm_lora_rank

    assert tuple(sorted(get_args(MaxLoRARanks))) == VLLM_LORA_RANKS
    for rank in range(1, VLLM_LORA_RANKS[-1] + 1):
        assert vllm_lora_rank(rank) == get_vllm_max_lora_rank(rank), rank
    with pytest.raises(ValueError):
        get_vllm_max_lora_rank(VLLM_LORA_RANKS[-1] + 1)  # (ours: a RecallmError, tests/unit/test_modeling.py)


@pytest.mark.parametrize("recipe", ["qwen2.5_7b_lora_1gpu", "qwen2.5_1.5b_lora_24gb"])
def test_single_gpu_recipes_pass_verls_validation(recipe, tmp_path):
    """verl's validate_config of a LoRA config with the vLLM rollout checks vLLM's version: here it is installed."""
    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.grpo.app import compose, prepare, validate
    from recallm.tiny import create_tiny

    model = create_tiny(tmp_path / "tiny", seed=0)
    mix = {
        "train": {
            "lengths": [256, 320],
            "entries": [{"task": "kv_retrieval", "count": 4, "params": {"key_type": "toy", "value_type": "toy"}}],
        }
    }
    run_schedule(schedule_from_config(mix), tmp_path / "data", model, workers=1, progress=False)
    data = tmp_path / "data" / "train.parquet"
    cfg = compose(
        [
            f"grpo={recipe}",
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={data}",
            f"data.val_files={data}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",  # the recipes require a run directory
        ]
    )
    prepare(cfg)
    validate(cfg)  # ours, then verl's


def test_eval_backend_serves_an_adapter_as_the_merged_model(tmp_path):
    from recallm.eval.backends import HFBackend, VLLMBackend
    from recallm.eval.types import GenerationSettings, TextRequest
    from recallm.tiny import create_tiny
    from recallm.tokens import load_tokenizer

    base = create_tiny(tmp_path / "tiny", seed=0, max_recall_tokens=8)
    adapter = _adapter(base, tmp_path / "adapter", std=0.3)
    tokenizer = load_tokenizer(adapter)
    settings = GenerationSettings(max_new_tokens=24)
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        for text in ("a b c d e f a b c", "key 7 is blue. key 9 is red. what is key 9?", "one two three one two")
    ]
    requests = [TextRequest(p, None, 24) for p in prompts]
    vllm = VLLMBackend(
        adapter,
        tokenizer,
        dtype="float32",
        max_model_len=512,
        engine_kwargs={"enforce_eager": True, "max_num_seqs": 4},
    )
    assert vllm.lora_request is not None
    got = [g.text for g in vllm.generate(requests, settings)]
    merged = [g.text for g in HFBackend(adapter, tokenizer, batch_size=1).generate(requests, settings)]
    plain = [g.text for g in HFBackend(base, tokenizer, batch_size=1).generate(requests, settings)]
    assert got == merged
    assert got != plain  # the adapter changed the outputs: vLLM applied it


def test_serve_answers_with_the_adapter_applied(tmp_path):
    """``recallm-serve ADAPTER_DIR``: vLLM serves the base with the adapter (``--lora-modules``) under the served
    name; its greedy completion is the merged model's (``recallm.generation`` on the merged weights), token for
    token, and not the base's."""
    import httpx

    from recallm.generation import GenRequest, generate
    from recallm.modeling import load_recallm_model
    from recallm.tiny import create_tiny
    from recallm.tokens import eos_token_ids, load_tokenizer

    base = create_tiny(tmp_path / "tiny", seed=0, max_recall_tokens=8)
    adapter = _adapter(base, tmp_path / "adapter", std=0.3)
    tokenizer = load_tokenizer(adapter)
    messages = [{"role": "user", "content": "key 7 is blue. key 9 is red. what is key 9?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tuple(tokenizer(prompt, add_special_tokens=False)["input_ids"])

    merged, plain = load_recallm_model(adapter), load_recallm_model(base)  # the adapter merged; the base alone
    eos = eos_token_ids(tokenizer=tokenizer, config=merged.config, generation_config=merged.generation_config)

    def greedy(model):
        out = generate(model, [GenRequest(prompt_ids, 24)], tokenizer=tokenizer, eos_token_ids=eos)[0].token_ids
        return [t for t in out if t not in eos]

    with serving(adapter, "recallm-lora", tmp_path / "server.log") as url:
        models = [m["id"] for m in httpx.get(f"{url}/models", timeout=30).json()["data"]]
        assert "recallm-lora" in models, models
        resp = httpx.post(
            f"{url}/completions",
            json={
                "model": "recallm-lora",
                "prompt": list(prompt_ids),
                "max_tokens": 24,
                "temperature": 0.0,
                "logprobs": 1,
                "return_tokens_as_token_ids": True,
            },
            timeout=300,
        )
    assert resp.status_code == 200, resp.text
    served = [int(t.split(":", 1)[1]) for t in resp.json()["choices"][0]["logprobs"]["tokens"]]
    served = [t for t in served if t not in eos]
    assert served == greedy(merged)
    assert served != greedy(plain)


def test_lora_grpo_with_verls_vllm_rollout_on_cpu(tmp_path):
    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.tiny import create_tiny

    model = create_tiny(tmp_path / "tiny", seed=0, max_recall_tokens=8)
    run_schedule(schedule_from_config(MIX), tmp_path / "data", model, workers=1, progress=False)
    data, ckpt, rollouts = tmp_path / "data" / "train.parquet", tmp_path / "ckpt", tmp_path / "rollouts"
    lora = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16")
    result = _run(grpo_command(model, data, ckpt, rollouts, *lora, rollout="vllm", steps=2), tmp_path)
    assert result.returncode == 0, result.stdout[-8000:]
    assert "enable_lora" in result.stdout  # verl started vLLM with LoRA: the adapter is loaded, not merged
    metrics = step_metrics(result.stdout)
    _report(metrics)
    assert sorted(metrics) == [1, 2], result.stdout[-4000:]
    for step, m in metrics.items():
        assert check_spans(rollouts, step) >= 4, step
        assert m["recallm/spans_verbatim"] == 1.0 and m["recallm/spans_per_response"] > 0
        assert m["recallm/logprob_gap_in_spans"] <= 1e-3, (step, m["recallm/logprob_gap_in_spans"])
        assert m["actor/grad_norm"] > 0
