"""SFT data: records of ``data_gen`` (``SFTExample.to_record()``) as training examples.

Each record carries the prompt and completion token ids (spans in the completion are the
prompt's own ids, see ``data_gen.traces``). An example is ``prompt_ids + completion_ids`` with
labels ``-100`` on the prompt: the loss is on the completion only, and it is computed under the
recall mask by the model's forward. Examples longer than ``max_length`` are dropped (and counted)
rather than truncated: a truncated prompt would cut the context the spans copy from.

Options of the recipe that act here:

* ``strip_spans`` — drop every recall span (``<|start_recall|>`` ... ``<|end_recall|>``) from
  the completions: the no-recall ablation trains on the same data, traces without spans;
  ``strip_spans_fraction`` < 1 strips only that share of the examples (a seeded draw per record),
  a model that recalls on some prompts and answers from memory on others;
* ``curriculum`` — order the training draws by prompt length: a schedule of points
  ``{at, lo, hi}`` (progress fraction of the run -> a window of length quantiles, linearly
  interpolated); draw ``i`` of ``n`` is uniform over the examples whose length rank lies in
  the window at ``i / n``. The draws are a fixed sequence (seeded), read in order;
* ``length_group`` — with a curriculum, the draws of ``length_group`` consecutive steps are sorted
  by length and cut into those steps' batches, and the steps shuffled among themselves (seeded):
  the same examples in nearly the same order, but a batch holds examples of similar length, so it
  pads little (the padded tokens cost as much as the real ones);
* ``position_skip`` — positional skip-wise training (PoSE, Zhu et al. 2024) for length
  extension: each example's position ids jump by a random skip ``u ~ U[0, position_skip - n]``
  at a random point inside the prompt, so relative distances up to ``position_skip`` are seen
  while the text stays short; local order on both sides of the jump is unchanged.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from recallm.errors import RecallmError
from recallm.io import iter_jsonl

__all__ = [
    "SFTDataset",
    "SFTCollator",
    "load_sft_file",
    "trace_lengths",
    "strip_recall_spans",
    "curriculum_order",
    "check_curriculum",
    "group_by_length",
]

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
    """Right-pads a batch; labels are -100 on padding and on the prompt. With ``position_skip``
    it also returns PoSE position ids (module doc), drawn from ``seed`` and a batch counter."""

    pad_token_id: int
    position_skip: int | None = None
    seed: int = 0
    _calls: int = 0

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
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        if self.position_skip:
            batch["position_ids"] = self._skip_positions(features, width)
        self._calls += 1
        return batch

    def _skip_positions(self, features: list[dict[str, Any]], width: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self._calls)
        positions = torch.arange(width).repeat(len(features), 1)
        for b, f in enumerate(features):
            n = len(f["input_ids"])
            prompt = next((i for i, label in enumerate(f["labels"]) if label != IGNORE_INDEX), n)
            room = self.position_skip - n
            if room <= 0 or prompt < 2:
                continue
            cut = int(torch.randint(1, prompt, (1,), generator=gen))
            skip = int(torch.randint(0, room + 1, (1,), generator=gen))
            positions[b, cut:] += skip
        return positions


def strip_recall_spans(completion: list[int], start_id: int, end_id: int) -> list[int]:
    """``completion`` without its recall spans (markers and contents); an unclosed span is kept."""
    out: list[int] = []
    i = 0
    while i < len(completion):
        if completion[i] == start_id:
            try:
                j = completion.index(end_id, i + 1)
            except ValueError:
                out.extend(completion[i:])
                break
            i = j + 1
            continue
        out.append(completion[i])
        i += 1
    return out


def check_curriculum(schedule) -> list[tuple[float, float, float]]:
    """Validate a curriculum schedule (module doc) into sorted ``(at, lo, hi)`` points."""
    points = []
    for n, point in enumerate(schedule or []):
        try:
            at, lo, hi = (float(point[k]) for k in ("at", "lo", "hi"))
        except (KeyError, TypeError, ValueError):
            raise RecallmError(
                f"sft.curriculum[{n}] must be a mapping with numbers at, lo, hi; got {point!r}"
            ) from None
        if not (0 <= at <= 1 and 0 <= lo < hi <= 1):
            raise RecallmError(f"sft.curriculum[{n}]: need 0 <= at <= 1 and 0 <= lo < hi <= 1, got {point!r}")
        points.append((at, lo, hi))
    if not points:
        raise RecallmError("sft.curriculum must list at least one {at, lo, hi} point")
    ats = [p[0] for p in points]
    if ats != sorted(ats):
        raise RecallmError(f"sft.curriculum points must be in increasing 'at' order, got {ats}")
    return points


def curriculum_order(lengths: list[int], draws: int, schedule, seed: int = 0) -> list[int]:
    """Example indices for ``draws`` draws following a length curriculum (module doc)."""
    import numpy as np

    points = check_curriculum(schedule)
    ats = [p[0] for p in points]
    los = [p[1] for p in points]
    his = [p[2] for p in points]
    by_length = np.argsort(np.asarray(lengths), kind="stable")
    n = len(by_length)
    rng = np.random.default_rng(seed)
    progress = np.arange(draws) / max(draws, 1)
    lo = np.floor(np.interp(progress, ats, los) * n).astype(int)
    hi = np.maximum(np.ceil(np.interp(progress, ats, his) * n).astype(int), lo + 1)
    ranks = lo + np.floor(rng.random(draws) * (hi - lo)).astype(int)
    return by_length[np.minimum(ranks, n - 1)].tolist()


def group_by_length(order: list[int], lengths: list[int], batch: int, steps: int, seed: int = 0) -> list[int]:
    """``order`` (draws, read ``batch`` at a time) regrouped: each run of ``steps`` consecutive
    batches is sorted by ``lengths[i]`` and cut into batches again, and those batches are put in a
    seeded random order. Every draw stays within ``steps`` batches of where it was drawn."""
    import numpy as np

    if steps <= 1:
        return list(order)
    rng = np.random.default_rng([seed, 0x6C656E])
    out: list[int] = []
    span = batch * steps
    for start in range(0, len(order), span):
        chunk = sorted(order[start : start + span], key=lambda i: lengths[i])
        batches = [chunk[i : i + batch] for i in range(0, len(chunk), batch)]
        for j in rng.permutation(len(batches)):
            out.extend(batches[j])
    return out


def trace_lengths(path: str | Path) -> list[int]:
    """Prompt + completion tokens of every record of an SFT JSONL file (unreadable records left out:
    ``load_sft_file`` names them)."""
    lengths = []
    for _, record in iter_jsonl(Path(path), "SFT data file"):
        try:
            lengths.append(len(record["prompt_ids"]) + len(record["completion_ids"]))
        except (KeyError, TypeError):
            continue
    return lengths


def load_sft_file(
    path: str | Path,
    tokenizer,
    *,
    max_length: int,
    vocab_size: int,
    strip_spans: tuple[int, int] | None = None,
    strip_fraction: float = 1.0,
    seed: int = 0,
) -> tuple[SFTDataset, dict]:
    """Read an SFT JSONL file into a dataset (see module doc); returns it and counts.
    ``strip_spans``: the (start, end) recall token ids whose spans are removed from completions;
    ``strip_fraction``: the share of records stripped (each record drawn with ``random.Random(seed)``
    in file order, so the same file and seed strip the same records)."""
    path = Path(path)
    draw = random.Random(seed)
    if not path.exists():
        raise RecallmError(
            f"SFT data file {path} does not exist; create it with `recallm-data` (programmatic traces) "
            "or `recallm-annotate` (annotated traces)"
        )
    examples, dropped, tokens, stripped = [], 0, 0, 0
    checked = False
    for number, record in iter_jsonl(path, "SFT data file"):
        try:
            prompt, completion = list(record["prompt_ids"]), list(record["completion_ids"])
        except (KeyError, TypeError) as exc:
            raise RecallmError(f"{path}:{number}: not an SFT record ({type(exc).__name__}: {exc})") from exc
        if not checked:  # the data must come from this tokenizer (same ids, same chat template)
            again = tokenizer(record.get("prompt_text", ""), add_special_tokens=False)["input_ids"]
            if record.get("prompt_text") is not None and again != prompt:
                raise RecallmError(
                    f"{path}: the prompts were tokenised with another tokenizer than the model's; regenerate the data "
                    "with this model's tokenizer"
                )
            checked = True
        if strip_spans is not None and draw.random() < strip_fraction:
            plain = strip_recall_spans(completion, *strip_spans)
            stripped += plain != completion
            completion = plain
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
    stats = {"examples": len(examples), "dropped_too_long": dropped, "tokens": tokens}
    if strip_spans is not None:
        stats["stripped"] = stripped
    return SFTDataset(examples), stats
