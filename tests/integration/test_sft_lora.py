"""SFT stage ``full`` as a LoRA finetune (``sft.lora.*``): the masked loss under PEFT, what trains,
the merged ``final`` and its adapter, resume, the token rows, the config's errors."""

from __future__ import annotations

import json

import pytest
import torch

from recallm.errors import RecallmError
from recallm.sft.train import find_checkpoint, run_sft
from tests.integration.test_sft import _cfg, sft_data  # noqa: F401  (the module-scoped data fixture)

LORA = ["stage=full", "sft.lora.rank=4", "sft.lora.alpha=8", "sft.eval.steps=1000"]


def _rows(model_dir):
    from recallm.tokens import RecallTokenIds

    return list(RecallTokenIds.from_config(_load(model_dir).config).as_config().values())


def _load(path):
    from recallm.modeling import load_recallm_model

    return load_recallm_model(path)


def test_the_adapter_sees_the_masked_loss(sft_data, tiny_dir):  # noqa: F811
    """PEFT calls the masked model's forward: with B = 0 (PEFT's init) the adapter's loss is the masked
    model's exactly, and it differs from the unmasked loss on traces with recall spans."""
    from recallm.sft.data import SFTCollator, load_sft_file
    from recallm.sft.lora import apply_lora
    from recallm.sft.settings import LoraSettings
    from recallm.tokens import load_tokenizer

    tok = load_tokenizer(tiny_dir)
    data, _ = load_sft_file(sft_data[0], tok, max_length=4096, vocab_size=4096)
    batch = SFTCollator(tok.pad_token_id)([data[i] for i in range(4)])
    base = _load(tiny_dir).eval()
    with torch.no_grad():
        masked = base(**batch).loss
        base.config.recall_constrained = False
        unmasked = base(**batch).loss
        base.config.recall_constrained = True
        base.label_logits_only(True)
        peft = apply_lora(base, LoraSettings(rank=4), _rows(tiny_dir), base_dir=tiny_dir, gradient_checkpointing=False)
        adapted = peft(**batch).loss
    assert type(peft).__name__ == "PeftModelForCausalLM"
    torch.testing.assert_close(adapted, masked, rtol=1e-5, atol=1e-6)
    assert abs(float(masked) - float(unmasked)) > 1e-4  # the mask matters on this batch
    trainable = {n for n, p in peft.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def test_lora_stage_trains_the_adapter_only_and_writes_a_merged_final(tmp_path, sft_data, tiny_dir, capsys):  # noqa: F811
    final = run_sft(
        _cfg(tmp_path, sft_data, tiny_dir, *LORA, f"init_from={tiny_dir}", "max_steps=12", "sft.full.lr=5e-3")
    )
    assert "[recallm] LoRA on (sft.lora.rank=4, alpha=" in capsys.readouterr().out  # the console says so (issue 38)
    from recallm.io import verify_covered
    from recallm.modeling import adapter_problem

    listed = json.loads((final / "recallm_files.json").read_text())["files"]
    assert "adapter/adapter_model.safetensors" in listed and "adapter/adapter_config.json" in listed
    assert verify_covered(final / "adapter") and adapter_problem(final / "adapter") is None
    info = json.loads((final / "recallm_sft.json").read_text())
    assert info["lora"]["rank"] == 4 and info["steps"] == 12
    history = json.loads((final.parent / "checkpoint-12" / "trainer_state.json").read_text())["log_history"]
    losses = [h["loss"] for h in history if "loss" in h]
    assert sum(losses[-3:]) / 3 < 0.95 * sum(losses[:3]) / 3, losses
    assert (final.parent / "checkpoint-12" / "adapter_model.safetensors").is_file()
    assert not (final.parent / "checkpoint-12" / "model.safetensors").exists()  # checkpoints hold the adapter
    from recallm.modeling import adapter_base, check_recallm_model

    check_recallm_model(final)
    check_recallm_model(final / "adapter")  # the adapter alone: its base's config, its own tokenizer
    assert adapter_base(final / "adapter") == tiny_dir.resolve()
    base, merged, adapter = _load(tiny_dir), _load(final), _load(final / "adapter")
    assert type(merged).__name__ == "RecallQwen2ForCausalLM"
    rows = _rows(tiny_dir)
    emb = merged.get_input_embeddings().weight
    assert torch.equal(emb, base.get_input_embeddings().weight)  # token rows frozen (token_rows=false)
    changed = [n for n, p in merged.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert changed and all(("proj" in n) for n in changed), changed  # only the adapted linear layers moved
    for name, value in merged.state_dict().items():
        torch.testing.assert_close(value, adapter.state_dict()[name], rtol=0, atol=1e-6, msg=name)
    assert rows  # (used by the token-row test)


def test_lora_resume_gives_the_same_adapter(tmp_path, sft_data, tiny_dir):  # noqa: F811
    from transformers import TrainerCallback

    class Kill(Exception):
        pass

    class KillAfter(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 4:
                raise Kill

    common = [*LORA, f"init_from={tiny_dir}", "max_steps=6", "sft.save_steps=2"]
    whole = run_sft(_cfg(tmp_path / "a", sft_data, tiny_dir, *common))
    cfg = _cfg(tmp_path / "b", sft_data, tiny_dir, *common)
    with pytest.raises(Kill):
        run_sft({**cfg, "_callbacks": [KillAfter()]})
    assert find_checkpoint(tmp_path / "b" / "run" / "full").name == "checkpoint-4"
    resumed = run_sft(cfg)
    a, b = _load(whole).state_dict(), _load(resumed).state_dict()
    for name, x in a.items():
        torch.testing.assert_close(x, b[name], rtol=1e-5, atol=1e-6, msg=name)
    # a rerun after everything was saved writes `final` again from the last checkpoint's adapter
    import shutil

    shutil.rmtree(resumed)
    again = run_sft(cfg)
    for name, x in _load(again).state_dict().items():
        torch.testing.assert_close(x, b[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("tied", [True, False])
def test_token_rows_train_next_to_the_adapter(tmp_path, sft_data, tiny_dir, tiny_untied_dir, tied):  # noqa: F811
    model_dir = tiny_dir if tied else tiny_untied_dir
    final = run_sft(
        _cfg(
            tmp_path,
            sft_data,
            model_dir,
            *LORA,
            f"init_from={model_dir}",
            "max_steps=3",
            "sft.full.lr=5e-3",
            "sft.lora.token_rows=true",
        )
    )
    base, merged = _load(model_dir), _load(final)
    rows = _rows(model_dir)
    other = torch.ones(base.config.vocab_size, dtype=torch.bool)
    other[rows] = False
    matrices = [(m.get_input_embeddings().weight, n) for m, n in ((base, "in"), (merged, "in"))]
    before, after = matrices[0][0], matrices[1][0]
    assert not torch.equal(after[rows], before[rows])
    assert torch.equal(after[other], before[other])
    if not tied:
        out_before, out_after = base.get_output_embeddings().weight, merged.get_output_embeddings().weight
        assert not torch.equal(out_after[rows], out_before[rows])
        assert torch.equal(out_after[other], out_before[other])


def test_lora_config_errors(tmp_path, sft_data, tiny_dir):  # noqa: F811
    with pytest.raises(RecallmError, match=r"sft.lora.rank must be >= 0, got -1"):
        run_sft(_cfg(tmp_path, sft_data, tiny_dir, "stage=full", "sft.lora.rank=-1"))
    with pytest.raises(RecallmError, match="target_modules must be all-linear or a list"):
        run_sft(_cfg(tmp_path, sft_data, tiny_dir, "stage=full", "sft.lora.rank=4", "sft.lora.target_modules=[]"))
    with pytest.raises(RecallmError, match=r"sft.lora.dropout must be <= 1"):
        run_sft(_cfg(tmp_path, sft_data, tiny_dir, "stage=full", "sft.lora.dropout=2.0"))
    # issue 38: a rank the model's width cannot use (before the adapter is allocated), an alpha that scales it to 0
    with pytest.raises(RecallmError, match=r"sft.lora.rank=129 is above the model's width \(hidden_size 128\)"):
        run_sft(_cfg(tmp_path, sft_data, tiny_dir, "stage=full", f"init_from={tiny_dir}", "sft.lora.rank=129"))
    with pytest.raises(RecallmError, match=r"sft.lora.alpha must be > 0"):
        run_sft(_cfg(tmp_path, sft_data, tiny_dir, "stage=full", "sft.lora.rank=4", "sft.lora.alpha=0"))
