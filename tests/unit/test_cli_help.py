"""``--help`` of a Hydra command opens with the command's name and what it does, not Hydra's
"app is powered by Hydra"."""

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
    assert "== Configuration groups ==" in out
