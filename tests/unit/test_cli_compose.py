"""``main.compose(argv)`` of a Hydra command: the config a command line composes, every override checked,
nothing run and nothing written (the manual's tests check its command lines with it)."""

from __future__ import annotations

import pytest

from recallm.errors import RecallmError


def test_compose_returns_the_composed_config_and_writes_nothing(tmp_path, monkeypatch):
    from recallm.cli.sft import main

    monkeypatch.chdir(tmp_path)
    cfg = main.compose(["sft=own_cpu", "model.path=models/smollm2", "stage=full", "sft.full.steps=2"])
    assert cfg.sft.full.steps == 2 and cfg.model.path == "models/smollm2" and cfg.stage == "full"
    assert list(tmp_path.iterdir()) == []  # no Hydra output directory, no lock, no data


@pytest.mark.parametrize(
    "argv, message",
    [
        (["+sft.lr=1"], "unknown setting sft.lr"),
        (["foo=1"], "Could not override 'foo'"),
        (["sft.embed.lr=abc"], "sft.embed.lr"),
    ],
)
def test_compose_refuses_what_the_command_refuses(argv, message):
    from recallm.cli.sft import main

    with pytest.raises(RecallmError, match=message):
        main.compose(argv)


def test_compose_follows_modes_and_subcommands():
    from recallm.cli.rlm import main

    assert main.compose(["show", "outputs/rlm/x.jsonl"]).trajectory == "outputs/rlm/x.jsonl"
    assert main.compose(["train", "trainer.total_training_steps=3"]).trainer.total_training_steps == 3
    with pytest.raises(RecallmError, match="unknown setting"):
        main.compose(["train", "+recallm.nonsense=1"])


def test_compose_reads_the_line_as_main_does_old_names_included(capsys):
    from recallm.cli.rlm import main

    assert main.compose(["to-sft", "sft_data.tokenizer_path=/models/q"]).sft_data.tokenizer_path == "/models/q"
    assert capsys.readouterr().err == ""
    # the names before 0.2.0 (MIGRATION.md): rewritten, with the one-line notice
    assert main.compose(["export", "export.tokenizer_path=/models/q"]).sft_data.tokenizer_path == "/models/q"
    assert "recallm-rlm export is deprecated" in capsys.readouterr().err


def test_compose_leaves_the_commands_own_flags_out():
    from recallm.cli.pipeline import main

    assert main.compose(["experiment=tiny_cpu", "--status"]).experiment.name == "tiny_cpu"


def test_a_subcommand_without_a_config_says_so():
    from recallm.cli.grpo import main

    with pytest.raises(RecallmError, match="plot composes no config"):
        main.compose(["plot", "--out", "x"])
