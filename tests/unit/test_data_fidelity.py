"""Data fidelity to the paper (issue 16 item 7): Table 5's gold counts, the reasoning-oriented
system prompt, dense negatives in the paper mixture, multi-hop distractors from a chunked local
Wikipedia, judged negatives as a sampled source, passages with or without titles, the 96K cell."""

from __future__ import annotations

import json
import random
import re

import pytest

import data_gen.datasets  # noqa: F401  (registers the tasks)
from data_gen.base import make_task
from data_gen.datasets.negatives import Corpus, dense_index, negative_stream, pooling_mode
from data_gen.datasets.wiki import load_wiki_chunks
from data_gen.fit import PromptRenderer
from data_gen.generate import draft_row, schedule_from_config
from data_gen.system_prompts import REASONING, SYSTEM_PROMPTS
from recallm.errors import RecallmError
from tests import data_fixtures


@pytest.fixture(scope="module")
def renderer():
    return data_fixtures.think_renderer()


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    base = tmp_path_factory.mktemp("fidelity")
    out = data_fixtures.write_all(base)
    out["qampari_dpr"] = data_fixtures.write_qampari_dpr(base)
    return out


def _row(task, renderer, target, seed=0):
    return draft_row(task, renderer, target, random.Random(seed), seed=seed)


def test_gold_counts_follow_table5(paths):
    niah = make_task("multi_niah")
    counts = [sum(p.gold for p in niah.draft(random.Random(s)).placed) for s in range(150)]
    assert min(counts) == 1 and max(counts) == 6  # retrieval: 1-6 (3 keys x 3 values would reach 9)
    with pytest.raises(RecallmError, match="max_needles"):
        make_task("multi_niah", max_needles=2)  # fewer than the target keys
    assert make_task("msmarco", path=str(paths["msmarco"])).gold_docs == (1, 26)  # reranking: 1-26
    qampari = make_task("qampari", path=str(paths["qampari"]))
    assert qampari.gold_entities == (5, 20) and qampari.min_tokens <= 4096  # entity citation: 5-20, the 4K cell
    questions, _ = qampari.data()
    for seed in range(20):  # at least 5 gold entities whenever the question has 5 supported answers
        draft = qampari.draft(random.Random(seed))
        supported = max(len([e for e in q.entities if e.support]) for q in questions if q.text in draft.question)
        assert draft.augmentations["gold_entities"] >= min(5, supported)


def test_reasoning_system_prompt(renderer, tmp_path):
    from omegaconf import OmegaConf

    from recallm.paths import config_dir

    assert SYSTEM_PROMPTS["reasoning"] == REASONING
    assert "<|start_recall|>" not in REASONING and "<|end_recall|>" not in REASONING  # would open a span
    assert "Answer:" in REASONING and "<think>" in REASONING
    named = PromptRenderer(renderer.tokenizer, "reasoning")
    assert named.messages("task") == [{"role": "system", "content": REASONING}, {"role": "user", "content": "task"}]
    assert PromptRenderer(renderer.tokenizer, "Be brief.").messages("t")[0]["content"] == "Be brief."
    text, _ = named.render("task")
    assert REASONING in text
    for config in ("data/paper.yaml", "eval/paper.yaml"):  # training and evaluation share it (§5.2)
        assert OmegaConf.load(config_dir() / config).system_prompt == "reasoning"


def _paper(tmp_path, **changes):
    from omegaconf import OmegaConf

    from recallm.paths import config_dir

    cfg = OmegaConf.load(config_dir() / "data" / "paper.yaml")
    cfg.dataset_root = str(tmp_path)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_container(OmegaConf.create({"data": cfg}), resolve=True)["data"]


