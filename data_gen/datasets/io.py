"""Reading the local copies of public data sets, once per process.

``load_records(path, dataset=..., hint=...)`` returns a data set's records as a list of plain
dicts, from any of:

* a ``.json`` file (a list of records, or an object with a ``data`` list), ``.jsonl`` /
  ``.ndjson`` (one record a line), either optionally gzipped; a file without one of these
  suffixes is sniffed (QuALITY ships JSON lines without an extension);
* a ``.parquet`` file (a Hugging Face ``ClassLabel`` column, recorded in the file's
  ``huggingface`` metadata, is decoded to its label names);
* a ``.csv`` / ``.tsv`` file with a header row;
* a directory written by ``datasets.Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
  (``ClassLabel`` columns decoded; of a ``DatasetDict``, the ``split`` asked for);
* any other directory: every file of the kinds above in it (recursively, in name order); when
  some of their names contain the split name (``train``), only those.

A missing path, or one that cannot be read, is a ``RecallmError`` of one line that names the
data set, the path and the ``hint`` (where to get the files). Nothing touches the network
(``HF_DATASETS_OFFLINE=1`` is set before ``datasets`` is imported). Records are cached per
(path, split): ask again and the same list comes back.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError

__all__ = ["load_records", "check_path", "read_lines", "data_files", "clear_cache"]

_SUFFIXES = (".json", ".jsonl", ".ndjson", ".parquet", ".csv", ".tsv")
_CACHE: dict[tuple[str, str], list[dict[str, Any]]] = {}
_HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def _one_line(text: object) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def check_path(path: str | os.PathLike | None, dataset: str, hint: str) -> Path:
    """``path`` as a ``Path`` if it exists; otherwise a one-line ``RecallmError``."""
    if path is None or str(path) == "":
        raise RecallmError(f"{dataset}: no path given; {hint}")
    p = Path(path).expanduser()
    if not p.exists():
        raise RecallmError(f"{dataset} not found at {p}: {hint}")
    return p


def _suffix(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return Path(name).suffix


def _open_text(path: Path):
    if path.name.lower().endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def read_lines(path: Path):
    """The lines of a (possibly gzipped) text file, newline stripped."""
    with _open_text(path) as f:
        for line in f:
            yield line.rstrip("\n").rstrip("\r")


def _json_records(path: Path) -> list[dict[str, Any]]:
    with _open_text(path) as f:
        text = f.read()
    stripped = text.lstrip()
    if not stripped:
        return []
    if stripped[0] == "[":
        data = json.loads(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if "Extra data" not in str(exc):
                raise
            return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        for key in ("data", "Data", "records", "examples"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            data = [data]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError("expected a list of JSON objects")
    return data


def _jsonl_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in read_lines(path) if line.strip()]


def _csv_records(path: Path, delimiter: str) -> list[dict[str, Any]]:
    with _open_text(path) as f:
        return [dict(row) for row in csv.DictReader(f, delimiter=delimiter)]


def _class_labels_from_features(features: dict[str, Any]) -> dict[str, list[str]]:
    out = {}
    for name, feat in (features or {}).items():
        if isinstance(feat, dict) and feat.get("_type") == "ClassLabel" and feat.get("names"):
            out[name] = list(feat["names"])
    return out


def _decode_labels(records: list[dict[str, Any]], labels: dict[str, list[str]]) -> list[dict[str, Any]]:
    if not labels:
        return records
    for record in records:
        for column, names in labels.items():
            value = record.get(column)
            if isinstance(value, int) and 0 <= value < len(names):
                record[column] = names[value]
    return records


def _parquet_records(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    labels: dict[str, list[str]] = {}
    meta = (table.schema.metadata or {}).get(b"huggingface")
    if meta:
        try:
            info = json.loads(meta)
            labels = _class_labels_from_features((info.get("info") or {}).get("features") or {})
        except (ValueError, AttributeError):
            labels = {}
    return _decode_labels(table.to_pylist(), labels)


def _hf_records(path: Path, split: str) -> list[dict[str, Any]]:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"split {split!r} not in the saved DatasetDict (it has {', '.join(ds)})")
        ds = ds[split]
    labels = {name: list(feat.names) for name, feat in ds.features.items() if isinstance(feat, datasets.ClassLabel)}
    return _decode_labels(ds.to_list(), labels)


def data_files(directory: Path, split: str | None = None) -> list[Path]:
    """The readable data files under ``directory`` (see module doc for the split rule)."""
    files = sorted(
        p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".") and _suffix(p) in _SUFFIXES
    )
    if split:
        matching = [p for p in files if split.lower() in p.name.lower()]
        if matching:
            return matching
    return files


def _file_records(path: Path) -> list[dict[str, Any]]:
    suffix = _suffix(path)
    if suffix == ".parquet":
        return _parquet_records(path)
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl_records(path)
    if suffix == ".csv":
        return _csv_records(path, ",")
    if suffix == ".tsv":
        return _csv_records(path, "\t")
    return _json_records(path)  # .json, or sniffed


def load_records(
    path: str | os.PathLike | None,
    *,
    dataset: str,
    hint: str,
    split: str = "train",
    cache: bool = True,
) -> list[dict[str, Any]]:
    """Every record of the data set at ``path`` (see module doc); cached per (path, split)."""
    p = check_path(path, dataset, hint).resolve()  # a symbolic link is read as what it points to
    key = (str(p), split)
    if cache and key in _CACHE:
        return _CACHE[key]
    try:
        if p.is_dir():
            if any((p / marker).is_file() for marker in _HF_MARKERS):
                records = _hf_records(p, split)
            else:
                files = data_files(p, split)
                if not files:
                    raise ValueError(f"no {'/'.join(_SUFFIXES)} files in the directory")
                records = [r for f in files for r in _file_records(f)]
        else:
            records = _file_records(p)
    except RecallmError:
        raise
    except Exception as exc:  # any parse or I/O failure is the user's file: one line, with the hint
        raise RecallmError(f"{dataset}: cannot read {p} ({type(exc).__name__}: {_one_line(exc)}); {hint}") from exc
    if not records:
        raise RecallmError(f"{dataset}: no records in {p}; {hint}")
    if cache:
        _CACHE[key] = records
    return records


def clear_cache() -> None:
    """Forget every loaded file (tests)."""
    _CACHE.clear()
