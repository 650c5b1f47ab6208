"""What the dataset-backed tasks share: document layouts, document ids, answer matching,
multiple-choice layouts, word-window chunks, and the parameters of document tasks.

Document ids. The documents of a prompt are numbered ``[1]..[n]`` in prompt order. A draft's
documents (``doc_piece``) carry provisional ids (the order they were drawn in: the gold ones
first, then the stream, so the ids are about as wide as the final ones and the pieces are
measured at about their final length); the draft's ``finalize`` hook calls
``number_documents`` on the final, ordered pieces, which rewrites every text with its final id
and sets ``Piece.doc_id``, and the task derives what depends on the ids from there (reranking's
``relevance``/``doc_ids``, citation's ``entities``, the answers).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from data_gen.base import QUESTION_POSITIONS, Piece, Task, check_choice, check_int
from data_gen.datasets.io import check_path
from data_gen.datasets.negatives import NEGATIVE_SOURCES, Corpus, check_dense_model, negative_stream
from recallm.errors import RecallmError

__all__ = [
    "DOC_FORMATS",
    "CHOICE_FORMATS",
    "TITLE_MODES",
    "format_doc",
    "format_choices",
    "doc_piece",
    "draw_ids",
    "number_documents",
    "AnswerFilter",
    "word_windows",
    "DocumentTask",
    "number_only",
    "first",
]

DOC_FORMATS = ("document", "bracket")
CHOICE_FORMATS = ("dot", "paren")
TITLE_MODES = ("title", "no_title")  # passages shown with or without their titles (paper §4.2)


def format_doc(fmt: str, doc_id: int | str | None, title: str, text: str) -> str:
    """One document in a layout: ``document`` -> ``Document [3] (Title: t): text``;
    ``bracket`` -> ``[3] t`` then the text on the next line."""
    title = (title or "").strip()
    text = text.strip()
    if fmt == "document":
        head = f"Document [{doc_id}]" if doc_id is not None else "Document"
        return f"{head} (Title: {title}): {text}" if title else f"{head}: {text}"
    if fmt == "bracket":
        head = f"[{doc_id}]" if doc_id is not None else ""
        head = f"{head} {title}".strip()
        return f"{head}\n{text}" if head else text
    raise RecallmError(f"unknown document format {fmt!r}; expected one of {', '.join(DOC_FORMATS)}")


def format_choices(fmt: str, choices: Sequence[str]) -> str:
    """Options lettered A, B, ...: ``dot`` -> ``A. text``; ``paren`` -> ``(A) text``."""
    lines = []
    for i, choice in enumerate(choices):
        letter = chr(ord("A") + i)
        lines.append(f"{letter}. {choice}" if fmt == "dot" else f"({letter}) {choice}")
    return "\n".join(lines)


def draw_ids(max_docs: int) -> Iterator[int]:
    """Provisional ids ``1..max_docs`` in draw order (see module doc); running out ends the stream
    of documents, so a prompt has at most ``max_docs`` of them."""
    return iter(range(1, max_docs + 1))


def doc_piece(fmt: str, doc_id: int, title: str, text: str, *, gold: bool = False, **meta: Any) -> Piece:
    """A document (``format_doc``) under its provisional id; ``number_documents`` renumbers it."""
    meta = {"doc": (fmt, title, text), "title": title, **meta}
    return Piece(format_doc(fmt, doc_id, title, text), gold=gold, meta=meta)


def number_documents(pieces: Sequence[Piece]) -> list[str]:
    """Number the documents ``[1]..[n]`` in the order given (the prompt's): rewrite each text with
    its id and set ``doc_id``; returns the ids (strings). Idempotent, so it may run every round."""
    ids = []
    for i, piece in enumerate(pieces, 1):
        fmt, title, text = piece.meta["doc"]
        piece.text = format_doc(fmt, i, title, text)
        piece.doc_id = str(i)
        ids.append(piece.doc_id)
    return ids


class AnswerFilter:
    """Does a text mention one of the answers? (case-insensitive, whole words). Yes/no answers
    and answers without a letter or digit are never looked for."""

    def __init__(self, aliases: Sequence[str]) -> None:
        terms = sorted(
            {a.strip().lower() for a in aliases if a and a.strip().lower() not in ("yes", "no") and re.search(r"\w", a)}
        )
        self.pattern = (
            re.compile(r"(?<!\w)(?:" + "|".join(re.escape(t) for t in terms) + r")(?!\w)", re.IGNORECASE)
            if terms
            else None
        )

    def __call__(self, text: str) -> bool:
        return bool(self.pattern and self.pattern.search(text))


_WORD = re.compile(r"\S+")


def word_windows(text: str, n_words: int) -> list[tuple[int, int]]:
    """Character spans of consecutive windows of ``n_words`` words covering ``text`` (a last
    window shorter than half of that joins the one before)."""
    words = [m.span() for m in _WORD.finditer(text)]
    if not words:
        return []
    starts = list(range(0, len(words), n_words))
    if len(starts) > 1 and len(words) - starts[-1] < n_words / 2:
        starts.pop()
    ends = starts[1:] + [len(words)]
    return [(words[a][0], words[b - 1][1]) for a, b in zip(starts, ends, strict=True)]


def first(record: dict[str, Any], *keys: str, default: Any = None) -> Any:
    """The value of the first of ``keys`` that ``record`` has (and is not None)."""
    for key in keys:
        if record.get(key) is not None:
            return record[key]
    return default


class DocumentTask(Task):
    """A task whose context is documents from a corpus: the shared parameters.

    Args:
        path: the data set's local file or directory (formats: ``data_gen.datasets.io``).
        split: the split of a saved ``DatasetDict`` (or the file-name filter of a directory).
        negatives: negative sources to draw from per example (``random``, ``bm25``, ``dense``,
            ``judged``, ``mixed``); ``dense`` needs ``dense_model``, ``judged`` a data set with
            judged negatives (MS MARCO, QAMPARI). Default: random, bm25 and mixed, plus dense when
            ``dense_model`` is given and judged where the data set has them.
        dense_model: a local encoder directory for dense negatives (None: off; the paper used
            GTE-ModernBERT-base).
        doc_formats: document layouts to draw from (``document``, ``bracket``).
        titles: passages with their titles, without, or both drawn per example (``title``,
            ``no_title``).
        max_docs: the most documents in one prompt (numbered ``[1]..[n]`` in prompt order).
        question_positions: where the question goes (``end``, ``beginning``, ``both``).
    """

    dataset_label: str = ""
    hint: str = ""
    has_judged_negatives: bool = False  # the data set judges negatives per query (the ``judged`` source)

    def __init__(
        self,
        path: str | None = None,
        split: str = "train",
        negatives=None,
        dense_model: str | None = None,
        doc_formats=DOC_FORMATS,
        titles=TITLE_MODES,
        max_docs: int = 2000,
        question_positions=QUESTION_POSITIONS,
        data_source: str | None = None,
    ) -> None:
        super().__init__(data_source)
        self.path = str(check_path(path, self.dataset_label or self.name, self.hint))
        self.split = str(split)
        self.dense_model = check_dense_model(dense_model)
        if negatives is None:
            negatives = ("random", "bm25", "mixed") + (("dense",) if self.dense_model else ())
            negatives += ("judged",) if self.has_judged_negatives else ()
        self.negatives = check_choice("negatives", negatives, NEGATIVE_SOURCES)
        if "dense" in self.negatives and self.dense_model is None:
            raise RecallmError(
                f"task {self.name}: negatives include 'dense' but no dense_model is given: set dense_model=<a local "
                "encoder directory> (data.dense_model=... in the paper mixture; the paper used GTE-ModernBERT-base), "
                "or leave 'dense' out of negatives"
            )
        if "judged" in self.negatives and not self.has_judged_negatives:
            raise RecallmError(
                f"task {self.name}: its data set has no judged negatives; leave 'judged' out of negatives"
            )
        self.doc_formats = check_choice("doc_formats", doc_formats, DOC_FORMATS)
        self.titles = check_choice("titles", titles, TITLE_MODES)
        self.max_docs = check_int("max_docs", max_docs, 2, 1_000_000)
        self.question_positions = check_choice("question_positions", question_positions, QUESTION_POSITIONS)

    def negative_indices(
        self,
        corpus: Corpus,
        source: str,
        query: str,
        rng: random.Random,
        exclude=(),
        reject=None,
        judged=(),
    ) -> Iterator[int]:
        return negative_stream(
            corpus, source, query, rng, exclude=exclude, reject=reject, dense_model=self.dense_model, judged=judged
        )

    def pick_titles(self, rng: random.Random) -> bool:
        """Whether this example shows its passages' titles."""
        return rng.choice(self.titles) == "title"

    def distractor_docs(
        self,
        corpus: Corpus,
        source: str,
        query: str,
        rng: random.Random,
        ids: Iterator[int],
        fmt: str,
        titled: bool,
        *,
        exclude=(),
        reject=None,
        judged=(),
        pieces: Callable[[int], list[Piece] | None] | None = None,
    ) -> Iterator[Piece]:
        """A draft's distractors, lazily: the ``source`` negatives of ``query`` (``negative_indices``),
        each as a document (``doc_piece``, title shown when ``titled``) under the next provisional id,
        until the ids run out (``max_docs``). ``pieces(i)`` replaces the one-document rendering of
        corpus entry ``i`` (several documents, or None when the ids ran out)."""
        for i in self.negative_indices(corpus, source, query, rng, exclude, reject, judged):
            if pieces is not None:
                made = pieces(i)
            else:
                doc_id = next(ids, None)
                made = None if doc_id is None else [doc_piece(fmt, doc_id, corpus.titles[i] if titled else "", corpus.texts[i])]
            if made is None:
                return
            yield from made


def number_only(pieces: list[Piece]) -> dict:
    """A draft's ``finalize`` when nothing depends on the document ids: just number them."""
    number_documents(pieces)
    return {}
