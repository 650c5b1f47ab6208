"""recallm-serve's command and checks (the server itself runs in the vLLM tier:
tests/vllm_tier/test_serve.py)."""

from __future__ import annotations

import json
import sys

import pytest

from recallm.errors import RecallmError
from recallm.serve import PROCESSOR, ServeSettings, serve_command, served_hf_overrides


def _option(command, name):
    i = command.index(name)
    return command[i + 1]


def test_command_serves_the_base_architecture_with_the_processor(tiny_dir):
    command = serve_command(ServeSettings(tiny_dir, port=8123), ["--max-model-len", "1024", "--dtype=float32"])
    assert command[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(tiny_dir)]
    assert _option(command, "--port") == "8123" and _option(command, "--host") == "127.0.0.1"
    assert _option(command, "--served-model-name") == tiny_dir.name
    assert json.loads(_option(command, "--hf-overrides")) == {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    assert _option(command, "--logits-processors") == PROCESSOR
    assert command[-3:] == ["--max-model-len", "1024", "--dtype=float32"]  # vLLM's own options pass through


def test_user_overrides_and_processors_are_merged(tiny_dir):
    command = serve_command(
        ServeSettings(tiny_dir, served_model_name="recallm-tiny"),
        ["--hf-overrides", '{"max_position_embeddings": 4096}', "--logits-processors", "my.mod:Other", "--seed", "3"],
    )
    assert json.loads(_option(command, "--hf-overrides")) == {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "max_position_embeddings": 4096,
    }
    i = command.index("--logits-processors")
    assert command[i + 1 : i + 3] == ["my.mod:Other", PROCESSOR]
    assert command.count("--hf-overrides") == 1 and command[-2:] == ["--seed", "3"]
    assert _option(command, "--served-model-name") == "recallm-tiny"
    plain = serve_command(ServeSettings(tiny_dir, recall=False))
    assert "--logits-processors" not in plain and "--hf-overrides" in plain  # vLLM still needs the base architecture


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--hf-overrides", '{"model_type": "llama"}'], "--hf-overrides sets model_type='llama'"),
        (["--hf-overrides={oops"], "--hf-overrides is not valid JSON"),
        (["--hf-overrides", "[1]"], "--hf-overrides must be a mapping"),
        (["--port", "9"], "--port is an option of recallm-serve itself"),
    ],
)
def test_bad_arguments(tiny_dir, extra, message):
    with pytest.raises(RecallmError, match=message):
        serve_command(ServeSettings(tiny_dir), extra)


def test_cli_errors_are_one_line(tiny_base_dir, tiny_dir, tmp_path, capsys, monkeypatch):
    from recallm.cli.serve import main

    for argv, message in [
        ([str(tiny_base_dir)], "without recall tokens"),
        ([str(tmp_path / "nope")], "is not a Hugging Face model directory"),
        ([str(tiny_dir), "--port", "70000"], "--port must be in 1..65535"),
    ]:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and message in err[0], err
    assert main([str(tiny_dir), "--print-command", "--max-model-len", "512"]) == 0
    out = capsys.readouterr().out
    assert "vllm.entrypoints.cli.main serve" in out and out.strip().endswith("--max-model-len 512")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(SystemExit):
        main([str(tiny_dir)])
    assert "recallm-serve needs vLLM" in capsys.readouterr().err


def test_served_hf_overrides_accepts_mappings():
    assert served_hf_overrides({"a": 1}, {"model_type": "qwen2"}) == {"a": 1, "model_type": "qwen2"}
    assert served_hf_overrides(None, {"model_type": "qwen2"}) == {"model_type": "qwen2"}
