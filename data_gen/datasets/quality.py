"""Long-document multiple-choice QA over one article: QuALITY (category ``long_doc_qa``).

The context is one whole article, every time: a natural-length task (``natural_length``; drafts
with ``fit_length=False``), whose target length is an upper bound — an article whose prompt
exceeds it is drawn again (``data_gen.generate.draft_row``; QuALITY articles are at most about
8K tokens with most tokenizers, the paper uses them at <= 10K). The article is cut into short
runs of whole sentences (at most ``chunk_words`` words; ``chunk_article``), all streamed in order
(``keep_order``, empty separator: the chunks carry the spaces and paragraph breaks between them).
No gold passages: the reward's recall is binary (``evidence=False``). Varied per example: choice
layout (``A. text`` or ``(A) text``), question position.

Source formats (any container of ``data_gen.datasets.io``):

* the QuALITY release (``QuALITY.v1.0.1.htmlstripped.train``, JSON lines): ``title``,
  ``article``, ``questions: [{question, options, gold_label (1-based)}]``; questions without a
  gold label (the test set) are skipped;
* one question per record (e.g. ``emozilla/quality``): ``article``, ``question``, ``options``,
  ``answer`` (0-based) or ``gold_label`` (1-based).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from data_gen.base import QUESTION_POSITIONS, Draft, Piece, Task, check_choice, check_int, register
from data_gen.datasets.common import CHOICE_FORMATS, first, format_choices
from data_gen.datasets.io import check_path, load_records
from recallm.errors import RecallmError

__all__ = ["Quality", "chunk_article"]


@dataclass
class Question:
    article: int  # index into the article list
    question: str
    options: list[str]
    answer: int  # 0-based


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def _sentences(paragraph: str) -> list[str]:
    out, pos = [], 0
    for m in _SENTENCE_END.finditer(paragraph):
        out.append(paragraph[pos : m.start()] + m.group(0).strip())
        pos = m.end()
    if paragraph[pos:].strip():
        out.append(paragraph[pos:].strip())
    return out


def chunk_article(article: str, chunk_words: int) -> list[str]:
    """The article as runs of whole sentences of at most ``chunk_words`` words (a longer sentence
    is cut at word boundaries), never across a paragraph break. Every chunk but the first starts
    with the whitespace that separated it from the one before (a space, or a blank line at a
    paragraph break), so the chunks joined with nothing are the article with its paragraphs,
    and any prefix of them reads as the start of the article."""
    chunks: list[str] = []
    for paragraph in (" ".join(p.split()) for p in article.replace("\r", "").split("\n")):
        if not paragraph:
            continue
        units = []
        for sent in _sentences(paragraph):
            words = sent.split()
            units += [" ".join(words[i : i + chunk_words]) for i in range(0, len(words), chunk_words)]
        groups: list[list[str]] = []
        count = 0
        for unit in units:
            n = len(unit.split())
            if not groups or count + n > chunk_words:
                groups.append([])
                count = 0
            groups[-1].append(unit)
            count += n
        for j, group in enumerate(groups):
            prefix = "" if not chunks else (" " if j else "\n\n")
            chunks.append(prefix + " ".join(group))
    return chunks


def _answer(q: dict) -> int | None:
    if isinstance(q.get("gold_label"), int) and q["gold_label"] >= 1:
        return q["gold_label"] - 1
    value = first(q, "answer", "label")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse(records: list[dict]) -> tuple[list[tuple[str, str]], list[Question]]:
    articles: list[tuple[str, str]] = []
    where: dict[tuple[str, str], int] = {}
    questions = []
    for record in records:
        article = str(record.get("article") or "").strip()
        if not article:
            continue
        key = (str(record.get("title") or "").strip(), article)
        if key not in where:
            where[key] = len(articles)
            articles.append(key)
        items = record.get("questions") if isinstance(record.get("questions"), list) else [record]
        for q in items:
            text, options, answer = str(q.get("question") or "").strip(), q.get("options") or [], _answer(q)
            options = [str(o).strip() for o in options]
            if text and len(options) >= 2 and all(options) and answer is not None and answer < len(options):
                questions.append(Question(where[key], text, options, answer))
    return articles, questions


_LOADED: dict[tuple, tuple[list[tuple[str, str]], list[Question]]] = {}


@register
class Quality(Task):
    name = "quality"
    category = "long_doc_qa"
    natural_length = True  # the whole article: the target is an upper bound (see module doc)
    min_tokens = 1024  # below this no QuALITY article fits (they are about 2K-8K tokens)
    max_tokens = 10240  # about the longest prompt (the paper's <= 10K): past it every article fits
    dataset_label = "QuALITY"
    hint = (
        "download QuALITY.v1.0.1.htmlstripped.train from https://github.com/nyu-mll/quality (or save emozilla/quality "
        "with datasets' save_to_disk) and pass path=<file or directory>"
    )
    instructions = (
        "Read the article below and answer the multiple-choice question about it with the letter of the correct option.",
        "Below is a long article followed by a question with several options. Choose the right option and give its letter.",
        "Answer the question about the following text by picking one of the options; reply with its letter.",
        "Here is an article. After reading it, select the correct answer to the question and state the option letter.",
    )

    def __init__(
        self,
        path: str | None = None,
        split: str = "train",
        choice_formats=CHOICE_FORMATS,
        chunk_words: int = 24,
        question_positions=QUESTION_POSITIONS,
        data_source: str | None = None,
    ) -> None:
        super().__init__(data_source)
        self.path = str(check_path(path, self.dataset_label, self.hint))
        self.split = str(split)
        self.choice_formats = check_choice("choice_formats", choice_formats, CHOICE_FORMATS)
        self.chunk_words = check_int("chunk_words", chunk_words, 4, 5000)
        self.question_positions = check_choice("question_positions", question_positions, QUESTION_POSITIONS)

    def data(self) -> tuple[list[tuple[str, str]], list[Question]]:
        key = (self.path, self.split)
        if key not in _LOADED:
            records = load_records(self.path, dataset=self.dataset_label, hint=self.hint, split=self.split, cache=False)
            articles, questions = parse(records)
            if not questions:
                raise RecallmError(f"{self.dataset_label}: no question with a gold answer in {self.path}; {self.hint}")
            _LOADED[key] = (articles, questions)
        return _LOADED[key]

    def draft(self, rng: random.Random) -> Draft:
        articles, questions = self.data()
        q = questions[rng.randrange(len(questions))]
        title, article = articles[q.article]
        fmt = rng.choice(self.choice_formats)
        chunks = chunk_article(article, self.chunk_words)
        letter = chr(ord("A") + q.answer)
        instruction, which = self.pick_instruction(rng)
        return Draft(
            instruction=instruction,
            question=f"Question: {q.question}\n{format_choices(fmt, q.options)}",
            placed=[],
            distractors=(Piece(c, meta={"chunk": i}) for i, c in enumerate(chunks)),
            answers=[letter],
            augmentations={"choice_format": fmt, "instruction": which},
            ground_truth={"choices": list(q.options)},
            header=f"Title: {title}\n\n" if title else "",
            separator="",
            question_position=self.pick_question_position(rng, self.question_positions),
            keep_order=True,
            evidence=False,
            trace_info={"answer": letter, "title": title, "n_chunks": len(chunks)},
            fit_length=False,
        )
