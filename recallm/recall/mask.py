"""Training-time recall masks: the allowed sets decoding used, for teacher-forced batches.

For every position ``t`` of a sequence whose next token is generated inside a recall span,
``allowed_positions`` returns what :class:`~recallm.recall.matcher.RecallMatcher` allows after
``tokens[:t+1]`` (it runs the same matcher, fed the same way). Batches may be

* padded (left or right): positions with ``attention_mask == 0`` are not part of any sequence;
* packed: several sequences in one row, a new one starting wherever ``position_ids`` does not
  increase (verl's ``use_remove_padding`` layout, ``attention_mask=None``).

``apply_recall_mask`` writes ``MASK_VALUE`` (-1e4, finite so that log-softmax and entropy stay
finite) into every disallowed logit of the constrained positions, touching only those rows.
Decoding masks with ``-inf``; both give the same log-probabilities (``exp(-1e4)`` is 0 in
float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from recallm.recall.matcher import iter_allowed_sets

__all__ = [
    "MASK_VALUE",
    "AllowedPositions",
    "allowed_positions",
    "apply_recall_mask",
    "apply_recall_mask_rows",
    "sequence_segments",
]

MASK_VALUE = -1e4
_ROWS_PER_CHUNK = 1024


@dataclass(frozen=True)
class AllowedPositions:
    """Constrained positions of a batch in CSR form.

    ``batch[i], pos[i]`` is the i-th constrained position; its allowed token ids are
    ``cols[offsets[i]:offsets[i+1]]`` (unsorted, may repeat; the end token is always there).
    """

    batch: np.ndarray
    pos: np.ndarray
    offsets: np.ndarray
    cols: np.ndarray

    def __len__(self) -> int:
        return int(self.batch.size)

    def allowed(self, i: int) -> np.ndarray:
        """Sorted unique allowed ids of the i-th constrained position."""
        return np.unique(self.cols[self.offsets[i] : self.offsets[i + 1]])

    def as_dict(self) -> dict[tuple[int, int], frozenset[int]]:
        """``{(b, t): allowed ids}`` (for tests and debugging)."""
        return {(int(self.batch[i]), int(self.pos[i])): frozenset(self.allowed(i).tolist()) for i in range(len(self))}


def _to_numpy(x) -> np.ndarray | None:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu").numpy()
    return np.asarray(x)


def sequence_segments(shape: tuple[int, int], attention_mask=None, position_ids=None) -> list[tuple[int, np.ndarray]]:
    """The sequences of a ``(B, T)`` batch as ``(row, positions)`` pairs, in order.

    Positions with ``attention_mask == 0`` belong to no sequence; within a row, a new
    sequence starts wherever ``position_ids`` does not increase.
    """
    B, T = shape
    mask = _to_numpy(attention_mask)
    pos_ids = _to_numpy(position_ids)
    if mask is not None and mask.shape != (B, T):
        raise ValueError(f"attention_mask has shape {mask.shape}, expected {(B, T)}")
    if pos_ids is not None:
        if pos_ids.ndim == 1:
            pos_ids = pos_ids[None, :]
        if pos_ids.shape[0] == 1 and B > 1:
            pos_ids = np.broadcast_to(pos_ids, (B, pos_ids.shape[1]))
        if pos_ids.shape != (B, T):
            raise ValueError(f"position_ids has shape {pos_ids.shape}, expected {(B, T)}")
    segments: list[tuple[int, np.ndarray]] = []
    for b in range(B):
        valid = np.arange(T) if mask is None else np.flatnonzero(mask[b])
        if valid.size == 0:
            continue
        if pos_ids is None:
            segments.append((b, valid))
            continue
        p = pos_ids[b, valid]
        cuts = np.flatnonzero(p[1:] <= p[:-1]) + 1
        for seg in np.split(valid, cuts):
            segments.append((b, seg))
    return segments


def allowed_positions(
    input_ids,
    start_id: int,
    end_id: int,
    *,
    attention_mask=None,
    position_ids=None,
    max_recall_tokens: int = 128,
    vocab_size: int | None = None,
) -> AllowedPositions:
    """Allowed sets of every constrained position of a teacher-forced ``(B, T)`` batch."""
    ids = _to_numpy(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be 2-D (batch, time), got shape {ids.shape}")
    batch: list[int] = []
    pos: list[int] = []
    lens: list[int] = []
    cols: list[np.ndarray] = []
    for b, seg in sequence_segments(ids.shape, attention_mask, position_ids):
        for j, allowed in iter_allowed_sets(
            ids[b, seg], start_id, end_id, max_recall_tokens=max_recall_tokens, vocab_size=vocab_size
        ):
            batch.append(b)
            pos.append(int(seg[j]))
            lens.append(allowed.size)
            cols.append(allowed)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return AllowedPositions(
        batch=np.asarray(batch, dtype=np.int64),
        pos=np.asarray(pos, dtype=np.int64),
        offsets=offsets,
        cols=np.concatenate(cols).astype(np.int64) if cols else np.empty(0, dtype=np.int64),
    )


def apply_recall_mask(
    logits: torch.Tensor,
    input_ids,
    start_id: int,
    end_id: int,
    *,
    attention_mask=None,
    position_ids=None,
    max_recall_tokens: int = 128,
    mask_value: float = MASK_VALUE,
    allowed: AllowedPositions | None = None,
) -> torch.Tensor:
    """Mask ``logits`` (``(B, L, V)``, the last ``L`` positions of ``input_ids``) in place.

    Returns ``logits``. Autograd-safe: gradients flow to the allowed logits only.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be (batch, time, vocab), got shape {tuple(logits.shape)}")
    B, L, V = logits.shape
    T = input_ids.shape[-1]
    if input_ids.shape[0] != B or L > T:
        raise ValueError(f"logits {tuple(logits.shape)} do not match input_ids {tuple(input_ids.shape)}")
    if allowed is None:
        allowed = allowed_positions(
            input_ids,
            start_id,
            end_id,
            attention_mask=attention_mask,
            position_ids=position_ids,
            max_recall_tokens=max_recall_tokens,
            vocab_size=V,
        )
    if len(allowed) == 0:
        return logits
    offset = T - L
    keep_rows = np.flatnonzero(allowed.pos >= offset)
    if keep_rows.size == 0:
        return logits
    device = logits.device
    for c0 in range(0, keep_rows.size, _ROWS_PER_CHUNK):
        chunk = keep_rows[c0 : c0 + _ROWS_PER_CHUNK]
        starts, stops = allowed.offsets[chunk], allowed.offsets[chunk + 1]
        lens = stops - starts
        flat = np.concatenate([allowed.cols[s:e] for s, e in zip(starts, stops, strict=True)])
        local = np.repeat(np.arange(chunk.size), lens)
        b_idx = torch.from_numpy(allowed.batch[chunk]).to(device, non_blocking=True)
        t_idx = torch.from_numpy(allowed.pos[chunk] - offset).to(device, non_blocking=True)
        keep = torch.zeros(chunk.size, V, dtype=torch.bool, device=device)
        keep[torch.from_numpy(local).to(device), torch.from_numpy(flat).to(device)] = True
        rows = logits[b_idx, t_idx].masked_fill(~keep, mask_value)
        logits[b_idx, t_idx] = rows
    return logits


