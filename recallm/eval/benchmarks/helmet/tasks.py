"""HELMET's tasks: what each one reads, how its prompt is made, and its settings per length.

Facts from princeton-nlp/HELMET (``data.py``, ``scripts/generate_configs.py``,
``scripts/collect_results.py``); the code is our own. The short task templates below are
HELMET's own wording (the benchmark is defined by them); the ALCE instructions and
demonstrations are read from HELMET's prompt files (``prompts/*_revised.json``), not copied.

Every data-backed task reads a local copy; paths default to places under ``helmet_dir`` (a
HELMET checkout after its ``scripts/download_data.sh``: ``data/`` and ``prompts/``) and
``dataset_root`` (the raw Hugging Face data sets HELMET loads from the Hub), and any of them can
be overridden per task (``task_params.<task>.path`` / ``demo_path`` / ``keypoints_path``). A
missing file is one ``error:`` line naming the task, the path and where to get it.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recallm.errors import RecallmError

__all__ = [
    "CATEGORIES",
    "json_kv_source",
    "ruler_file_source",
    "REPORTED",
    "HELMET_SEED",
    "balance_labels",
    "hf_permutation",
    "HELMET_LENGTHS",
    "HelmetTask",
    "TASKS",
    "Sample",
    "size_at",
    "stable_seed",
]

#: the context lengths HELMET's settings are tabulated for (4K-128K)
HELMET_LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
#: the seven categories of the paper's Table 2, in its order
CATEGORIES = ("Recall", "RAG", "ICL", "Cite", "Re-rank", "LongQA", "Summ")


def size_at(sizes: Sequence[int], target: int, *, scale: bool = False) -> int:
    """A per-length setting (passages, shots, documents) for a prompt of ``target`` tokens: the
    value of the HELMET length at or above it (the 128K value beyond), or with ``scale`` that
    value scaled down to ``target`` (generated tasks at lengths HELMET does not tabulate)."""
    for length, size in zip(HELMET_LENGTHS, sizes, strict=True):
        if target <= length:
            return max(4, math.ceil(size * target / length)) if scale and target < length else size
    return sizes[-1]


def stable_seed(*parts: Any) -> int:
    """A seed from text (HELMET seeds demonstrations by a SHA-256 of the question)."""
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest(), 16) % 2**31


@dataclass
class Sample:
    """One test item: the template's fields (``context`` is the part HELMET truncates) and what
    scoring needs."""

    fields: dict[str, str]
    reference: dict[str, Any]


@dataclass(frozen=True)
class HelmetTask:
    """One HELMET data set. ``gen_tokens``: HELMET's generation budget, kept free when the prompt
    is truncated (``length - gen_tokens`` tokens at most); ``reserve``: for the long-document
    tasks, the document is first cut to ``length - reserve`` tokens with ``" ... [the rest of the
    text is omitted]"`` (HELMET cuts with the Llama-2 tokenizer; we use the model's);
    ``sizes``: passages / shots / documents at 4K..128K; ``metric``: the metric HELMET reports."""

    name: str
    category: str
    family: str
    template: str
    gen_tokens: int
    metric: str
    sizes: tuple[int, ...] = ()
    shots: int = 2
    per_cell: int = 100
    reserve: int = 0
    files: Mapping[str, str] = field(default_factory=dict)  # default paths: path / demo_path / keypoints_path
    hint: str = ""
    judged: bool = False
    prefix: str = "Answer:"  # the prefix HELMET's post_process gives parse_output for this task
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def data_backed(self) -> bool:
        """Read from local files in every mode (the Recall tasks only with ``recall_data: files``)."""
        return self.family not in ("json_kv", "ruler")


RAG_TEMPLATE = (
    "Use the given documents to write a concise and short answer to the question. Write your answer in the following "
    "format:\nAnswer: [answer]\n\n{demos}{context}\n\nQuestion: {question}"
)
JSON_KV_TEMPLATE = "{context}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n{demos}Key: {question}"
RERANK_TEMPLATE = (
    "You are provided with a list of documents, each indicated by their ID. Rank each document based on their "
    "relevance to the question in descending order from most relelvant to least relevant texts. Include all documents "
    "in the rankings. Write your answer using the unique IDs, with the following format:\nRanking: ID3 > ID1 > ID2\n\n"
    "{demos}{context}\n\nQuery: {question}"
)
ICL_TEMPLATE = (
    'Use the provided mapping from the text to label to assign a label to the text. Only output "label: {{label}}" '
    "and nothing else. \n\n{context}\n\n{question}"
)
CITE_TEMPLATE = "{demos}{instruction}\n\nQuestion: {question}\n\n{context}"
NARRATIVEQA_TEMPLATE = (
    "You are given a story, which can be either a novel or a movie script, and a question. Answer the question as "
    "concisely as you can, using a single phrase if possible.\n\n{demos}{context}\n\nQuestion: {question}"
)
INFBENCH_QA_TEMPLATE = (
    "You are given a story and a question. Answer the question as concisely as you can, using a single phrase if "
    "possible.\n\n{demos}{context}\n\nQuestion: {question}"
)
INFBENCH_CHOICE_TEMPLATE = (
    "You are given a story and a question with multiple choices. Choose the best answer from the options provided. "
    "Only one of the following options is correct, output the answer using one single letter (A, B, C, or D). Don't "
    "say anything else.\n\n{demos}{context}\n\nQuestion: {question}\nOptions:\n{options}"
)
INFBENCH_SUM_TEMPLATE = (
    "You are given a book and you are tasked to summarize it. Write a summary of about 1000 to 1200 words. Only write "
    "about the plot and characters of the story. Do not discuss the themes or background of the book. Do not provide "
    "any analysis or commentary.\n\n{demos}{context}\n\nNow summarize the book."
)
MULTI_LEXSUM_TEMPLATE = (
    "You are given the legal documents in a civil rights lawsuit, and you are tasked to summarize the case. Write a "
    "concise summary of one paragraph (200 to 250 words). The summary should contain a short description of the "
    "background, the parties involved, and the outcomes of the case.\n\n{demos}Legal documents:\n{context}\n\nNow "
    "please summarize the case."
)

# HELMET's Recall needle templates (data.py load_ruler): RULER's, singular for one asked value (niah_mk_*), plural
# for several (niah_mv); its files hold context, query, type_needle_v and the answers
NIAH_MANY = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} "
    "mentioned in the provided text?"
)
NIAH_ONE = (
    "A special magic {type_needle_v} is hidden within the following text. Make sure to memorize it. I will quiz you "
    "about the {type_needle_v} afterwards.\n{context}\nWhat is the special magic {type_needle_v} for {query} "
    "mentioned in the provided text?"
)

_KILT_HINT = "HELMET's data (bash scripts/download_data.sh in a princeton-nlp/HELMET checkout; set helmet_dir)"
_ALCE_HINT = "HELMET's data/alce and prompts/ (scripts/download_data.sh of princeton-nlp/HELMET; set helmet_dir)"


def _hf_hint(dataset: str, layout: str) -> str:
    return (
        f"a local copy of the Hugging Face data set {dataset} (datasets.save_to_disk, parquet or JSON lines) with "
        f"{layout}; put it under dataset_root or set the task's path"
    )


def _kilt(name: str, dev: str, demo: str, sizes=(20, 50, 105, 220, 440, 1000)) -> HelmetTask:
    return HelmetTask(
        name, "RAG", "kilt", RAG_TEMPLATE, 20, "substring_exact_match", sizes,
        files={"path": f"{{helmet_dir}}/data/kilt/{dev}", "demo_path": f"{{helmet_dir}}/data/kilt/{demo}"},
        hint=_KILT_HINT, options={"popularity_threshold": 3.0} if name == "popqa" else {},
    )  # fmt: skip


def _icl(name: str, dataset: str, sizes: tuple[int, ...], label: str, test_split: str, layout: str) -> HelmetTask:
    return HelmetTask(
        name, "ICL", "icl", ICL_TEMPLATE, 20, "exact_match", sizes, shots=0, per_cell=500,
        files={"path": f"{{dataset_root}}/{dataset.split('/')[-1]}"}, hint=_hf_hint(dataset, layout),
        prefix="label:", options={"label_field": label, "test_split": test_split},
    )  # fmt: skip


TASKS: dict[str, HelmetTask] = {
    t.name: t
    for t in (
        # Recall: generated offline (json_kv) or by our RULER generator (the three needle tasks HELMET keeps)
        HelmetTask("json_kv", "Recall", "json_kv", JSON_KV_TEMPLATE, 100, "substring_exact_match",
                   (50, 105, 220, 440, 900, 1800), prefix="corresponding value:",
                   files={"path": "{helmet_dir}/data/json_kv/test_k{k}_dep6.jsonl"}, hint=_KILT_HINT),
        HelmetTask("ruler_niah_mk_2", "Recall", "ruler", NIAH_ONE, 50, "ruler_recall",
                   files={"path": "{helmet_dir}/data/ruler/niah_multikey_2/validation_{length}.jsonl"}, hint=_KILT_HINT,
                   options={"ruler_task": "niah_multikey_2"}),
        HelmetTask("ruler_niah_mk_3", "Recall", "ruler", NIAH_ONE, 100, "ruler_recall",
                   files={"path": "{helmet_dir}/data/ruler/niah_multikey_3/validation_{length}.jsonl"}, hint=_KILT_HINT,
                   options={"ruler_task": "niah_multikey_3"}),
        HelmetTask("ruler_niah_mv", "Recall", "ruler", NIAH_MANY, 50, "ruler_recall",
                   files={"path": "{helmet_dir}/data/ruler/niah_multivalue/validation_{length}.jsonl"}, hint=_KILT_HINT,
                   options={"ruler_task": "niah_multivalue"}),
        # RAG over KILT passages
        _kilt("nq", "nq-dev-multikilt_1000_k{k}_dep6.jsonl", "nq-train-multikilt_1000_k3_dep6.jsonl"),
        _kilt("triviaqa", "triviaqa-dev-multikilt_1000_k{k}_dep6.jsonl", "triviaqa-train-multikilt_1000_k3_dep6.jsonl"),
        _kilt("hotpotqa", "hotpotqa-dev-multikilt_1000_k{k}_dep3.jsonl", "hotpotqa-train-multikilt_1000_k3_dep3.jsonl"),
        _kilt("popqa", "popqa_test_1000_k{k}_dep6.jsonl", "popqa_test_1000_k3_dep6.jsonl"),
        # Re-rank
        HelmetTask("msmarco_rerank", "Re-rank", "msmarco", RERANK_TEMPLATE, 200, "NDCG@10",
                   (14, 50, 130, 285, 600, 1000),
                   files={"path": "{helmet_dir}/data/msmarco/test_reranking_data_k{k}_dep3.jsonl",
                          "demo_path": "{helmet_dir}/data/msmarco/test_reranking_data_k10_dep3.jsonl"},
                   hint=_KILT_HINT, prefix="Ranking:"),
        # Cite (ALCE)
        HelmetTask("alce_asqa", "Cite", "alce", CITE_TEMPLATE, 300, "str_em+citation", (8, 30, 75, 165, 345, 700),
                   files={"path": "{helmet_dir}/data/alce/asqa_eval_gtr_top2000.json",
                          "demo_path": "{helmet_dir}/prompts/asqa_revised.json"},
                   hint=_ALCE_HINT, judged=True),
        HelmetTask("alce_qampari", "Cite", "alce", CITE_TEMPLATE, 300, "rec_top5+citation", (8, 30, 75, 165, 345, 700),
                   files={"path": "{helmet_dir}/data/alce/qampari_eval_gtr_top2000.json",
                          "demo_path": "{helmet_dir}/prompts/qampari_revised.json"},
                   hint=_ALCE_HINT, judged=True),
        # LongQA
        HelmetTask("narrativeqa", "LongQA", "narrativeqa", NARRATIVEQA_TEMPLATE, 100, "judge (fluency x correctness)",
                   reserve=300, files={"path": "{dataset_root}/narrativeqa"},
                   hint=_hf_hint("deepmind/narrativeqa", "document.text, question.text, answers[].text (test and "
                                 "train splits)"),
                   judged=True, options={"min_document_tokens": 131072}),
        HelmetTask("infbench_qa", "LongQA", "infbench", INFBENCH_QA_TEMPLATE, 10, "rougeL_f1", reserve=210,
                   files={"path": "{dataset_root}/infinitebench/longbook_qa_eng.jsonl"},
                   hint=_hf_hint("xinrongzhang2022/InfiniteBench", "longbook_qa_eng.jsonl: id, context, input, answer"),
                   options={"kind": "qa"}),
        HelmetTask("infbench_choice", "LongQA", "infbench", INFBENCH_CHOICE_TEMPLATE, 10, "exact_match", reserve=210,
                   files={"path": "{dataset_root}/infinitebench/longbook_choice_eng.jsonl"},
                   hint=_hf_hint("xinrongzhang2022/InfiniteBench",
                                 "longbook_choice_eng.jsonl: id, context, input, answer, options"),
                   options={"kind": "choice"}),
        # Summ
        HelmetTask("infbench_sum", "Summ", "infbench", INFBENCH_SUM_TEMPLATE, 1200, "judge F1", reserve=1400,
                   files={"path": "{dataset_root}/infinitebench/longbook_sum_eng.jsonl",
                          "keypoints_path": "{helmet_dir}/data/infbench/longbook_sum_eng_keypoints.jsonl"},
                   hint=_hf_hint("xinrongzhang2022/InfiniteBench", "longbook_sum_eng.jsonl: id, context, answer"),
                   judged=True, options={"kind": "sum"}),  # (parse_output's default prefix: Answer:)
        HelmetTask("multi_lexsum", "Summ", "multi_lexsum", MULTI_LEXSUM_TEMPLATE, 400, "judge F1", reserve=700,
                   files={"path": "{dataset_root}/multi_lexsum",
                          "keypoints_path": "{helmet_dir}/data/multi_lexsum/multi_lexsum_val.jsonl"},
                   hint=_hf_hint("allenai/multi_lexsum (v20230518)",
                                 "id, sources, summary/short, summary/long (validation and train splits)"),
                   judged=True, prefix="Summary:", options={"min_document_tokens": 65536}),
        # ICL: labels mapped to random integers (HELMET's default)
        _icl("trec_coarse", "CogComp/trec", (200, 400, 800, 1600, 3300, 6600), "coarse_label", "test",
             "text, coarse_label (train and test splits)"),
        _icl("trec_fine", "CogComp/trec", (200, 400, 800, 1600, 3200, 6400), "fine_label", "test",
             "text, fine_label (train and test splits)"),
        _icl("banking77", "PolyAI/banking77", (180, 360, 720, 1450, 2900, 5900), "label", "test",
             "text, label (train and test splits)"),
        _icl("clinic150", "clinc_oos", (220, 440, 880, 1750, 3525, 7050), "intent", "validation",
             "the 'plus' configuration: text, intent (train and validation splits)"),
        _icl("nlu", "xingkunliuxtracta/nlu_evaluation_data", (250, 510, 1020, 2040, 4080, 8296), "label", "",
             "text, label (one split; 10% is held out for testing, as HELMET does)"),
    )
}  # fmt: skip


#: the metrics HELMET's ``scripts/collect_results.py`` reports per task (a category averages them all); each is
#: averaged over the examples that have it (upstream drops unreadable judge verdicts and claim-less ALCE outputs).
#: Without a judge, a judged metric is replaced by its fallback (second entry), labelled in the report.
REPORTED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "json_kv": (("substring_exact_match",), ()),
    **{t: (("ruler_recall",), ()) for t in ("ruler_niah_mk_2", "ruler_niah_mk_3", "ruler_niah_mv")},
    **{t: (("substring_exact_match",), ()) for t in ("nq", "triviaqa", "hotpotqa", "popqa")},
    "msmarco_rerank": (("NDCG@10",), ()),
    "alce_asqa": (("str_em", "citation_rec", "citation_prec"), ()),
    "alce_qampari": (("qampari_rec_top5", "citation_rec", "citation_prec"), ()),
    "narrativeqa": (("judge_score",), ("rougeL_f1",)),
    "infbench_qa": (("rougeL_f1",), ()),
    "infbench_choice": (("exact_match",), ()),
    "infbench_sum": (("judge_f1",), ("rougeLsum_f1",)),
    "multi_lexsum": (("judge_f1",), ("rougeLsum_f1",)),
    **{t: (("exact_match",), ()) for t in ("trec_coarse", "trec_fine", "banking77", "clinic150", "nlu")},
}


# --------------------------------------------------------------------------- reading local copies


def _records(path: str, task: HelmetTask, what: str = "data", split: str = "train") -> list[dict[str, Any]]:
    """The records of a local copy, not cached (the benchmark keeps only the items it asks)."""
    from data_gen.datasets.io import load_records

    return load_records(path, dataset=f"helmet {task.name} ({what})", hint=task.hint, split=split, cache=False)


def _field(record: Mapping[str, Any], task: HelmetTask, path: str, *keys: str) -> Any:
    value: Any = record
    try:
        for key in keys:
            value = value[key]
    except (KeyError, TypeError, IndexError):
        raise RecallmError(f"helmet {task.name}: a record of {path} has no {'.'.join(keys)}; {task.hint}") from None
    return value


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


class Source:
    """The items of one data-backed task at one file (see the family functions below):
    ``items`` (what can be asked, in a seeded order) and ``make(item, size, rng)`` (a ``Sample``)."""

    def __init__(self, items: list[Any], make: Callable[[Any, int, random.Random], Sample]) -> None:
        self.items, self.make = items, make


def _select(keys: Sequence[str], seed: int, n: int | None = None) -> list[int]:
    """Indices of ``keys`` in a seeded order, each key once (HELMET samples unique questions)."""
    seen: dict[str, int] = {}
    for i, key in enumerate(keys):
        seen.setdefault(str(key), i)
    order = sorted(seen)
    random.Random(seed).shuffle(order)
    chosen = [seen[k] for k in order]
    return chosen if n is None else chosen[:n]


def _first(n: int, per_cell: int | None, seed: int) -> list[int]:
    """HELMET's ``data.shuffle(seed).select(range(min(max_test_samples, len(data))))``."""
    order = hf_permutation(n, seed)
    return order if per_cell is None else order[:per_cell]


