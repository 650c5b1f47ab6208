"""The manual builds and its commands work as written (``tests/docs_blocks.py`` says what runs how).

* ``mkdocs build --strict`` succeeds: a broken link or anchor, a page missing from the navigation, a
  reference page whose generator fails — each fails the build; the generated pages name every command and
  every config schema.
* Every shell block of README.md and docs/ runs in bash (one bash per page, blocks in order), with the
  project's commands replaced by ``tests/docs_shim.py``: quick ones run for real, the others are composed
  (Hydra: every override checked), parsed (argparse) or dry-run (``make -n``) here, without running.
* Every ``console`` block's command runs and prints the lines the page shows (the troubleshooting page's
  error lines are the commands' own).
* Blocks marked ``<!-- not run: REASON -->`` are listed by ``test_blocks_not_run_are_listed``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from unittest import mock

import pytest

from tests import REPO_ROOT
from tests.docs_blocks import ALLOWED, SBATCH_COMMANDS, SHELL, SHIMMED, Block, all_blocks, blocks, doc_files

VENV_BIN = Path(sys.executable).parent


# ------------------------------------------------------------------------------------------------ the site
@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    cli = (site / "reference" / "cli.html").read_text()
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        from docs_hooks import SCHEMAS, renamed_to
    finally:
        sys.path.pop(0)
    for name, entry in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"].items():
        if new := renamed_to(entry):  # an old name kept for one release: listed with its new name
            assert f"{name}</code>: now <code>{new}</code>" in cli, name
        else:
            assert f"usage: {name}" in cli, name
    config = (site / "reference" / "config.html").read_text()
    for _, _, ref in SCHEMAS:
        assert ref.replace(":", ".") in config, ref
    for yaml_file in (REPO_ROOT / "configs").rglob("*.yaml"):
        rel = yaml_file.relative_to(REPO_ROOT / "configs")
        name = f"configs/{rel}" if len(rel.parts) == 1 else f"{rel.parent.as_posix()}={yaml_file.stem}"
        assert name in config, name
    api = (site / "reference" / "api.html").read_text()
    assert "RecallMatcher" in api and "score_response" in api


# ----------------------------------------------------------------------------------------- shell blocks
def _pages_with_shell() -> list[Path]:
    return [p for p in doc_files() if any(b.lang in SHELL and b.not_run is None for b in blocks(p))]


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory, tiny_dir, tiny_base_dir):
    """A working directory the blocks run in (``models/tiny`` the tiny model, ``models/tiny-base`` the tiny
    model without the recall tokens; ``slurm/``, ``configs/`` and ``bench/`` of the checkout: copies of each) and a ``PATH`` of
    the shims and the allowed programs only."""
    root = tmp_path_factory.mktemp("docs-run")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    shim = REPO_ROOT / "tests" / "docs_shim.py"
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for prog in [*scripts, *SHIMMED]:
        (bin_dir / prog).write_text(f'#!/bin/bash\nexec {sys.executable} {shim} {prog} "$@"\n')
        (bin_dir / prog).chmod(0o755)
    for prog in ALLOWED:
        found = shutil.which(prog)
        if found and not (bin_dir / prog).exists():
            (bin_dir / prog).symlink_to(found)
    # copies, not links: a block may damage what it is given (the troubleshooting page truncates a `cp -r` of
    # models/tiny, and `cp -r` of a link copies the link), and the session's tiny model, which other tests
    # hold memory-mapped, or the checkout must never be what it damages
    work = root / "work"
    (work / "models").mkdir(parents=True)
    shutil.copytree(tiny_dir, work / "models" / "tiny")
    shutil.copytree(tiny_base_dir, work / "models" / "tiny-base")
    for name in ("slurm", "configs", "bench"):
        shutil.copytree(REPO_ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    return {"bin": bin_dir, "work": work}


def _script(page: Path, runnable: list[Block]) -> str:
    lines = ["set -eo pipefail"]
    for block in runnable:
        # the shims stand in for .venv/bin's commands, and for activating it
        code = re.sub(r"^(source|\.) \.venv/bin/activate\b", "true", block.code, flags=re.M).replace(".venv/bin/", "")
        lines += [f"export DOCS_BLOCK={shlex.quote(block.where)}", f"echo '>>> {block.where}' >&2", code]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with_shell(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_shell_blocks(page, shell_env, tmp_path):
    runnable = [b for b in blocks(page) if b.lang in SHELL and b.not_run is None]
    log = tmp_path / "shim.jsonl"
    log.touch()
    env = {
        "PATH": str(shell_env["bin"]), "HOME": os.environ.get("HOME", str(tmp_path)), "USER": "docs",
        "DOCS_SHIM_LOG": str(log), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "RECALLM_CACHE": os.environ.get("RECALLM_CACHE", str(Path.home() / ".cache" / "recallm")),
    }  # fmt: skip
    proc = subprocess.run(
        ["/bin/bash", "-c", _script(page, runnable)], cwd=shell_env["work"], env=env,
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stderr[-3000:]}\n{proc.stdout[-1000:]}"
    problems = []
    for line in log.read_text().splitlines():
        record = json.loads(line)
        try:
            check_without_running(record["prog"], record["args"])
        except BaseException as exc:  # noqa: BLE001  (a SystemExit of a refused line, too)
            problems.append(f"{record['block']}: {record['prog']} {' '.join(record['args'])}\n    {_why(exc)}")
    assert not problems, "\n".join(problems)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


# ----------------------------------------------------------------------------- checks that run nothing
class _Parsed(Exception):
    pass


def _parse_only(main, args: list[str]) -> None:
    """Call an argparse command's ``main`` until its parser has read ``args``: flags it does not know,
    or values of the wrong type, are argparse's exit 2."""
    real_args, real_known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    inside = []  # parse_args calls parse_known_args: the outer call decides

    def parse_known(self, argv=None, namespace=None):
        parsed = real_known(self, argv, namespace)
        if inside:
            return parsed
        raise _Parsed

    def parse(self, argv=None, namespace=None):
        inside.append(1)
        try:
            real_args(self, argv, namespace)
        finally:
            inside.pop()
        raise _Parsed

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", parse),
        mock.patch.object(argparse.ArgumentParser, "parse_known_args", parse_known),
    ):
        try:
            main(args)
        except _Parsed:
            return
    raise AssertionError("the command never parsed its arguments")


