"""Tiny stand-ins for the public data sets, in the formats the readers of ``data_gen.datasets`` accept.

Each ``write_*`` function writes a few dozen generated records into a directory and returns the
path to pass as the task's ``path``. Text is lorem-style (``data_gen.text``); answers and
entity names are invented city names, which never occur in that text, so a passage mentions an
answer only when it is meant to. Every example also has "topic" words that its question and its
own distractor passages share, so BM25 has hard negatives to find. All deterministic.
"""

from __future__ import annotations

import gzip
import json
import random
import zlib
from pathlib import Path

from data_gen.text import cities, first_names, sentence, words

__all__ = [
    "write_hotpotqa",
    "write_2wikimqa",
    "write_musique",
    "write_nq",
    "write_triviaqa",
    "write_dapo_math",
    "write_mcqa_math",
    "write_mathqa",
    "write_banking77",
    "write_banking77_csv",
    "write_massive",
    "write_quality",
    "write_msmarco_trec",
    "write_msmarco_records",
    "write_qampari",
    "write_qampari_alce",
    "write_all",
    "link_dataset_root",
    "PAPER_DATASETS",
    "think_renderer",
    "INTENTS",
]


class _Names:
    """Distinct invented names (city names: not in the lorem vocabulary)."""

    def __init__(self, seed: int) -> None:
        pool = list(cities())
        random.Random(seed).shuffle(pool)
        self.pool = iter(pool)

    def __call__(self) -> str:
        return next(self.pool)


def _topic(rng: random.Random, n: int = 3) -> list[str]:
    vocab = words()
    return [vocab[rng.randrange(len(vocab))] for _ in range(n)]


def _sentences(rng: random.Random, n: int) -> list[str]:
    return [sentence(rng) for _ in range(n)]


def _with_topic(rng: random.Random, topic: list[str], n: int = 3) -> list[str]:
    sents = _sentences(rng, n)
    sents[rng.randrange(n)] = f"It was about {' '.join(topic)} and {rng.choice(topic)} more than once."
    return sents


def _write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def _write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _multihop_examples(seed: int, n: int, n_gold=(2, 2), n_others: int = 8):
    """(question, answer, aliases, [(title, sentences, supporting sentence)], [(title, sentences)])."""
    rng, name = random.Random(seed), _Names(seed)
    out = []
    for _ in range(n):
        topic = _topic(rng)
        answer = name()
        k = rng.randint(*n_gold)
        chain = [name() for _ in range(k)]
        gold = []
        for j, title in enumerate(chain):
            sents = _sentences(rng, 3)
            target = chain[j + 1] if j + 1 < k else answer
            sents[1] = f"{title} is tied to {target} by the {topic[j % 3]} {topic[(j + 1) % 3]}."
            gold.append((title, sents, 1))
        others = [(name(), _with_topic(rng, topic)) for _ in range(n_others)]
        question = f"Following the {' '.join(topic)} links from {chain[0]}, which place do you reach?"
        out.append((question, answer, [answer.upper()], gold, others))
    return out


def write_hotpotqa(directory: Path, n: int = 40) -> Path:
    """HotpotQA's release JSON (a list; context and supporting facts as lists of pairs)."""
    records = []
    for i, (question, answer, _aliases, gold, others) in enumerate(_multihop_examples(1, n)):
        context = [[t, [" " + s if j else s for j, s in enumerate(sents)]] for t, sents, _ in gold]
        context += [[t, sents] for t, sents in others]
        random.Random(i).shuffle(context)
        records.append(
            {
                "_id": f"h{i}",
                "question": question,
                "answer": answer,
                "type": "bridge",
                "level": "easy",
                "supporting_facts": [[t, s] for t, _, s in gold],
                "context": context,
            }
        )
    return _write_json(directory / "hotpot_train_v1.1.json", records)


