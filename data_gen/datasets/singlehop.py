"""Single-hop QA over documents: Natural Questions and TriviaQA (category ``single_hop_qa``).

One passage that holds the answer is the gold document; distractors come from the data set's
corpus (every passage of every example), drawn random, by BM25 or dense similarity to the
question, or a mix, and never one that mentions an answer (so the gold passage is the only one
that answers). Varied per example: document layout, negative source, passages with or without
titles, question position.

Source formats (any container of ``data_gen.datasets.io``):

* DPR retriever data (``biencoder-nq-train.json``, ``biencoder-trivia-train.json``):
  ``question``, ``answers``, ``positive_ctxs``/``negative_ctxs``/``hard_negative_ctxs``
  ``[{title, text}]``; the first positive is the gold passage;
* Tevatron layout (``Tevatron/wikipedia-nq``, ``wikipedia-trivia``): ``query``, ``answers``,
  ``positive_passages``/``negative_passages`` ``[{docid, title, text}]``;
* TriviaQA ``rc`` (Hugging Face ``mandarjoshi/trivia_qa``): ``question``,
  ``answer: {value, aliases}``, ``entity_pages: {title, wiki_context}`` and/or
  ``search_results: {title, search_context}``; the evidence pages are cut into windows of
  ``chunk_words`` words, the first window that mentions an answer is the gold passage and the
  others join the corpus.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from data_gen.base import Draft, check_int, register
from data_gen.datasets.common import (
    AnswerFilter,
    DocumentTask,
    doc_piece,
    draw_ids,
    first,
    number_only,
    word_windows,
)
from data_gen.datasets.io import load_records
from data_gen.datasets.negatives import Corpus
from recallm.errors import RecallmError

__all__ = ["NaturalQuestions", "TriviaQA"]


@dataclass
class Example:
    question: str
    answers: list[str]
    gold: tuple[str, str]  # (title, text)
    passages: list[tuple[str, str]]  # the example's other passages (corpus material)


def _strs(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value.strip()] if value.strip() else []
    out: list[str] = []
    for v in value:
        s = str(v).strip()
        if s and s not in out:
            out.append(s)
    return out


def _ctx(items) -> list[tuple[str, str]]:
    out = []
    for c in items or []:
        if isinstance(c, dict):
            text = str(first(c, "text", "passage", "contents", default="")).strip()
            if text:
                out.append((str(c.get("title") or "").strip(), text))
    return out


def _columns(value, *keys):
    """``{title: [...], wiki_context: [...]}`` (HF) or ``[{title, wiki_context}]`` -> pairs."""
    if isinstance(value, dict):
        return list(zip(*(value.get(k) or [] for k in keys), strict=False))
    return [tuple(v.get(k) for k in keys) for v in value or [] if isinstance(v, dict)]


def _trivia_answers(record: dict) -> list[str]:
    answer = record.get("answer")
    if isinstance(answer, dict):
        return _strs([answer.get("value"), *(answer.get("aliases") or [])])
    return _strs(record.get("answers") or answer)


def parse(records: list[dict], chunk_words: int) -> list[Example]:
    examples = []
    for record in records:
        question = str(first(record, "question", "query", default="")).strip()
        if not question:
            continue
        positives = _ctx(first(record, "positive_ctxs", "positive_passages", default=[]))
        if positives or "positive_ctxs" in record or "positive_passages" in record:
            answers = _strs(record.get("answers"))
            if not positives or not answers:
                continue
            negatives = _ctx(record.get("negative_ctxs")) + _ctx(record.get("hard_negative_ctxs"))
            negatives += _ctx(record.get("negative_passages"))
            examples.append(Example(question, answers, positives[0], positives[1:] + negatives))
            continue
        answers = _trivia_answers(record)
        pages = _columns(record.get("entity_pages"), "title", "wiki_context")
        pages += _columns(record.get("search_results"), "title", "search_context")
        if not answers or not pages:
            continue
        mentions = AnswerFilter(answers)
        gold, rest = None, []
        for title, context in pages:
            context = str(context or "")
            for start, end in word_windows(context, chunk_words):
                chunk = (str(title or "").strip(), context[start:end])
                if gold is None and mentions(chunk[1]):
                    gold = chunk
                else:
                    rest.append(chunk)
        if gold is not None:
            examples.append(Example(question, answers, gold, rest))
    return examples


_LOADED: dict[tuple, tuple[list[Example], Corpus, dict]] = {}


class _SingleHop(DocumentTask):
    category = "single_hop_qa"
    min_tokens = 512
    instructions = (
        "Answer the question using the documents below. Answer with a short phrase.",
        "Read the following documents and answer the question; one of them contains the answer.",
        "The documents below may help with the question. Find the one that answers it and give the answer briefly.",
        "Use the passages that follow to answer the question at hand with a few words.",
        "Below is a set of documents. Locate the evidence for the question among them and state the answer.",
    )

    def __init__(self, chunk_words: int = 100, **kwargs) -> None:
        super().__init__(**kwargs)
        self.chunk_words = check_int("chunk_words", chunk_words, 8, 1000)

    def data(self) -> tuple[list[Example], Corpus, dict]:
        key = (self.name, self.path, self.split, self.chunk_words)
        if key not in _LOADED:
            records = load_records(self.path, dataset=self.dataset_label, hint=self.hint, split=self.split, cache=False)
            examples = parse(records, self.chunk_words)
            if not examples:
                raise RecallmError(
                    f"{self.dataset_label}: no usable question in {self.path} (each needs a question, answers and a "
                    f"passage with the answer); {self.hint}"
                )
            passages = [p for ex in examples for p in (ex.gold, *ex.passages)]
            corpus, index = Corpus.build(f"{self.name}:{self.path}:{self.split}:{self.chunk_words}", passages)
            _LOADED[key] = (examples, corpus, index)
        return _LOADED[key]

    def draft(self, rng: random.Random) -> Draft:
        examples, corpus, index = self.data()
        ex = examples[rng.randrange(len(examples))]
        fmt = rng.choice(self.doc_formats)
        source = rng.choice(self.negatives)
        titled = self.pick_titles(rng)
        ids = draw_ids(self.max_docs)
        title, text = ex.gold
        gold = doc_piece(fmt, next(ids), title if titled else "", text, gold=True)
        exclude = [index[ex.gold]] if ex.gold in index else []
        mentions_answer = AnswerFilter(ex.answers)
        neg_rng = random.Random(rng.random())

        distractors = self.distractor_docs(
            corpus, source, ex.question, neg_rng, ids, fmt, titled, exclude=exclude, reject=lambda i: mentions_answer(corpus.texts[i])
        )
        instruction, which = self.pick_instruction(rng)
        question = ex.question if ex.question.endswith("?") else ex.question + "?"
        return Draft(
            instruction=instruction,
            question=f"Question: {question}",
            placed=[gold],
            distractors=distractors,
            answers=list(ex.answers),
            augmentations={
                "doc_format": fmt,
                "negatives": source,
                "titles": "title" if titled else "no_title",
                "instruction": which,
            },
            separator="\n\n",
            question_position=self.pick_question_position(rng, self.question_positions),
            trace_info={"answer": ex.answers[0], "title": title},
            finalize=number_only,
        )


@register
class NaturalQuestions(_SingleHop):
    name = "nq"
    dataset_label = "Natural Questions (DPR retriever data)"
    hint = (
        "download biencoder-nq-train.json from https://github.com/facebookresearch/DPR (or save Tevatron/wikipedia-nq "
        "with datasets' save_to_disk) and pass path=<file or directory>"
    )


@register
class TriviaQA(_SingleHop):
    name = "triviaqa"
    dataset_label = "TriviaQA"
    hint = (
        "download biencoder-trivia-train.json from https://github.com/facebookresearch/DPR (or save "
        "mandarjoshi/trivia_qa, config rc, with datasets' save_to_disk) and pass path=<file or directory>"
    )
