"""The in-context retrieval reward R_ret (paper App. C.5, eq. 4-9).

Recall spans and gold passages are character intervals of the prompt text:

* ``F1_char(g, s) = 2 * max(0, min(g_e, s_e) - max(g_s, s_s)) / ((g_e - g_s) + (s_e - s_s))``;
* ``overlap(g) = min(max_s F1_char(g, s), tau) / tau``; the mean over all gold passages, or over
  the ``top_k`` highest;
* a span occurring several times in the prompt is scored at its best occurrence for each gold
  passage (only occurrences that can touch the passage are looked at);
* density penalty ``P = 0.5 ** (max(0, d - delta) / h)`` with ``d = (N_spans - N_free) /
  (N_tokens / 1024)``;
* correctness penalty ``P = max(0, 1 - (N_short + |#start - #end|) / sqrt(N_spans))``, and 1 when
  the response has no complete span (eq. 8 is undefined at ``N_spans = 0``; the authors'
  release returns 1 there, so unpaired markers without any complete span cost nothing here —
  they still fail the format reward when they follow the think block);
* ``R_ret = overlap * P_density * P_correct``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from recallm.errors import RecallmError

__all__ = [
    "GoldPassage",
    "interval_f1",
    "span_gold_f1",
    "locate_gold",
    "recall_overlap",
    "recall_overlap_detail",
    "OverlapResult",
    "density_penalty",
    "correctness_penalty",
    "clean_span",
    "occurring",
]

_EDGE = " \t\r\n\ufffd"


class GoldPassage(NamedTuple):
    """A gold passage: its text and its character interval ``[start, end)`` in the prompt."""

    text: str
    start: int
    end: int


def interval_f1(g_start: int, g_end: int, s_start: int, s_end: int) -> float:
    """Character-level F1 of two intervals (eq. 4)."""
    total = (g_end - g_start) + (s_end - s_start)
    if total <= 0:
        return 0.0
    return 2.0 * max(0, min(g_end, s_end) - max(g_start, s_start)) / total


def clean_span(text: str) -> str:
    """Span text as searched in the prompt: edge whitespace and U+FFFD (a multi-byte character
    cut by a token boundary) removed."""
    return text.strip(_EDGE)


def span_gold_f1(prompt: str, span: str, g_start: int, g_end: int) -> float:
    """max over the occurrences of ``span`` in ``prompt`` of ``F1_char(gold, occurrence)``."""
    n = len(span)
    if n == 0 or g_end <= g_start:
        return 0.0
    lo, hi = max(0, g_start - n + 1), min(len(prompt), g_end + n - 1)
    cap = min(n, g_end - g_start)  # the largest intersection possible
    best = 0
    pos = prompt.find(span, lo, hi)
    while pos != -1:
        inter = min(g_end, pos + n) - max(g_start, pos)
        if inter > best:
            best = inter
            if best == cap:
                break
        pos = prompt.find(span, pos + 1, hi)
    return 2.0 * best / ((g_end - g_start) + n)


def locate_gold(prompt: str, gold: GoldPassage) -> tuple[int, int]:
    """The gold passage's interval in ``prompt``: the recorded one if the text is there, else
    the occurrence nearest to it (a prompt re-rendered by decoding may shift offsets)."""
    if 0 <= gold.start <= gold.end <= len(prompt) and prompt[gold.start : gold.end] == gold.text:
        return gold.start, gold.end
    best = None
    pos = prompt.find(gold.text)
    while pos != -1:
        if best is None or abs(pos - gold.start) < abs(best - gold.start):
            best = pos
        pos = prompt.find(gold.text, pos + 1)
    if best is None or not gold.text:
        raise RecallmError(
            f"gold passage {gold.text[:60]!r} (recorded at [{gold.start}, {gold.end})) does not occur in the "
            f"prompt text ({len(prompt)} characters): the row's ground truth does not match its prompt"
        )
    return best, best + len(gold.text)


_K = 8  # the longest prefix of a text looked up in the prompt index
_DIRECT = 1_000  # up to this many distinct texts, each is searched in the whole prompt (str.find)
_CANDIDATES = 64  # occurrences of a text's rarest k-gram checked before a direct search
_MASK = (1 << 64) - 1
_BASE = 0x9E3779B97F4A7C15


def _codes(text: str):
    import numpy as np

    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)


class _PromptIndex:
    """Sorted hashes of every ``n``-character window of a prompt, for each ``n <= _K`` asked for
    (numpy: a few vector operations and one sort per length), with the windows' positions."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt
        self.codes = _codes(prompt)
        self.tables: dict[int, tuple] = {}

    def table(self, n: int):
        import numpy as np

        if n not in self.tables:
            windows = max(len(self.codes) - n + 1, 0)
            h = np.zeros(windows, dtype=np.uint64)
            with np.errstate(over="ignore"):
                power = np.uint64(1)
                for j in range(n):
                    h += self.codes[j : j + windows] * power
                    power = power * np.uint64(_BASE)
            order = np.argsort(h)
            self.tables[n] = (h[order], order)
        return self.tables[n]

    def ranges(self, n: int, grams: list[str]) -> tuple[list[int], list[int]]:
        """For each ``n``-character gram, the range of ``order`` holding its occurrences (all at once)."""
        import numpy as np

        hashes, _ = self.table(n)
        codes = _codes("".join(grams)).reshape(len(grams), n)
        keys = np.zeros(len(grams), dtype=np.uint64)
        with np.errstate(over="ignore"):
            power = np.uint64(1)
            for j in range(n):  # the same hash as the windows'
                keys += codes[:, j] * power
                power = power * np.uint64(_BASE)
        return np.searchsorted(hashes, keys, "left").tolist(), np.searchsorted(hashes, keys, "right").tolist()

    def occurring(self, texts: list[str]) -> list[str]:
        prompt, size = self.prompt, len(self.prompt)
        ok: dict[str, bool] = {}
        short = [t for t in texts if len(t) <= _K and len(t) <= size]
        for n in sorted({len(t) for t in short}):
            group = [t for t in short if len(t) == n]
            order = self.table(n)[1]
            for text, lo, hi in zip(group, *self.ranges(n, group), strict=True):
                ok[text] = any(prompt.startswith(text, p) for p in order[lo:hi].tolist())
        long = [t for t in texts if _K < len(t) <= size]
        offsets = [sorted({*range(0, len(t) - _K + 1, _K), len(t) - _K}) for t in long]
        grams = [t[j : j + _K] for t, offs in zip(long, offsets, strict=True) for j in offs]
        los, his = self.ranges(_K, grams) if grams else ([], [])
        order, k = self.table(_K)[1] if grams else None, 0
        for text, offs in zip(long, offsets, strict=True):
            spans = list(zip(offs, los[k : k + len(offs)], his[k : k + len(offs)], strict=True))
            k += len(offs)
            offset, lo, hi = min(spans, key=lambda x: x[2] - x[1])  # the rarest k-gram
            if hi == lo:
                ok[text] = False  # a k-gram the prompt lacks
            elif hi - lo > _CANDIDATES:
                ok[text] = text in prompt
            else:
                ok[text] = any(prompt.startswith(text, p - offset) for p in order[lo:hi].tolist() if p >= offset)
        return [t for t in texts if ok.get(t, False)]


