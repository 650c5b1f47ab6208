"""``--help`` of every command works: a Hydra command's opens with its name and what it does (not Hydra's
"app is powered by Hydra"), lists its config groups (the chosen option marked) and its main keys with the
values the rest of the line composes."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "module, first",
    [
        ("recallm.cli.sft", "recallm-sft: one stage of the SFT cold start"),
        ("recallm.cli.eval", "recallm-eval: evaluate a model on the benchmark suites"),  # run() lives in eval.app
    ],
)
def test_help_names_the_command(module, first, capsys):
    import importlib

    main = importlib.import_module(module).main
    try:
        main(["--help"])
    except SystemExit as exc:
        assert not exc.code
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(first) and "app is powered by Hydra" not in out
    assert "config groups (group=option; [the one chosen]):" in out and "main keys" in out


def test_help_lists_the_groups_and_keys_the_line_chooses(capsys):
    from recallm.cli.grpo import main as grpo
    from recallm.cli.sft import main as sft

    assert sft(["--help", "sft=own_cpu"]) == 0
    out = capsys.readouterr().out
    assert "  sft: llama3.1_8b, [own_cpu], qwen2.5_7b, smollm2_cpu, tiny_cpu, toy_cpu" in out
    assert "  model: llama3.1_8b, [own], qwen2.5_7b, tiny" in out  # sft=own_cpu chooses model=own
    assert "  sft.max_length: null" in out and "  stage: embed" in out and "eval:" not in out.split("main keys")[0]
    assert grpo(["-h", "grpo=own_cpu"]) == 0  # (Hydra does not run recallm-grpo: the help is ours all the same)
    out = capsys.readouterr().out
    assert "  grpo/platform: [cpu], gpu, vllm_cpu" in out and "  recallm.console: summary" in out
    assert "  trainer.default_local_dir: outputs/grpo/${trainer.experiment_name}" in out
    assert "--print-config prints the whole composed config" in out


@pytest.mark.parametrize("command", ["create-model", "export", "serve", "doctor"])
def test_argparse_commands_have_help(command):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).parent / f"recallm-{command}"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: recallm-{command}"), done.stderr