def write_2wikimqa(directory: Path, n: int = 40) -> Path:
    """2WikiMultihopQA in the Hugging Face layout (dict columns), as parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = []
    for i, (question, answer, aliases, gold, others) in enumerate(_multihop_examples(2, n, n_gold=(2, 4))):
        paras = [(t, s) for t, s, _ in gold] + others
        random.Random(i).shuffle(paras)
        records.append(
            {
                "id": f"w{i}",
                "question": question,
                "answer": answer,
                "answer_aliases": aliases,
                "type": "compositional",
                "context": {"title": [t for t, _ in paras], "sentences": [s for _, s in paras]},
                "supporting_facts": {"title": [t for t, _, _ in gold], "sent_id": [s for _, _, s in gold]},
            }
        )
    path = directory / "2wikimqa" / "train.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)
    return path.parent


def write_musique(directory: Path, n: int = 40) -> Path:
    """MuSiQue's release JSONL (paragraph-level support), with one unanswerable record."""
    records = []
    for i, (question, answer, aliases, gold, others) in enumerate(_multihop_examples(3, n, n_gold=(2, 4))):
        paras = [{"title": t, "paragraph_text": " ".join(s), "is_supporting": True} for t, s, _ in gold]
        paras += [{"title": t, "paragraph_text": " ".join(s), "is_supporting": False} for t, s in others]
        random.Random(i).shuffle(paras)
        for idx, p in enumerate(paras):
            p["idx"] = idx
        records.append(
            {
                "id": f"m{i}",
                "question": question,
                "answer": answer,
                "answer_aliases": aliases,
                "answerable": i != 0,
                "paragraphs": paras,
            }
        )
    return _write_jsonl(directory / "musique_ans_v1.0_train.jsonl", records)


def _single_examples(seed: int, n: int):
    rng, name = random.Random(seed), _Names(seed)
    out = []
    for _ in range(n):
        topic, answer, subject = _topic(rng), name(), name()
        sents = _sentences(rng, 4)
        sents[2] = f"The {topic[0]} {topic[1]} of {subject} is {answer}."
        gold = (subject, " ".join(sents))
        hard = [(name(), " ".join(_with_topic(rng, topic))) for _ in range(4)]
        easy = [(name(), " ".join(_sentences(rng, 4))) for _ in range(4)]
        question = f"what is the {topic[0]} {topic[1]} of {subject} regarding {topic[2]}"
        out.append((question, answer, gold, hard, easy))
    return out


def write_nq(directory: Path, n: int = 40) -> Path:
    """DPR retriever data (``biencoder-nq-train.json``)."""
    records = []
    for question, answer, gold, hard, easy in _single_examples(4, n):

        def ctx(p):
            return {"title": p[0], "text": p[1], "score": 1.0, "passage_id": str(zlib.crc32(p[1].encode()))}

        records.append(
            {
                "dataset": "nq_train_psgs_w100",
                "question": question,
                "answers": [answer],
                "positive_ctxs": [ctx(gold)],
                "negative_ctxs": [ctx(p) for p in easy],
                "hard_negative_ctxs": [ctx(p) for p in hard],
            }
        )
    return _write_json(directory / "biencoder-nq-train.json", records)


def write_triviaqa(directory: Path, n: int = 60) -> Path:
    """TriviaQA ``rc`` in the Hugging Face layout (long evidence pages), as JSONL."""
    rng, name = random.Random(5), _Names(5)
    records = []
    for i in range(n):
        answer, subject, topic = name(), name(), _topic(rng)
        sents = _sentences(rng, 30)
        sents[rng.randrange(8, 22)] = f"Its {topic[0]} is called {answer} by everyone."
        records.append(
            {
                "question_id": f"t{i}",
                "question": f"Which {topic[0]} {topic[1]} belongs to {subject}?",
                "answer": {"value": answer, "aliases": [answer, answer.lower()], "normalized_value": answer.lower()},
                "entity_pages": {"title": [subject], "wiki_context": [" ".join(sents)]},
                "search_results": {"title": [name()], "search_context": [" ".join(_with_topic(rng, topic, 12))]},
            }
        )
    return _write_jsonl(directory / "triviaqa" / "train.jsonl", records).parent


