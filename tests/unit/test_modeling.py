"""Masked model classes: registration, conversion of base checkpoints, round trips, errors."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import recallm.modeling  # noqa: F401  (registers the classes)
from recallm.errors import RecallmError
from recallm.modeling import (
    RECALL_CLASSES,
    check_recallm_model,
    create_recallm_model,
    recall_classes_for,
    vllm_hf_overrides,
)
from recallm.tokens import RecallTokenIds, load_tokenizer
from tests.assets import save_base


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "mistral"])
@pytest.mark.parametrize("tied", [True, False])
def test_convert_base_checkpoint(tmp_path, arch, tied):
    base = save_base(tmp_path / "base", arch, tied=tied)
    out = create_recallm_model(base, tmp_path / "recallm")
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    config_cls, model_cls, base_cls = RECALL_CLASSES[arch]
    assert type(model) is model_cls and isinstance(model, base_cls)
    assert model.config.model_type == f"recallm_{arch}" and isinstance(model.config, config_cls)
    assert json.loads((out / "config.json").read_text())["architectures"] == [model_cls.__name__]
    tokenizer = load_tokenizer(out)
    ids = RecallTokenIds.from_pretrained(model.config, tokenizer)
    assert check_recallm_model(out)["recall_start_token_id"] == ids.start
    # outside spans the converted model computes what the base computed (old vocabulary)
    plain = AutoModelForCausalLM.from_pretrained(base).eval()
    x = tokenizer("17: bako\n18: kuri\nwhat is 18", return_tensors="pt")
    n_old = ids.start
    with torch.no_grad():
        torch.testing.assert_close(model(**x).logits[..., :n_old], plain(**x).logits[..., :n_old])
    # save/load round trip
    model.save_pretrained(tmp_path / "again")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again").eval()
    assert type(again) is model_cls
    for (ka, va), (kb, vb) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    with torch.no_grad():
        assert torch.equal(model(**x).logits, again(**x).logits)


def test_plain_checkpoint_loads_into_the_masked_class(tiny_base_dir):
    _, model_cls, _ = recall_classes_for("qwen2")
    model = model_cls.from_pretrained(tiny_base_dir).eval()
    plain = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()
    for (ka, va), (kb, vb) in zip(model.state_dict().items(), plain.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    x = torch.tensor([[5, 6, 7]])
    with pytest.raises(RecallmError, match="no recall tokens"):
        model(input_ids=x)
    model.config.recall_constrained = False  # the unmasked ablation needs no recall tokens
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, plain(input_ids=x).logits)


def test_unknown_architecture(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from recallm.tiny import build_tiny_tokenizer

    GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=32, n_head=1, vocab_size=64, bos_token_id=0, eos_token_id=0)
    ).save_pretrained(tmp_path / "gpt2")
    build_tiny_tokenizer().save_pretrained(tmp_path / "gpt2")
    with pytest.raises(RecallmError, match="unsupported architecture model_type='gpt2'; supported: llama, mistral"):
        create_recallm_model(tmp_path / "gpt2", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_registration_and_overrides(tiny_dir):
    for base in ("qwen2", "qwen3", "llama", "mistral"):
        config = AutoConfig.for_model(f"recallm_{base}")
        assert type(config) is RECALL_CLASSES[base][0]
        assert config.max_recall_tokens == 128 and config.recall_constrained is True
    config = AutoConfig.from_pretrained(tiny_dir)
    assert vllm_hf_overrides(config) == {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}


def test_yarn_and_idempotent_conversion(tmp_path, tiny_dir):
    out = create_recallm_model(tiny_dir, tmp_path / "yarn", yarn_factor=4, max_recall_tokens=32)
    config = AutoConfig.from_pretrained(out)
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 4.0
    assert config.rope_parameters["original_max_position_embeddings"] == 32768
    assert config.max_position_embeddings == 4 * 32768
    assert config.max_recall_tokens == 32
    # converting a RecaLLM directory keeps the ids
    assert RecallTokenIds.from_config(config) == RecallTokenIds.from_config(AutoConfig.from_pretrained(tiny_dir))
    with pytest.raises(RecallmError, match=r"yarn_factor must be a number in \(1, 64\]"):
        create_recallm_model(tiny_dir, tmp_path / "bad", yarn_factor=0.5)
    with pytest.raises(RecallmError, match="--out must differ from --base"):
        create_recallm_model(tiny_dir, tiny_dir)


def test_served_hf_overrides_accepts_mappings():
    # the one merge of a user's hf_overrides with what vLLM must serve (recallm-serve, recallm-grpo)
    from recallm.modeling import served_hf_overrides

    assert served_hf_overrides({"a": 1}, {"model_type": "qwen2"}) == {"a": 1, "model_type": "qwen2"}
    assert served_hf_overrides(None, {"model_type": "qwen2"}) == {"model_type": "qwen2"}
    assert served_hf_overrides('{"a": 1}', {"b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(RecallmError, match="sets model_type='llama', but this RecaLLM model is served by vLLM as"):
        served_hf_overrides({"model_type": "llama"}, {"model_type": "qwen2"})


def test_vllm_lora_rank_is_one_table_for_a_rank_and_an_adapter(tmp_path):
    """One ``vllm_lora_rank``: a rank (the plan, as verl rounds ``lora_rank``) and an adapter directory (serve,
    eval) round up in vLLM 0.24's ``MaxLoRARanks``, rank 1 included (the vLLM tier checks the table against
    vLLM's own and verl's rounding: tests/vllm_tier/test_vllm_lora.py)."""
    from recallm.modeling import VLLM_LORA_RANKS, vllm_lora_rank
    from recallm.plan import vllm_lora_rank as planned

    assert planned is vllm_lora_rank
    assert VLLM_LORA_RANKS == (1, 8, 16, 32, 64, 128, 256, 320, 512)

    def adapter(name, **config):
        path = tmp_path / name
        path.mkdir()
        (path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "..", **config}))
        return path

    for rank, served in ((1, 1), (2, 8), (8, 8), (9, 16), (300, 320), (512, 512)):
        assert vllm_lora_rank(rank) == served
        assert vllm_lora_rank(adapter(f"r{rank}", r=rank)) == served
    assert vllm_lora_rank(adapter("unset")) == 8  # PEFT's default rank
    with pytest.raises(RecallmError, match="lora_rank 513 is above vLLM's largest max_lora_rank, 512"):
        vllm_lora_rank(513)
    with pytest.raises(RecallmError, match="has LoRA rank 600; vLLM serves ranks up to 512"):
        vllm_lora_rank(adapter("r600", r=600))
    with pytest.raises(RecallmError, match="trains the recall token rows next to the adapter"):
        vllm_lora_rank(adapter("rows", r=4, trainable_token_indices=[1, 2]))
