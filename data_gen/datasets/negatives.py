"""Negative (distractor) passages: random, BM25 and dense, streamed hardest first.

A ``Corpus`` is the passage pool of one data set (titles and texts), built once per file. For a
query, ``negative_stream`` yields corpus indices, each at most once, skipping the ``exclude``d
ones (the gold passages) and those ``reject`` refuses (e.g. passages that contain the answer):

* ``random``: a uniformly random order of the whole corpus;
* ``bm25``: the corpus ranked by BM25 against the query (``bm25s``; an index per corpus, built
  on first use and cached), passages with a positive score first, best first; then the rest in
  random order;
* ``dense``: the same with cosine similarity of embeddings from a local encoder directory
  (``transformers.AutoModel`` / ``AutoTokenizer``), pooled as the directory's
  sentence-transformers ``1_Pooling/config.json`` says (CLS for GTE-ModernBERT-base, the paper's
  encoder), mean pooling without one; the corpus is embedded once per (model, corpus) and cached;
* ``judged``: the query's own judged negatives (passages retrieved or assessed for it that hold
  no answer: MS MARCO's grade-0 qrels, QAMPARI's retrieved contexts), in random order, then the
  BM25 stream;
* ``mixed``: each next passage comes from the BM25, the random or (with a dense model) the
  dense stream, picked at random (a per-example mixture of sources).

The stream ends when the corpus runs out. Everything is deterministic in the caller's RNG.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path

import numpy as np

from recallm.errors import RecallmError

__all__ = [
    "NEGATIVE_SOURCES",
    "Corpus",
    "BM25Index",
    "DenseIndex",
    "bm25_index",
    "dense_index",
    "random_order",
    "negative_stream",
    "check_dense_model",
    "pooling_mode",
]

NEGATIVE_SOURCES = ("random", "bm25", "dense", "judged", "mixed")
HARD_TOP_K = 2000  # ranked passages per query; past them the stream goes on at random


class Corpus:
    """A passage pool: ``titles[i]``, ``texts[i]`` (``key`` names it in the index caches)."""

    def __init__(self, key: str, titles: list[str], texts: list[str]) -> None:
        if len(titles) != len(texts):
            raise ValueError("titles and texts differ in length")
        self.key = key
        self.titles = titles
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def search_text(self, i: int) -> str:
        title = self.titles[i]
        return f"{title} {self.texts[i]}" if title else self.texts[i]

    @classmethod
    def build(cls, key: str, passages: Iterable[tuple[str, str]]) -> tuple[Corpus, dict[tuple[str, str], int]]:
        """A corpus of distinct (title, text) passages, and the index of each."""
        index: dict[tuple[str, str], int] = {}
        titles: list[str] = []
        texts: list[str] = []
        for title, text in passages:
            k = (title or "", text)
            if not text or k in index:
                continue
            index[k] = len(texts)
            titles.append(k[0])
            texts.append(text)
        return cls(key, titles, texts), index


def random_order(n: int, rng: random.Random) -> Iterator[int]:
    """0..n-1 in a uniformly random order, lazily (cheap when only the first few are used)."""
    if n <= 0:
        return
    np_rng = np.random.default_rng(rng.getrandbits(64))
    seen: set[int] = set()
    while len(seen) < n // 2:  # rejection sampling while collisions are rare
        for i in np_rng.integers(0, n, size=64).tolist():
            if i not in seen:
                seen.add(i)
                yield i
    rest = np.ones(n, dtype=bool)
    rest[list(seen)] = False
    remaining = np.flatnonzero(rest)
    np_rng.shuffle(remaining)
    yield from remaining.tolist()


class BM25Index:
    """BM25 over a corpus (``bm25s``, English stopwords, lower-cased word tokens)."""

    def __init__(self, corpus: Corpus) -> None:
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.n = len(corpus)
        self.tokenizer = Tokenizer(stopwords="en")
        tokens = self.tokenizer.tokenize(
            [corpus.search_text(i) for i in range(self.n)], return_as="tuple", show_progress=False
        )
        self.retriever = bm25s.BM25()
        self.retriever.index(tokens, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        ids = self.tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)[0]
        empty = self.retriever.vocab_dict.get("")  # what unknown query words map to
        ids = [i for i in ids if i != empty]
        if not ids:
            return np.zeros(self.n, dtype=np.float32)
        return np.asarray(self.retriever.get_scores_from_ids(ids), dtype=np.float32)

    def rank(self, query: str, k: int = HARD_TOP_K) -> list[int]:
        """Indices of the (at most ``k``) passages with a positive score, best first (ties by index)."""
        return _top(self.scores(query), k)


def _top(scores: np.ndarray, k: int) -> list[int]:
    positive = np.flatnonzero(scores > 0)
    if len(positive) > k:
        part = np.argpartition(-scores[positive], k - 1)[:k]
        positive = positive[part]
    order = np.lexsort((positive, -scores[positive]))
    return positive[order].tolist()


class DenseIndex:
    """Cosine similarity of mean-pooled embeddings from a local encoder directory."""

    def __init__(self, corpus: Corpus, model_path: str, batch_size: int = 32, max_length: int = 256) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch = torch
        self.pooling = pooling_mode(model_path)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.tokenizer.pad_token is None:  # decoder-style tokenizers: pad with something, it is masked out
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.model = AutoModel.from_pretrained(model_path).to(self.device).eval()
        self.max_length = max_length
        self.batch_size = batch_size
        texts = [corpus.search_text(i) for i in range(len(corpus))]
        self.embeddings = (
            np.concatenate([self.encode(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)])
            if texts
            else np.zeros((0, 1), dtype=np.float32)
        )

    def encode(self, texts: list[str]) -> np.ndarray:
        torch = self.torch
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad():
            hidden = self.model(**enc).last_hidden_state
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        pooled = torch.nn.functional.normalize(pooled.float(), dim=-1)
        return pooled.cpu().numpy()

    def scores(self, query: str) -> np.ndarray:
        return self.embeddings @ self.encode([query])[0]

    def rank(self, query: str, k: int = HARD_TOP_K) -> list[int]:
        scores = self.scores(query)
        k = min(k, len(scores))
        if k == 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k]
        return top[np.lexsort((top, -scores[top]))].tolist()


_BM25: dict[str, BM25Index] = {}
_DENSE: dict[tuple[str, str], DenseIndex] = {}


def bm25_index(corpus: Corpus) -> BM25Index:
    """The corpus's BM25 index, built once per process."""
    if corpus.key not in _BM25:
        _BM25[corpus.key] = BM25Index(corpus)
    return _BM25[corpus.key]


