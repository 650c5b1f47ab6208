"""Multi-hop QA over documents: HotpotQA, 2WikiMultihopQA, MuSiQue (category ``multi_hop_qa``).

The supporting paragraphs of a question (2-4) are the gold documents; the distractors are other
paragraphs of the data set's corpus (every paragraph of every example, deduplicated), drawn
random, by BM25 or dense similarity to the question, or a mix, and never one that mentions the
answer. Varied per example: document layout, negative source, passage type (``paragraph``: a
whole paragraph per document; ``chunk``: fixed windows of ``chunk_words`` words cut across
sentence boundaries, gold when they hold a supporting sentence, the other windows of a gold
paragraph always present as distractors — HotpotQA and 2Wiki, whose supporting facts are
sentences; both types by default there), passages with or without titles, question position.
With ``wiki_corpus`` (a chunked local Wikipedia: KILT's knowledge source or DPR's passages, see
``data_gen.datasets.wiki``) the distractors of ``chunk`` passages are windows of that corpus
instead of the data set's own paragraphs (paper App. C.4: "a fixed-window chunked Wikipedia
corpus from the KILT knowledge source").

Source formats (any container of ``data_gen.datasets.io``):

* HotpotQA / 2Wiki release JSON: records with ``question``, ``answer`` (2Wiki: optional
  ``answer_aliases``), ``context`` ``[[title, [sentence, ...]], ...]`` and
  ``supporting_facts`` ``[[title, sentence_index], ...]``; or the Hugging Face layout
  (``context: {title: [...], sentences: [[...]]}``, ``supporting_facts: {title: [...],
  sent_id: [...]}``, either possibly a JSON string);
* MuSiQue release JSONL: ``question``, ``answer``, ``answer_aliases``, ``answerable``,
  ``paragraphs: [{title, paragraph_text, is_supporting}]``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from data_gen.base import Draft, Piece, check_choice, check_int, register
from data_gen.datasets.common import (
    AnswerFilter,
    DocumentTask,
    doc_piece,
    draw_ids,
    first,
    number_only,
    word_windows,
)
from data_gen.datasets.io import check_path, load_records
from data_gen.datasets.negatives import Corpus
from recallm.errors import RecallmError

__all__ = ["HotpotQA", "TwoWikiMQA", "MuSiQue", "PASSAGE_TYPES"]

PASSAGE_TYPES = ("paragraph", "chunk")
GOLD_RANGE = (2, 4)


@dataclass
class Paragraph:
    title: str
    text: str
    sentences: list[tuple[int, int]] | None = None  # character spans of the sentences in text
    support: list[int] = field(default_factory=list)  # supporting sentence indices (empty: whole paragraph)


@dataclass
class Example:
    question: str
    answers: list[str]
    gold: list[Paragraph]
    others: list[Paragraph]


def _maybe_json(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _pairs(value, a: str, b: str) -> list[tuple]:
    value = _maybe_json(value)
    if isinstance(value, dict):
        return list(zip(value.get(a) or [], value.get(b) or [], strict=False))
    return [tuple(item[:2]) for item in (value or []) if isinstance(item, (list, tuple)) and len(item) >= 2]


def _join(sentences: list[str]) -> tuple[str, list[tuple[int, int]]]:
    text, spans = "", []
    for s in sentences:
        s = str(s).strip()
        if not s:
            spans.append((len(text), len(text)))
            continue
        if text:
            text += " "
        spans.append((len(text), len(text) + len(s)))
        text += s
    return text, spans


def _aliases(record: dict, answer_key: str = "answer") -> list[str]:
    answers = [str(record.get(answer_key) or "").strip()]
    for key in ("answer_aliases", "aliases"):
        extra = record.get(key)
        if isinstance(extra, str):
            extra = [extra]
        answers += [str(a).strip() for a in extra or []]
    out: list[str] = []
    for a in answers:
        if a and a not in out:
            out.append(a)
    return out


def parse_hotpot_like(records: list[dict]) -> list[Example]:
    examples = []
    for record in records:
        question, answers = str(first(record, "question", default="")).strip(), _aliases(record)
        context = _pairs(record.get("context"), "title", "sentences")
        support: dict[str, list[int]] = {}
        for title, sid in _pairs(record.get("supporting_facts"), "title", "sent_id"):
            support.setdefault(str(title), []).append(int(sid))
        if not question or not answers or not context or not support:
            continue
        gold, others = [], []
        for title, sentences in context:
            title = str(title)
            if isinstance(sentences, str):
                sentences = [sentences]
            text, spans = _join(list(sentences))
            if not text:
                continue
            para = Paragraph(title, text, spans)
            if title in support:
                para.support = sorted({s for s in support[title] if 0 <= s < len(spans) and spans[s][1] > spans[s][0]})
                gold.append(para)
            else:
                others.append(para)
        if len(gold) == len(support) and GOLD_RANGE[0] <= len(gold) <= GOLD_RANGE[1]:
            examples.append(Example(question, answers, gold, others))
    return examples


def parse_musique(records: list[dict]) -> list[Example]:
    examples = []
    for record in records:
        if record.get("answerable") is False:
            continue
        question, answers = str(record.get("question") or "").strip(), _aliases(record)
        gold, others = [], []
        for p in record.get("paragraphs") or []:
            text = str(first(p, "paragraph_text", "text", default="")).strip()
            if not text:
                continue
            para = Paragraph(str(p.get("title") or ""), text)
            (gold if p.get("is_supporting") else others).append(para)
        if question and answers and GOLD_RANGE[0] <= len(gold) <= GOLD_RANGE[1]:
            examples.append(Example(question, answers, gold, others))
    return examples


_LOADED: dict[tuple[str, str, str], tuple[list[Example], Corpus, dict]] = {}


class _MultiHop(DocumentTask):
    category = "multi_hop_qa"
    min_tokens = 1024  # room for up to four gold paragraphs and some distractors
    sentence_support = True
    instructions = (
        "Answer the question using the documents below. The answer needs facts from more than one document.",
        "Read the following documents and answer the question; you will have to combine information from several of them.",
        "Several documents are given below. Find the pieces of evidence the question depends on and connect them to answer it.",
        "Use the documents that follow to answer a question that takes more than one reasoning step. Answer with a short phrase.",
        "Below are documents, some relevant and some not. Work out the answer to the question by linking facts across documents.",
    )

    def __init__(
        self,
        passage_types=None,
        chunk_words: int = 48,
        wiki_corpus: str | None = None,
        wiki_max_passages: int = 200_000,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        allowed = PASSAGE_TYPES if self.sentence_support or wiki_corpus else ("paragraph",)
        self.passage_types = check_choice("passage_types", allowed if passage_types is None else passage_types, allowed)
        self.chunk_words = check_int("chunk_words", chunk_words, 8, 1000)
        self.wiki_max_passages = check_int("wiki_max_passages", wiki_max_passages, 1, 100_000_000)
        self.wiki_corpus = None
        if wiki_corpus is not None:
            from data_gen.datasets.wiki import WIKI_HINT

            self.wiki_corpus = str(check_path(wiki_corpus, "Wikipedia corpus", WIKI_HINT))

    def wiki(self) -> Corpus:
        """The chunked Wikipedia corpus (``wiki_corpus``), built once per process."""
        from data_gen.datasets.wiki import load_wiki_chunks

        key = ("wiki", self.wiki_corpus, str(self.chunk_words), str(self.wiki_max_passages))
        if key not in _LOADED:
            chunks = load_wiki_chunks(self.wiki_corpus, self.chunk_words, self.wiki_max_passages)
            corpus, _ = Corpus.build(f"wiki:{self.wiki_corpus}:{self.chunk_words}:{self.wiki_max_passages}", chunks)
            _LOADED[key] = ([], corpus, {})
        return _LOADED[key][1]

    def parse(self, records: list[dict]) -> list[Example]:
        raise NotImplementedError

    def data(self) -> tuple[list[Example], Corpus, dict]:
        key = (self.name, self.path, self.split)
        if key not in _LOADED:
            records = load_records(self.path, dataset=self.dataset_label, hint=self.hint, split=self.split, cache=False)
            examples = self.parse(records)
            if not examples:
                raise RecallmError(
                    f"{self.dataset_label}: no usable question in {self.path} (each needs a question, an answer and "
                    f"{GOLD_RANGE[0]}-{GOLD_RANGE[1]} supporting paragraphs); {self.hint}"
                )
            passages = [(p.title, p.text) for ex in examples for p in (*ex.gold, *ex.others)]
            corpus, index = Corpus.build(f"{self.name}:{self.path}:{self.split}", passages)
            _LOADED[key] = (examples, corpus, index)
        return _LOADED[key]

    def _pieces(
        self, para: Paragraph, ptype: str, fmt: str, ids, gold: bool, titled: bool = True
    ) -> list[Piece] | None:
        """The documents of one paragraph; None when the ids ran out."""
        title = para.title if titled else ""
        if ptype == "paragraph":
            doc_id = next(ids, None)
            if doc_id is None:
                return None
            return [doc_piece(fmt, doc_id, title, para.text, gold=gold)]
        out = []
        support = [para.sentences[s] for s in para.support] if para.sentences and para.support else []
        for start, end in word_windows(para.text, self.chunk_words):
            doc_id = next(ids, None)
            if doc_id is None:
                return None
            is_gold = gold and (not support or any(s < end and start < e for s, e in support))
            out.append(doc_piece(fmt, doc_id, title, para.text[start:end], gold=is_gold))
        return out

    def draft(self, rng: random.Random) -> Draft:
        examples, corpus, index = self.data()
        ex = examples[rng.randrange(len(examples))]
        fmt = rng.choice(self.doc_formats)
        source = rng.choice(self.negatives)
        ptype = rng.choice(self.passage_types)
        titled = self.pick_titles(rng)
        ids = draw_ids(self.max_docs)
        placed: list[Piece] = []
        for para in ex.gold:
            pieces = self._pieces(para, ptype, fmt, ids, gold=True, titled=titled)
            if pieces is None:
                raise RecallmError(f"max_docs={self.max_docs} is too small for the gold documents of {self.name}")
            placed += pieces
        from_wiki = ptype == "chunk" and self.wiki_corpus is not None
        pool = self.wiki() if from_wiki else corpus
        exclude = [] if from_wiki else [index[(p.title, p.text)] for p in ex.gold if (p.title, p.text) in index]
        mentions_answer = AnswerFilter(ex.answers)
        neg_rng = random.Random(rng.random())

        # a Wikipedia window is one document as it is; a paragraph of the data set is cut like the gold
        kind = "paragraph" if from_wiki else ptype
        distractors = self.distractor_docs(
            pool,
            source,
            ex.question,
            neg_rng,
            ids,
            fmt,
            titled,
            exclude=exclude,
            reject=lambda i: mentions_answer(pool.texts[i]),
            pieces=lambda i: self._pieces(Paragraph(pool.titles[i], pool.texts[i]), kind, fmt, ids, gold=False, titled=titled),
        )
        instruction, which = self.pick_instruction(rng)
        return Draft(
            instruction=instruction,
            question=f"Question: {ex.question}",
            placed=placed,
            distractors=distractors,
            answers=list(ex.answers),
            augmentations={
                "doc_format": fmt,
                "negatives": source,
                "passage_type": ptype,
                "distractor_corpus": "wikipedia" if from_wiki else "native",
                "titles": "title" if titled else "no_title",
                "n_gold": sum(p.gold for p in placed),
                "instruction": which,
            },
            separator="\n\n",
            question_position=self.pick_question_position(rng, self.question_positions),
            trace_info={"answer": ex.answers[0], "titles": [p.title for p in ex.gold]},
            finalize=number_only,
        )


@register
class HotpotQA(_MultiHop):
    name = "hotpotqa"
    dataset_label = "HotpotQA"
    hint = (
        "download hotpot_train_v1.1.json from https://hotpotqa.github.io (or save hotpotqa/hotpot_qa with "
        "datasets' save_to_disk) and pass path=<file or directory>"
    )

    def parse(self, records: list[dict]) -> list[Example]:
        return parse_hotpot_like(records)


@register
class TwoWikiMQA(_MultiHop):
    name = "2wikimqa"
    dataset_label = "2WikiMultihopQA"
    hint = (
        "download train.json of 2WikiMultihopQA from https://github.com/Alab-NII/2wikimultihop and pass "
        "path=<file or directory>"
    )

    def parse(self, records: list[dict]) -> list[Example]:
        return parse_hotpot_like(records)


@register
class MuSiQue(_MultiHop):
    name = "musique"
    dataset_label = "MuSiQue"
    hint = (
        "download musique_ans_v1.0_train.jsonl from https://github.com/StonyBrookNLP/musique and pass "
        "path=<file or directory>"
    )
    sentence_support = False  # paragraph-level supporting facts: no chunk passages

    def parse(self, records: list[dict]) -> list[Example]:
        return parse_musique(records)
