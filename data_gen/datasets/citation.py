"""Multi-answer QA with citations: QAMPARI (category ``entity_citation``).

A question with many answers (entities). ``gold_entities`` of them (default 1-5, drawn per
example) get one supporting passage each, placed at random positions: those passages are the
gold evidence. Any other answer that a gold passage mentions is supported too and joins the
ground truth. Distractors come from the corpus (random, BM25, dense or mixed, hardest first) and
never mention an answer of the question, so the supported entities are exactly those of the
ground truth. Documents carry ids (``[1]``..``[n]`` in prompt order, see
``data_gen.datasets.common``); the answer lists entities with their citations,
``Entity [2][5], Other [7]``.

Ground truth (set once the prompt order is final): ``entities`` ``[{"answers": aliases, "docs":
[ids]}]``, in the question's answer order, each with the ids of the shown passages that support
it; ``answers``: the first alias of each.

Source formats (any container of ``data_gen.datasets.io``):

* the QAMPARI release (``full_train_data.jsonl``): ``question_text``, ``answer_list:
  [{answer_text, aliases, proof: [{proof_text, found_in_url}]}]`` — the proofs are the
  supporting passages (titled after their Wikipedia page);
* ALCE's QAMPARI files (``qampari_eval_gtr_top100.json``): ``question``, ``answers``
  (a list of alias lists) and ``docs: [{title, text}]`` — an answer's supporting passages are
  the docs that mention one of its aliases.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from urllib.parse import unquote

from data_gen.base import Draft, Piece, Row, register
from data_gen.datasets.common import (
    AnswerFilter,
    DocumentTask,
    check_range,
    doc_piece,
    draw_ids,
    first,
    number_documents,
)
from data_gen.datasets.io import load_records
from data_gen.datasets.negatives import Corpus
from recallm.errors import RecallmError

__all__ = ["Qampari"]


@dataclass
class Entity:
    aliases: list[str]
    support: list[int]  # corpus indices


@dataclass
class Question:
    text: str
    entities: list[Entity]


def _title(url: str) -> str:
    return unquote(str(url or "").rstrip("/").rsplit("/", 1)[-1]).replace("_", " ").strip()


def _aliases(*values) -> list[str]:
    out: list[str] = []
    for v in values:
        for a in [v] if isinstance(v, str) else list(v or []):
            a = str(a).strip()
            if a and a not in out:
                out.append(a)
    return out


def parse(records: list[dict]) -> tuple[list[tuple[str, str]], list[tuple[str, list[tuple[list[str], list]]]]]:
    """(passages, questions as (text, [(aliases, supporting passage keys)]))."""
    passages, questions = [], []
    for record in records:
        if "answer_list" in record:
            text = str(first(record, "question_text", "question", default="")).strip()
            entities = []
            for answer in record.get("answer_list") or []:
                aliases = _aliases(answer.get("answer_text"), answer.get("aliases"))
                keys = []
                for proof in answer.get("proof") or []:
                    body = str(proof.get("proof_text") or "").strip()
                    if body:
                        keys.append((_title(proof.get("found_in_url")), body))
                passages += keys
                if aliases:
                    entities.append((aliases, keys))
        else:
            text = str(first(record, "question", "question_text", default="")).strip()
            docs = [
                (str(d.get("title") or "").strip(), str(d.get("text") or "").strip())
                for d in record.get("docs") or []
                if isinstance(d, dict) and str(d.get("text") or "").strip()
            ]
            passages += docs
            entities = []
            for answer in record.get("answers") or []:
                aliases = _aliases(answer)
                mentions = AnswerFilter(aliases)
                entities.append((aliases, [d for d in docs if mentions(d[1])]))
        if text and entities:
            questions.append((text, entities))
    return passages, questions


_LOADED: dict[tuple, tuple[list[Question], Corpus]] = {}


@register
class Qampari(DocumentTask):
    name = "qampari"
    category = "entity_citation"
    min_tokens = 1024  # room for the gold pieces (up to a dozen) and some distractors
    dataset_label = "QAMPARI"
    hint = (
        "download full_train_data.jsonl from https://github.com/samsam3232/qampari (or ALCE's "
        "qampari_eval_gtr_top100.json from https://github.com/princeton-nlp/ALCE) and pass path=<file or directory>"
    )
    instructions = (
        "Answer the question using the documents below. List every answer that the documents support, each followed "
        "by the ids of the documents that support it, like: Entity [2][5], Other [7].",
        "The question has several answers. Name each one found in the documents below and cite its sources by id, "
        "in the form Name [3], Another name [1][8].",
        "Using only the documents that follow, give all answers to the question, separated by commas, each with the "
        "bracketed ids of its supporting documents (e.g. Answer [4][9], Answer [2]).",
        "Find every answer to the question in the documents below. For each answer, cite the document ids that "
        "support it: Entity [6], Other entity [1][3].",
    )

    def __init__(self, gold_entities=(1, 5), **kwargs) -> None:
        super().__init__(**kwargs)
        self.gold_entities = check_range("gold_entities", gold_entities)
        if self.gold_entities[0] < 1:
            raise RecallmError(f"gold_entities must be at least 1, got {gold_entities}")

    def data(self) -> tuple[list[Question], Corpus]:
        key = (self.path, self.split)
        if key not in _LOADED:
            records = load_records(self.path, dataset=self.dataset_label, hint=self.hint, split=self.split, cache=False)
            passages, raw = parse(records)
            corpus, index = Corpus.build(f"{self.name}:{self.path}:{self.split}", passages)
            questions = []
            for text, entities in raw:
                ents = [Entity(a, sorted({index[k] for k in keys if k in index})) for a, keys in entities]
                if any(e.support for e in ents):
                    questions.append(Question(text, ents))
            if not questions:
                raise RecallmError(
                    f"{self.dataset_label}: no question with a supported answer in {self.path}; {self.hint}"
                )
            _LOADED[key] = (questions, corpus)
        return _LOADED[key]

    def draft(self, rng: random.Random) -> Draft:
        questions, corpus = self.data()
        q = questions[rng.randrange(len(questions))]
        supported = [e for e in q.entities if e.support]
        k = min(rng.randint(*self.gold_entities), len(supported))
        chosen = rng.sample(supported, k)
        fmt = rng.choice(self.doc_formats)
        source = rng.choice(self.negatives)
        ids = draw_ids(self.max_docs)
        gold: list[int] = []  # corpus indices of the supporting passages, one per chosen entity (or shared)
        for entity in chosen:
            i = rng.choice(entity.support)
            if i not in gold:
                gold.append(i)
        if len(gold) > self.max_docs:
            raise RecallmError(f"max_docs={self.max_docs} is too small for {len(gold)} gold passages of {self.name}")
        # every answer a gold passage supports or mentions (the chosen ones among them)
        mentions = [AnswerFilter(e.aliases) for e in q.entities]
        placed = [
            doc_piece(
                fmt,
                next(ids),
                corpus.titles[i],
                corpus.texts[i],
                gold=True,
                supports=[j for j, e in enumerate(q.entities) if i in e.support or mentions[j](corpus.texts[i])],
            )
            for i in gold
        ]
        trace_info: dict = {}

        def finalize(pieces: list[Piece]) -> dict:
            """Number the passages in prompt order; each entity's supporting ids follow."""
            number_documents(pieces)
            entities = []
            for j, entity in enumerate(q.entities):
                docs = [p.doc_id for p in pieces if p.gold and j in p.meta["supports"]]
                if docs:
                    entities.append({"answers": list(entity.aliases), "docs": docs})
            trace_info["entities"] = entities
            return {"entities": entities, "answers": [e["answers"][0] for e in entities]}

        provisional = finalize(placed)  # the gold passages alone, in draw order (build_row calls it again)
        mentions_any = AnswerFilter([a for e in q.entities for a in e.aliases])
        neg_rng = random.Random(rng.random())

        def distractors():
            for i in self.negative_indices(
                corpus, source, q.text, neg_rng, gold, lambda i: mentions_any(corpus.texts[i])
            ):
                doc_id = next(ids, None)
                if doc_id is None:
                    return
                yield doc_piece(fmt, doc_id, corpus.titles[i], corpus.texts[i])

        instruction, which = self.pick_instruction(rng)
        question = q.text if q.text.endswith("?") else q.text + "?"
        return Draft(
            instruction=instruction,
            question=f"Question: {question}",
            placed=placed,
            distractors=distractors(),
            answers=provisional.pop("answers"),
            augmentations={
                "doc_format": fmt,
                "negatives": source,
                "gold_entities": k,
                "entities": len(provisional["entities"]),
                "instruction": which,
            },
            ground_truth=provisional,
            separator="\n\n",
            question_position=self.pick_question_position(rng, self.question_positions),
            trace_info=trace_info,
            finalize=finalize,
        )

    def answer_text(self, row: Row) -> str:
        return ", ".join(
            e["answers"][0] + " " + "".join(f"[{d}]" for d in e["docs"]) for e in row.ground_truth["entities"]
        )