def occurring(prompt: str, texts: Sequence[str]) -> list[str]:
    """The distinct ``texts`` that occur in ``prompt``, in time bounded by the prompt's length plus
    the texts' rather than by their number times the prompt's length, as a search of each would be
    (30K distinct spans over a 500K-character prompt took 6.7 s; ``bench/rewards.py``). A few texts
    are searched for directly; many are looked up in an index of the prompt built once
    (``_PromptIndex``): a text is checked at the occurrences of its rarest ``_K``-gram, rejected at
    once when the prompt lacks one of them."""
    texts = list(dict.fromkeys(texts))
    if len(texts) <= _DIRECT:
        return [t for t in texts if t in prompt]
    return _PromptIndex(prompt).occurring(texts)


class OverlapResult(NamedTuple):
    overlap: float  # eq. 5 averaged (over all gold or the top_k)
    spans_in_prompt: int  # spans that occur in the prompt at all


def recall_overlap_detail(
    prompt: str,
    spans: Sequence[str],
    golds: Sequence[GoldPassage],
    *,
    tau: float,
    top_k: int | None = None,
) -> OverlapResult:
    """Mean per-gold overlap (eq. 5), over all gold passages or the ``top_k`` best, and how many
    spans occur in the prompt. Spans are searched only in windows around the gold passages; the
    whole prompt is searched only for spans found near none of them."""
    cleaned = [t for t in (clean_span(s) for s in spans) if t]
    multiplicity = Counter(cleaned)
    texts = list(multiplicity)  # each distinct span once: a repeat scores what its first copy does
    located = [locate_gold(prompt, gold) for gold in golds]
    found = [False] * len(texts)
    scores = []
    find, n_prompt = prompt.find, len(prompt)
    for g_start, g_end in located:
        g_len = g_end - g_start
        best = 0.0
        for i, text in enumerate(texts):  # span_gold_f1, inlined: this loop is the hot path
            n = len(text)
            lo, hi = g_start - n + 1, g_end + n - 1
            pos = find(text, lo if lo > 0 else 0, hi if hi < n_prompt else n_prompt)
            if pos == -1:
                continue
            found[i] = True
            cap, inter = (n if n < g_len else g_len), 0
            while pos != -1:
                end = pos + n
                v = (g_end if g_end < end else end) - (g_start if g_start > pos else pos)
                if v > inter:
                    inter = v
                    if inter == cap:
                        break
                pos = find(text, pos + 1, hi)
            f1 = 2.0 * inter / (g_len + n)
            if f1 > best:
                best = f1
                if best >= tau:  # capped: no span can score this gold higher (unvisited spans are
                    break  # still counted in the prompt below, by a plain search)
        scores.append(min(best, tau) / tau)
    rest = [text for ok, text in zip(found, texts, strict=True) if not ok]
    in_prompt = sum(multiplicity[text] for ok, text in zip(found, texts, strict=True) if ok)
    in_prompt += sum(multiplicity[text] for text in occurring(prompt, rest))
    if not scores:
        return OverlapResult(0.0, in_prompt)
    if top_k is not None:
        scores = sorted(scores, reverse=True)[: max(1, min(top_k, len(scores)))]
    return OverlapResult(sum(scores) / len(scores), in_prompt)


def recall_overlap(
    prompt: str,
    spans: Sequence[str],
    golds: Sequence[GoldPassage],
    *,
    tau: float,
    top_k: int | None = None,
) -> float:
    """Mean per-gold overlap (eq. 5), over all gold passages or the ``top_k`` best."""
    return recall_overlap_detail(prompt, spans, golds, tau=tau, top_k=top_k).overlap


def density_penalty(
    n_spans: int, n_tokens: int, *, free_spans: int, delta: float = 4.0, half_life: float = 4.0, per_tokens: int = 1024
) -> float:
    """Eq. 6-7: halve the reward for every ``half_life`` excess spans per ``per_tokens`` tokens
    beyond ``delta``; the first ``free_spans`` spans are exempt."""
    density = (n_spans - free_spans) / (max(n_tokens, 1) / per_tokens)
    return 0.5 ** (max(0.0, density - delta) / half_life)


def correctness_penalty(n_short: int, n_mismatch: int, n_spans: int) -> float:
    """Eq. 8, clamped to [0, 1]; 1 without a complete span (the authors' release; see module doc)."""
    if n_spans <= 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - (n_short + n_mismatch) / math.sqrt(n_spans)))