_DAPO_HEAD = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
_DAPO_TAIL = '\n\nRemember to put your answer on its own line after "Answer:".'


def write_dapo_math(directory: Path, n: int = 30) -> Path:
    """DAPO-Math-17k's parquet layout (chat prompt, ``reward_model.ground_truth``); duplicates and a
    non-integer answer included (both dropped by the reader)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(6)
    rows = []
    for i in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        problem = f"A box holds {a} red balls and {b} blue balls. How many balls are in the box?"
        row = {
            "data_source": "math_dapo",
            "prompt": [{"content": _DAPO_HEAD + problem + _DAPO_TAIL, "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(a + b), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": str(i)},
        }
        rows += [row, row] if i % 5 == 0 else [row]
    rows.append(
        {
            **rows[0],
            "reward_model": {"ground_truth": "\\frac{1}{2}", "style": "x"},
            "prompt": [{"content": _DAPO_HEAD + "What is one half?" + _DAPO_TAIL, "role": "user"}],
        }
    )
    path = directory / "dapo" / "dapo-math-17k.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_mcqa_math(directory: Path, n: int = 30) -> Path:
    """AQuA-RAT's JSON lines (``options: ["A)..."]``, ``correct``)."""
    rng = random.Random(7)
    records = []
    for _ in range(n):
        a, b = rng.randint(2, 50), rng.randint(2, 50)
        right = a * b
        options = sorted({right, right + 1, right - 1, right + 10, right * 2})[:5]
        rng.shuffle(options)
        letters = "ABCDE"
        records.append(
            {
                "question": f"A farmer plants {a} rows of {b} trees. How many trees does he plant?",
                "options": [f"{letters[j]}){o}" for j, o in enumerate(options)],
                "rationale": f"{a} * {b} = {right}",
                "correct": letters[options.index(right)],
            }
        )
    return _write_jsonl(directory / "aqua" / "train.json", records)


def write_mathqa(directory: Path, n: int = 10) -> Path:
    """MathQA's layout (``Problem``, ``options`` as one string, ``correct`` lower-case)."""
    rng = random.Random(8)
    records = []
    for _ in range(n):
        a, b = rng.randint(2, 50), rng.randint(2, 50)
        records.append(
            {
                "Problem": f"what is {a} plus {b} ?",
                "Rationale": "add",
                "options": f"a ) {a + b - 1} , b ) {a + b} , c ) {a + b + 1} , d ) none of these , e ) 1,000",
                "correct": "b",
            }
        )
    return _write_json(directory / "mathqa" / "train.json", records)


INTENTS = (
    "card_arrival",
    "lost_or_stolen_card",
    "top_up_failed",
    "exchange_rate",
    "pin_blocked",
    "transfer_timing",
    "cash_withdrawal_charge",
    "declined_card_payment",
    "change_pin",
    "terminate_account",
)


def _utterances(seed: int, per_label: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for label in INTENTS:
        cue = label.split("_")[0]
        for _ in range(per_label):
            out.append((f"{sentence(rng, 5, 9)[:-1]} {cue} please", label))
    rng.shuffle(out)
    return out


def write_banking77(directory: Path, per_label: int = 20) -> Path:
    """BANKING77 as ``datasets``' ``save_to_disk`` of a DatasetDict with a ``ClassLabel`` column."""
    import datasets

    datasets.disable_progress_bars()
    rows = _utterances(9, per_label)
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=list(INTENTS))})
    ds = datasets.Dataset.from_dict(
        {"text": [t for t, _ in rows], "label": [INTENTS.index(lab) for _, lab in rows]}, features=features
    )
    path = directory / "banking77_hf"
    datasets.DatasetDict({"train": ds, "test": ds.select(range(10))}).save_to_disk(str(path))
    return path


