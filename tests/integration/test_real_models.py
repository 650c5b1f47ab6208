"""Real checkpoints' quirks, built locally: the pad-token rule, a Llama-3.1-style tokenizer without a
pad token through create-model -> SFT -> generate, GGUF header ids. (SmolLM2 itself:
tests/integration/test_smollm2.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from recallm.errors import RecallmError
from recallm.tokens import eos_token_ids, pad_token_id
from tests.assets import save_llama31_style_base


def test_pad_token_rule_in_order():
    tok = SimpleNamespace(pad_token_id=7, eos_token_id=3)
    assert pad_token_id(tokenizer=tok, config=SimpleNamespace(pad_token_id=9)) == 7
    tok_nopad = SimpleNamespace(pad_token_id=None, eos_token_id=3)
    gen = SimpleNamespace(pad_token_id=None, eos_token_id=[11, 12])
    assert pad_token_id(tokenizer=tok_nopad, config=SimpleNamespace(pad_token_id=9), generation_config=gen) == 9
    assert pad_token_id(tokenizer=tok_nopad, config=SimpleNamespace(pad_token_id=None), generation_config=gen) == 11
    assert pad_token_id(tokenizer=tok_nopad) == 3
    assert pad_token_id(config=SimpleNamespace(pad_token_id=None, eos_token_id=5)) == 5
    with pytest.raises(RecallmError, match="no pad token and no end-of-sequence token"):
        pad_token_id(tokenizer=SimpleNamespace(pad_token_id=None, eos_token_id=None))
    assert eos_token_ids(tokenizer=tok, config=SimpleNamespace(eos_token_id=None), generation_config=gen) == [11, 12]
    assert eos_token_ids(tokenizer=tok) == [3]
    assert eos_token_ids() == []


@pytest.fixture(scope="module")
def llama31_model(tmp_path_factory):
    from recallm.modeling import create_recallm_model

    root = tmp_path_factory.mktemp("llama31")
    base = save_llama31_style_base(root / "base")
    return base, create_recallm_model(base, root / "recallm")


def test_create_model_gives_a_tokenizer_without_pad_one(llama31_model):
    from transformers import AutoConfig, GenerationConfig

    from recallm.modeling import check_recallm_model
    from recallm.tokens import load_tokenizer

    base, out = llama31_model
    assert load_tokenizer(base).pad_token_id is None
    tok, config = load_tokenizer(out), AutoConfig.from_pretrained(out)
    end_of_text = tok.convert_tokens_to_ids("<|end_of_text|>")
    # the rule: no pad anywhere -> the first end-of-sequence id of the generation config
    assert tok.pad_token == "<|end_of_text|>" and tok.pad_token_id == end_of_text
    assert config.pad_token_id == end_of_text
    assert GenerationConfig.from_pretrained(out).pad_token_id == end_of_text
    assert tok.eos_token == "<|eot_id|>"  # the end of a turn is left alone
    summary = check_recallm_model(out)
    assert summary["pad_token"].startswith("<|end_of_text|>")
    # converting again changes nothing
    again = out.parent / "again"
    from recallm.modeling import create_recallm_model

    create_recallm_model(out, again)
    assert load_tokenizer(again).pad_token_id == end_of_text
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        assert json.loads((again / name).read_text()) == json.loads((out / name).read_text()), name
    assert torch.equal(
        *(
            __import__("safetensors.torch", fromlist=["load_file"]).load_file(d / "model.safetensors")[
                "model.embed_tokens.weight"
            ]
            for d in (out, again)
        )
    )


def test_check_refuses_a_model_without_a_consistent_pad_token(llama31_model, tmp_path):
    import shutil

    from recallm.modeling import check_recallm_model

    _, out = llama31_model
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["pad_token_id"] = None
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RecallmError, match="no consistent pad token"):
        check_recallm_model(broken)


@pytest.mark.slow
def test_llama31_style_model_through_sft_and_generate(llama31_model, tmp_path):
    """The reported failure: SFT's collator crashed on a tokenizer without a pad token."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.eval.backends import HFBackend
    from recallm.eval.types import GenerationSettings, TextRequest
    from recallm.paths import config_dir
    from recallm.sft.train import run_sft
    from recallm.tokens import load_tokenizer

    _, model_dir = llama31_model
    mix = {
        "seed": 0,
        "tolerance": 0.05,
        "train": {
            "lengths": [192, 256],
            "entries": [{"task": "kv_retrieval", "count": 12, "params": {"key_type": "toy", "value_type": "toy"}}],
        },
        "sft": {"count": 12, "val_fraction": 0.25},
    }
    run_schedule(schedule_from_config(mix), tmp_path / "data", model_dir, workers=1, progress=False)
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(
            "sft",
            overrides=[
                f"train_file={tmp_path / 'data' / 'sft' / 'train.jsonl'}",
                f"val_file={tmp_path / 'data' / 'sft' / 'val.jsonl'}",
                f"out_dir={tmp_path}/sft",
                f"model.path={model_dir}",
                "stage=full",
                f"init_from={model_dir}",
                "max_steps=2",
                "sft.per_device_batch_size=4",  # rows of different lengths: padding is exercised
                "sft.eval.recall_prompts=2",
                "sft.eval.max_new_tokens=8",
                "sft.eval.steps=2",
            ],
        )
    final = run_sft(OmegaConf.to_container(cfg, resolve=True))
    model = AutoModelForCausalLM.from_pretrained(final)
    tok = load_tokenizer(final)
    assert tok.pad_token_id == model.config.pad_token_id is not None
    # batched, left-padded generation with forced spans: padding and the constraint together
    backend = HFBackend(final, tok, batch_size=2, force_recall_every=3, force_recall_length=4)
    record = json.loads((tmp_path / "data" / "sft" / "val.jsonl").read_text().splitlines()[0])
    short = tok.apply_chat_template(
        [{"role": "user", "content": "a: b\nkey q"}], tokenize=False, add_generation_prompt=True
    )
    requests = [TextRequest(prompt_text=p, messages=None, max_new_tokens=12) for p in (record["prompt_text"], short)]
    gens = backend.generate(requests, GenerationSettings(max_new_tokens=12))
    assert [g.finish_reason in ("stop", "length") for g in gens] == [True, True]
    assert sum(g.spans.count for g in gens) > 0
    assert all(g.spans.verbatim == g.spans.count for g in gens)
