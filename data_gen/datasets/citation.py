"""Multi-answer QA with citations: QAMPARI (category ``entity_citation``).

A question with many answers (entities). ``gold_entities`` of them (default 5-20, drawn per
example: the paper's Table 5 gives entity citation 5-20 gold; QAMPARI questions have at least 5
answers) get one supporting passage each, placed at random positions: those passages are the
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
  the docs that mention one of its aliases; the retrieved docs that mention no answer are the
  question's judged negatives;
* QAMPARI with retrieved contexts (DPR format, ``full_train_data.jsonl`` of
  ``qampari_with_contexts``): ``question``, ``answers``, ``ans_mappings`` (answer -> aliases),
  ``positive_ctxs: [{title, text, pid}]`` (``pid`` = ``<id>__<answer index>__<proof index>``: the
  answer a proof supports) and ``ctxs: [{title, text}]`` (retrieved passages; those that mention
  no answer are the question's judged negatives).

Negative sources: random, BM25, dense, mixed and ``judged`` (the question's own judged negatives
first, then BM25; paper Table 6: negative source BM25 / random / judged). Passages are shown
with or without their titles.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from urllib.parse import unquote

from data_gen.base import Draft, Piece, Row, int_range, register
from data_gen.datasets.common import (
    AnswerFilter,
    DocumentTask,
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
    judged: list[int] = field(default_factory=list)  # corpus indices of its judged negatives


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


def _ctx(items) -> list[tuple[str, str]]:
    return [
        (str(d.get("title") or "").strip(), str(d.get("text") or "").strip())
        for d in items or []
        if isinstance(d, dict) and str(d.get("text") or "").strip()
    ]


def _unanswered(docs: list[tuple[str, str]], entities: list[tuple[list[str], list]]) -> list[tuple[str, str]]:
    mentions = AnswerFilter([a for aliases, _ in entities for a in aliases])
    return [d for d in docs if not mentions(f"{d[0]} {d[1]}")]


def parse(records: list[dict]) -> tuple[list[tuple[str, str]], list[tuple[str, list[tuple[list[str], list]], list]]]:
    """(passages, questions as (text, [(aliases, supporting passage keys)], judged negative keys))."""
    passages, questions = [], []
    for record in records:
        judged: list[tuple[str, str]] = []
        if "positive_ctxs" in record:  # DPR format with retrieved contexts
            text = str(first(record, "question", "question_text", default="")).strip()
            mappings = record.get("ans_mappings") or {}
            names = [str(a).strip() for a in record.get("answers") or [] if str(a).strip()]
            support: dict[int, list[tuple[str, str]]] = {}
            for ctx in record.get("positive_ctxs") or []:
                key = _ctx([ctx])
                parts = str(ctx.get("pid") or "").split("__")
                if key and len(parts) >= 3 and parts[-2].isdigit():
                    support.setdefault(int(parts[-2]), []).append(key[0])
            entities = []
            for j, name in enumerate(names):
                extra = mappings.get(name) if isinstance(mappings, dict) else None
                entities.append((_aliases(name, extra), support.get(j, [])))
            passages += [k for _, keys in entities for k in keys]
            judged = _unanswered(_ctx(record.get("ctxs")), entities)
            passages += judged
        elif "answer_list" in record:
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
            docs = _ctx(record.get("docs"))
            passages += docs
            entities = []
            for answer in record.get("answers") or []:
                aliases = _aliases(answer)
                mentions = AnswerFilter(aliases)
                entities.append((aliases, [d for d in docs if mentions(d[1])]))
            judged = _unanswered(docs, entities)
        if text and entities:
            questions.append((text, entities, judged))
    return passages, questions


_LOADED: dict[tuple, tuple[list[Question], Corpus]] = {}


@register
class Qampari(DocumentTask):
    name = "qampari"
    category = "entity_citation"
    has_judged_negatives = True
    min_tokens = 1024  # raised per instance with gold_entities: room for the gold passages (see __init__)
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

    def __init__(self, gold_entities=(5, 20), **kwargs) -> None:
        super().__init__(**kwargs)
        self.gold_entities = int_range("gold_entities", gold_entities)
        if self.gold_entities[0] < 1:
            raise RecallmError(f"gold_entities must be at least 1, got {gold_entities}")
        # the gold passages alone must fit: about 160 tokens each (a 100-word passage with its title)
        # plus the instructions, so 20 gold entities need about 3.7K tokens and the paper's 4K cell is reachable
        self.min_tokens = max(type(self).min_tokens, 160 * self.gold_entities[1] + 512)

    def data(self) -> tuple[list[Question], Corpus]:
        key = (self.path, self.split)
        if key not in _LOADED:
            records = load_records(self.path, dataset=self.dataset_label, hint=self.hint, split=self.split, cache=False)
            passages, raw = parse(records)
            corpus, index = Corpus.build(f"{self.name}:{self.path}:{self.split}", passages)
            questions = []
            for text, entities, judged in raw:
                ents = [Entity(a, sorted({index[k] for k in keys if k in index})) for a, keys in entities]
                if any(e.support for e in ents):
                    questions.append(Question(text, ents, sorted({index[k] for k in judged if k in index})))
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
        titled = self.pick_titles(rng)
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
                corpus.titles[i] if titled else "",
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

        distractors = self.distractor_docs(
            corpus,
            source,
            q.text,
            neg_rng,
            ids,
            fmt,
            titled,
            exclude=gold,
            reject=lambda i: mentions_any(corpus.texts[i]),
            judged=q.judged,
        )
        instruction, which = self.pick_instruction(rng)
        question = q.text if q.text.endswith("?") else q.text + "?"
        return Draft(
            instruction=instruction,
            question=f"Question: {question}",
            placed=placed,
            distractors=distractors,
            answers=provisional.pop("answers"),
            augmentations={
                "doc_format": fmt,
                "negatives": source,
                "titles": "title" if titled else "no_title",
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