def write_banking77_csv(directory: Path, per_label: int = 20) -> Path:
    """BANKING77's release CSV (``text,category``)."""
    import csv

    path = directory / "banking77" / "train.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "category"])
        w.writerows(_utterances(10, per_label))
    return path


def write_massive(directory: Path, per_label: int = 20) -> Path:
    """MASSIVE's release JSONL (``utt``, ``intent``, ``locale``, ``partition``), with records of
    another locale and another partition that the reader must drop."""
    records = []
    for i, (utt, intent) in enumerate(_utterances(11, per_label)):
        records.append(
            {
                "id": str(i),
                "locale": "en-US",
                "partition": "test" if i % 10 == 9 else "train",
                "scenario": intent.split("_")[0],
                "intent": intent,
                "utt": utt,
                "annot_utt": utt,
            }
        )
    records += [{**records[0], "id": "x", "locale": "de-DE", "intent": "german_only", "utt": "hallo"}] * 3
    return _write_jsonl(directory / "massive" / "data" / "en-US.jsonl", records)


def write_quality(directory: Path, paragraphs=(10, 18, 28, 45)) -> Path:
    """QuALITY's release file: JSON lines without a file extension, questions nested; one article
    per entry of ``paragraphs`` (its length in paragraphs: short to long, about 170 tokens each with
    the tiny tokenizer)."""
    rng = random.Random(12)
    records = []
    for a, n_paragraphs in enumerate(paragraphs):
        article = "\n\n".join(" ".join(_sentences(rng, 3)) for _ in range(n_paragraphs))
        questions = []
        for q in range(3):
            options = [" ".join(_topic(rng, 3)) for _ in range(4)]
            questions.append(
                {
                    "question": f"What does the story say about {' '.join(_topic(rng, 2))}?",
                    "options": options,
                    "gold_label": rng.randint(1, 4),
                    "question_unique_id": f"{a}_{q}",
                    "difficult": q % 2,
                }
            )
        questions.append({"question": "No gold here?", "options": ["x", "y"], "question_unique_id": "nogold"})
        records.append(
            {
                "article_id": str(a),
                "set_unique_id": f"s{a}",
                "title": f"Story {a}",
                "author": "Anon",
                "article": article,
                "questions": questions,
            }
        )
    return _write_jsonl(directory / "quality" / "QuALITY.v1.0.1.htmlstripped.train", records)


def _msmarco(seed: int, n_queries: int):
    """(queries [(qid, text)], qrels [(qid, pid, grade)], passages {pid: text})."""
    rng = random.Random(seed)
    passages, queries, qrels = {}, [], []
    pid = 0
    for q in range(n_queries):
        topic = _topic(rng, 4)
        qid = str(1000 + q)
        queries.append((qid, f"how does {' '.join(topic)} work"))
        for grade in [rng.choice((1, 2, 3)) for _ in range(rng.randint(2, 5))] + [0, 0, 0]:
            text = " ".join(_with_topic(rng, topic if grade else topic[:1], 2))
            passages[f"msmarco_passage_00_{pid}"] = text
            qrels.append((qid, f"msmarco_passage_00_{pid}", grade))
            pid += 1
        for _ in range(4):
            passages[f"msmarco_passage_01_{pid}"] = " ".join(_sentences(rng, 2))
            pid += 1
    return queries, qrels, passages