def json_kv_source(task: HelmetTask, path: str, seed: int, shots: int, per_cell: int | None) -> Source:
    """HELMET's JSON KV files (``data/json_kv/test_k{k}_dep6.jsonl``: ``context``, ``question``,
    ``answer``, ``demos`` as key-value pairs), as ``load_json_kv`` reads them."""
    records = _records(path, task)
    for r in records[:1]:
        for name in ("context", "question", "answer", "demos"):
            _field(r, task, path, name)

    def make(record, size, rng) -> Sample:
        demos = [(str(k), str(v)) for k, v in list(record["demos"])[:shots]]
        text = "\n\n".join(f"Key: {k}\nCorresponding value: {v}" for k, v in demos) + ("\n\n" if shots > 0 else "")
        fields = {"context": str(record["context"]), "question": str(record["question"]), "demos": text}
        return Sample(fields, {"answers": _strings(record["answer"])})

    return Source([records[i] for i in _first(len(records), per_cell, seed)], make)


def ruler_file_source(task: HelmetTask, path: str, seed: int, per_cell: int | None) -> Source:
    """HELMET's RULER files (``data/ruler/<task>/validation_<length>.jsonl``: ``context``,
    ``query``, ``type_needle_v``, the answers as ``answer`` or ``outputs``), as ``load_ruler``."""
    records = _records(path, task)
    for r in records[:1]:
        for name in ("context", "query", "type_needle_v"):
            _field(r, task, path, name)
        if "answer" not in r and "outputs" not in r:
            _field(r, task, path, "outputs")

    def make(record, size, rng) -> Sample:
        fields = {k: str(record[k]) for k in ("context", "query", "type_needle_v")}
        return Sample(fields, {"answers": _strings(record["answer"] if "answer" in record else record["outputs"])})

    return Source([records[i] for i in _first(len(records), per_cell, seed)], make)