def test_paper_mixture_asks_for_dense_negatives(paths, tmp_path):
    root = data_fixtures.link_dataset_root(paths, tmp_path / "root")
    cfg = _paper(root)
    assert cfg["dense_model"] is None and cfg["val"]["lengths"][-2:] == [98304, 131072]  # the 96K cell
    with pytest.raises(
        RecallmError, match=r"task hotpotqa: negatives include 'dense' but no dense_model .*data\.dense_model="
    ):
        schedule_from_config(cfg)
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    with pytest.raises(RecallmError, match="not a model directory"):
        schedule_from_config(_paper(root, dense_model=str(encoder)))
    (encoder / "config.json").write_text("{}")  # the plan checks the directory; the model loads on first use
    plan = schedule_from_config(_paper(root, dense_model=str(encoder)))
    docs = [j for j in plan.jobs if j.split == "train" and j.task in ("nq", "msmarco", "qampari")]
    assert all("dense" in dict(j.params)["negatives"] for j in docs)
    assert "judged" in dict(docs[-1].params)["negatives"]


def test_dense_pooling_from_the_encoder_directory(renderer, tmp_path):
    mean = data_fixtures.save_tiny_encoder(tmp_path / "mean", renderer.tokenizer)
    cls = data_fixtures.save_tiny_encoder(tmp_path / "cls", renderer.tokenizer, cls_pooling=True)
    assert pooling_mode(mean) == "mean" and pooling_mode(cls) == "cls"
    corpus, _ = Corpus.build("t:pool", [("", f"alpha beta {i}") for i in range(12)])
    a, b = dense_index(corpus, mean), dense_index(corpus, cls)
    assert a.pooling == "mean" and b.pooling == "cls" and a.embeddings.shape == b.embeddings.shape
    assert not (a.embeddings == b.embeddings).all()
    order = list(negative_stream(corpus, "mixed", "alpha", random.Random(0), dense_model=cls))
    assert sorted(order) == list(range(12))  # mixed draws from BM25, random and dense alike


def _docs(row) -> list[str]:
    return re.findall(r"^(?:Document \[\d+\].*|\[\d+\].*)$", row.messages[-1]["content"], re.MULTILINE)


@pytest.mark.parametrize("name", ["nq", "hotpotqa", "qampari"])
def test_passages_with_or_without_titles(name, paths, renderer):
    seen = set()
    for titles in (("title",), ("no_title",)):
        task = make_task(name, path=str(paths[name]), titles=titles, doc_formats=("document",))
        row = _row(task, renderer, 4096 if name == "qampari" else 1024)
        assert row.augmentations["titles"] == titles[0]
        with_title = sum("(Title: " in d for d in _docs(row))
        seen.add(with_title > 0)
        assert (with_title > 0) == (titles[0] == "title")
    both = make_task("nq", path=str(paths["nq"]))
    assert both.titles == ("title", "no_title")
    assert {_row(both, renderer, 1024, s).augmentations["titles"] for s in range(8)} == {"title", "no_title"}


def test_judged_negatives_are_a_sampled_source(paths, renderer):
    with pytest.raises(RecallmError, match="no judged negatives"):
        make_task("nq", path=str(paths["nq"]), negatives=("judged",))
    assert "judged" in make_task("msmarco", path=str(paths["msmarco"])).negatives
    # MS MARCO: the query's grade-0 passages come first with `judged`, never with another source
    task = make_task("msmarco", path=str(paths["msmarco"]), negatives=("judged",))
    queries, corpus = task.data()
    for negatives, expect_judged in ((("judged",), True), (("random",), False)):
        task = make_task("msmarco", path=str(paths["msmarco"]), negatives=negatives)
        draft = task.draft(random.Random(3))
        q = next(q for q in queries if q.text in draft.question)
        zero = {corpus.texts[i] for i, g in q.judged.items() if g <= 0}
        relevant = {corpus.texts[i] for i, g in q.judged.items() if g > 0}
        first = [next(draft.distractors).meta["doc"][2] for _ in range(len(zero))]
        assert (set(first) == zero) is expect_judged
        assert not relevant & set(first)
    # QAMPARI (DPR format): entities and their proofs from the pids, judged negatives = retrieved contexts without an answer
    task = make_task("qampari", path=str(paths["qampari_dpr"]), negatives=("judged",))
    questions, corpus = task.data()
    assert all(q.judged and all(e.support for e in q.entities) for q in questions)
    judged_texts = {corpus.texts[i] for q in questions for i in q.judged}
    assert not any(t.startswith("Nothing but") for t in judged_texts)  # a context naming an answer is no negative
    draft = task.draft(random.Random(1))
    q = next(q for q in questions if q.text in draft.question)
    first = {next(draft.distractors).meta["doc"][2] for _ in range(len(q.judged))}
    assert first == {corpus.texts[i] for i in q.judged}
    row = _row(task, renderer, 4096, seed=2)
    assert row.augmentations["negatives"] == "judged" and len(row.ground_truth["entities"]) >= 4
    # ALCE's layout: the retrieved docs that mention no answer
    alce = make_task("qampari", path=str(paths["qampari_alce"]), negatives=("judged",))
    assert all(len(q.judged) == 5 for q in alce.data()[0])


