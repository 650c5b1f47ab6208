"""Passage reranking: MS MARCO v2 passage ranking with graded relevance (category ``reranking``).

A query, and passages each shown with an id (``[1]``..``[n]`` in prompt order, see
``data_gen.datasets.common``). Some of the query's judged-relevant passages (grade >=
``min_grade``; ``gold_docs`` of them, default 1-26 as the paper's Table 5) are placed at random positions and are the
gold evidence; the distractors come from the source drawn for the example: ``judged`` (the
query's judged non-relevant passages first, then BM25), random, BM25, dense or mixed (hardest
first) — never a passage judged relevant to the query, and judged negatives only through
``judged`` (the paper's Table 6: negative source BM25 / random / judged). The answer ranks ids, most relevant first (``[3] > [1] > [7]``, NDCG@10).

Ground truth (set once the prompt order is final): ``relevance`` ``{id: grade}`` of the gold
passages, and ``doc_ids``: the ids of every passage shown, ``"1"``..``"n"``.

Source formats:

* a directory in the TREC Deep Learning layout: a queries file (``*quer*``: ``qid<TAB>text``),
  a qrels file (``*qrel*``: ``qid Q0 pid grade``, or ``qid pid grade``) and passage files
  (``*passage*``, ``*collection*`` or ``*corpus*``: ``pid<TAB>text`` TSV, or JSON lines with
  ``pid``/``id``/``docid`` and ``passage``/``text`` — the msmarco_v2_passage shards, gzipped or
  not); only the judged queries whose passages are present are used;
* one record per query (any container of ``data_gen.datasets.io``): ``query`` and ``passages``
  — ``[{pid, text, relevance}]`` (``grade``/``label`` accepted), or the Hugging Face
  ``ms_marco`` layout ``{passage_text: [...], is_selected: [...]}`` (grades 0/1).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from data_gen.base import Draft, Piece, int_range, register
from data_gen.datasets.common import DocumentTask, doc_piece, draw_ids, first, number_documents
from data_gen.datasets.io import check_path, load_records, read_lines
from data_gen.datasets.negatives import Corpus
from recallm.errors import RecallmError

__all__ = ["MSMarco"]


@dataclass
class Query:
    text: str
    judged: dict[int, float]  # corpus index -> grade


def _grade(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _is_trec_dir(p: Path) -> bool:
    return p.is_dir() and any("qrel" in f.name.lower() for f in p.rglob("*") if f.is_file())


def _trec(p: Path) -> tuple[list[tuple[str, str]], list[tuple[str, dict[str, float]]]]:
    files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
    qrels_files = [f for f in files if "qrel" in f.name.lower()]
    query_files = [f for f in files if "quer" in f.name.lower() and f not in qrels_files]
    passage_files = [
        f
        for f in files
        if any(k in f.name.lower() for k in ("passage", "collection", "corpus"))
        and f not in query_files
        and f not in qrels_files
    ]
    if not query_files or not passage_files:
        raise ValueError("a TREC directory needs a queries file (*quer*), a qrels file (*qrel*) and passage files")
    judged: dict[str, dict[str, float]] = {}
    for f in qrels_files:
        for line in read_lines(f):
            cols = line.split()
            if len(cols) in (3, 4):
                qid, pid, grade = cols[0], cols[-2], _grade(cols[-1])
                if grade is not None:
                    judged.setdefault(qid, {})[pid] = grade
    queries = {}
    for f in query_files:
        for line in read_lines(f):
            qid, _, text = line.partition("\t")
            if qid in judged and text.strip():
                queries[qid] = text.strip()
    passages: dict[str, tuple[str, str]] = {}
    for f in passage_files:
        for line in read_lines(f):
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                rec = json.loads(line)
                pid = str(first(rec, "pid", "id", "docid", "_id", default=""))
                text = str(first(rec, "passage", "text", "contents", default="")).strip()
                title = str(rec.get("title") or "").strip()
            else:
                cols = line.split("\t")
                pid, text, title = cols[0], cols[-1].strip(), (cols[1].strip() if len(cols) >= 3 else "")
            if pid and text:
                passages[pid] = (title, text)
    corpus_passages = list(passages.values())
    rows = []
    for qid, text in queries.items():
        grades = {}
        for pid, grade in judged[qid].items():
            if pid in passages:
                grades[passages[pid]] = grade
        rows.append((text, grades))
    return corpus_passages, rows


def _records(records: list[dict]) -> tuple[list[tuple[str, str]], list[tuple[str, dict]]]:
    corpus, rows = [], []
    for record in records:
        query = str(first(record, "query", "query_text", "question", default="")).strip()
        raw = record.get("passages") or []
        grades: dict[tuple[str, str], float] = {}
        if isinstance(raw, dict):  # Hugging Face ms_marco: columns of lists
            texts = raw.get("passage_text") or []
            selected = raw.get("is_selected") or [0] * len(texts)
            items = [{"text": t, "relevance": s} for t, s in zip(texts, selected, strict=False)]
        else:
            items = [r for r in raw if isinstance(r, dict)]
        for item in items:
            text = str(first(item, "text", "passage", "passage_text", "contents", default="")).strip()
            grade = _grade(first(item, "relevance", "grade", "label", "is_selected", default=0))
            if text and grade is not None:
                key = (str(item.get("title") or "").strip(), text)
                grades[key] = max(grade, grades.get(key, grade))
                corpus.append(key)
        if query and grades:
            rows.append((query, grades))
    return corpus, rows


_LOADED: dict[tuple, tuple[list[Query], Corpus]] = {}


@register
class MSMarco(DocumentTask):
    name = "msmarco"
    category = "reranking"
    has_judged_negatives = True
    min_tokens = 1024  # room for the gold pieces (up to a dozen) and some distractors
    dataset_label = "MS MARCO v2 passage ranking"
    hint = (
        "put the TREC Deep Learning queries, qrels and msmarco_v2_passage files (https://microsoft.github.io/msmarco/"
        "TREC-Deep-Learning) in one directory, or a JSONL of {query, passages: [{pid, text, relevance}]}, and pass "
        "path=<directory or file>"
    )
    instructions = (
        "Rank the passages below by how relevant they are to the query. Answer with passage ids, most relevant first, "
        "like [4] > [2] > [9]; list the relevant ones (at most ten).",
        "Below are passages with ids in brackets. Order the ones that answer the query from most to least relevant, as "
        "[id] > [id] > ..., at most ten.",
        "Judge each passage below against the query and give a ranking of the relevant ones by their bracketed ids, "
        "best first (for example [12] > [3]).",
        "Which passages below address the query, and in what order of relevance? Reply with their ids, most relevant "
        "first, separated by >, such as [5] > [1].",
    )

    def __init__(self, gold_docs=(1, 26), min_grade: float = 1, **kwargs) -> None:
        kwargs.setdefault("doc_formats", ("document", "bracket"))
        super().__init__(**kwargs)
        self.gold_docs = int_range("gold_docs", gold_docs)
        if self.gold_docs[0] < 1:
            raise RecallmError(f"gold_docs must be at least 1, got {gold_docs}")
        try:
            self.min_grade = float(min_grade)
        except (TypeError, ValueError):
            self.min_grade = 0.0
        if not self.min_grade > 0:
            raise RecallmError(f"min_grade must be a number > 0, got {min_grade!r}")

    def data(self) -> tuple[list[Query], Corpus]:
        key = (self.path, self.split)
        if key not in _LOADED:
            p = check_path(self.path, self.dataset_label, self.hint)
            if _is_trec_dir(p):
                try:
                    passages, rows = _trec(p)
                except Exception as exc:
                    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise RecallmError(f"{self.dataset_label}: cannot read {p} ({msg}); {self.hint}") from exc
            else:
                records = load_records(p, dataset=self.dataset_label, hint=self.hint, split=self.split, cache=False)
                passages, rows = _records(records)
            corpus, index = Corpus.build(f"{self.name}:{self.path}:{self.split}", passages)
            queries = [Query(text, {index[k]: g for k, g in grades.items()}) for text, grades in rows]
            queries = [q for q in queries if any(g >= self.min_grade for g in q.judged.values())]
            if not queries:
                raise RecallmError(
                    f"{self.dataset_label}: no query in {self.path} has a judged passage of grade >= {self.min_grade}; "
                    f"{self.hint}"
                )
            _LOADED[key] = (queries, corpus)
        return _LOADED[key]

    def draft(self, rng: random.Random) -> Draft:
        queries, corpus = self.data()
        q = queries[rng.randrange(len(queries))]
        relevant = sorted(i for i, g in q.judged.items() if g >= self.min_grade)
        k = min(len(relevant), rng.randint(*self.gold_docs))
        if k > self.max_docs:
            raise RecallmError(f"max_docs={self.max_docs} is too small for {k} gold passages of {self.name}")
        chosen = rng.sample(relevant, k)
        fmt = rng.choice(self.doc_formats)
        source = rng.choice(self.negatives)
        titled = self.pick_titles(rng)
        ids = draw_ids(self.max_docs)

        def title(i: int) -> str:
            return corpus.titles[i] if titled else ""

        placed = [doc_piece(fmt, next(ids), title(i), corpus.texts[i], gold=True, grade=q.judged[i]) for i in chosen]
        judged_negatives = sorted(i for i, g in q.judged.items() if g <= 0)
        relevant_elsewhere = [i for i, g in q.judged.items() if g > 0]
        neg_rng = random.Random(rng.random())

        # never a passage judged relevant for the query; its judged negatives only from the `judged` source
        exclude = relevant_elsewhere if source == "judged" else list(q.judged)
        distractors = self.distractor_docs(
            corpus, source, q.text, neg_rng, ids, fmt, titled, exclude=exclude, judged=judged_negatives
        )
        trace_info: dict = {}

        def finalize(pieces: list[Piece]) -> dict:
            """Number the passages in prompt order; the relevance, ids and ideal ranking that follow."""
            shown = number_documents(pieces)
            relevance = {p.doc_id: p.meta["grade"] for p in pieces if p.gold}
            ideal = sorted(relevance, key=lambda d: (-relevance[d], int(d)))
            trace_info["ranking"] = ideal
            return {
                "relevance": relevance,
                "doc_ids": shown,
                "answers": [" > ".join(f"[{d}]" for d in ideal[:10])],
            }

        provisional = finalize(placed)  # the gold passages alone, in draw order (build_row calls it again)
        instruction, which = self.pick_instruction(rng)
        return Draft(
            instruction=instruction,
            question=f"Query: {q.text}",
            placed=placed,
            distractors=distractors,
            answers=provisional.pop("answers"),
            augmentations={
                "doc_format": fmt,
                "negatives": source,
                "titles": "title" if titled else "no_title",
                "n_gold": k,
                "instruction": which,
            },
            ground_truth=provisional,
            separator="\n\n",
            question_position=self.pick_question_position(rng, self.question_positions),
            trace_info=trace_info,
            finalize=finalize,
        )