def write_msmarco_trec(directory: Path, n_queries: int = 40) -> Path:
    """The TREC DL layout: ``queries.tsv``, ``qrels.txt`` (graded) and a gzipped JSONL passage shard."""
    queries, qrels, passages = _msmarco(13, n_queries)
    root = directory / "msmarco_trec"
    root.mkdir(parents=True, exist_ok=True)
    (root / "queries.tsv").write_text("".join(f"{qid}\t{text}\n" for qid, text in queries))
    (root / "qrels.txt").write_text("".join(f"{qid} Q0 {pid} {g}\n" for qid, pid, g in qrels))
    shard = root / "msmarco_v2_passage" / "msmarco_passage_00.gz"
    shard.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(shard, "wt") as f:
        for pid, text in passages.items():
            f.write(json.dumps({"pid": pid, "passage": text, "spans": "", "docid": "d"}) + "\n")
    return root


def write_msmarco_records(directory: Path, n_queries: int = 40) -> Path:
    """One record per query: ``{query, passages: [{pid, text, relevance}]}`` (JSONL)."""
    queries, qrels, passages = _msmarco(14, n_queries)
    by_query: dict[str, list] = {}
    for qid, pid, g in qrels:
        by_query.setdefault(qid, []).append({"pid": pid, "text": passages[pid], "relevance": g})
    judged = {pid for _, pid, _ in qrels}
    extra = [{"pid": pid, "text": t, "relevance": 0} for pid, t in passages.items() if pid not in judged]
    records = [{"query_id": qid, "query": text, "passages": by_query[qid]} for qid, text in queries]
    records[0]["passages"] = records[0]["passages"] + extra  # unjudged passages join the corpus this way
    return _write_jsonl(directory / "msmarco_records.jsonl", records)


def _qampari(seed: int, n: int):
    """[(question, [(name, aliases, [(title, proof text)])])]"""
    rng, name = random.Random(seed), _Names(seed)
    out = []
    for _ in range(n):
        topic = _topic(rng, 2)
        answers = []
        for _ in range(rng.randint(4, 9)):
            entity = name()
            proofs = []
            for _ in range(rng.randint(1, 2)):
                sents = _sentences(rng, 3)
                sents[1] = f"{entity} is known for its {topic[0]} {topic[1]}."
                proofs.append((name(), " ".join(sents)))
            answers.append((entity, [entity.lower()], proofs))
        out.append((f"Which places are known for their {topic[0]} {topic[1]}", answers))
    return out


def write_qampari(directory: Path, n: int = 40) -> Path:
    """QAMPARI's release JSONL (``answer_list`` with proofs)."""
    records = []
    for i, (question, answers) in enumerate(_qampari(15, n)):
        records.append(
            {
                "qid": f"q{i}",
                "question_text": question + "?",
                "entities": [],
                "answer_list": [
                    {
                        "answer_text": entity,
                        "aliases": aliases,
                        "answer_url": f"https://en.wikipedia.org/wiki/{entity}",
                        "proof": [
                            {
                                "proof_text": text,
                                "found_in_url": f"https://en.wikipedia.org/wiki/{title.replace(' ', '_')}",
                                "pid": f"{i}_{j}_{k}",
                            }
                            for k, (title, text) in enumerate(proofs)
                        ],
                    }
                    for j, (entity, aliases, proofs) in enumerate(answers)
                ],
            }
        )
    return _write_jsonl(directory / "qampari" / "full_train_data.jsonl", records)


def write_qampari_alce(directory: Path, n: int = 40) -> Path:
    """ALCE's QAMPARI JSON (``answers`` as alias lists, retrieved ``docs``)."""
    rng = random.Random(16)
    records = []
    for question, answers in _qampari(17, n):
        docs = [{"title": t, "text": text} for _, _, proofs in answers for t, text in proofs]
        docs += [{"title": first_names()[rng.randrange(100)], "text": " ".join(_sentences(rng, 3))} for _ in range(5)]
        rng.shuffle(docs)
        records.append({"question": question, "answers": [[e, *al] for e, al, _ in answers], "docs": docs})
    return _write_json(directory / "qampari_alce.json", records)


