"""Reading and writing rows: verl-ready parquet, SFT JSONL (``write_jsonl``/``read_jsonl`` are
``recallm.io``'s); every write is atomic (``recallm.io``: temporary file, fsync, rename).

A verl record (``RLHFDataset`` reads ``prompt`` as chat messages):

* ``data_source``, ``ability`` (the category), ``prompt`` (messages);
* ``reward_model``: ``{"style": "rule", "ground_truth": <JSON string>}`` — a JSON string, so that
  rows of every category share one parquet schema (the reward parses it back);
* ``extra_info``: ``index``, ``split``, ``task``, ``category``, ``question``, ``instruction``, ``seed``,
  ``prompt_tokens``, ``target_tokens``, ``augmentations`` (JSON string) and, when asked for,
  ``prompt_text`` (verl's ``custom_reward_function`` path needs it; the reward manager does not).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from data_gen.base import Row
from recallm.errors import RecallmError
from recallm.io import (  # (the JSONL pair is recallm.io's; re-exported)
    atomic_path,
    read_jsonl,
    verify_file,
    write_jsonl,
)

__all__ = ["row_record", "write_parquet", "read_records", "read_rows", "write_jsonl", "read_jsonl"]


def row_record(row: Row, index: int, split: str, *, store_prompt_text: bool = False) -> dict[str, Any]:
    extra = {
        "index": index,
        "split": split,
        "task": row.task,
        "category": row.category,
        "question": row.question,
        "instruction": row.instruction,
        "seed": row.seed,
        "prompt_tokens": row.prompt_tokens,
        "target_tokens": row.target_tokens,
        "augmentations": json.dumps(row.augmentations, sort_keys=True),
        "trace_info": json.dumps(row.trace_info, sort_keys=True),
        "n_pieces": row.n_pieces,
    }
    if store_prompt_text:
        extra["prompt_text"] = row.prompt_text
    return {
        "data_source": row.data_source,
        "ability": row.category,
        "prompt": row.messages,
        "reward_model": {"style": "rule", "ground_truth": json.dumps(row.ground_truth)},
        "extra_info": extra,
    }


def write_parquet(records: list[dict[str, Any]], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not records:
        raise RecallmError(f"no rows to write to {path}")
    table = pa.Table.from_pylist(records)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return Path(path)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise RecallmError(f"data file {path} does not exist; generate it with `recallm-data`")
    verify_file(path)  # the checksum recorded when it was written (recallm-data's outputs)
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise RecallmError(f"cannot read {path} as parquet: {str(exc).splitlines()[0]}") from exc


def read_rows(path: str | Path, tokenizer=None) -> list[Row]:
    """Rows back from a parquet written by ``write_parquet``. Without a stored ``prompt_text`` the
    prompt is rendered again from the messages with ``tokenizer``'s chat template."""
    rows = []
    for number, record in enumerate(read_records(path), 1):
        try:
            rows.append(_row(record, path, tokenizer))
        except RecallmError:
            raise
        except KeyError as exc:
            raise RecallmError(
                f"{path}: row {number} has no {exc.args[0]!r} column: not rows written by recallm-data "
                f"(columns: {', '.join(sorted(record))})"
            ) from None
        except (TypeError, AttributeError, ValueError, IndexError) as exc:
            raise RecallmError(
                f"{path}: row {number} is not a row written by recallm-data ({type(exc).__name__}: {exc})"
            ) from None
    return rows


_ROW_COLUMNS = ("prompt", "data_source", "ability", "reward_model")


def _row(record: dict[str, Any], path, tokenizer) -> Row:
    if not isinstance(record, dict):
        raise TypeError(f"a {type(record).__name__}, not a record")
    for column in _ROW_COLUMNS:
        if column not in record:
            raise KeyError(column)
    extra = record.get("extra_info") or {}
    ground_truth = json.loads(record["reward_model"]["ground_truth"])
    prompt_text = extra.get("prompt_text")
    if not prompt_text:
        if tokenizer is None:
            raise RecallmError(f"{path} has no prompt_text: pass the tokenizer to render the prompts")
        prompt_text = tokenizer.apply_chat_template(record["prompt"], tokenize=False, add_generation_prompt=True)
        for gold in ground_truth.get("gold", []):
            if prompt_text[gold["start"] : gold["end"]] != gold["text"]:
                raise RecallmError(
                    f"{path}: row {extra.get('index')} renders differently with this tokenizer's chat template "
                    "(gold intervals do not match); use the tokenizer the data was generated with"
                )
    return (
        Row(
            task=extra.get("task", record["data_source"]),
            category=record["ability"],
            data_source=record["data_source"],
            seed=int(extra.get("seed", 0)),
            messages=list(record["prompt"]),
            prompt_text=prompt_text,
            prompt_tokens=int(extra.get("prompt_tokens", 0)),
            target_tokens=int(extra.get("target_tokens", 0)),
            question=extra.get("question", ""),
            answers=ground_truth.get("answers", []),
            gold=ground_truth.get("gold", []),
            augmentations=json.loads(extra.get("augmentations") or "{}"),
            ground_truth=ground_truth,
            n_pieces=int(extra.get("n_pieces", 0)),
            trace_info=json.loads(extra.get("trace_info") or "{}"),
            instruction=extra.get("instruction") or "",
        )
    )
