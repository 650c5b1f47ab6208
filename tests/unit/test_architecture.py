"""The layer rule (ARCHITECTURE.md) and the light imports it buys. (That ``recallm.modeling`` is what
registers the model classes is tests/integration/test_model_registration.py: it loads torch.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Everything a data or reward worker, and every light command, imports (no model is loaded).
LIGHT = (
    "recallm",
    "recallm.errors",
    "recallm.io",
    "recallm.config",
    "recallm.paths",
    "recallm.tokens",
    "recallm.tiny",
    "recallm.clients",
    "recallm.cancel",
    "rewards",
    "rewards.score",
    "rewards.config",
    "data_gen",
    "data_gen.generate",
    "data_gen.traces",
    "data_gen.annotate",
    "data_gen.toy_kv",
    "data_gen.tasks.kv",
)


def _loaded_after(modules: tuple[str, ...]) -> list[str]:
    code = (
        "import importlib, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(' '.join(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_light_packages_import_neither_torch_nor_transformers():
    assert _loaded_after(LIGHT) == []


def test_the_import_graph_keeps_its_layers():
    """``lint-imports`` with the contract in pyproject.toml (also run by ``make lint``)."""
    pytest.importorskip("importlinter")
    command = Path(sys.executable).parent / "lint-imports"  # (installed with the dev extra)
    done = subprocess.run([str(command), "--no-logo", "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "Contracts: 5 kept, 0 broken" in done.stdout


def test_the_contract_names_every_top_level_module():
    """A module the layers contract does not name is not checked: each top-level module of ``recallm`` (and
    ``data_gen``, ``rewards``) has its place in it, so a new one fails here until it gets one."""
    import pkgutil
    import tomllib

    import recallm

    contract = next(
        c
        for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
        if c["id"] == "layers"
    )
    named = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    modules = {f"recallm.{m.name}" for m in pkgutil.iter_modules(recallm.__path__)} | {"data_gen", "rewards"}
    assert modules - named == set(), f"not in the layers contract of pyproject.toml: {sorted(modules - named)}"
    assert named - modules == set(), f"named in the contract but not modules: {sorted(named - modules)}"
