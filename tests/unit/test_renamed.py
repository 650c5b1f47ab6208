"""MIGRATION.md is true: every new name it lists exists, every old Python name and config file is gone (no
second name for one thing), the old command names are still installed and print one notice line before
doing what the new name does."""

from __future__ import annotations

import dataclasses
import importlib
import re
import tomllib

from tests import REPO_ROOT

MIGRATION = (REPO_ROOT / "MIGRATION.md").read_text()
SCRIPTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _table(heading: str) -> list[tuple[str, str, str]]:
    """(old, new, the rest of the row) of the table under ``heading``: the first backticked name of each cell."""
    section = MIGRATION.split(heading, 1)[1].split("\n### ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            old, new = (re.match(r"`([^`]+)`", c).group(1) for c in cells[:2])
            rows.append((old, new, " ".join(cells)))
    assert rows, heading
    return rows


def _resolve(dotted: str) -> object | None:
    """The module, or the attribute (a dataclass field counts) a dotted name names; None if there is none."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            fields = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
            if hasattr(obj, name):
                obj = getattr(obj, name)
            elif name in fields:
                obj = fields[name]
            else:
                return None
        return obj
    return None


def test_the_python_names_moved():
    for old, new, row in _table("### Python names"):
        assert _resolve(new) is not None, new
        if "deprecated command" not in row:  # recallm.cli.demo: now the old command's alias, nothing else
            assert _resolve(old) is None, f"{old} still exists beside {new}"
    assert _resolve("recallm.cli.demo.run") is None and _resolve("recallm.cli.decoding_demo.run") is not None
    removed = MIGRATION.split("### Removed", 1)[1].split("\n### ", 1)[0]
    for name in re.findall(r"`([\w.]+)`", removed):
        assert _resolve(name.rsplit(".", 1)[0]) is not None and _resolve(name) is None, name


def test_the_config_files_moved():
    configs = REPO_ROOT / "configs"
    for old, new, _ in _table("### Config files"):
        if old == new:  # a section of the same file (checked below)
            continue
        assert (REPO_ROOT / new).is_file() and not (REPO_ROOT / old).exists(), (old, new)
    rlm = (configs / "rlm.yaml").read_text()
    assert "\nsft_data:" in rlm and "\nexport:" not in rlm


def test_the_old_commands_are_still_installed():
    for old, new, _ in _table("### Commands and settings you type"):
        assert new.split()[0] in SCRIPTS and old.split()[0] in SCRIPTS, (old, new)
    assert SCRIPTS["recallm-demo"] == "recallm.cli.demo:main"


def test_the_old_demo_name_prints_one_notice_then_runs_the_decoding_demo(capsys):
    from recallm.cli.demo import main

    assert main(["--help"]) in (0, None)
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "warning: recallm-demo is deprecated: use recallm-decoding-demo (renamed in 0.2.0; the old name works until "
        "0.3.0, see MIGRATION.md)"
    ]
    assert captured.out.startswith("recallm-decoding-demo: constrained recall on the tiny default model")
