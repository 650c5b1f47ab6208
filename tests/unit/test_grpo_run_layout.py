"""A GRPO run directory's layout has one home, ``recallm.paths``: the ``global_step_N`` names and their
parser, verl's tracker and how it reads, the metrics log, the console log, the stop file. Every reader
(resume, retention, export, the run names) takes them from there and agrees on a tracker that does not
read as a step."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from recallm.grpo.checkpoints import prepare_resume
from recallm.grpo.export import find_actor_dir
from recallm.grpo.retention import prune
from recallm.paths import (
    GRPO_LOG,
    METRICS_FILE,
    STOP_FILE,
    TRACKER,
    is_grpo_run,
    saved_steps,
    step_dir,
    step_name,
    step_of,
    tracked_step,
)

ROOT = Path(__file__).resolve().parents[2]


def test_step_names_round_trip_and_nothing_else_parses(tmp_path):
    assert step_name(7) == "global_step_7" and step_dir(tmp_path, 7) == tmp_path / "global_step_7"
    assert step_of(step_dir(tmp_path, 120)) == 120 and step_of("global_step_0") == 0
    for other in ("global_step_", "global_step_x", "corrupt-global_step_2", "global_step_2.tmp", "global_step2"):
        assert step_of(other) is None, other
    for step in (2, 10):
        step_dir(tmp_path, step).mkdir()
    (tmp_path / "global_step_3").write_text("a file, not a step")
    (tmp_path / "corrupt-global_step_4").mkdir()  # moved aside by a resume
    assert saved_steps(tmp_path) == {2: tmp_path / "global_step_2", 10: tmp_path / "global_step_10"}
    assert saved_steps(tmp_path / "missing") == {}
    assert is_grpo_run(tmp_path) and not is_grpo_run(tmp_path / "global_step_2")


def _tracker(root: Path, kind: str) -> None:
    tracker = root / TRACKER
    if kind == "a number":
        tracker.write_text("12\n")
    elif kind == "empty":
        tracker.write_text("")  # a kill while verl rewrote it
    elif kind == "binary":
        tracker.write_bytes(b"\xff\xfe\x00\x01")
    elif kind == "text":
        tracker.write_text("twelve")
    elif kind == "a directory":
        tracker.mkdir()


@pytest.mark.parametrize(
    "kind, step", [("absent", None), ("a number", 12), ("empty", -1), ("binary", -1), ("text", -1), ("a directory", -1)]
)
def test_the_tracker_reads_as_a_step_none_or_unreadable(tmp_path, kind, step):
    _tracker(tmp_path, kind)
    assert tracked_step(tmp_path) == step
    assert is_grpo_run(tmp_path) == (kind not in ("absent", "a directory"))


def _run(root: Path, *steps: int) -> None:
    for step in steps:
        actor = step_dir(root, step) / "actor"
        (actor / "huggingface").mkdir(parents=True)
        (actor / "model_world_size_1_rank_0.pt").write_bytes(b"m")
        (actor / "optim_world_size_1_rank_0.pt").write_bytes(b"o")


@pytest.mark.parametrize("kind", ["empty", "binary", "text"])
def test_every_reader_takes_an_unreadable_tracker_as_naming_the_newest_step(tmp_path, kind):
    for what in ("resume", "export", "prune"):
        root = tmp_path / what
        root.mkdir()
        _run(root, 1, 2)
        _tracker(root, kind)
        if what == "resume":  # (steps saved before checksums: resumed unverified)
            assert prepare_resume(root).step == 2 and tracked_step(root) == 2
        elif what == "export":
            assert find_actor_dir(root) == step_dir(root, 2) / "actor"
        else:  # the unreadable tracker protects no step: only the newest is kept
            assert prune(root, keep=1) == [str(step_dir(root, 1))]


def test_a_directory_where_the_tracker_belongs_is_read_as_none_by_export_and_retention(tmp_path):
    _run(tmp_path, 1, 2)
    _tracker(tmp_path, "a directory")
    assert find_actor_dir(tmp_path) == step_dir(tmp_path, 2) / "actor"
    assert prune(tmp_path, keep=1) == [str(step_dir(tmp_path, 1))]


def _code_strings(path: Path) -> list[str]:
    """The string constants of a module's code (docstrings left out), f-strings' literal parts included."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_the_layout_is_named_in_recallm_paths_alone():
    """A file name of the run directory as a whole string, or the step directory's prefix as code uses it
    (``f"global_step_{n}"``, a glob, a pattern), appears in no module of ``recallm`` but ``recallm.paths``
    (prose such as ``global_step_N`` in a message is not a use)."""
    names = {TRACKER, METRICS_FILE, GRPO_LOG, STOP_FILE}
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "recallm").rglob("*.py")):
        for text in _code_strings(path):
            prefix_use = text.endswith("global_step_") or "global_step_*" in text or "global_step_(" in text
            if text in names or prefix_use:
                found.setdefault(text, []).append(str(path.relative_to(ROOT)))
    assert set(found) >= names | {"global_step_"}
    assert {text: where for text, where in found.items() if where != ["recallm/paths.py"]} == {}