def kilt_source(task: HelmetTask, path: str, demo_path: str, seed: int, shots: int) -> Source:
    """RAG: HELMET's KILT files (``question``, ``answers``, ``ctxs: [{title, text}]``; PopQA also
    ``s_pop``, filtered to log10(popularity) < 3); two demonstrations with their passages, from
    the demo file, chosen by a hash of the question."""
    records = _records(path, task)
    demos = _records(demo_path, task, "demonstrations")
    threshold = task.options.get("popularity_threshold")
    if threshold is not None:
        records = [r for r in records if math.log10(max(float(r.get("s_pop") or 1), 1e-9)) < threshold]
        demos = [r for r in demos if math.log10(max(float(r.get("s_pop") or 1), 1e-9)) < threshold]
    key = "id" if records and "id" in records[0] else "question"
    for r in records[:1] + demos[:1]:
        for name in ("question", "answers", "ctxs"):
            _field(r, task, path, name)

    def passages(ctxs) -> str:
        return "\n\n".join(f"Document (Title: {c.get('title', '')}): {c.get('text', '')}" for c in ctxs)

    def make(record, size, rng) -> Sample:
        demo_text = ""
        if shots:
            pool = [d for d in demos if str(d.get(key)) != str(record.get(key))]
            order = _select([str(d.get(key)) for d in pool], stable_seed(record.get(key), seed))[:shots]
            demo_text = (
                "\n\n".join(
                    f"{passages(pool[i]['ctxs'])}\n\nQuestion: {pool[i]['question']}\nAnswer: {_strings(pool[i]['answers'])[0]}"
                    for i in order
                )
                + "\n\n"
            )
        return Sample(
            {"demos": demo_text, "context": passages(record["ctxs"]), "question": str(record["question"])},
            {"answers": _strings(record["answers"])},
        )

    order = _select([str(r.get(key)) for r in records], seed)
    return Source([records[i] for i in order], make)


