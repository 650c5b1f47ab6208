"""Special files and the one atomic writer (``recallm.io``, issue 38): a device, FIFO, socket, directory or
symbolic link is never renamed over; an output where writing one makes sense (``sink=True``: the null
device, a FIFO some process reads) is written in place with no lock or manifest beside it; an input
that can block or never end is refused. Every node is made in a temporary directory (``mknod`` of a
private null device, ``mkfifo``, a bound socket), never the machine's own ``/dev``."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from recallm.errors import RecallmError
from recallm.io import (
    MANIFEST_FILE,
    atomic_dir,
    atomic_path,
    check_in_file,
    check_out_dir,
    check_out_file,
    iter_jsonl,
    lock_output,
    record_files,
    special_kind,
    verify_covered,
    verify_manifest,
    write_manifest,
    write_text_atomic,
)


def _node(path: Path, minor: int) -> Path:
    """A private character device of the memory driver (major 1: minor 3 is the null device, 5 zero)."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD)")
    return path


@pytest.fixture
def nodes(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mkfifo(dev / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(dev / "sock"))
    _node(dev / "null", 3)
    _node(dev / "zero", 5)
    (dev / "to-null").symlink_to(dev / "null")
    yield dev
    sock.close()


def _listing(dev: Path) -> dict[str, int]:
    return {p.name: stat.S_IFMT(os.lstat(p).st_mode) for p in dev.iterdir()}


@pytest.mark.parametrize("name", ["null", "zero", "fifo", "sock", "to-null"])
def test_the_atomic_writer_never_replaces_a_special_file(nodes, name):
    before = _listing(nodes)
    with pytest.raises(RecallmError, match="not a regular file|symbolic link"):
        write_text_atomic(nodes / name, "x")
    with pytest.raises(RecallmError, match="not a directory|symbolic link"):
        with atomic_dir(nodes / name) as tmp:
            (tmp / "f").write_text("x")
    assert _listing(nodes) == before  # the node is still what it was, nothing was left beside it
    assert special_kind(nodes / name) is not None


def test_a_directory_is_not_replaced_by_a_file_nor_a_file_by_a_directory(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("k")
    (tmp_path / "f").write_text("f")
    with pytest.raises(RecallmError, match="is a directory, not a regular file"):
        write_text_atomic(tmp_path / "d", "x")
    with pytest.raises(RecallmError, match="is a file, not a directory"):
        with atomic_dir(tmp_path / "f"):
            pass
    assert (tmp_path / "d" / "keep").read_text() == "k" and (tmp_path / "f").read_text() == "f"


def test_a_link_to_a_regular_file_is_written_through(tmp_path):
    (tmp_path / "real.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    write_text_atomic(tmp_path / "link.txt", "new")
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "new"


def test_the_null_device_is_a_sink_written_in_place_with_nothing_beside_it(nodes):
    before = _listing(nodes)
    null = check_out_file(nodes / "null", "output", sink=True)
    with lock_output(null, "test"), atomic_path(null, sink=True) as tmp, tmp.open("w") as out:
        assert tmp == null
        out.write("discarded\n")
    record_files(nodes, ["null"])
    assert _listing(nodes) == before  # still a character device; no lock file, no manifest in "dev"
    assert not (nodes / MANIFEST_FILE).exists()


@pytest.mark.parametrize("name", ["zero", "sock"])
def test_other_special_outputs_are_refused_even_as_sinks(nodes, name):
    with pytest.raises(RecallmError, match="not a regular file: nothing is written to it; to discard"):
        check_out_file(nodes / name, "output", sink=True)
    with pytest.raises(RecallmError, match="not a regular file"):
        with atomic_path(nodes / name, sink=True):
            pass


def test_a_fifo_sink_needs_a_reader_and_feeds_it_whole(nodes):
    fifo = nodes / "fifo"
    check_out_file(fifo, "output", sink=True)  # (no probe here: opening it would end a reader's input)
    with pytest.raises(RecallmError, match="no process reads"):
        with atomic_path(fifo, sink=True):
            pass
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    try:
        for _ in range(200):  # until the reader has the FIFO open
            try:
                with atomic_path(fifo, sink=True) as tmp, tmp.open("w") as out:
                    out.write("line 1\n")
                    out.write("line 2\n")
                break
            except RecallmError:
                threading.Event().wait(0.01)
    finally:
        reader.join(timeout=10)
    assert got == [b"line 1\nline 2\n"]


@pytest.mark.parametrize("name", ["fifo", "zero", "null", "sock", "to-null"])
def test_an_input_that_can_block_or_never_end_is_refused(nodes, name):
    with pytest.raises(RecallmError, match="not a regular file: reading it could block or never end"):
        check_in_file(nodes / name, "input", kind="jsonl")
    with pytest.raises(RecallmError, match="not a regular file"):
        list(iter_jsonl(nodes / name))


def test_an_output_directory_that_is_a_special_file(nodes):
    with pytest.raises(RecallmError, match="is a FIFO \\(named pipe\\), not a directory"):
        check_out_dir(nodes / "fifo", "out_dir")


def test_a_json_line_with_a_5000_digit_integer_is_one_line(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text('{"n": ' + "9" * 5000 + "}\n")
    with pytest.raises(RecallmError, match=r"big\.jsonl:1: not readable JSON \(Exceeds the limit"):
        list(iter_jsonl(path))


@pytest.mark.parametrize(
    "manifest",
    ['{"version": 1, "files": {"a": {"size": 1e999, "crc32": "0"}}}', "[" * 100000 + "]" * 100000, "\xff"],
    ids=["inf-size", "deep", "binary"],
)
def test_a_damaged_manifest_is_one_line(tmp_path, manifest):
    (tmp_path / "a").write_text("a")
    (tmp_path / MANIFEST_FILE).write_text(manifest, errors="surrogateescape")
    with pytest.raises(RecallmError, match="recallm_files.json unreadable"):
        verify_manifest(tmp_path)


def test_an_empty_or_partial_manifest_vouches_for_nothing_when_it_must_be_complete(tmp_path):
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"version": 1, "files": {}}))
    assert verify_manifest(tmp_path) is True  # (what it lists, it verifies: nothing)
    assert verify_manifest(tmp_path, complete=True) is False  # counts as no manifest
    write_manifest(tmp_path)
    assert verify_manifest(tmp_path, complete=True) is True
    (tmp_path / "c").write_text("c")  # a file the manifest does not cover
    assert verify_manifest(tmp_path, complete=True) is False


def test_a_subdirectory_is_verified_by_the_manifest_that_covers_it(tmp_path):
    model = tmp_path / "final"
    (model / "adapter").mkdir(parents=True)
    (model / "adapter" / "w.bin").write_bytes(b"\x00" * 64)
    (model / "config.json").write_text("{}")
    assert verify_covered(model / "adapter") is False  # no manifest covers it
    write_manifest(model)  # lists adapter/w.bin
    assert verify_covered(model / "adapter") is True
    data = bytearray((model / "adapter" / "w.bin").read_bytes())
    data[10] ^= 0xFF
    (model / "adapter" / "w.bin").write_bytes(bytes(data))
    with pytest.raises(RecallmError, match="changed since it was written"):
        verify_covered(model / "adapter")
    (model / "adapter" / "extra").write_text("x")  # a file the manifest does not list: not covered
    assert verify_covered(model / "adapter") is False


def test_atomic_dir_without_overwrite_discards_the_second_result(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RecallmError, match="is not empty: another run wrote it"):
        with atomic_dir(out, overwrite=False) as mine:
            (mine / "first").write_text("1")
            with atomic_dir(out, overwrite=False) as theirs:  # another run finishes first
                (theirs / "second").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["second"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # this run's private directory is gone
