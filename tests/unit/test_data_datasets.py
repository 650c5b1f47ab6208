"""Dataset-backed tasks (``data_gen.datasets``) on tiny generated fixtures (``tests/data_fixtures.py``)."""

from __future__ import annotations

import random
import re

import pytest

import data_gen.datasets  # noqa: F401  (registers the tasks)
import rewards
from data_gen.base import make_task
from data_gen.datasets import io
from data_gen.datasets.common import DOC_FORMATS
from data_gen.datasets.negatives import Corpus, bm25_index, dense_index, negative_stream
from data_gen.fit import DraftTooLong, build_row
from data_gen.generate import draft_row
from recallm.errors import RecallmError
from tests import data_fixtures

DOC_TASKS = ("hotpotqa", "2wikimqa", "musique", "nq", "triviaqa", "msmarco", "qampari")
NATURAL_TASKS = ("dapo_math", "mcqa_math", "quality")  # natural length: the target is an upper bound
FITTED_TASKS = DOC_TASKS + ("banking77", "massive")
ALL_TASKS = FITTED_TASKS + NATURAL_TASKS
GOLD_COUNT = {
    "hotpotqa": (2, 2),
    "2wikimqa": (2, 4),
    "musique": (2, 4),
    "nq": (1, 1),
    "triviaqa": (1, 1),
    "banking77": (4, 12),
    "massive": (4, 12),
    "msmarco": (1, 26),  # Table 5 (the fixtures judge 2-5 passages relevant per query)
    "qampari": (1, 3),  # asked for here (short prompts); the paper's 5-20 is test_data_fidelity's
    "dapo_math": (0, 0),
    "mcqa_math": (0, 0),
    "quality": (0, 0),
}
_ID = re.compile(r"^(?:Document \[(\d+)\]|\[(\d+)\])", re.MULTILINE)
# one document of either layout: (id, title, text) of "Document [i] (Title: t): text" or "[i] t\ntext"
_DOC = re.compile(
    r"^(?:Document \[(\d+)\](?: \(Title: ([^\n]*?)\))?: ([^\n]*)|\[(\d+)\](?: ([^\n]*))?\n([^\n]*))$", re.MULTILINE
)
PIECE_SLACK = 300  # tokens: more than the largest fixture piece (TriviaQA's 100-word windows, about 250)
QUALITY_LONGEST = 9000  # tokens: above the prompt of every fixture article (the longest is about 7.8K)


