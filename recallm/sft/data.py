"""SFT data: records of ``data_gen`` (``SFTExample.to_record()``) as training examples.

Each record carries the prompt and completion token ids (spans in the completion are the
prompt's own ids, see ``data_gen.traces``). An example is ``prompt_ids + completion_ids`` with
labels ``-100`` on the prompt: the loss is on the completion only, and it is computed under the
recall mask by the model's forward. Examples longer than ``max_length`` are dropped (and counted)
rather than truncated: a truncated prompt would cut the context the spans copy from.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from recallm.errors import RecallmError

__all__ = ["SFTDataset", "SFTCollator", "load_sft_file"]

log = logging.getLogger(__name__)
IGNORE_INDEX = -100


class SFTDataset(torch.utils.data.Dataset):
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.records[i]


@dataclass
class SFTCollator:
    """Right-pads a batch; labels are -100 on padding and on the prompt."""

    pad_token_id: int

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        width = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(features), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(features), width), dtype=torch.long)
        for b, f in enumerate(features):
            n = len(f["input_ids"])
            ids[b, :n] = torch.tensor(f["input_ids"])
            labels[b, :n] = torch.tensor(f["labels"])
            mask[b, :n] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def load_sft_file(path: str | Path, tokenizer, *, max_length: int, vocab_size: int) -> tuple[SFTDataset, dict]:
    """Read an SFT JSONL file into a dataset (see module doc); returns it and counts."""
    path = Path(path)
    if not path.is_file():
        raise RecallmError(
            f"SFT data file {path} does not exist; create it with `recallm-data` (programmatic traces) "
            "or `recallm-annotate` (annotated traces)"
        )
    examples, dropped, tokens = [], 0, 0
    checked = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompt, completion = list(record["prompt_ids"]), list(record["completion_ids"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise RecallmError(f"{path}:{number}: not an SFT record ({type(exc).__name__}: {exc})") from exc
        if not checked:  # the data must come from this tokenizer (same ids, same chat template)
            again = tokenizer(record.get("prompt_text", ""), add_special_tokens=False)["input_ids"]
            if record.get("prompt_text") is not None and again != prompt:
                raise RecallmError(
                    f"{path}: the prompts were tokenised with another tokenizer than the model's; regenerate the data "
                    "with this model's tokenizer"
                )
            checked = True
        ids = prompt + completion
        if not completion or max(ids) >= vocab_size or min(ids) < 0:
            raise RecallmError(f"{path}:{number}: token ids out of range for a vocabulary of {vocab_size}")
        if len(ids) > max_length:
            dropped += 1
            continue
        examples.append({"input_ids": ids, "labels": [IGNORE_INDEX] * len(prompt) + completion})
        tokens += len(ids)
    if not examples:
        raise RecallmError(f"{path}: no example fits max_length={max_length} ({dropped} longer)")
    if dropped:
        log.warning("%s: dropped %d examples longer than max_length=%d", path, dropped, max_length)
    return SFTDataset(examples), {"examples": len(examples), "dropped_too_long": dropped, "tokens": tokens}