def apply_recall_mask_rows(
    row_logits: torch.Tensor,
    row_batch: np.ndarray,
    row_pos: np.ndarray,
    allowed: AllowedPositions,
    *,
    mask_value: float = MASK_VALUE,
) -> torch.Tensor:
    """Mask a gathered subset of a batch's logits: ``row_logits[i]`` (``(N, V)``) are the logits
    of position ``row_pos[i]`` of sequence row ``row_batch[i]``. Rows that are constrained
    positions of ``allowed`` get the mask; the others are unchanged. Returns a new tensor
    (autograd-safe)."""
    if len(allowed) == 0 or row_logits.shape[0] == 0:
        return row_logits
    width = int(max(row_pos.max(initial=0), allowed.pos.max(initial=0))) + 1
    keys = row_batch.astype(np.int64) * width + row_pos.astype(np.int64)
    order = np.argsort(keys, kind="stable")
    wanted = allowed.batch * width + allowed.pos
    at = np.searchsorted(keys, wanted, sorter=order)
    found = (at < keys.size) & (keys[order[np.minimum(at, keys.size - 1)]] == wanted)
    which = np.flatnonzero(found)
    if which.size == 0:
        return row_logits
    rows = order[at[which]]
    starts, stops = allowed.offsets[which], allowed.offsets[which + 1]
    lens = stops - starts
    flat = np.concatenate([allowed.cols[s:e] for s, e in zip(starts, stops, strict=True)])
    local = np.repeat(np.arange(which.size), lens)
    device = row_logits.device
    keep = torch.zeros(which.size, row_logits.shape[1], dtype=torch.bool, device=device)
    keep[torch.from_numpy(local).to(device), torch.from_numpy(flat).to(device)] = True
    index = torch.from_numpy(rows).to(device)
    out = row_logits.clone()
    out[index] = row_logits[index].masked_fill(~keep, mask_value)
    return out