def msmarco_source(task: HelmetTask, path: str, demo_path: str, seed: int, shots: int) -> Source:
    """Re-rank: HELMET's MS MARCO files (``qid``, ``query``, ``ctxs: [{id, title?, text, label}]``);
    two demonstrations (other queries, with their gold ranking)."""
    records = _records(path, task)
    demos = _records(demo_path, task, "demonstrations")
    for r in records[:1]:
        for name in ("qid", "query", "ctxs"):
            _field(r, task, path, name)

    def passages(ctxs) -> str:
        titled = "title" in ctxs[0]
        return "\n\n".join(
            f"[ID: {c['id']}] Document (Title: {c['title']}): {c['text']}"
            if titled
            else f"[ID: {c['id']}] Document: {c['text']}"
            for c in ctxs
        )

    def ranking(ctxs) -> str:
        return " > ".join(str(c["id"]) for c in sorted(ctxs, key=lambda c: c["label"], reverse=True))

    def make(record, size, rng) -> Sample:
        demo_text = ""
        if shots:
            pool = [d for d in demos if str(d["qid"]) != str(record["qid"])]
            order = _select([str(d["qid"]) for d in pool], stable_seed(record["qid"], seed))[:shots]
            for i in order:
                d = pool[i]
                demo_text += f"{passages(d['ctxs'])}\n\nQuery: {d['query']}\nRanking: {ranking(d['ctxs'])}\n\n"
        qrels = {str(c["id"]): float(c["label"]) for c in record["ctxs"]}
        return Sample(
            {"demos": demo_text, "context": passages(record["ctxs"]), "question": str(record["query"])},
            {"qrels": qrels, "answers": [ranking(record["ctxs"])]},
        )

    order = _select([str(r["qid"]) for r in records], seed)
    return Source([records[i] for i in order], make)


