"""Tiny local copies of the data HELMET and RULER read, in their release layouts, written by tests.

Nothing here is real data: the texts are word salad from ``data_gen.text.words()``, deterministic
from a seed, shaped like each release (HELMET's ``data/`` and ``prompts/`` after its download
script, the raw Hugging Face data sets as JSON lines, RULER's SQuAD / HotpotQA / essay files),
and the judge model the HELMET tests put behind the stub server (``judge_reply``).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from data_gen.text import words


def _text(rng: random.Random, n: int) -> str:
    vocab = words()
    return " ".join(vocab[rng.randrange(len(vocab))].lower() for _ in range(n)) + "."


def _jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_helmet_data(root: Path, seed: int = 0, n: int = 6) -> tuple[Path, Path]:
    """``(helmet_dir, dataset_root)`` holding every file the 21 HELMET tasks read at 4K (the files
    a 1K-4K prompt uses), ``n`` test items each."""
    rng = random.Random(seed)
    helmet, hf = root / "HELMET", root / "hf"
    kilt = helmet / "data" / "kilt"
    for name, dev, demo in (
        ("nq", "nq-dev-multikilt_1000_k20_dep6.jsonl", "nq-train-multikilt_1000_k3_dep6.jsonl"),
        ("triviaqa", "triviaqa-dev-multikilt_1000_k20_dep6.jsonl", "triviaqa-train-multikilt_1000_k3_dep6.jsonl"),
        ("hotpotqa", "hotpotqa-dev-multikilt_1000_k20_dep3.jsonl", "hotpotqa-train-multikilt_1000_k3_dep3.jsonl"),
        ("popqa", "popqa_test_1000_k20_dep6.jsonl", "popqa_test_1000_k3_dep6.jsonl"),
    ):
        for file, k in ((dev, 20), (demo, 3)):
            records = []
            for i in range(n):
                answer = f"{name}answer{i}"
                ctxs = [{"title": f"T{j}", "text": _text(rng, 12)} for j in range(k)]
                ctxs[i % k]["text"] += f" The answer is {answer}."
                record = {"id": f"{name}-{file[:5]}-{i}", "question": f"what is {name} question {i}?",
                          "answers": [answer, f"alias{i}"], "ctxs": ctxs}  # fmt: skip
                if name == "popqa":
                    record["s_pop"] = 500 if i % 3 else 5000  # every third is too popular (log10 >= 3): dropped
                records.append(record)
            _jsonl(kilt / file, records)
    msmarco = helmet / "data" / "msmarco"
    for file, k in (("test_reranking_data_k14_dep3.jsonl", 14), ("test_reranking_data_k10_dep3.jsonl", 10)):
        records = []
        for i in range(n):
            ctxs = [{"id": str(100 + j), "text": _text(rng, 8), "label": [3, 2, 1, 0][min(j, 3)]} for j in range(k)]
            rng.shuffle(ctxs)
            records.append({"qid": f"{file[:25]}-{i}", "query": f"query {i} about things", "ctxs": ctxs})
        _jsonl(msmarco / file, records)
    alce = helmet / "data" / "alce"
    prompts = helmet / "prompts"
    prompts.mkdir(parents=True, exist_ok=True)
    for name in ("asqa", "qampari"):
        docs = lambda: [{"title": f"Doc {j}", "text": _text(rng, 10)} for j in range(12)]  # noqa: E731
        records = []
        for i in range(n):
            record = {"question": f"{name} question {i}?", "docs": docs(), "answer": "long answer"}
            if name == "asqa":
                record["qa_pairs"] = [{"short_answers": [f"alpha{i}"]}, {"short_answers": [f"beta{i}", "b"]}]
                record["docs"][0]["text"] += f" It is alpha{i}."
            else:
                record["answers"] = [[f"item{i}a"], [f"item{i}b", "bee"], [f"item{i}c"]]
                record["docs"][1]["text"] += f" Lists item{i}a and item{i}b."
            records.append(record)
        (alce / f"{name}_eval_gtr_top2000.json").parent.mkdir(parents=True, exist_ok=True)
        (alce / f"{name}_eval_gtr_top2000.json").write_text(json.dumps(records))
        demo = {"question": "demo question?", "answer": "demo answer [1].", "docs": docs()[:2]}
        (prompts / f"{name}_revised.json").write_text(
            json.dumps(
                {
                    "instruction": f"Instruction: answer the {name} question from the documents and cite them as [x].",
                    "demo_sep": "\n\n\n",
                    "demo_prompt": "{instruction}\n\nQuestion: {question}\n\n{context}\n\nAnswer: {answer}",
                    "doc_prompt": "Document [{ID}](Title: {title}): {text}",
                    "demos": [demo, demo, demo],
                }
            )
        )
    # LongQA / Summ: long documents (a few thousand tokens of the tiny tokenizer)
    story = lambda: " ".join(_text(rng, 12) for _ in range(300))  # noqa: E731
    narrative = lambda i: {"document": {"id": f"doc{i // 2}", "text": story() + f" The hero is hero{i}."},  # noqa: E731
                           "question": {"text": f"who is the hero {i}?"},
                           "answers": [{"text": f"hero{i}"}, {"text": f"the hero{i}"}]}  # fmt: skip
    _jsonl(hf / "narrativeqa" / "test.jsonl", [narrative(i) for i in range(n)])
    _jsonl(hf / "narrativeqa" / "train.jsonl", [narrative(i) for i in range(3)])
    inf = hf / "infinitebench"
    _jsonl(inf / "longbook_qa_eng.jsonl", [
        {"id": i, "context": story(), "input": f"where does chapter {i} happen?", "answer": [f"place{i}"], "options": []}
        for i in range(n)
    ])  # fmt: skip
    _jsonl(inf / "longbook_choice_eng.jsonl", [
        {"id": i, "context": story(), "input": f"which one {i}?", "answer": [f"option{i}c"],
         "options": [f"option{i}a", f"option{i}b", f"option{i}c", f"option{i}d"]}
        for i in range(n)
    ])  # fmt: skip
    _jsonl(inf / "longbook_sum_eng.jsonl", [
        {"id": i, "context": story(), "input": "", "answer": [f"The book {i} is about a hero. It ends well."], "options": []}
        for i in range(n)
    ])  # fmt: skip
    _jsonl(helmet / "data" / "infbench" / "longbook_sum_eng_keypoints.jsonl",
           [{"id": i, "keypoints": [f"book {i} has a hero", "it ends well"]} for i in range(n)])  # fmt: skip
    lexsum = lambda i: {"id": f"case{i}", "sources": [story(), story()], "summary/short": f"Case {i} was settled.",  # noqa: E731
                        "summary/long": f"Case {i} was filed and then settled."}  # fmt: skip
    _jsonl(hf / "multi_lexsum" / "validation.jsonl", [lexsum(i) for i in range(n)])
    _jsonl(hf / "multi_lexsum" / "train.jsonl", [lexsum(100 + i) for i in range(3)])
    _jsonl(helmet / "data" / "multi_lexsum" / "multi_lexsum_val.jsonl",
           [{"id": f"case{i}", "summary/short_keypoints": [f"case {i} settled"], "summary/long": f"Case {i} settled."}
            for i in range(n)])  # fmt: skip
    # Recall: HELMET's JSON KV file (50 pairs at 4K) and its RULER needle files (context, query, type_needle_v, outputs)
    kv_records = []
    for i in range(n):
        pairs = [(f"{rng.getrandbits(64):016x}-k{i}-{j}", f"{rng.getrandbits(64):016x}-v{i}-{j}") for j in range(50)]
        gold = pairs[(7 * i) % 50]
        kv_records.append({"context": "JSON data:\n" + json.dumps(dict(pairs)), "question": json.dumps(gold[0]),
                           "answer": gold[1], "num_kvs": 50,
                           "demos": [[json.dumps(a), json.dumps(b)] for a, b in (pairs[1], pairs[2], pairs[3])]})  # fmt: skip
    _jsonl(helmet / "data" / "json_kv" / "test_k50_dep6.jsonl", kv_records)
    for task, kind, values in (("niah_multikey_2", "number", 1), ("niah_multikey_3", "uuid", 1),
                               ("niah_multivalue", "numbers", 4)):  # fmt: skip
        for length in (2048, 4096):
            rows = []
            for i in range(n):
                answers = [f"{rng.randrange(10**6, 10**7)}" for _ in range(values)]
                needles = [f"One of the special magic {kind} for key-{i} is: {a}." for a in answers]
                filler = [f"One of the special magic {kind} for other-{i}-{j} is: {j}{i}." for j in range(40)]
                rows.append({"context": "\n".join(filler[:20] + needles + filler[20:]), "query": f"key-{i}",
                             "type_needle_v": kind, "outputs": answers, "length": length})  # fmt: skip
            _jsonl(helmet / "data" / "ruler" / task / f"validation_{length}.jsonl", rows)
    # HELMET's judge prompts are read from its scripts/ (module-level string constants): stand-ins with its field names
    from recallm.eval.judge import JudgePrompts

    ours = JudgePrompts.ours()
    (helmet / "scripts").mkdir(parents=True, exist_ok=True)
    (helmet / "scripts" / "eval_gpt4_longqa.py").write_text(f"import re\njudge_prompt = {ours.longqa!r}\n")
    (helmet / "scripts" / "eval_gpt4_summ.py").write_text(
        "".join(f"{name} = {getattr(ours, role)!r}\n" for role, name in (
            ("fluency", "fluency_prompt"), ("fluency_book", "fluency_prompt_book"), ("recall", "recall_prompt"),
            ("recall_book", "recall_prompt_book"), ("precision", "precision_prompt"),
            ("precision_book", "precision_prompt_book")))
    )  # fmt: skip
    # ICL: classification sets, labels as class indices (a ClassLabel column, as HELMET maps them)
    for folder, label_field, test_split, labels in (
        ("trec", ("coarse_label", "fine_label"), "test", list(range(6))),
        ("banking77", ("label",), "test", list(range(7))),
        ("clinc_oos", ("intent",), "validation", list(range(5))),
        ("nlu_evaluation_data", ("label",), None, list(range(4))),
    ):

        def items(count: int, labels=labels, label_field=label_field) -> list[dict]:
            out = []
            for j in range(count):
                record = {"text": f"{_text(rng, 6)} sample {j}"}
                for f in label_field:
                    record[f] = labels[j % len(labels)]
                out.append(record)
            return out

        if test_split is None:
            _jsonl(hf / folder / "train.jsonl", items(60))
        else:
            _jsonl(hf / folder / "train.jsonl", items(40))
            _jsonl(hf / folder / f"{test_split}.jsonl", items(12))
    return helmet, hf


def write_ruler_data(root: Path, seed: int = 0) -> dict[str, Path]:
    """RULER's local files: SQuAD 2.0 dev, HotpotQA dev (distractor) and the essays JSON."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    articles = []
    for a in range(6):
        paragraphs = []
        for p in range(3):
            answer = f"squadanswer{a}x{p}"
            context = _text(rng, 40) + f" The thing is {answer}."
            qas = [
                {"question": f"what is thing {a} {p}?", "answers": [{"text": answer}], "is_impossible": False},
                {"question": f"unanswerable {a} {p}?", "answers": [], "is_impossible": True},
            ]
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"Article {a}", "paragraphs": paragraphs})
    squad = root / "squad.json"
    squad.write_text(json.dumps({"version": "v2.0", "data": articles}))
    hotpot = []
    for q in range(6):
        context = [[f"Title {q} {j}", [_text(rng, 15), f" Fact {q}-{j}."]] for j in range(10)]
        hotpot.append({"question": f"which fact {q}?", "answer": f"hotpotanswer{q}", "context": context})
        context[3][1].append(f" The answer is hotpotanswer{q}.")
    hotpotqa = root / "hotpotqa.json"
    hotpotqa.write_text(json.dumps(hotpot))
    essays = root / "PaulGrahamEssays.json"
    essays.write_text(json.dumps({"text": "\n\n".join(f"Essay sentence number {i} is here. " + _text(rng, 10)
                                                          for i in range(400))}))  # fmt: skip
    return {"squad_path": squad, "hotpotqa_path": hotpotqa, "haystack_path": essays}


