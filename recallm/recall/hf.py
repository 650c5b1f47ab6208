"""Constrained recall for Hugging Face ``model.generate``.

``RecallLogitsProcessor`` keeps one :class:`~recallm.recall.matcher.RecallMatcher` per batch
row and, at every step, masks the rows that are inside a recall span to their allowed set
(disallowed logits become ``-inf``: a span can only ever be a verbatim copy). It works with
batched, left-padded prompts, greedy decoding and sampling, several spans per sequence and
sequences that finish early. Per step it moves only the newest token ids to the CPU; on an
accelerator it sends only the allowed ids of in-span rows and builds the mask there, on the CPU
the matchers write straight into one reused boolean buffer. Beam search is not supported (beams reorder
rows between steps); the processor detects reordered rows and raises.

``ForceRecallSpans`` is a debugging/benchmark aid: it opens a span every ``every`` tokens
generated outside spans and closes it after ``length`` tokens (an untrained model rarely
opens one on its own). Put it after the ``RecallLogitsProcessor``.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import LogitsProcessor

from recallm.recall.matcher import RecallMatcher

__all__ = ["RecallLogitsProcessor", "ForceRecallSpans"]


class RecallLogitsProcessor(LogitsProcessor):
    """Mask logits inside recall spans to the verbatim continuations of the searchable context.

    Args:
        start_id, end_id: ids of ``<|start_recall|>`` and ``<|end_recall|>``.
        max_recall_tokens: span length after which only the end token is allowed.
        prompt_attention_mask: the prompt's attention mask (``(B, L0)``), to leave padding out
            of the searchable context. Without it, leading ``pad_token_id`` tokens are dropped.
        pad_token_id: see above.
        mask_value: value written into disallowed logits.
        dense: build the mask in one reused host buffer (True) or send only the allowed ids to the
            scores' device (False). Default: dense on the CPU, sparse on accelerators.

    A processor instance serves one ``generate`` call (a new batch of prompts resets it).
    """

    def __init__(
        self,
        start_id: int,
        end_id: int,
        *,
        max_recall_tokens: int = 128,
        prompt_attention_mask: torch.Tensor | None = None,
        pad_token_id: int | None = None,
        mask_value: float = float("-inf"),
        dense: bool | None = None,
    ) -> None:
        RecallMatcher(start_id, end_id, max_recall_tokens=max_recall_tokens)  # validates the arguments
        self.start_id = int(start_id)
        self.end_id = int(end_id)
        self.max_recall_tokens = int(max_recall_tokens)
        self.prompt_attention_mask = prompt_attention_mask
        self.pad_token_id = pad_token_id
        self.mask_value = mask_value
        self.dense = dense
        self.matchers: list[RecallMatcher] = []
        self._seen = 0  # sequence length already fed to the matchers
        self._last_col: np.ndarray | None = None  # input_ids[:, _seen - 1] at the previous step
        self._keep: np.ndarray | None = None  # CPU path: (B, V) allowed-token buffer
        self._dirty: list[bool] = []

    @classmethod
    def from_config(cls, config, **kwargs) -> RecallLogitsProcessor:
        """Build from a RecaLLM model config (token ids and ``max_recall_tokens``)."""
        from recallm.tokens import DEFAULT_MAX_RECALL_TOKENS, RecallTokenIds

        ids = RecallTokenIds.from_config(config)
        kwargs.setdefault("max_recall_tokens", getattr(config, "max_recall_tokens", None) or DEFAULT_MAX_RECALL_TOKENS)
        kwargs.setdefault("pad_token_id", getattr(config, "pad_token_id", None))
        return cls(ids.start, ids.end, **kwargs)

    def reset(self) -> None:
        self.matchers = []
        self._seen = 0
        self._last_col = None
        self._keep = None

    def _prompt_tokens(self, ids: np.ndarray, b: int) -> np.ndarray:
        mask = self.prompt_attention_mask
        if mask is not None and tuple(mask.shape) == ids.shape:
            return ids[b][mask[b].detach().to("cpu").numpy().astype(bool)]
        row = ids[b]
        if self.pad_token_id is not None:
            lead = np.flatnonzero(row != self.pad_token_id)
            return row[lead[0] :] if lead.size else row[:0]
        return row

    def _start(self, input_ids: torch.LongTensor, vocab_size: int) -> None:
        ids = input_ids.detach().to("cpu").numpy()
        self.matchers = []
        self._keep = None
        for b in range(ids.shape[0]):
            m = RecallMatcher(
                self.start_id, self.end_id, max_recall_tokens=self.max_recall_tokens, vocab_size=vocab_size
            )
            m.feed(self._prompt_tokens(ids, b))
            self.matchers.append(m)
        self._seen = ids.shape[1]
        self._last_col = ids[:, -1].copy()

    def _advance(self, input_ids: torch.LongTensor) -> None:
        # the last token fed and the new ones, in one transfer
        tail = input_ids[:, self._seen - 1 :].detach().to("cpu").numpy()
        if not np.array_equal(tail[:, 0], self._last_col):
            raise RuntimeError(
                "RecallLogitsProcessor: batch rows changed between steps (beam search, or one processor "
                "reused across generate calls); use a new processor per call and no beam search"
            )
        for m, row in zip(self.matchers, tail, strict=True):
            if row.size == 2:
                m.feed_one(int(row[1]))
            else:
                m.feed(row[1:])
        self._seen = input_ids.shape[1]
        self._last_col = tail[:, -1].copy()

    def start(self, input_ids: torch.LongTensor, vocab_size: int) -> None:
        """One matcher per row of ``input_ids`` (the prompts; padding left out), for a caller that feeds
        the matchers itself (``self.matchers[row].feed_one``) and masks with :meth:`mask_rows` — a
        decoder that verifies several tokens of a row per step (``recallm.decoding``)."""
        self._start(input_ids, vocab_size)

    def mask_rows(self, scores: torch.FloatTensor, rows: list[int]) -> torch.FloatTensor:
        """Mask ``scores`` (one row per entry of ``rows``) with those rows' matchers as they stand."""
        inside = [i for i, b in enumerate(rows) if self.matchers[b].in_span]
        if not inside:
            return scores
        keep = np.zeros((len(inside), scores.shape[-1]), dtype=bool)
        for i, row in zip(inside, keep, strict=True):
            self.matchers[rows[i]].fill_mask_row(row)
        allowed = torch.from_numpy(keep).to(scores.device)
        if len(inside) == len(rows):
            return scores.masked_fill(~allowed, self.mask_value)
        index = torch.tensor(inside, device=scores.device)
        scores = scores.clone()
        scores[index] = scores[index].masked_fill(~allowed, self.mask_value)
        return scores

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        B, L = input_ids.shape
        if not self.matchers or B != len(self.matchers) or L <= self._seen:
            self._start(input_ids, scores.shape[-1])
        else:
            self._advance(input_ids)
        in_span = [b for b, m in enumerate(self.matchers) if m.in_span]
        if not in_span:
            return scores
        if self.dense or (self.dense is None and scores.device.type == "cpu"):
            return self._mask_dense(scores)
        return self._mask_sparse(scores, in_span)

    def _mask_dense(self, scores: torch.FloatTensor) -> torch.FloatTensor:
        """CPU: one persistent boolean buffer, rows filled by the matchers, one ``torch.where``."""
        B, V = scores.shape
        keep = self._keep
        if keep is None or keep.shape != (B, V):
            keep = self._keep = np.ones((B, V), dtype=bool)
            self._dirty = [False] * B
        for b, m in enumerate(self.matchers):
            if m.fill_mask_row(keep[b]):
                self._dirty[b] = True
            elif self._dirty[b]:  # left its span: unmask the row again
                keep[b] = True
                self._dirty[b] = False
        return torch.where(torch.from_numpy(keep).to(scores.device), scores, self.mask_value)

    def _mask_sparse(self, scores: torch.FloatTensor, in_span: list[int]) -> torch.FloatTensor:
        """Accelerators: move only the allowed ids of in-span rows; build the mask on the device."""
        device = scores.device
        cols = [self.matchers[b].allowed_tokens() for b in in_span]
        local = torch.from_numpy(np.repeat(np.arange(len(in_span)), [c.size for c in cols])).to(device)
        flat = torch.from_numpy(np.concatenate(cols)).to(device)
        keep = torch.zeros(len(in_span), scores.shape[-1], dtype=torch.bool, device=device)
        keep[local, flat] = True
        if len(in_span) == scores.shape[0]:
            return scores.masked_fill(~keep, self.mask_value)
        row_idx = torch.tensor(in_span, device=device)
        scores = scores.clone()
        scores[row_idx] = scores[row_idx].masked_fill(~keep, self.mask_value)
        return scores


