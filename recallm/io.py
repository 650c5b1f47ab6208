"""Files, written once for the whole project: atomic writes, the JSONL reader, output-directory
locks, what kind of path a setting names, and checksummed file manifests.

* **Atomic writes.** ``replace(tmp, path)`` is the one atomic rename: it fsyncs ``tmp`` (a file,
  or a directory and everything in it), renames it over ``path`` and fsyncs the directory that
  holds ``path``, so that after a crash or a power cut ``path`` is either the old content or the
  new, never a mix or an empty file. ``atomic_path`` (write to a temporary name, then ``replace``),
  ``write_text_atomic`` / ``write_json_atomic`` and ``atomic_dir`` (a whole directory, e.g. a
  model's ``final``) are built on it.
* **JSONL.** ``write_jsonl`` (atomic); ``iter_jsonl`` / ``read_jsonl``: a missing file, a directory, a parquet or other
  binary file, a line that is not UTF-8 or not JSON are each a one-line ``RecallmError`` naming
  the file (and line).
* **Locks.** ``lock_dir(dir, what)``: one writer per output directory (``flock`` on
  ``<dir>/.recallm.lock``, released by the kernel when the process dies, so a killed run leaves no
  stale lock); a second writer — another process, or another thread — gets a ``RecallmError``
  naming the holder. Re-entrant within one thread. The lock file is removed when released, and
  so are the directories taking the lock created, if left empty. ``lock_output(file, what)``: the same for one
  output file (``.<name>.recallm.lock`` next to it). A lock path that is a directory is one line.
* **Kinds of path.** ``check_out_dir`` / ``check_out_file`` / ``check_in_file``: a setting that
  names an output directory but points at a file (or under one), an input that is a directory or
  a parquet file where JSONL is read — a one-line error before anything is written.
* **Special files** (``special_kind``: a character or block device, a FIFO, a socket). The atomic
  writer never renames anything over one, nor over a directory or a symbolic link (``replace``
  refuses; a link to a regular file is written through: the file it names is replaced). An input that
  is one is refused (``check_in_file``: a FIFO blocks until someone writes, a device may never end).
  An output where writing to one makes sense (``sink=True``: ``recallm-score output=/dev/null``) may
  be the null device or a FIFO some process reads (``SINKS``): ``atomic_path(path, sink=True)``
  then hands the path itself to a plain open, and no lock (``lock_output``) or manifest entry
  (``record_files``) is written beside it.
* **Manifests.** ``write_manifest(dir)`` records every file's size and CRC-32 in
  ``recallm_files.json`` (fsyncing each file on the way); ``verify_manifest(dir)`` checks them, so
  a truncated or overwritten file of a checkpoint is found before it is used. Artifacts written one
  at a time into a shared directory (data shards and outputs, score files) are added to it with
  ``record_files`` (serialised between processes) and checked where they are read with
  ``verify_file`` / ``file_problem``: the one checksum of every artifact we write and read back.
  ``verify_manifest(dir, complete=True)`` counts a manifest that does not list every file as none (a GRPO
  step's); ``verify_covered(dir)`` checks a directory against the manifest that covers it, its own or its
  parent's entries under ``<name>/`` (a LoRA adapter inside a model's ``final``).

Standard library only (no torch): ``data_gen`` and ``rewards`` may import it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import socket
import stat
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError

__all__ = [
    "move_aside",
    "fsync_path",
    "replace",
    "atomic_path",
    "atomic_dir",
    "write_text_atomic",
    "write_json_atomic",
    "iter_jsonl",
    "read_jsonl",
    "write_jsonl",
    "lock_dir",
    "check_unlocked",
    "lock_output",
    "check_output_unlocked",
    "check_out_dir",
    "check_out_file",
    "check_in_file",
    "special_kind",
    "SINKS",
    "write_manifest",
    "verify_manifest",
    "record_files",
    "forget_files",
    "file_problem",
    "verify_file",
    "verify_covered",
    "MANIFEST_FILE",
    "LOCK_FILE",
]

log = logging.getLogger(__name__)

MANIFEST_FILE = "recallm_files.json"
LOCK_FILE = ".recallm.lock"
_MANIFEST_LOCK = ".recallm_files.lock"
_CHUNK = 8 << 20


# ------------------------------------------------------------------------------ atomic writes
def fsync_path(path: str | Path) -> None:
    """fsync one file or directory (by opening it read-only: enough on Linux and macOS)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for root, _, files in os.walk(path, topdown=False):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_path(root)