def write_eval_data(root: Path) -> dict[str, Path]:
    """HELMET's files (``helmet_dir``, ``dataset_root``) and RULER's (``squad_path``,
    ``hotpotqa_path``, ``haystack_path``) under ``root``."""
    helmet, hf = write_helmet_data(root)
    return {"helmet_dir": helmet, "dataset_root": hf, **write_ruler_data(root / "ruler")}


def judge_reply(path: str, body: dict) -> str:
    """A judge model behind the stub: readable JSON verdicts, except for outputs saying "garble"."""
    prompt = body["messages"][-1]["content"]
    if "garble" in prompt:
        return "I cannot decide."
    if "Answer to grade:" in prompt:
        graded = prompt.split("Answer to grade:")[1]
        return 'Fine.\n{"fluency": 1, "correctness": 3}' if "hero" in graded else '{"fluency": 1, "correctness": 0}'
    if "judge the fluency" in prompt:
        return '{"fluency": 1}'
    if "Key points:" in prompt:
        return 'Point 1 is there. {"supported_key_points": [1], "recall": 1}'
    if "Expert summary:" in prompt:
        return '```json\n{"precision": 1, "sentence_count": 2}\n```'
    if "Hypothesis:" in prompt:
        premise = prompt.split("Premise: <<<")[1].split(">>>")[0]
        hypothesis = prompt.split("Hypothesis: <<<")[1].split(">>>")[0]
        return json.dumps({"entails": int(all(w in premise for w in re.findall(r"item\w+", hypothesis)))})
    if "Reasoning:\n" in prompt:
        for line in prompt.split("Reasoning:\n")[1].splitlines():
            if "look" in line:
                return json.dumps({"segment": int(line.split("]")[0].lstrip("["))})
        return '{"segment": -1}'
    return "?"