@pytest.fixture(scope="module")
def renderer():
    return data_fixtures.think_renderer()


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return data_fixtures.write_all(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def config():
    return rewards.load_reward_config()


def _task(name, paths, **params):
    if name == "qampari":  # short prompts here: the paper's 5-20 gold entities need about 4K tokens
        params.setdefault("gold_entities", (1, 3))  # (test_data_fidelity checks the paper's default)
    return make_task(name, path=str(paths[name]), **params)


def _row(task, renderer, target, seed=0):
    """A row as generation makes it: a natural-length draft longer than ``target`` is drawn again."""
    return draft_row(task, renderer, target, random.Random(seed), seed=seed)


def _documents(row) -> list[tuple[str, str, str]]:
    """(id, title, text) of every document of the prompt, in order."""
    out = []
    for m in _DOC.finditer(row.messages[-1]["content"]):
        if m.group(1):
            out.append((m.group(1), m.group(2) or "", m.group(3)))
        else:
            out.append((m.group(4), m.group(5) or "", m.group(6)))
    return out


def _doc_id(text: str) -> str:
    m = _ID.match(text)
    return m.group(1) or m.group(2)


def _perfect(task, row):
    return f"<think>\nChecking the context.</think>\nAnswer: {task.answer_text(row)}"


def _check_row(task, row, config, target):
    assert row.task == row.data_source == task.name and row.category == task.category
    lo, hi = GOLD_COUNT[task.name]
    assert lo <= len(row.gold) <= hi or (
        task.name in ("hotpotqa", "2wikimqa") and row.augmentations["passage_type"] == "chunk"
    )
    for g in row.gold:
        assert row.prompt_text[g["start"] : g["end"]] == g["text"]
    if task.natural_length:  # the target is an upper bound, and the row records its own length
        assert row.prompt_tokens <= target and row.target_tokens == row.prompt_tokens
    else:  # fitted: within the tolerance, or short of it by less than a piece (none left that fits)
        assert 0.98 * target - PIECE_SLACK <= row.prompt_tokens <= 1.02 * target and row.target_tokens == target
    rewards.check_ground_truth(row.ground_truth, row.data_source, config)
    score = rewards.score_response(
        _perfect(task, row), row.ground_truth, prompt_text=row.prompt_text, data_source=row.data_source, config=config
    )
    assert score.answer == 1.0, (task.name, task.answer_text(row), row.ground_truth)
    assert score.format == 1.0


@pytest.mark.parametrize("name", FITTED_TASKS)
@pytest.mark.parametrize("target", [1024, 4096])
def test_rows_at_lengths(name, target, paths, renderer, config):
    task = _task(name, paths)
    for seed in (0, 1):
        _check_row(task, _row(task, renderer, target, seed), config, target)


def _article(task, row) -> tuple[str, str]:
    title = re.search(r"Title: (.+)", row.messages[-1]["content"]).group(1)
    return title, next(a for t, a in task.data()[0] if t == title)


def test_quality_rows_hold_the_whole_article(paths, renderer, config):
    task = _task("quality", paths)
    titles = set()
    for seed in range(6):
        row = _row(task, renderer, QUALITY_LONGEST, seed)
        _check_row(task, row, config, QUALITY_LONGEST)
        assert "gold" not in row.ground_truth and row.ground_truth["choices"]
        title, article = _article(task, row)
        assert article in row.messages[-1]["content"]  # all of it, in order, paragraphs kept
        titles.add(title)
    assert len(titles) >= 2


def test_quality_target_below_an_article_draws_a_shorter_one(paths, renderer, config):
    task = _task("quality", paths)
    lengths = {}  # prompt tokens of each article's rows (about: questions differ a little)
    for seed in range(12):
        row = _row(task, renderer, QUALITY_LONGEST, seed)
        lengths.setdefault(_article(task, row)[0], row.prompt_tokens)
    assert len(lengths) == 4
    short, second, third = sorted(lengths.values())[:3]
    target = (second + third) // 2  # the two shorter articles fit, the two longer do not
    redrawn = 0
    for seed in range(8):
        row = _row(task, renderer, target, seed)
        _check_row(task, row, config, target)
        assert lengths[_article(task, row)[0]] <= second + 100
        first_draft = task.draft(random.Random(seed))  # what draft_row drew first for this seed
        redrawn += lengths[re.search(r"Title: (.+)", first_draft.header).group(1)] > target
    assert redrawn  # some seeds drew a long article first, and got a shorter one instead
    with pytest.raises(RecallmError, match="drafts in a row were longer than"):
        _row(task, renderer, short - 200)  # below every article: a clear error after the redraws
    with pytest.raises(RecallmError, match="at least 1024"):
        task.check_length(512)
    task.check_length(1024)
    task.check_length(32_768)  # any larger target is fine: an upper bound


@pytest.mark.parametrize("name", ["dapo_math", "mcqa_math"])
def test_short_math_rows(name, paths, renderer, config):
    task = _task(name, paths)
    lengths = []
    for seed in range(6):
        row = _row(task, renderer, 1024, seed)
        _check_row(task, row, config, 1024)
        assert "gold" not in row.ground_truth and row.n_pieces == 0
        assert "Problem:" in row.prompt_text
        lengths.append(row.prompt_tokens)
    # a target between the problems' lengths: only those that fit come out
    target = sorted(lengths)[len(lengths) // 2]
    for seed in range(6):
        row = _row(task, renderer, target, seed)
        _check_row(task, row, config, target)
    with pytest.raises(RecallmError, match="drafts in a row were longer than"):
        _row(task, renderer, min(lengths) - 20)
    with pytest.raises(RecallmError, match="at least"):
        task.check_length(8)
    task.check_length(4096)  # an upper bound: any larger target is fine
    with pytest.raises(DraftTooLong):  # build_row alone says so; draft_row draws again
        build_row(task, task.draft(random.Random(0)), renderer, 20, random.Random(0))


def test_dapo_reader_strips_the_wrapper_and_keeps_integers(paths):
    task = _task("dapo_math", paths)
    problems = task.data()
    assert len(problems) == 30  # duplicates and the fraction answer dropped
    assert all(p.startswith("A box holds") and p.endswith("?") for p, _ in problems)
    assert all(re.fullmatch(r"\d+", a) for _, a in problems)


@pytest.mark.parametrize("name", ALL_TASKS)
def test_deterministic(name, paths, renderer):
    task = _task(name, paths)
    target = 1024 if name != "quality" else QUALITY_LONGEST
    a, b = _row(task, renderer, target, seed=5), _row(task, renderer, target, seed=5)
    assert a == b
    other = _row(task, renderer, target, seed=6)
    assert other.prompt_text != a.prompt_text


AUGMENTATIONS = {
    "hotpotqa": {
        "doc_format": {"document", "bracket"},
        "negatives": {"random", "bm25", "mixed"},
        "passage_type": {"paragraph", "chunk"},
    },
    "2wikimqa": {"doc_format": {"document", "bracket"}, "passage_type": {"paragraph", "chunk"}},
    "musique": {"doc_format": {"document", "bracket"}, "negatives": {"random", "bm25", "mixed"}},
    "nq": {"doc_format": {"document", "bracket"}, "negatives": {"random", "bm25", "mixed"}},
    "triviaqa": {"negatives": {"random", "bm25", "mixed"}},
    "mcqa_math": {"choice_format": {"dot", "paren"}},
    "banking77": {"label_format": {"number", "text"}, "demo_format": {"arrow", "fields"}},
    "massive": {"label_format": {"number", "text"}, "demo_format": {"arrow", "fields"}},
    "quality": {"choice_format": {"dot", "paren"}, "question_position": {"end", "beginning", "both"}},
    "msmarco": {"doc_format": {"document", "bracket"}, "negatives": {"random", "bm25", "mixed"}},
    "qampari": {"doc_format": {"document", "bracket"}, "gold_entities": {1, 2, 3}},
}


@pytest.mark.parametrize("name", sorted(AUGMENTATIONS))
def test_every_augmentation_value_appears(name, paths):
    task = _task(name, paths)
    seen: dict[str, set] = {}
    for seed in range(40):
        draft = task.draft(random.Random(seed))
        for key, value in {**draft.augmentations, "question_position": draft.question_position}.items():
            seen.setdefault(key, set()).add(value)
    for key, values in AUGMENTATIONS[name].items():
        assert values <= seen[key], (key, seen[key])


def test_chunk_passages_hold_the_supporting_sentences(paths, renderer):
    task = _task("hotpotqa", paths, passage_types=("chunk",), chunk_words=12)
    row = _row(task, renderer, 2048, seed=3)
    assert row.augmentations["passage_type"] == "chunk" and len(row.gold) >= 2
    gold_text = " ".join(g["text"] for g in row.gold)
    assert len(re.findall(r"\btied\b", gold_text)) == 2  # both supporting sentences are in gold chunks
    for g in row.gold:
        body = g["text"].split("): ", 1)[1] if g["text"].startswith("Document") else g["text"].split("\n", 1)[1]
        assert len(body.split()) < 18  # windows of 12 words, a short tail merged into the last
    with pytest.raises(RecallmError, match="passage_types"):
        _task("musique", paths, passage_types=("chunk",))


def test_negatives_never_mention_the_answer(paths, renderer):
    for name in ("nq", "hotpotqa", "triviaqa"):
        task = _task(name, paths)
        for seed in range(3):
            row = _row(task, renderer, 4096, seed)
            body = row.messages[-1]["content"]
            for g in row.gold:  # drop the gold passages: what is left must not name the answer
                body = body.replace(g["text"], "")
            assert not any(a.lower() in body.lower() for a in row.answers), (name, row.answers)


def _overlap(a: str, b: str) -> int:
    return len(set(re.findall(r"[a-z]{3,}", a.lower())) & set(re.findall(r"[a-z]{3,}", b.lower())))


def test_bm25_negatives_come_hardest_first(paths):
    task = _task("hotpotqa", paths, negatives=("bm25",))
    examples, corpus, _ = task.data()
    random_task = _task("hotpotqa", paths, negatives=("random",))
    for seed in range(5):
        draft = task.draft(random.Random(seed))
        assert draft.augmentations["negatives"] == "bm25"
        question = draft.question
        hard = [next(draft.distractors).text for _ in range(3)]
        easy_draft = random_task.draft(random.Random(seed))
        easy = [next(easy_draft.distractors).text for _ in range(10)]
        assert easy_draft.question == question
        assert _overlap(hard[0], question) > sum(_overlap(e, question) for e in easy) / len(easy)
    # the stream is the BM25 ranking: scores never increase along the positive-score prefix
    query = examples[0].question
    scores = bm25_index(corpus).scores(query)
    order = list(negative_stream(corpus, "bm25", query, random.Random(0)))
    assert sorted(order) == list(range(len(corpus)))  # every passage once, then the stream ends
    ranked = [scores[i] for i in order if scores[i] > 0]
    assert ranked == sorted(ranked, reverse=True) and len(ranked) >= 3
    assert order[: len(ranked)] == [i for i in order if scores[i] > 0]


def test_mixed_and_excluded_negatives():
    corpus, _ = Corpus.build("t:mixed", [("", f"alpha beta {i}" if i % 2 else f"gamma {i}") for i in range(40)])
    got = list(negative_stream(corpus, "mixed", "alpha", random.Random(1), exclude=[1, 3], reject=lambda i: i == 5))
    assert sorted(got) == [i for i in range(40) if i not in (1, 3, 5)]
    assert len(got) == len(set(got))
    first = got[:10]
    assert sum(i % 2 for i in first) >= 4  # about half come from the BM25 ranking (odd ids match "alpha")


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory, renderer):
    return data_fixtures.save_tiny_encoder(tmp_path_factory.mktemp("encoder"), renderer.tokenizer)


def test_dense_negatives(paths, renderer, config, dense_model):
    task = _task("nq", paths, negatives=("dense",), dense_model=dense_model)
    row = _row(task, renderer, 2048, seed=2)
    _check_row(task, row, config, 2048)
    assert row.augmentations["negatives"] == "dense"
    examples, corpus, _ = task.data()
    index = dense_index(corpus, dense_model)
    assert index.embeddings.shape[0] == len(corpus)
    query = examples[0].question
    scores = index.scores(query)
    order = list(negative_stream(corpus, "dense", query, random.Random(0), dense_model=dense_model))
    head = [scores[i] for i in order[:20]]
    assert head == sorted(head, reverse=True)
    assert "dense" in _task("nq", paths, dense_model=dense_model).negatives  # on by default once configured
    assert "dense" not in _task("nq", paths).negatives
    with pytest.raises(RecallmError, match="dense_model"):
        _task("nq", paths, negatives=("dense",))
    with pytest.raises(RecallmError, match="config.json"):
        _task("nq", paths, negatives=("dense",), dense_model=str(paths["nq"].parent))


@pytest.mark.parametrize("name", ALL_TASKS)
def test_missing_path_is_one_line(name, tmp_path):
    missing = tmp_path / "nowhere" / "data.json"
    with pytest.raises(RecallmError) as err:
        make_task(name, path=str(missing))
    msg = str(err.value)
    assert "\n" not in msg and str(missing) in msg and "not found" in msg and ("http" in msg or "save_to_disk" in msg)
    with pytest.raises(RecallmError) as err:
        make_task(name)
    assert "\n" not in str(err.value) and "path=" in str(err.value)


@pytest.mark.parametrize(
    "name, params, match",
    [
        ("hotpotqa", {"negatives": ("bm25", "tfidf")}, "negatives"),
        ("nq", {"doc_formats": ("html",)}, "doc_formats"),
        ("msmarco", {"max_docs": 1}, "max_docs"),
        ("msmarco", {"min_grade": 0}, "min_grade"),
        ("qampari", {"gold_entities": (3, 1)}, "gold_entities"),
        ("banking77", {"label_formats": ("roman",)}, "label_formats"),
        ("banking77", {"gold_demos": 0}, "gold_demos"),
        ("quality", {"choice_formats": ("A:",)}, "choice_formats"),
        ("mcqa_math", {"choice_formats": ()}, "choice_formats"),
        ("triviaqa", {"chunk_words": "many"}, "chunk_words"),
        ("musique", {"colour": "blue"}, "colour"),
    ],
)
def test_bad_parameters(name, params, match, paths):
    with pytest.raises(RecallmError, match=match):
        _task(name, paths, **params)


def test_unreadable_file_is_one_line(tmp_path):
    bad = tmp_path / "hotpot.json"
    bad.write_text('[{"question": "x", \n broken')
    task = make_task("hotpotqa", path=str(bad))
    with pytest.raises(RecallmError) as err:
        task.draft(random.Random(0))
    msg = str(err.value)
    assert "\n" not in msg and str(bad) in msg and "hotpotqa.github.io" in msg
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(RecallmError, match="no .* files"):
        make_task("nq", path=str(empty)).draft(random.Random(0))


def test_unusable_records_are_reported(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(RecallmError, match="no usable question"):
        make_task("musique", path=str(f)).draft(random.Random(0))


def test_unreachable_lengths(paths, renderer):
    with pytest.raises(RecallmError, match="cannot reach 200000 tokens"):
        _row(_task("msmarco", paths), renderer, 200_000)
    with pytest.raises(RecallmError, match="cannot reach"):
        _row(_task("nq", paths, max_docs=5), renderer, 4096)  # at most five documents
    with pytest.raises(RecallmError, match="cannot reach a prompt of 512"):
        _row(_task("banking77", paths), renderer, 512)  # below min_tokens


@pytest.mark.parametrize("fmt", DOC_FORMATS)
@pytest.mark.parametrize("name", DOC_TASKS)
def test_documents_are_numbered_in_prompt_order(name, fmt, paths, renderer):
    task = _task(name, paths, doc_formats=(fmt,))
    for seed in range(2):
        row = _row(task, renderer, 2048, seed)
        assert row.augmentations["doc_format"] == fmt
        docs = _documents(row)
        shown = [d for d, _, _ in docs]
        assert shown == [str(i) for i in range(1, row.n_pieces + 1)]
        assert shown == [a or b for a, b in _ID.findall(row.messages[-1]["content"])]
        if name == "msmarco":
            assert row.ground_truth["doc_ids"] == shown
        bodies = {d: text for d, _, text in docs}
        for g in row.gold:  # gold intervals are exact after the renumbering
            assert row.prompt_text[g["start"] : g["end"]] == g["text"]
            assert bodies[_doc_id(g["text"])] in g["text"]
    with pytest.raises(RecallmError, match="cannot reach|too small"):  # max_docs caps the documents of a prompt
        _row(_task(name, paths, doc_formats=(fmt,), max_docs=6), renderer, 4096)


def test_reranking_relevance_names_the_judged_passages(paths, renderer, config):
    task = _task("msmarco", paths)
    queries, corpus = task.data()
    where = {text: i for i, text in enumerate(corpus.texts)}
    for seed in range(4):
        row = _row(task, renderer, 4096, seed)
        q = next(q for q in queries if f"Query: {q.text}" == row.question)
        docs = _documents(row)
        shown = [d for d, _, _ in docs]
        assert row.ground_truth["doc_ids"] == shown == [str(i) for i in range(1, len(docs) + 1)]
        relevance = row.ground_truth["relevance"]
        assert set(relevance) == {_doc_id(g["text"]) for g in row.gold} and set(relevance) <= set(shown)
        for d, _, text in docs:  # every id's text is its passage: graded as judged, the others not relevant
            grade = q.judged.get(where[text], 0)
            assert relevance.get(d, 0) == (grade if grade >= task.min_grade else 0), (d, text)
        ideal = sorted(relevance, key=lambda d: (-relevance[d], int(d)))
        assert row.answers == [" > ".join(f"[{d}]" for d in ideal[:10])]
        perfect = "<think>\nx</think>\nAnswer: " + " > ".join(f"[{d}]" for d in ideal)
        best = rewards.score_response(
            perfect, row.ground_truth, prompt_text=row.prompt_text, data_source=row.data_source, config=config
        )
        worse = rewards.score_response(
            "<think>\nx</think>\nAnswer: " + " > ".join(f"[{i}]" for i in reversed(shown)),
            row.ground_truth,
            prompt_text=row.prompt_text,
            data_source=row.data_source,
            config=config,
        )
        assert best.answer == 1.0 > worse.answer and best.format == 1.0


def test_citation_entities_cite_shown_supporting_passages(paths, renderer, config):
    task = _task("qampari", paths)
    questions, corpus = task.data()
    for seed in range(4):
        row = _row(task, renderer, 2048, seed)
        docs = _documents(row)
        assert [d for d, _, _ in docs] == [str(i) for i in range(1, len(docs) + 1)]
        texts = {d: text for d, _, text in docs}
        gold_ids = {_doc_id(g["text"]) for g in row.gold}
        entities = row.ground_truth["entities"]
        assert entities and row.answers == [e["answers"][0] for e in entities]
        for entity in entities:  # each cites shown gold passages that name it
            assert entity["docs"] == sorted(entity["docs"], key=int)
            for d in entity["docs"]:
                assert d in gold_ids and entity["answers"][0] in texts[d]
        assert {d for e in entities for d in e["docs"]} == gold_ids
        q = next(q for q in questions if row.question.startswith(f"Question: {q.text}"))
        for entity in q.entities:  # and every shown passage that names an answer is cited for it
            naming = sorted((d for d, text in texts.items() if entity.aliases[0] in text), key=int)
            cited = next((e["docs"] for e in entities if e["answers"] == entity.aliases), [])
            assert naming == cited, (entity.aliases, naming, cited)
        perfect = rewards.score_response(
            _perfect(task, row),
            row.ground_truth,
            prompt_text=row.prompt_text,
            data_source=row.data_source,
            config=config,
        )
        assert perfect.answer == 1.0 and perfect.format == 1.0
        wrong = ", ".join(f"{e['answers'][0]} [{len(docs) + 1}]" for e in entities)  # an id not shown
        assert (
            rewards.score_response(
                f"<think>\nx</think>\nAnswer: {wrong}",
                row.ground_truth,
                prompt_text=row.prompt_text,
                data_source=row.data_source,
                config=config,
            ).answer
            < 1.0
        )


def test_icl_gold_are_exactly_the_query_label(paths, renderer):
    task = _task("banking77", paths, label_formats=("number",), demo_formats=("arrow",))
    for seed in range(4):
        row = _row(task, renderer, 2048, seed)
        label = row.answers[0]
        assert label.isdigit() and row.augmentations["label_format"] == "number"
        lines = [ln for ln in row.messages[-1]["content"].split("\n") if " -> " in ln and not ln.endswith("->")]
        with_label = [ln for ln in lines if ln.endswith(f" -> {label}")]
        assert sorted(with_label) == sorted(g["text"] for g in row.gold)
        assert 4 <= len(row.gold) <= 12


def test_massive_keeps_its_locale_and_partition(paths):
    task = _task("massive", paths)
    examples, by_label, _ = task.data()
    assert "german_only" not in by_label and len(examples) == 180
    assert set(by_label) == set(data_fixtures.INTENTS)


def test_format_variants(tmp_path, paths, renderer, config):
    import datasets

    variants = {
        "banking77": data_fixtures.write_banking77_csv(tmp_path),
        "msmarco": data_fixtures.write_msmarco_records(tmp_path),
        "qampari": data_fixtures.write_qampari_alce(tmp_path),
        "mcqa_math": data_fixtures.write_mathqa(tmp_path),
    }
    parquet = tmp_path / "banking77.parquet"  # a Hugging Face parquet: the ClassLabel names are in its metadata
    datasets.load_from_disk(str(paths["banking77"]))["train"].to_parquet(str(parquet))
    variants["banking77_parquet"] = parquet
    for key, path in variants.items():
        name = key.split("_parquet")[0]
        task = _task(name, {name: path})
        target = 1024 if name != "mcqa_math" else 512
        row = _row(task, renderer, target, seed=1)
        _check_row(task, row, config, target)
    labels = make_task("banking77", path=str(parquet)).data()[1]
    assert set(labels) == set(data_fixtures.INTENTS)


def test_io_containers(tmp_path):
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / "train-00.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    (d / "sub" / "train-01.json").write_text('[{"a": 3}]')
    (d / "test.jsonl").write_text('{"a": 9}\n')
    recs = io.load_records(d, dataset="X", hint="get it", split="train")
    assert [r["a"] for r in recs] == [3, 1, 2]  # files in path order: sub/train-01.json, train-00.jsonl
    assert io.load_records(d, dataset="X", hint="get it", split="train") is recs  # cached
    assert [r["a"] for r in io.load_records(d, dataset="X", hint="h", split="test")] == [9]
    wrapped = tmp_path / "w.json"
    wrapped.write_text('{"version": 1, "data": [{"a": 5}]}')
    assert io.load_records(wrapped, dataset="X", hint="h") == [{"a": 5}]
    with pytest.raises(RecallmError, match="split 'validation' not in"):
        import datasets

        ds = datasets.Dataset.from_dict({"a": [1]})
        datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "hf"))
        io.load_records(tmp_path / "hf", dataset="X", hint="h", split="validation")