def _replaceable(path: Path, directory: bool) -> None:
    """Refuse to rename over ``path`` unless it is missing or what is written (a regular file, a
    directory): never over a device, a FIFO, a socket or a symbolic link (module doc)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise RecallmError(f"{path} is a symbolic link: it is not replaced; give the path it points to")
    kind = special_kind(path) or ("a directory" if stat.S_ISDIR(mode) else "a file")
    if (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)) is False:
        raise RecallmError(f"{path} is {kind}, not a {'directory' if directory else 'regular file'}: it is not replaced")


def replace(tmp: str | Path, path: str | Path, *, overwrite: bool = True) -> Path:
    """Atomically put ``tmp`` (a file or a directory, completely written) at ``path``: fsync ``tmp``,
    rename it, fsync ``path``'s directory. A directory replaces an existing one through a rename
    aside (the old one is deleted after the new one is in place); with ``overwrite=False`` it takes
    ``path`` only while that is missing or empty (another run's result there: a ``RecallmError``, and
    ``tmp`` stays). ``path`` must be missing or of the same kind as ``tmp`` (a regular file, a
    directory): a device, FIFO, socket or symbolic link there is a ``RecallmError``, and nothing is renamed."""
    tmp, path = Path(tmp), Path(path)
    _replaceable(path, tmp.is_dir())
    if tmp.is_dir() and not overwrite:
        _fsync_tree(tmp)
        try:
            os.rename(tmp, path)  # (onto an empty directory it succeeds; onto a non-empty one it fails)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise _taken(path) from None
            raise
        fsync_path(path.parent)
        return path
    if tmp.is_dir():
        _fsync_tree(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}-{secrets.token_hex(3)}")
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_path(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return path
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)
    return path


def _alive(pid: str) -> bool:
    """Whether process ``pid`` (of this host) still runs; a name that is no pid counts as alive."""
    try:
        os.kill(int(pid), 0)
    except ValueError:
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}")


class atomic_path:
    """``with atomic_path(p) as tmp:`` write to ``tmp``; it replaces ``p`` (``replace``: fsync'd) only
    if the block succeeds, and is removed if it fails. ``p`` a symbolic link to a regular file: the
    file it names is replaced. ``p`` a special file: a ``RecallmError`` — unless ``sink`` and it is
    one of :data:`SINKS`: then ``tmp`` is ``p`` itself, written through a plain open (module doc)."""

    def __init__(self, path: str | Path, *, sink: bool = False) -> None:
        self.path = Path(path)
        if self.path.is_symlink() and self.path.is_file():  # write what the link names, keep the link
            self.path = Path(os.path.realpath(self.path))
        self.sink = sink
        self.keeper: int | None = None  # a FIFO's write end, held open while the block writes
        self.tmp = _tmp_name(self.path)
        self.made: list[Path] = []

    def __enter__(self) -> Path:
        if special_kind(self.path) is not None:
            self.keeper = _open_sink(self.path, "output") if self.sink else _refuse_special(self.path, "output")
            self.tmp = self.path
            return self.tmp
        self.made = [p for p in self.path.parents if not p.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.tmp == self.path:  # a sink: written in place
            if self.keeper is not None:
                os.close(self.keeper)
            return
        if exc_type is None:
            replace(self.tmp, self.path)
            return
        self.tmp.unlink(missing_ok=True)
        for path in self.made:  # the directories made for it, if left empty (deepest first)
            try:
                path.rmdir()
            except OSError:
                break


def _taken(path: Path) -> RecallmError:
    return RecallmError(
        f"{path} is not empty: another run wrote it (this run's result is discarded, nothing of theirs is touched); "
        "choose another output directory"
    )


@contextlib.contextmanager
def atomic_dir(path: str | Path, *, overwrite: bool = True) -> Iterator[Path]:
    """``with atomic_dir(d) as tmp:`` fill the directory ``tmp`` (a name of this process's own); it
    replaces ``d`` whole if the block succeeds — with ``overwrite=False`` only a missing or empty ``d``
    (refused before the block and again at the rename: two runs writing one new output directory, the
    second's is discarded, the first's untouched). Temporary directories left by killed earlier
    attempts (their process gone) are removed first."""
    path = Path(path)
    _replaceable(path, directory=True)  # (before anything is written)
    if not overwrite and path.is_dir() and any(path.iterdir()):
        raise _taken(path)
    for stale in path.parent.glob(f".{path.name}.tmp-*") if path.parent.is_dir() else ():
        if not _alive(stale.name.rsplit("-", 2)[-2]):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = _tmp_name(path)  # this run's own name: two runs writing one directory never share it
    tmp.mkdir(parents=True)
    try:
        yield tmp
        replace(tmp, path, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json_atomic(path: str | Path, value: Any, *, indent: int | None = 2, sort_keys: bool = True) -> Path:
    """``value`` as JSON (and a final newline), atomically."""
    return write_text_atomic(path, json.dumps(value, indent=indent, sort_keys=sort_keys) + "\n")


# ------------------------------------------------------------------------------------- JSONL
def iter_jsonl(path: str | Path, what: str = "JSONL file") -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line (see module doc for the errors)."""
    path = Path(path)
    check_in_file(path, what, kind="jsonl")
    verify_file(path)  # the checksum recorded when it was written, if its directory's manifest has one
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise RecallmError(f"{path}:{number}: not UTF-8 text (a JSONL file is expected)") from None
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecallmError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            except ValueError as exc:  # an integer of more than 4,300 digits (Python's int conversion limit)
                raise RecallmError(f"{path}:{number}: not readable JSON ({str(exc).split(';')[0]})") from None
            except RecursionError:
                raise RecallmError(f"{path}:{number}: JSON nested too deeply") from None


def read_jsonl(path: str | Path, what: str = "JSONL file") -> list[Any]:
    return [value for _, value in iter_jsonl(path, what)]


def write_jsonl(records: Iterable[Any], path: str | Path) -> Path:
    """One JSON value a line, atomically (``atomic_path``)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    return Path(path)


# ------------------------------------------------------------------------------- kinds of path
def _file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` if it is not a directory."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


_SPECIAL = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
}
#: the special files an output with ``sink=True`` may be (module doc): written through a plain open
SINKS = ("the null device", "a FIFO some process reads")


def special_kind(path: str | Path) -> str | None:
    """What ``path`` is (through symbolic links) when it is neither a regular file nor a directory:
    ``"a character device"``, ``"a block device"``, ``"a FIFO (named pipe)"``, ``"a socket"``; None for
    a regular file, a directory or a path that does not exist."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return _SPECIAL.get(stat.S_IFMT(mode))


def _is_null_device(path: Path) -> bool:
    try:
        st, null = os.stat(path), os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev


def _refuse_special(path: Path, name: str, *, sink: bool = False) -> None:
    kind = special_kind(path)
    hint = "; to discard the output give the null device (/dev/null)" if sink else ""
    raise RecallmError(f"{name} {path} is {kind}, not a regular file: nothing is written to it{hint}")


def _open_sink(path: Path, name: str) -> int | None:
    """Check that ``path`` is one of :data:`SINKS` (else a ``RecallmError``); for a FIFO, open its write end
    without blocking (no reader: a ``RecallmError``) and return it, to be held open while the output is
    written (closing a probe would end the reader's input)."""
    if _is_null_device(path):
        return None
    if special_kind(path) != _SPECIAL[stat.S_IFIFO]:
        _refuse_special(path, name, sink=True)
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise RecallmError(f"{name} {path} is a FIFO that no process reads: writing would block; start its reader first") from None
        raise RecallmError(f"{name} {path} cannot be opened ({exc.strerror})") from None


def _out_path(path: str | Path | None, name: str, *, directory: bool, sink: bool = False) -> Path:
    kind = "directory" if directory else "file"
    if path is None or str(path) == "":
        raise RecallmError(f"{name} must be a {kind} path, got {path!r}")
    path = Path(str(path))
    special = special_kind(path)
    if special is not None and directory:
        raise RecallmError(f"{name} {path} is {special}, not a directory")
    if special is not None:
        if not (sink and (_is_null_device(path) or special == _SPECIAL[stat.S_IFIFO])):
            _refuse_special(path, name, sink=sink)
        return path  # (a FIFO's reader is checked when it is written: atomic_path)
    if path.exists() and path.is_dir() != directory:
        raise RecallmError(f"{name} {path} is a {'file' if directory else 'directory'}, not a {kind}")
    blocker = _file_above(path)
    if blocker is not None:
        raise RecallmError(f"{name} {path}: {blocker} is a file, not a directory")
    return path


def check_out_dir(path: str | Path | None, name: str) -> Path:
    """``path`` can be (or become) a directory: not an existing file, not under one."""
    return _out_path(path, name, directory=True)


def check_out_file(path: str | Path | None, name: str, *, sink: bool = False) -> Path:
    """``path`` can be (or become) a file: not an existing directory, not under a file, not a special
    file — except, with ``sink``, one of :data:`SINKS` (module doc)."""
    return _out_path(path, name, directory=False, sink=sink)


_MAGIC = {b"PAR1": "a parquet file", b"PK\x03\x04": "a zip archive", b"\x1f\x8b": "a gzip file"}


def check_in_file(path: str | Path | None, name: str, *, kind: str | None = None, hint: str = "") -> Path:
    """``path`` is an existing, readable file — of ``kind`` ``"jsonl"`` (text, not parquet or other
    binary data) or ``"parquet"`` when given. ``hint`` ends the message of a missing file."""
    if path is None or str(path) == "":
        raise RecallmError(f"{name} must be a file path, got {path!r}")
    path = Path(path)
    if not path.exists():
        raise RecallmError(f"{name} {path} does not exist{'; ' + hint if hint else ''}")
    if path.is_dir():
        raise RecallmError(f"{name} {path} is a directory, not a file")
    special = special_kind(path)
    if special is not None:  # (a FIFO blocks until someone writes; /dev/zero never ends)
        raise RecallmError(
            f"{name} {path} is {special}, not a regular file: reading it could block or never end; copy it to a file"
        )
    if kind is None:
        return path
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise RecallmError(f"{name} {path} cannot be read ({exc.strerror})") from None
    found = next((what for magic, what in _MAGIC.items() if head.startswith(magic)), None)
    if kind == "jsonl":
        if found is None and b"\x00" in head:
            found = "a binary file"
        if found is not None:
            raise RecallmError(f"{name} {path} is {found}, not JSONL (one JSON object per line)")
    elif kind == "parquet" and not head.startswith(b"PAR1"):
        raise RecallmError(f"{name} {path} is not a parquet file")
    return path


# ---------------------------------------------------------------------------------------- locks
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
_HELD: dict[tuple[Path, int], list[int]] = {}  # (lock file, thread) -> [fd, depth]
_HELD_GUARD = threading.Lock()


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "an unknown process"
    except OSError:
        return "an unknown process"


def _busy(directory: Path, holder: str) -> RecallmError:
    return RecallmError(
        f"{directory} is in use by another writer ({holder}); wait for it to finish or choose another output directory"
    )


def _open_lock(lock: Path) -> int:
    if lock.is_dir():
        raise RecallmError(f"{lock} is a directory, not a lock file; remove it")
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RecallmError(f"cannot open the lock file {lock} ({exc.strerror})") from None


@contextlib.contextmanager
def _flock(lock: Path, subject: Path, what: str) -> Iterator[None]:
    """Hold the ``flock`` of the file ``lock`` for ``subject`` (module doc: re-entrant per thread)."""
    key = (lock.resolve(), threading.get_ident())
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is not None:
            held[1] += 1
    if held is not None:
        try:
            yield
        finally:
            with _HELD_GUARD:
                held[1] -= 1
        return
    for _ in range(3):
        fd = _open_lock(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno in _BUSY:
                raise _busy(subject, holder) from None
            log.warning("cannot lock %s (%s): a second writer would not be detected", subject, exc.strerror)
            yield  # a file system without locks: go on unlocked
            return
        try:  # the file may have been unlinked by its previous holder meanwhile: lock the one on disk
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    else:
        raise _busy(subject, "a writer that keeps replacing its lock file")
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what}, pid {os.getpid()} on {socket.gethostname()}, since {stamp}\n".encode(), 0)
        with _HELD_GUARD:
            _HELD[key] = [fd, 1]
        yield
    finally:
        with _HELD_GUARD:
            _HELD.pop(key, None)
        with contextlib.suppress(OSError):
            lock.unlink()  # (still held: a process that opened it meanwhile finds another inode on disk)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def _made(directory: Path) -> Iterator[None]:
    """``directory`` created (with its parents) for the block; those it created are removed again
    if the block leaves them empty (a refused or failed run leaves nothing behind)."""
    new = [p for p in (directory, *directory.parents) if not p.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    try:
        yield
    finally:
        for path in new:  # deepest first
            try:
                path.rmdir()
            except OSError:
                break


@contextlib.contextmanager
def lock_dir(directory: str | Path, what: str) -> Iterator[Path]:
    """Hold the write lock of ``directory`` (created if needed) for the block; ``what`` names this
    writer in the message a second one gets (module doc)."""
    directory = Path(directory)
    with _made(directory), _flock(directory / LOCK_FILE, directory, what):
        yield directory


def _probe(lock: Path, subject: Path) -> None:
    if lock.is_dir():
        raise RecallmError(f"{lock} is a directory, not a lock file; remove it")
    if not lock.is_file():
        return
    if (lock.resolve(), threading.get_ident()) in _HELD:
        return
    try:
        fd = os.open(lock, os.O_RDWR)  # (NFS emulates flock with write locks)
    except OSError:
        return  # not ours to probe: the run itself finds out
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _BUSY:
                raise _busy(subject, _holder(fd)) from None
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _output_lock(path: Path) -> Path:
    return path.parent / f".{path.name}.recallm.lock"


@contextlib.contextmanager
def lock_output(path: str | Path, what: str) -> Iterator[Path]:
    """One writer per output *file* (``path``): ``lock_dir``'s lock, on ``.<name>.recallm.lock``
    next to it, so that two runs writing different files of one directory both go on."""
    path = Path(path)
    if special_kind(path) is not None:  # a sink (the null device, a FIFO): no lock file lands beside it
        yield path
        return
    with _made(path.parent), _flock(_output_lock(path), path, what):
        yield path


def check_output_unlocked(path: str | Path) -> None:
    """``check_unlocked`` for ``lock_output``'s lock of one file."""
    path = Path(path)
    _probe(_output_lock(path), path)


def move_aside(path: str | Path, prefix: str = "corrupt-") -> Path:
    """Rename ``path`` to ``<prefix><name>`` beside it (``-1``, ``-2``, ... when taken), fsyncing the
    directory: a damaged artifact is kept, out of the way of the run that would read it."""
    path = Path(path)
    target = path.with_name(f"{prefix}{path.name}")
    n = 1
    while target.exists():
        target = path.with_name(f"{prefix}{path.name}-{n}")
        n += 1
    os.replace(path, target)
    fsync_path(path.parent)
    return target


def check_unlocked(directory: str | Path) -> None:
    """Raise the ``lock_dir`` error if another writer holds ``directory`` now (writes nothing: for
    checks before a run starts; the run itself takes the lock)."""
    directory = Path(directory)
    _probe(directory / LOCK_FILE, directory)


# ------------------------------------------------------------------------------------ manifests
def _crc(path: Path, sync: bool) -> tuple[int, str]:
    crc, size = 0, 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
        if sync:
            os.fsync(f.fileno())
    return size, f"{crc:08x}"


def _files(directory: Path) -> list[str]:
    return sorted(
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and p.name not in (MANIFEST_FILE, _MANIFEST_LOCK, LOCK_FILE)
    )


def _checksums(directory: Path, names: list[str], *, sync: bool = False) -> dict[str, tuple[int, str]]:
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:  # zlib and reads release the GIL
        return dict(zip(names, pool.map(lambda n: _crc(directory / n, sync), names), strict=True))


def write_manifest(directory: str | Path) -> Path:
    """Record the size and CRC-32 of every file under ``directory`` in ``MANIFEST_FILE`` (fsyncing
    each file first); the manifest itself is written atomically."""
    directory = Path(directory)
    sums = _checksums(directory, _files(directory), sync=True)
    files = {name: {"size": size, "crc32": crc} for name, (size, crc) in sums.items()}
    return write_json_atomic(directory / MANIFEST_FILE, {"version": 1, "files": files})


@contextlib.contextmanager
def _manifest_lock(directory: Path) -> Iterator[None]:
    """Serialise the read-modify-write of one directory's manifest between processes (blocking:
    each holder only checksums its own files)."""
    lock = directory / _MANIFEST_LOCK
    if lock.is_dir():
        raise RecallmError(f"{lock} is a directory, not a lock file; remove it")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: unserialised
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing releases the lock)


def _read_entries(path: Path) -> dict[str, dict]:
    try:
        files = json.loads(path.read_text())["files"]
        return {str(k): {"size": int(v["size"]), "crc32": str(v["crc32"])} for k, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
        return {}  # (a size of 1e999 is inf: int() overflows; 100k-deep JSON exhausts the recursion)


def record_files(directory: str | Path, names: Iterable[str]) -> Path:
    """Add (or update) the size and CRC-32 of the files ``names`` (relative to ``directory``) in its
    manifest, fsyncing each; other entries are kept. For artifacts written one at a time (data
    shards, outputs, score files); ``verify_file`` checks one when it is read."""
    directory = Path(directory)
    names = sorted(n for n in set(names) if special_kind(directory / n) is None)
    if not names:  # (a sink, /dev/null or a FIFO, has no content to record: no manifest lands beside it)
        return directory / MANIFEST_FILE
    sums = _checksums(directory, names, sync=True)
    with _manifest_lock(directory):
        entries = _read_entries(directory / MANIFEST_FILE)
        entries.update({name: {"size": size, "crc32": crc} for name, (size, crc) in sums.items()})
        return write_json_atomic(directory / MANIFEST_FILE, {"version": 1, "files": entries})


def forget_files(directory: str | Path, names: Iterable[str]) -> None:
    """Drop ``names`` from ``directory``'s manifest (files deleted or about to be rewritten)."""
    directory = Path(directory)
    if not (directory / MANIFEST_FILE).is_file():
        return
    with _manifest_lock(directory):
        entries = _read_entries(directory / MANIFEST_FILE)
        for name in names:
            entries.pop(name, None)
        write_json_atomic(directory / MANIFEST_FILE, {"version": 1, "files": entries})


def file_problem(path: str | Path, *, required: bool = False) -> str | None:
    """What is wrong with ``path`` against the manifest of its directory: missing, another size or
    CRC-32 than was recorded when it was written; not listed (only with ``required``). None if it
    matches (or is not listed and not ``required``)."""
    path = Path(path)
    entry = _read_entries(path.parent / MANIFEST_FILE).get(path.name)
    if entry is None:
        return f"{path} has no recorded checksum" if required else None
    return _entry_problem(path, entry)


def verify_covered(directory: str | Path) -> bool:
    """Check the files of ``directory`` against the manifest that covers them: its own (every file listed:
    ``verify_manifest(complete=True)``), else its parent's entries under ``<name>/`` (a model's ``final``
    lists ``adapter/...``). True when one covers every file there and each matches; False when none does
    (an empty or partial manifest is none); a ``RecallmError`` naming the first file that differs."""
    directory = Path(directory)
    if verify_manifest(directory, complete=True):
        return True
    prefix = directory.name + "/"
    entries = {n[len(prefix) :]: e for n, e in _read_entries(directory.parent / MANIFEST_FILE).items() if n.startswith(prefix)}
    if not entries or not set(_files(directory)) <= set(entries):
        return False
    for name, entry in sorted(entries.items()):
        problem = _entry_problem(directory / name, entry)
        if problem:
            raise RecallmError(problem)
    return True


def _entry_problem(path: Path, entry: dict) -> str | None:
    if not path.is_file():
        return f"{path} is missing"
    size = path.stat().st_size
    if size != entry["size"]:
        return f"{path} has {size} bytes, {entry['size']} were written (truncated or overwritten)"
    _, crc = _crc(path, False)
    if crc != entry["crc32"]:
        return f"{path} changed since it was written (CRC-32 {crc}, expected {entry['crc32']})"
    return None


def verify_file(path: str | Path) -> Path:
    """``file_problem`` as a one-line ``RecallmError`` (a file its directory's manifest does not
    list is taken as it is: written by hand or by an older version)."""
    problem = file_problem(path)
    if problem:
        raise RecallmError(problem)
    return Path(path)


def verify_manifest(directory: str | Path, *, complete: bool = False) -> bool:
    """Check ``directory`` against its manifest: False when it has none; True when every listed file
    is there with its size and CRC-32; otherwise a ``RecallmError`` naming the first bad file.
    ``complete``: the manifest must also list every file under ``directory``: an empty or partial one
    vouches for nothing and counts as none (False) — a checkpoint whose manifest was rewritten or cut."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    if not path.is_file():
        return False
    try:
        files = json.loads(path.read_text())["files"]
        expected = {str(name): (int(v["size"]), str(v["crc32"])) for name, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        raise RecallmError(f"{MANIFEST_FILE} unreadable ({type(exc).__name__})") from None
    if complete and not set(_files(directory)) <= set(expected):
        return False
    for name, (size, _) in expected.items():
        file = directory / name
        if not file.is_file():
            raise RecallmError(f"{name} is missing")
        if file.stat().st_size != size:
            raise RecallmError(f"{name} has {file.stat().st_size} bytes, {size} were written")
    for name, (_, crc) in _checksums(directory, sorted(expected)).items():
        if crc != expected[name][1]:
            raise RecallmError(f"{name} changed since it was written (CRC-32 {crc}, expected {expected[name][1]})")
    return True