def _command_main(prog: str):
    entry = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"][prog]
    module, _, function = entry.partition(":")
    return getattr(importlib.import_module(module), function)


def check_without_running(prog: str, args: list[str]) -> None:
    """Compose, parse or dry-run one recorded command line; raise if it would be refused."""
    args = [a for a in args if a != "..."]  # the manual's "and the rest of your line"
    if prog.startswith("recallm-"):
        main = _command_main(prog)
        compose = getattr(main, "compose", None)
        if compose is not None and args[:1] != ["plot"]:
            compose(args)
        else:
            _parse_only(main, args)
    elif prog == "sbatch":
        rest = list(args)
        while rest and rest[0].startswith("-"):
            rest.pop(0)
        script, overrides = rest[0], rest[1:]
        assert (REPO_ROOT / script).is_file(), f"no such script {script}"
        command, sub = SBATCH_COMMANDS[Path(script).name]
        _command_main(command).compose([*sub, *overrides])
    elif prog == "torchrun":
        i = args.index("-m")
        importlib.import_module(args[i + 1]).main.compose(args[i + 2 :])
    elif prog == "make":
        targets = [a for a in args if not a.startswith("-") and "=" not in a]
        proc = subprocess.run(["make", "-n", "-C", str(REPO_ROOT), *targets], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    elif prog == "python":
        if args[0] == "-m":
            assert importlib.util.find_spec(args[1]) is not None, f"no module {args[1]}"
        else:
            assert (REPO_ROOT / args[0]).is_file(), f"no such file {args[0]}"
    else:
        raise AssertionError(f"no check for {prog}")


# --------------------------------------------------------------------------------------- console blocks
def _console_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang == "console" and b.not_run is None]


def _commands_and_lines(block: Block) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out and line.strip():
            out[-1][1].append(line)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("block", _console_blocks(), ids=lambda b: b.where)
def test_console_blocks_print_what_the_page_shows(block, shell_env, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(shell_env["work"], work, symlinks=True)
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "COLUMNS": "200"}
    for command, expected in _commands_and_lines(block):
        proc = subprocess.run(["/bin/bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
        printed = (proc.stdout + proc.stderr).splitlines()
        for line in expected:
            pattern = re.compile(".*".join(re.escape(part) for part in line.split("…")))  # … stands for any text
            assert any(pattern.fullmatch(got) for got in printed), (
                f"{block.where}: `{command}` no longer prints\n  {line}\nit printed:\n" + "\n".join(printed[-30:])
            )


# ------------------------------------------------------------------------------------------ not run
def test_blocks_not_run_are_listed():
    """Every block left out says why; the list is printed (``pytest -s``) for the reader of a CI log."""
    marked = [b for b in all_blocks() if b.not_run is not None]
    assert all(b.not_run.strip() for b in marked)
    assert all(b.lang in (*SHELL, "python", "console") for b in marked), [b.where for b in marked]
    for b in marked:
        print(f"not run: {b.where} ({b.lang}): {b.not_run}")