class ForceRecallSpans(LogitsProcessor):
    """Force a span open every ``every`` tokens generated outside spans; close it after ``length``.

    A debugging and benchmarking aid (an untrained model seldom opens a span by itself). It
    tracks span state from the token stream on its own, so it also works without the recall
    mask (to show what unconstrained spans look like). Put it after the
    ``RecallLogitsProcessor`` in the processor list.
    """

    def __init__(self, start_id: int, end_id: int, *, every: int, length: int) -> None:
        if every < 1 or length < 1:
            raise ValueError(f"every and length must be >= 1, got every={every} length={length}")
        self.start_id = int(start_id)
        self.end_id = int(end_id)
        self.every = int(every)
        self.length = int(length)
        self._seen = 0
        self._in_span: list[bool] = []
        self._count: list[int] = []  # tokens inside the open span, or outside since the last span

    def start(self, last_tokens: list[int]) -> None:
        """A new batch whose prompts end with ``last_tokens`` (a prompt ends outside spans unless its
        last token opens one)."""
        self._in_span = [tok == self.start_id for tok in last_tokens]
        self._count = [0] * len(last_tokens)

    def observe(self, row: int, token: int) -> None:
        """``token`` was generated in ``row``."""
        if self._in_span[row]:
            if token == self.end_id:
                self._in_span[row], self._count[row] = False, 0
            else:
                self._count[row] += 1
        elif token == self.start_id:
            self._in_span[row], self._count[row] = True, 0
        else:
            self._count[row] += 1

    def forced(self, row: int) -> int | None:
        """The token ``row`` must generate next, or None."""
        inside = self._in_span[row]
        if self._count[row] >= (self.length if inside else self.every):
            return self.end_id if inside else self.start_id
        return None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        B, L = input_ids.shape
        last = input_ids[:, -1].tolist()
        if len(self._in_span) != B or L != self._seen + 1:  # a new batch: the prompt ends outside spans
            self.start(last)
        else:
            for b, tok in enumerate(last):
                self.observe(b, tok)
        self._seen = L
        force = [(b, tok) for b in range(B) if (tok := self.forced(b)) is not None]
        if force:
            scores = scores.clone()
            for b, tok in force:
                scores[b] = float("-inf")
                scores[b, tok] = 0.0
        return scores