def _write_kilt(tmp_path):
    pages = []
    for p in range(30):
        words = [f"w{p}x{i}" for i in range(250)]
        pages.append(
            {
                "wikipedia_id": str(p),
                "wikipedia_title": f"Page {p}",
                "text": [
                    f"Page {p}",
                    " ".join(words[:120]),
                    "Section::::History.",
                    "BULLET::::" + " ".join(words[120:]),
                ],
            }
        )
    kilt = tmp_path / "kilt" / "kilt_knowledgesource.json"
    kilt.parent.mkdir()
    kilt.write_text("".join(json.dumps(p) + "\n" for p in pages))
    tsv = tmp_path / "psgs_w100.tsv"
    tsv.write_text('id\ttext\ttitle\n1\tone two three\tFirst\n2\t"four five"\tSecond\n')
    return kilt, tsv


def test_wikipedia_chunks(tmp_path):
    kilt, tsv = _write_kilt(tmp_path)
    chunks = load_wiki_chunks(str(kilt.parent), 100, 1000)
    assert chunks[0][0] == "Page 0" and chunks[0][1].split()[0] == "w0x0" and len(chunks[0][1].split()) == 100
    assert not any("Section::::" in t or "BULLET" in t or t.startswith("Page") for _, t in chunks)
    assert len(chunks) == 30 * 3  # 250 words: two windows of 100 and one of 50 (at least half a window)
    assert len(load_wiki_chunks(str(kilt), 100, 7)) == 7  # bounded
    assert load_wiki_chunks(str(tsv), 100, 10) == (("First", "one two three"), ("Second", "four five"))
    with pytest.raises(RecallmError, match="Wikipedia corpus not found"):
        load_wiki_chunks(str(tmp_path / "nope"), 100, 10)


def test_multihop_distractors_from_a_chunked_wikipedia(paths, renderer, tmp_path):
    kilt, _ = _write_kilt(tmp_path)
    task = make_task("hotpotqa", path=str(paths["hotpotqa"]), wiki_corpus=str(kilt), passage_types=("chunk",))
    row = _row(task, renderer, 2048)
    assert row.augmentations["distractor_corpus"] == "wikipedia" and row.augmentations["passage_type"] == "chunk"
    wiki = {t for _, t in load_wiki_chunks(str(kilt), task.chunk_words, task.wiki_max_passages)}
    texts = [d.split(": ", 1)[-1] if d.startswith("Document") else d for d in _docs(row)]
    body = row.messages[-1]["content"]
    assert sum(t in body for t in wiki) >= 5  # distractors are Wikipedia windows
    assert all(g["text"] in body for g in row.gold) and texts
    plain = make_task("hotpotqa", path=str(paths["hotpotqa"]), passage_types=("chunk",))
    assert _row(plain, renderer, 2048).augmentations["distractor_corpus"] == "native"
    # MuSiQue (paragraph-level support) gets fixed-window passages only with the Wikipedia corpus
    assert make_task("musique", path=str(paths["musique"])).passage_types == ("paragraph",)
    assert make_task("musique", path=str(paths["musique"]), wiki_corpus=str(kilt)).passage_types == (
        "paragraph",
        "chunk",
    )
    with pytest.raises(RecallmError, match="Wikipedia corpus not found"):
        make_task("hotpotqa", path=str(paths["hotpotqa"]), wiki_corpus=str(tmp_path / "nope"))