def alce_source(task: HelmetTask, path: str, demo_path: str, seed: int, shots: int) -> Source:
    """Cite: ALCE's ASQA / QAMPARI eval files (``question``, ``docs: [{title, text}]``; ASQA
    ``qa_pairs: [{short_answers}]``, QAMPARI ``answers`` as alias lists) and HELMET's prompt file
    (``instruction``, ``demo_prompt``, ``doc_prompt``, ``demos``); the first ``size`` documents."""
    records = _records(path, task)
    from data_gen.datasets.io import check_path

    prompt_file = check_path(demo_path, f"helmet {task.name} (prompt file)", task.hint)
    try:
        prompts = json.loads(prompt_file.read_text(encoding="utf-8"))
        instruction, demo_prompt, doc_prompt = prompts["instruction"], prompts["demo_prompt"], prompts["doc_prompt"]
        demo_pool = list(prompts["demos"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RecallmError(
            f"helmet {task.name}: {prompt_file} is not a HELMET prompt file with instruction, demo_prompt, doc_prompt "
            f"and demos ({type(exc).__name__}); {task.hint}"
        ) from None
    qampari = task.name == "alce_qampari"
    for r in records[:1]:
        _field(r, task, path, "question")
        _field(r, task, path, "docs")
        _field(r, task, path, "answers" if qampari else "qa_pairs")

    def fill(template: str, **fields: Any) -> str:
        try:
            return template.format(**fields)
        except (KeyError, IndexError, ValueError) as exc:
            raise RecallmError(
                f"helmet {task.name}: {prompt_file}'s template {template[:40]!r}... needs a field the data lacks "
                f"({type(exc).__name__}: {exc}); {task.hint}"
            ) from None

    def docs_text(docs) -> str:
        return "\n\n".join(fill(doc_prompt, **{"title": "", "text": "", **d, "ID": i + 1}) for i, d in enumerate(docs))

    def make(record, size, rng) -> Sample:
        docs = list(record["docs"])[:size]
        demo_text = ""
        if shots:
            chosen = rng.sample(demo_pool, min(shots, len(demo_pool)))
            demo_text = (
                "\n\n\n".join(
                    fill(demo_prompt, **{**d, "instruction": instruction, "context": docs_text(d.get("docs") or [])})
                    for d in chosen
                )
                + "\n\n\n"
            )
        reference = {  # every document of the item: upstream's NLI reads citations past the shown ones too
            "question": str(record["question"]),
            "docs": [
                f"Title: {d.get('title', '')}\n{d['sent'] if 'sent' in d else d.get('text', '')}"
                for d in record["docs"]
            ],
        }
        if qampari:
            reference["answers"] = [_strings(a) for a in record["answers"]]
        else:
            reference["qa_pairs"] = [{"short_answers": _strings(p["short_answers"])} for p in record["qa_pairs"]]
        fields = {"demos": demo_text, "instruction": instruction, "question": str(record["question"]),
                  "context": docs_text(docs)}  # fmt: skip
        return Sample(fields, reference)

    order = _select([str(r["question"]) for r in records], seed)
    return Source([records[i] for i in order], make)


def _long_document_demo(lines: list[str], intro: str, outro: str) -> str:
    return f"{intro}\n\n" + "\n\n".join(lines) + f"\n\n{outro}\n\n"


def narrativeqa_source(task: HelmetTask, path: str, seed: int, shots: int) -> Source:
    """NarrativeQA (test split; demonstrations: questions and answers of the train split)."""
    test = _records(path, task, split="test")
    for r in test[:1]:
        _field(r, task, path, "document", "text")
        _field(r, task, path, "question", "text")
        _field(r, task, path, "answers")
    # demonstrations: questions and answers only (the train split's stories are let go)
    train = [
        {"question": r["question"]["text"], "answer": r["answers"][0]["text"]}
        for r in (_records(path, task, "demonstrations", split="train") if shots else [])
        if r.get("answers")
    ]

    def make(record, size, rng) -> Sample:
        demo_text = ""
        if shots:
            picks = rng.sample(range(len(train)), min(shots, len(train)))
            demo_text = _long_document_demo(
                [f"Question: {train[i]['question']}\nAnswer: {train[i]['answer']}" for i in picks],
                "For example:",
                "Now, use the following story to answer the question:",
            )
        answers = [a["text"] if isinstance(a, Mapping) else str(a) for a in record["answers"]]
        return Sample(
            {"demos": demo_text, "context": record["document"]["text"], "question": record["question"]["text"]},
            {"answers": answers, "question": record["question"]["text"]},
        )

    keys = [f"{r['document'].get('id', '')}|{r['question']['text']}" for r in test]
    return Source([test[i] for i in _select(keys, seed)], make)


def infbench_source(task: HelmetTask, path: str, keypoints_path: str | None, seed: int, shots: int) -> Source:
    """InfiniteBench En.QA / En.MC / En.Sum (``id``, ``context``, ``input``, ``answer``,
    ``options``); demonstrations are other items with ``[story text]`` for the story."""
    records = _records(path, task)
    kind = task.options["kind"]
    for r in records[:1]:
        for name in ("id", "context", "input", "answer") + (("options",) if kind == "choice" else ()):
            _field(r, task, path, name)
    keypoints: dict[str, list[str]] = {}
    if keypoints_path is not None:
        for r in _records(keypoints_path, task, "key points"):
            keypoints[str(_field(r, task, keypoints_path, "id"))] = _strings(
                _field(r, task, keypoints_path, "keypoints")
            )

    def answers_of(record) -> list[str]:
        answer = _strings(record["answer"])
        if kind != "choice":
            return answer
        options = _strings(record["options"])
        letter = chr(ord("A") + options.index(answer[0])) if answer and answer[0] in options else "?"
        return [letter, f"{letter}. {answer[0] if answer else ''}"]

    def options_text(record) -> str:
        return "\n".join(f"{chr(ord('A') + i)}. {o}" for i, o in enumerate(_strings(record["options"])[:4]))

    def make(record, size, rng) -> Sample:
        demo_text = ""
        if shots:
            pool = [r for r in records if str(r["id"]) != str(record["id"])]
            picks = rng.sample(range(len(pool)), min(shots, len(pool)))
            if kind == "qa":
                lines = [f"[story text]\nQuestion: {pool[i]['input']}\nAnswer: {answers_of(pool[i])[0]}" for i in picks]
            elif kind == "choice":
                lines = [
                    f"[story text]\nQuestion: {pool[i]['input']}\nOptions:\n{options_text(pool[i])}\n"
                    f"Answer: {answers_of(pool[i])[0]}"
                    for i in picks
                ]
            else:
                lines = [f"[story text]\nSummary: {answers_of(pool[i])[0].strip()}" for i in picks]
            demo_text = _long_document_demo(lines, "For example:", "Now, read the following story:")
        fields = {"demos": demo_text, "context": str(record["context"]), "question": str(record["input"])}
        if kind == "choice":
            fields["options"] = options_text(record)
        reference: dict[str, Any] = {"answers": answers_of(record), "question": str(record["input"])}
        if kind == "sum":
            reference["keypoints"] = keypoints.get(str(record["id"]))
            reference["expert"] = answers_of(record)[0]
        return Sample(fields, reference)

    return Source([records[i] for i in _select([str(r["id"]) for r in records], seed)], make)


def multi_lexsum_source(task: HelmetTask, path: str, keypoints_path: str | None, seed: int, shots: int) -> Source:
    """Multi-LexSum (validation split, items with a short summary; demonstrations: short summaries
    of the train split; key points for the judge from HELMET's ``multi_lexsum_val.jsonl``)."""
    records = [r for r in _records(path, task, split="validation") if r.get("summary/short")]
    for r in records[:1]:
        for name in ("id", "sources", "summary/short"):
            _field(r, task, path, name)
    train = [  # demonstrations: short summaries only
        {"summary/short": r["summary/short"]}
        for r in (_records(path, task, "demonstrations", split="train") if shots else [])
        if r.get("summary/short")
    ]
    keypoints: dict[str, dict[str, Any]] = {}
    if keypoints_path is not None:
        for r in _records(keypoints_path, task, "key points"):
            keypoints[str(_field(r, task, keypoints_path, "id"))] = r

    def make(record, size, rng) -> Sample:
        demo_text = ""
        if shots:
            picks = rng.sample(range(len(train)), min(shots, len(train)))
            demo_text = (
                "Example summaries:\n\n"
                + "\n\n".join(f"Summary: {train[i]['summary/short']}" for i in picks)
                + "\n\nNow, write a summary of the following legal documents.\n"
            )
        extra = keypoints.get(str(record["id"])) or {}
        reference = {
            "answers": [str(record["summary/short"])],
            "keypoints": _strings(extra.get("summary/short_keypoints")) or None,
            "expert": extra.get("summary/long") or record.get("summary/long") or str(record["summary/short"]),
        }
        context = "\n\n".join(_strings(record["sources"]))
        return Sample({"demos": demo_text, "context": context, "question": ""}, reference)

    return Source([records[i] for i in _select([str(r["id"]) for r in records], seed)], make)


#: HELMET's seed (``arguments.py --seed`` default): its sampling of test items, demonstrations and label maps
HELMET_SEED = 42
#: the label counts HELMET maps to random integers (``data.py`` ``load_icl`` ``num_labels``)
ICL_LABELS = {"trec_coarse": 6, "trec_fine": 50, "banking77": 77, "clinic150": 151, "nlu": 68}


def balance_labels(
    data: Sequence[Mapping[str, Any]], label_field: str, shots: int, seed: int
) -> list[Mapping[str, Any]]:
    """HELMET's ``balance_labels``: ``shots`` items in rounds of one per label (labels in order of
    first appearance), each round shuffled; per label, ``rounds % len(items)`` distinct picks, topped
    up with further draws when a label has too few (upstream's arithmetic, kept as it is)."""
    rand = random.Random(seed)
    by_label: dict[Any, list[Mapping[str, Any]]] = {}
    for item in data:
        by_label.setdefault(item[label_field], []).append(item)
    rounds = math.ceil(shots / len(by_label))
    sets: list[list[Mapping[str, Any]]] = [[] for _ in range(rounds)]
    for items in by_label.values():
        picks = rand.sample(range(len(items)), rounds % len(items))
        while len(picks) < rounds:
            picks += rand.sample(range(len(items)), min(rounds - len(picks), len(items)))
        for i, pick in enumerate(picks):
            sets[i].append(items[pick])
    for s in sets:
        rand.shuffle(s)
    return [item for s in sets for item in s][:shots]


def hf_permutation(n: int, seed: int) -> list[int]:
    """The row order of Hugging Face ``Dataset.shuffle(seed=seed)`` on ``n`` rows."""
    from datasets import Dataset

    return list(Dataset.from_dict({"i": list(range(n))}).shuffle(seed=seed)["i"])


def hf_train_test_split(n: int, test_size: float, seed: int) -> tuple[list[int], list[int]]:
    """Row indices (train, test) of Hugging Face ``Dataset.train_test_split(test_size, seed=seed)``."""
    from datasets import Dataset

    split = Dataset.from_dict({"i": list(range(n))}).train_test_split(test_size=test_size, seed=seed)
    return list(split["train"]["i"]), list(split["test"]["i"])


def icl_source(task: HelmetTask, path: str, seed: int = HELMET_SEED, per_cell: int | None = None) -> Source:
    """ICL as HELMET's ``load_icl`` builds it: labels are class indices mapped to a random
    permutation of ``range(num_labels)`` per test item (HELMET's fixed label counts); the
    demonstrations (``size`` of them) are ``balance_labels`` of the train split seeded by the item's
    text; more test items than ``per_cell``: the test split shuffled (Hugging Face's
    ``shuffle(seed)``) and label-balanced. NLU's one split is cut with ``train_test_split(0.1,
    seed)``. ``seed``: HELMET's (42)."""
    label_field, test_split = task.options["label_field"], task.options["test_split"]
    num_labels = ICL_LABELS[task.name]
    train = _records(path, task, split="train")
    if test_split:
        test = _records(path, task, split=test_split)
    else:  # one split: 10% held out, as HELMET's train_test_split(test_size=0.1, seed=42)
        train_idx, test_idx = hf_train_test_split(len(train), 0.1, seed)
        test, train = [train[i] for i in test_idx], [train[i] for i in train_idx]
    for r in train[:1] + test[:1]:
        _field(r, task, path, "text")
        label = _field(r, task, path, label_field)
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < num_labels:
            raise RecallmError(
                f"helmet {task.name}: {path}'s {label_field} must be a class index in [0, {num_labels}) as in the "
                f"Hugging Face data set, got {label!r}; {task.hint}"
            )

    def make(record, size, rng) -> Sample:
        local = (int(hashlib.sha256(str(record["text"]).encode("utf-8")).hexdigest(), 16) + seed) % 2**31
        demos = balance_labels(train, label_field, size, local)
        mapping = list(range(num_labels))
        random.Random(local).shuffle(mapping)
        context = "\n\n".join(f"{d['text']}\nlabel: {mapping[int(d[label_field])]}" for d in demos)
        return Sample(
            {"context": context, "question": str(record["text"])}, {"answers": [str(mapping[int(record[label_field])])]}
        )

    items: list[Mapping[str, Any]] = list(test)
    if per_cell is not None and len(items) > per_cell:
        shuffled = [items[i] for i in hf_permutation(len(items), seed)]
        items = balance_labels(shuffled, label_field, per_cell, seed)
    return Source(list(items), make)