def write_all(directory: Path) -> dict[str, Path]:
    """Every fixture; keys are task names (plus a few format variants)."""
    directory = Path(directory)
    return {
        "hotpotqa": write_hotpotqa(directory),
        "2wikimqa": write_2wikimqa(directory),
        "musique": write_musique(directory),
        "nq": write_nq(directory),
        "triviaqa": write_triviaqa(directory),
        "dapo_math": write_dapo_math(directory),
        "mcqa_math": write_mcqa_math(directory),
        "mathqa": write_mathqa(directory),
        "banking77": write_banking77(directory),
        "banking77_csv": write_banking77_csv(directory),
        "massive": write_massive(directory),
        "quality": write_quality(directory),
        "msmarco": write_msmarco_trec(directory),
        "msmarco_records": write_msmarco_records(directory),
        "qampari": write_qampari(directory),
        "qampari_alce": write_qampari_alce(directory),
    }


# the data sets of the paper mixture (configs/data), by the directory name it reads them from
PAPER_DATASETS = (
    "hotpotqa",
    "2wikimqa",
    "musique",
    "nq",
    "triviaqa",
    "dapo_math",
    "mcqa_math",
    "banking77",
    "massive",
    "quality",
    "msmarco",
    "qampari",
)


def link_dataset_root(paths: dict[str, Path], root: Path) -> Path:
    """``root`` laid out as the paper mixture expects: one link per data set to its fixture in ``paths``."""
    root = Path(root)
    root.mkdir(exist_ok=True)
    for task in PAPER_DATASETS:
        (root / task).symlink_to(paths[task])
    return root


def think_renderer():
    """A ``PromptRenderer`` over the tiny tokenizer (no model directory) with the thinking
    generation prompt the data tasks render with."""
    from data_gen.fit import PromptRenderer
    from recallm.tiny import build_tiny_tokenizer
    from recallm.tokens import ensure_think_generation_prompt

    tok = build_tiny_tokenizer()
    ensure_think_generation_prompt(tok)
    return PromptRenderer(tok)


def save_tiny_encoder(directory: Path, tokenizer, *, cls_pooling: bool = False) -> str:
    """A tiny random BERT encoder with ``tokenizer``, saved locally (dense negatives without a
    download); ``cls_pooling`` adds a sentence-transformers pooling config asking for CLS pooling."""
    import torch
    from transformers import BertConfig, BertModel

    directory = Path(directory)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    if cls_pooling:
        (directory / "1_Pooling").mkdir(exist_ok=True)
        (directory / "1_Pooling" / "config.json").write_text(
            json.dumps(
                {"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
            )
        )
    return str(directory)


def write_qampari_dpr(directory: Path, n: int = 20) -> Path:
    """QAMPARI with retrieved contexts (DPR format): ``answers``, ``ans_mappings``, ``positive_ctxs``
    (``pid`` = ``<id>__<answer index>__<proof index>``) and retrieved ``ctxs``, some holding no answer."""
    rng = random.Random(18)
    records = []
    for i, (question, answers) in enumerate(_qampari(19, n)):
        qid = f"{i}__wikidata_simple__train"
        positives = [
            {"title": title, "text": text, "pid": f"{qid}__{j}__{k}", "chunk_id": f"c{i}_{j}_{k}"}
            for j, (_, _, proofs) in enumerate(answers)
            for k, (title, text) in enumerate(proofs)
        ]
        ctxs = [{"id": f"r{i}_{m}", "title": f"Other {m}", "text": " ".join(_sentences(rng, 3))} for m in range(6)]
        ctxs.append({"id": f"r{i}_a", "title": "Mentions", "text": f"Nothing but {answers[0][0]} here."})
        records.append(
            {
                "id": qid,
                "question": question + "?",
                "answers": [entity for entity, _, _ in answers],
                "ans_mappings": {entity: aliases for entity, aliases, _ in answers},
                "positive_ctxs": positives,
                "ctxs": ctxs,
            }
        )
    return _write_jsonl(directory / "qampari_dpr" / "full_train_data.jsonl", records)