def pooling_mode(model_path: str) -> str:
    """``cls`` or ``mean``: what the encoder directory's sentence-transformers pooling config asks
    for (``1_Pooling/config.json``); ``mean`` without one."""
    import json

    config = Path(model_path) / "1_Pooling" / "config.json"
    try:
        settings = json.loads(config.read_text())
    except (OSError, ValueError):
        return "mean"
    return "cls" if settings.get("pooling_mode_cls_token") and not settings.get("pooling_mode_mean_tokens") else "mean"


def check_dense_model(model_path: str | None) -> str | None:
    """Validate a dense-negative model directory (None: dense negatives off)."""
    if model_path is None:
        return None
    p = Path(model_path).expanduser()
    if not (p / "config.json").is_file():
        raise RecallmError(
            f"dense_model {p} is not a model directory (no config.json): give a local encoder saved with save_pretrained"
        )
    return str(p)


def dense_index(corpus: Corpus, model_path: str) -> DenseIndex:
    """The corpus embedded with ``model_path``, once per process."""
    key = (corpus.key, str(Path(model_path).resolve()))
    if key not in _DENSE:
        try:
            _DENSE[key] = DenseIndex(corpus, model_path)
        except OSError as exc:
            raise RecallmError(f"cannot load the dense model at {model_path}: {str(exc).splitlines()[0]}") from exc
    return _DENSE[key]


def _ranked_then_random(ranked: list[int], n: int, rng: random.Random) -> Iterator[int]:
    yield from ranked
    yield from random_order(n, rng)  # repeats of the ranked ones are dropped by the caller


def negative_stream(
    corpus: Corpus,
    source: str,
    query: str,
    rng: random.Random,
    *,
    exclude: Iterable[int] = (),
    reject: Callable[[int], bool] | None = None,
    dense_model: str | None = None,
    judged: Sequence[int] = (),
) -> Iterator[int]:
    """Corpus indices of negatives for ``query``, hardest first for ``bm25``/``dense`` (module doc).
    ``judged``: the query's judged negatives (corpus indices), for the ``judged`` source."""
    if source not in NEGATIVE_SOURCES:
        raise RecallmError(f"unknown negative source {source!r}; expected one of {', '.join(NEGATIVE_SOURCES)}")
    n = len(corpus)
    if source == "random":
        order: Iterator[int] = random_order(n, rng)
    elif source in ("bm25", "dense"):
        if source == "dense":
            if dense_model is None:
                raise RecallmError("dense negatives need dense_model=<local encoder directory>")
            ranked = dense_index(corpus, dense_model).rank(query)
        else:
            ranked = bm25_index(corpus).rank(query)
        order = _ranked_then_random(ranked, n, rng)
    elif source == "judged":
        first = [judged[i] for i in random_order(len(judged), rng)]
        order = chain(first, _ranked_then_random(bm25_index(corpus).rank(query), n, rng))
    else:  # mixed
        streams = [_ranked_then_random(bm25_index(corpus).rank(query), n, rng), random_order(n, rng)]
        if dense_model is not None:
            streams.append(_ranked_then_random(dense_index(corpus, dense_model).rank(query), n, rng))
        order = _interleave(streams, rng)
    seen = set(exclude)
    for i in order:
        if i in seen:
            continue
        seen.add(i)
        if reject is not None and reject(i):
            continue
        yield i


def _interleave(streams: list[Iterator[int]], rng: random.Random) -> Iterator[int]:
    coin = random.Random(rng.random())
    sources = list(streams)
    while sources:
        src = sources[0] if len(sources) == 1 else sources[coin.randrange(len(sources))]
        value = next(src, None)
        if value is None:
            sources.remove(src)
            continue
        yield value
