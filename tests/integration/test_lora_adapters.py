"""LoRA adapter directories (``adapter_config.json`` naming a base): loaded merged (eval's HF backend),
merged by ``recallm-export``, served by ``recallm-serve`` as vLLM serves adapters, and their errors."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from recallm.errors import RecallmError


def _adapter(base_dir, out, *, token_rows: bool = False, std: float = 0.05):
    """A LoRA adapter of ``base_dir`` with non-zero weights, saved as recallm-sft saves one."""
    from tests.assets import save_adapter

    return save_adapter(base_dir, out, token_rows=token_rows, std=std)


@pytest.fixture(scope="module")
def adapter_dir(tiny_dir, tmp_path_factory):
    return _adapter(tiny_dir, tmp_path_factory.mktemp("lora") / "adapter")


def test_an_adapter_loads_merged_everywhere(adapter_dir, tiny_dir, tmp_path, capsys):
    from recallm.cli.export import main as export_main
    from recallm.eval.backends import HFBackend, check_model_dir
    from recallm.modeling import check_recallm_model, load_recallm_model
    from recallm.tokens import load_tokenizer

    assert check_recallm_model(adapter_dir)["model_type"] == "recallm_qwen2"
    assert check_model_dir(adapter_dir, constrained=True)["recall"] is True
    base, merged = load_recallm_model(tiny_dir), load_recallm_model(adapter_dir)
    assert type(merged).__name__ == "RecallQwen2ForCausalLM"
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight, base.model.layers[0].self_attn.q_proj.weight)
    backend = HFBackend(adapter_dir, load_tokenizer(adapter_dir), batch_size=1)
    for name, value in merged.state_dict().items():
        torch.testing.assert_close(backend.model.state_dict()[name], value, rtol=0, atol=0, msg=name)
    assert export_main(["--checkpoint", str(adapter_dir), "--out", str(tmp_path / "merged")]) == 0
    assert "merged into" in capsys.readouterr().out
    exported = load_recallm_model(tmp_path / "merged")
    for name, value in merged.state_dict().items():
        torch.testing.assert_close(exported.state_dict()[name], value, rtol=0, atol=0, msg=name)
    check_recallm_model(tmp_path / "merged")
    with pytest.raises(SystemExit) as exc:  # argparse's one line: --keep-adapter is for GRPO checkpoints
        export_main(["--checkpoint", str(adapter_dir), "--out", str(tmp_path / "x"), "--keep-adapter"])
    assert exc.value.code == 2 and "--keep-adapter and --step take a GRPO checkpoint" in capsys.readouterr().err


def test_serve_serves_an_adapter_with_vllms_lora(adapter_dir, tiny_dir, tmp_path):
    from recallm.serve import PROCESSOR, ServeSettings, serve_command

    command = serve_command(ServeSettings(adapter_dir, served_model_name="m"))
    assert command[:5] == [sys.executable, "-m", "recallm.serve", "serve", str(tiny_dir.resolve())]

    def option(name):
        return command[command.index(name) + 1]

    assert option("--served-model-name") == "m-base" and "--enable-lora" in command
    assert option("--lora-modules") == f"m={adapter_dir.resolve()}" and option("--max-lora-rank") == "8"
    assert option("--tokenizer") == str(adapter_dir.resolve()) and option("--logits-processors") == PROCESSOR
    assert json.loads(option("--hf-overrides"))["model_type"] == "qwen2"
    rows = _adapter(tiny_dir, tmp_path / "rows", token_rows=True)
    with pytest.raises(RecallmError, match="trains the recall token rows next to the adapter, which vLLM cannot"):
        serve_command(ServeSettings(rows))


def test_an_adapter_whose_base_is_gone_is_one_line(adapter_dir, tmp_path):
    from recallm.cli.serve import main
    from recallm.modeling import adapter_base

    moved = shutil.copytree(adapter_dir, tmp_path / "moved")
    config = json.loads((moved / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (moved / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(RecallmError, match="is for the base model .*gone, which is not a model directory here"):
        adapter_base(moved)
    with pytest.raises(SystemExit) as exc:
        main([str(moved), "--print-command"])
    assert exc.value.code == 2


def test_a_sound_adapter_passes_every_check_and_is_said_so(adapter_dir, capsys):
    """--check ends in a verdict line; the checks that refuse damaged adapters (tests/integration/adversarial:
    test_cli_fuzz's adapter cases) pass a sound one, whose merged weights are finite."""
    from recallm.cli.create_model import main
    from recallm.modeling import adapter_problem, check_recallm_model

    assert adapter_problem(adapter_dir) is None
    check_recallm_model(adapter_dir, weights=True)
    assert main(["--check", str(adapter_dir)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"ok: {adapter_dir} is a LoRA adapter of a RecaLLM model:"), last


def test_the_adapter_of_an_sft_final_is_verified_by_the_finals_manifest(tiny_dir, tmp_path):
    """recallm-sft's final/recallm_files.json lists adapter/...: a flipped byte in final/adapter's weights (still a
    readable, finite float) is refused before it is merged, loaded or served (it was merged)."""
    from recallm.modeling import adapter_problem, load_recallm_model
    from tests.assets import damaged_adapters, save_adapter

    adapters = damaged_adapters(save_adapter(tiny_dir, tmp_path / "sound"), tmp_path)
    flipped = adapters["f_flip/adapter"]
    problem = adapter_problem(flipped)
    assert problem and "adapter_model.safetensors changed since it was written (CRC-32" in problem
    with pytest.raises(RecallmError, match="changed since it was written"):
        load_recallm_model(flipped)
    expected = {
        "a_nan": "has non-finite values (NaN or inf) in tensor",
        "a_trunc": "is unreadable, truncated or not safetensors",
        "a_empty": "adapter_model.safetensors is empty",
        "a_noweights": "has no adapter weights (adapter_model.safetensors)",
        "a_shape": "down_proj is adapted as [out, in] = [128, 128], but the base model's is [128, 256]",
        "a_rank": "says r=8, but its weights have rank 4",
        "a_basenum": "names no base model (base_model_name_or_path must be a path, got 5)",
        "a_list": "must be a JSON object (PEFT's LoRA config), got a list",
        "a_notargets": "has target_modules=None",
        "a_alpha0": "has lora_alpha=0: a positive number",
        "a_binconfig": "cannot read",
        "a_deepconfig": "cannot read",
    }
    for name, said in expected.items():
        try:
            problem = adapter_problem(adapters[name])
        except RecallmError as exc:  # (a config that does not read: adapter_base says so)
            problem = str(exc)
        assert problem and said in problem and "\n" not in problem, (name, problem)
