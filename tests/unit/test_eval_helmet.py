"""HELMET's seven categories and RULER's QA / essay tasks on tiny local copies of their data, the judge
through a local OpenAI-compatible stub server, and the lost-in-thought injection located by the judge."""

from __future__ import annotations

import json
import re
import socket

import pytest

from data_gen.fit import PromptRenderer
from recallm.errors import RecallmError
from recallm.eval.benchmarks import make_benchmarks
from recallm.eval.types import Generation, Spec
from tests.eval_fixtures import judge_reply, write_eval_data
from tests.openai_stub import OpenAIStub

GEN = {"max_new_tokens": 8}
S, E = "<|start_recall|>", "<|end_recall|>"


@pytest.fixture(scope="module")
def renderer(tiny_dir):
    from recallm.tokens import load_tokenizer

    return PromptRenderer(load_tokenizer(tiny_dir))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_eval_data(tmp_path_factory.mktemp("helmet-data"))


def make(name, judge=None, seed=0, **cfg):
    return make_benchmarks({"seed": seed, "generation": GEN, "benchmarks": {name: cfg}}, judge=judge)[0]


def helmet(data, judge=None, **cfg):
    params = {"narrativeqa": {"min_document_tokens": 100}, "multi_lexsum": {"min_document_tokens": 100}}
    params.update(cfg.pop("task_params", {}))
    return make(
        "helmet",
        judge,
        helmet_dir=str(data["helmet_dir"]),
        dataset_root=str(data["dataset_root"]),
        haystack_path=str(data["haystack_path"]),
        task_params=params,
        **cfg,
    )


def gen(text):
    return Generation(text=text, n_tokens=len(text.split()), finish_reason="stop")


def user(example) -> str:
    return example.messages[-1]["content"]


# --------------------------------------------------------------------------- building


def test_every_helmet_task_builds_from_local_copies(data, renderer):
    from recallm.eval.benchmarks.helmet import TASKS

    bench = helmet(data, lengths=[2048, 4096], per_cell=2)
    specs = bench.specs()
    assert len(specs) == 21 * 2 * 2 and {s.task for s in specs} == set(TASKS)
    examples = {t: bench.build(Spec(4096, "helmet", 1, t), renderer) for t in bench.task_names}
    for name, ex in examples.items():
        task = TASKS[name]
        assert ex.prompt_tokens == renderer.length(ex.prompt_text), name
        # HELMET's truncation (at the end of the context) leaves its generation budget free
        assert ex.prompt_tokens <= 4096 - task.gen_tokens, name
        first_words = " ".join(task.template.split("{")[0].split()[:4])
        assert first_words in user(ex) or task.family in ("json_kv", "alce"), name
    again = helmet(data, lengths=[2048, 4096], per_cell=2)
    for name in ("nq", "alce_asqa", "trec_coarse", "json_kv", "narrativeqa"):
        assert again.build(Spec(4096, "helmet", 1, name), renderer).prompt_text == examples[name].prompt_text

    # json_kv: HELMET's file - one JSON object holding the asked key, its first two demonstrations
    kv = examples["json_kv"]
    obj = json.loads(user(kv).split("JSON data:\n")[1].split("\n\nExtract the value")[0])
    key = json.loads(user(kv).rsplit("Key: ", 1)[1])
    assert obj[key] == kv.reference["answers"][0] and user(kv).count("Corresponding value:") == 2
    # the Recall needles: HELMET's files in its templates (singular for one asked value)
    mk = user(examples["ruler_niah_mk_2"])
    assert mk.startswith("A special magic number is hidden") and mk.endswith("mentioned in the provided text?")
    assert user(examples["ruler_niah_mv"]).startswith("Some special magic numbers are hidden")
    # RAG: two demonstrations with their passages, then the passages and the question
    nq = user(examples["nq"])
    assert nq.count("\nAnswer: nqanswer") == 2 and nq.count("Document (Title: T") == 2 * 3 + 20
    assert re.search(r"Question: what is nq question \d\?$", nq)
    assert examples["nq"].reference["answers"][0] in nq.split("\n\n", 8)[-1]  # the gold passage is in the context
    popqa = {helmet(data, lengths=[4096], per_cell=4).build(Spec(4096, "helmet", i, "popqa"), renderer).reference[
        "answers"][0] for i in range(4)}  # fmt: skip
    assert popqa.isdisjoint({"popqaanswer0", "popqaanswer3"})  # too popular: filtered as HELMET's popqa_3
    # re-ranking: IDs, qrels and demonstrations with their gold ranking
    rerank = examples["msmarco_rerank"]
    assert user(rerank).count("\nRanking: 1") == 2 and "[ID: 1" in user(rerank)  # (and the format line: ID3 > ...)
    assert sorted(rerank.reference["qrels"].values(), reverse=True)[:4] == [3.0, 2.0, 1.0, 0.0]
    # citation: 8 documents at 4K (HELMET's table), numbered from 1, after two demonstrations
    cite = user(examples["alce_qampari"]).split("Question: qampari question")[1]
    assert (
        "Document [8](Title:" in cite
        and "Document [9]" not in cite
        and len(examples["alce_qampari"].reference["docs"]) > 8  # the NLI reads every document of the item
    )
    # long documents: cut to length - reserve tokens with HELMET's marker (which the prompt's own truncation may cut
    # into: the tiny tokenizer spends many tokens on the instruction and demonstrations), two demonstrations
    narrative = bench.build(Spec(2048, "helmet", 0, "narrativeqa"), renderer)
    assert " ... " in user(narrative) and user(narrative).count("\nAnswer: hero") == 2
    choice = examples["infbench_choice"]
    assert "Options:\nA. option" in user(choice) and choice.reference["answers"][0] in "ABCD"
    assert choice.reference["answers"][1].endswith(choice.reference["answers"][1].split(". ")[1])
    # ICL: demonstrations map texts to random integer labels; the answer is one of them
    icl = user(examples["banking77"])
    labels = set(re.findall(r"\nlabel: (\S+)", icl))
    assert (
        labels and all(label.isdigit() for label in labels) and examples["banking77"].reference["answers"][0].isdigit()
    )
    assert examples["banking77"].reference["truncated_context"]  # 180 shots do not fit 4K tiny tokens


def test_helmet_scores_each_family(data, renderer):
    from recallm.eval.scoring import trec_ndcg

    bench = helmet(data, lengths=[4096], per_cell=2)

    def ex(task, index=0):
        return bench.build(Spec(4096, "helmet", index, task), renderer)

    def score(example, text):
        return bench.score(example, gen(text), None)

    nq = ex("nq")
    answer = nq.reference["answers"][0]
    assert score(nq, f"Reading.</think>\nAnswer: {answer}").score == 1.0
    assert score(nq, f"It is {answer}.</think>\nAnswer: no idea").score == 0.0  # only the answer region counts
    assert score(nq, f"</think>The answer is {answer.upper()}!").metrics["substring_exact_match"] == 1.0
    kv = ex("json_kv")
    assert score(kv, f'</think>\nAnswer: "{kv.reference["answers"][0]}"').score == 1.0
    mv = ex("ruler_niah_mv")
    assert score(mv, "</think>Answer: " + ", ".join(mv.reference["answers"][:3])).score == 0.75
    rerank = ex("msmarco_rerank")
    qrels = rerank.reference["qrels"]
    best = sorted(qrels, key=lambda d: -qrels[d])
    assert score(rerank, "</think>\nRanking: " + " > ".join(best)).score == pytest.approx(1.0)
    worst = score(rerank, "</think>\nRanking: " + " > ".join(reversed(best)))
    scores = {d: float(len(best) - i) for i, d in enumerate(reversed(best))}
    assert worst.score == pytest.approx(trec_ndcg(scores, qrels)) and worst.score < 1
    icl = ex("trec_fine")
    label = icl.reference["answers"][0]
    wrong = str((int(label) + 1) % 6)
    assert score(icl, f"</think>\nlabel: {label}").score == 1.0
    assert score(icl, f"</think>\nAnswer: {label}").score == 0.0  # HELMET reads only "label:" (else the first line)
    assert score(icl, f"</think>\nlabel: {wrong}").score == 0.0
    choice = ex("infbench_choice")
    letter, full = choice.reference["answers"]
    assert score(choice, f"</think>\nAnswer: {letter}").score == 1.0 and score(choice, f"</think>{full}").score == 1.0
    assert score(choice, "</think>\nAnswer: " + ("A" if letter != "A" else "B")).score == 0.0
    qa = ex("infbench_qa")
    assert score(qa, f"</think>\nAnswer: {qa.reference['answers'][0]}").metrics == {"rougeL_f1": 1.0}
    # no judge: NarrativeQA by ROUGE-L F1, summaries by ROUGE-Lsum F1, both marked as not judged
    narrative = ex("narrativeqa")
    scored = score(narrative, f"</think>\nAnswer: {narrative.reference['answers'][0]} obviously")
    assert (
        scored.metrics["judged"] == 0.0
        and scored.score == pytest.approx(scored.metrics["rougeL_f1"])
        and 0 < scored.score < 1
    )
    summ = ex("multi_lexsum")
    scored = score(summ, f"</think>\nSummary: {summ.reference['answers'][0]}")
    assert scored.score == pytest.approx(1.0) and scored.metrics["judged"] == 0.0
    # citation with the deterministic NLI stand-in
    qampari = ex("alce_qampari")
    i = int(qampari.reference["question"].split()[-1].rstrip("?"))
    scored = score(qampari, f"</think>\nitem{i}a [2], item{i}b [2], nothing [1]")
    assert scored.metrics["qampari_rec_top5"] == pytest.approx(2 / 3) and scored.metrics["judged"] == 0.0
    prefixed = score(qampari, f"</think>\nAnswer: item{i}a [2], item{i}b [2], nothing [1]")
    assert prefixed.metrics["qampari_rec_top5"] == pytest.approx(1 / 3)  # as ALCE: "answer itema" is no item
    assert scored.metrics["citation_rec"] == pytest.approx(2 / 3) and scored.metrics["citation_prec"] == pytest.approx(
        2 / 3
    )
    assert scored.score == pytest.approx((2 / 3 + 2 / 3 + 2 / 3) / 3)
    asqa = ex("alce_asqa")
    i = int(asqa.reference["question"].split()[-1].rstrip("?"))
    scored = score(asqa, f"</think>\nIt is alpha{i} [1].")
    assert (scored.metrics["str_em"], scored.metrics["citation_rec"], scored.metrics["citation_prec"]) == (
        0.5,
        1.0,
        1.0,
    )


def test_helmet_summary_is_hand_computed():
    bench = make("helmet", lengths=[8192, 16384], per_cell=1, tasks=["json_kv", "ruler_niah_mv", "nq", "popqa"])

    def rec(task, length, score):  # the metric HELMET reports for the task
        from recallm.eval.benchmarks.helmet.tasks import REPORTED

        return {"task": task, "length": length, "score": score, "metrics": {REPORTED[task][0][0]: score}}

    records = [
        rec("json_kv", 8192, 1.0), rec("json_kv", 8192, 0.0), rec("ruler_niah_mv", 8192, 0.5),
        rec("json_kv", 16384, 1.0), rec("ruler_niah_mv", 16384, 1.0),
        rec("nq", 8192, 1.0), rec("popqa", 8192, 0.0), rec("nq", 16384, 0.0),
    ]  # fmt: skip
    table = bench.summarize(records)
    assert table["tasks"]["json_kv"] == {"8192": 0.5, "16384": 1.0}
    recall = table["categories"]["Recall"]
    assert recall["by_length"] == {"8192": 0.5, "16384": 1.0} and recall["average"] == 0.75 and recall["complete"]
    rag = table["categories"]["RAG"]
    assert rag["by_length"] == {"8192": 0.5, "16384": None} and not rag["complete"]  # popqa has no 16K result
    assert set(table["categories"]) == {"Recall", "RAG"} and table["judge"] is None
    assert "haystack" not in table  # (the needle tasks read HELMET's files: no essays involved)


def test_helmet_errors_are_one_line(data, renderer, tmp_path):
    with pytest.raises(RecallmError, match=r"set eval.benchmarks.helmet.helmet_dir .*download_data.sh"):
        make("helmet", lengths=[4096], per_cell=1, tasks=["nq"]).specs()
    with pytest.raises(
        RecallmError, match=r"helmet nq \(path\) not found at .*kilt/nq-dev-multikilt_1000_k20_dep6.jsonl"
    ):
        make("helmet", lengths=[4096], per_cell=1, tasks=["nq"], helmet_dir=str(tmp_path)).specs()
    with pytest.raises(
        RecallmError, match=r"not found at .*/narrativeqa: a local copy of the Hugging Face data set deepmind"
    ):
        make("helmet", lengths=[4096], per_cell=1, tasks=["narrativeqa"], dataset_root=str(tmp_path)).specs()
    with pytest.raises(RecallmError, match="unknown tasks"):
        make("helmet", lengths=[4096], per_cell=1, tasks=["nq", "babi"])
    with pytest.raises(RecallmError, match=r"task_params.nq: unknown keys \['depth'\]"):
        make("helmet", lengths=[4096], per_cell=1, task_params={"nq": {"depth": 3}})
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"question": "q", "answers": ["a"]}) + "\n")
    bench = helmet(data, lengths=[4096], per_cell=1, tasks=["nq"], task_params={"nq": {"path": str(broken)}})
    with pytest.raises(RecallmError, match=r"helmet nq: a record of .*broken.jsonl has no ctxs"):
        bench.build(Spec(4096, "helmet", 0, "nq"), renderer)
    few = helmet(data, lengths=[4096], per_cell=9, tasks=["nq"])
    with pytest.raises(RecallmError, match=r"has only 6 usable items, fewer than per_cell=9"):
        few.build(Spec(4096, "helmet", 8, "nq"), renderer)
    tight = make("helmet", lengths=[1024], per_cell=1, tasks=["infbench_sum"], dataset_root=str(data["dataset_root"]))
    with pytest.raises(RecallmError, match=r"without its context has \d+ tokens, more than -176 \(1024 minus the 1200"):
        tight.build(Spec(1024, "helmet", 0, "infbench_sum"), renderer)


def test_fit_lengths_keep_the_cell_name_and_fit_the_mapped_length(data, renderer):
    lit = {"lengths": [2048], "per_cell": 1, "key_type": "toy", "value_type": "toy"}
    ruler = {"lengths": [2048], "per_cell": 1, "tasks": ["niah_single_1"]}
    suite = {"generation": GEN, "fit_lengths": {"2K": 1800}, "benchmarks": {"lost_in_thought": lit, "ruler": ruler}}
    bench, ruler_bench = make_benchmarks(suite)
    ex = bench.build(Spec(2048, "lost_in_thought", 0, "reasoning_retrieval"), renderer)
    assert ex.spec.length == 2048 and abs(ex.prompt_tokens - 1800) <= 0.05 * 1800
    assert bench.describe()["fit_lengths"] == {2048: 1800}
    # RULER (and HELMET) keep upstream's cell: the length less the task's generation budget
    assert ruler_bench.target(2048) == 2048 and "fit_lengths" not in ruler_bench.describe()
    with pytest.raises(RecallmError, match="bad length"):
        make_benchmarks({**suite, "fit_lengths": {"2K": "x"}})


# --------------------------------------------------------------------------- RULER: QA and the essay haystack


def test_ruler_qa_tasks_read_squad_and_hotpotqa(data, renderer):
    bench = make("ruler", lengths=[2048], per_cell=2, tasks=["qa_1", "qa_2"], squad_path=str(data["squad_path"]),
                 hotpotqa_path=str(data["hotpotqa_path"]))  # fmt: skip
    assert len(bench.specs()) == 4
    squad = bench.build(Spec(2048, "ruler", 1, "qa_1"), renderer)
    # the second answerable question in file order (unanswerable ones are skipped)
    assert squad.reference == {"answers": ["squadanswer0x1"], "metric": "part"}
    assert "Question: what is thing 0 1?" in squad.prompt_text and "squadanswer0x1" in squad.prompt_text
    numbers = [int(n) for n in re.findall(r"Document (\d+):\n", squad.prompt_text)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) > 3
    assert abs(squad.prompt_tokens - 2048) <= 0.05 * 2048 or squad.prompt_tokens < 2048
    hotpot = bench.build(Spec(2048, "ruler", 0, "qa_2"), renderer)
    assert hotpot.reference["answers"] == ["hotpotanswer0"] and all(
        f"Title 0 {j}\n" in hotpot.prompt_text for j in range(10)
    )
    assert bench.score(hotpot, gen("</think>\nAnswer: HotpotAnswer0"), None).score == 1.0  # RULER's string_match_part
    assert bench.score(hotpot, gen("</think>\nAnswer: nothing"), None).score == 0.0
    with pytest.raises(RecallmError, match=r"SQuAD 2.0 \(RULER qa_1\): no path given; .*squad_path"):
        make("ruler", lengths=[2048], per_cell=1, tasks=["qa_1"]).specs()
    assert len(make("ruler", lengths=[2048], per_cell=1).tasks) == 13


def test_ruler_essay_haystack_from_a_local_copy(data, renderer, tmp_path):
    bench = make("ruler", lengths=[1024], per_cell=1, tasks=["niah_single_2"], haystack_path=str(data["haystack_path"]))
    ex = bench.build(Spec(1024, "ruler", 0, "niah_single_2"), renderer)
    assert "Essay sentence number 0 is here." in ex.prompt_text and ex.reference["haystack"] == "essay"
    assert bench.summarize([])["haystack"].startswith("Paul Graham essays from")
    offline = make("ruler", lengths=[1024], per_cell=1, tasks=["niah_single_2"])
    assert offline.build(Spec(1024, "ruler", 0, "niah_single_2"), renderer).reference["haystack"] == "generated"
    assert "offline default" in offline.summarize([])["haystack"] and "haystack_path" not in offline.describe()
    folder = tmp_path / "essays"
    folder.mkdir()
    (folder / "b.txt").write_text("Second essay here. It has words.")
    (folder / "a.txt").write_text("First essay starts. Then it goes on.")
    from recallm.eval.benchmarks.ruler import load_essays

    assert load_essays(str(folder))[:3] == ["First essay starts.", "Then it goes on.", "Second essay here."]
    with pytest.raises(RecallmError, match="the essay haystack not found at .*nope.*PaulGrahamEssays.json"):
        make("ruler", lengths=[1024], per_cell=1, tasks=["niah_single_2"], haystack_path=str(tmp_path / "nope")).specs()


# --------------------------------------------------------------------------- the judge


@pytest.fixture
def judge():
    from recallm.eval.judge import make_judge

    stub = OpenAIStub(judge_reply)
    j = make_judge({"base_url": stub.url, "model": "judge-m", "api_key_env": None, "retries": 0, "concurrency": 4})
    yield j, stub
    j.close()
    stub.close()


def test_the_judge_through_a_stub_server(judge):
    from recallm.eval.judge import fallback_entails, make_judge, read_json, segments

    j, stub = judge
    j.ping()
    assert j.longqa("who?", ["hero1"], "the hero1") == 1.0
    assert j.longqa("who?", ["hero1"], "a cat") == 0.0 and j.longqa("who?", ["x"], "garble") is None
    summary = j.summary("A summary. Two sentences.", ["key one", "key two"], "expert", book=True)
    assert summary == {"fluency": 1.0, "recall": 0.5, "precision": 0.5, "f1": 0.5}
    assert j.entails("item1a is here", "Q item1a") is True and j.entails("nothing", "Q item1b") is False
    trace = "Let me solve it. x = 42.\nNow I look for key 42 in the table. It says abc."
    offset = j.first_retrieval(trace, "42")
    assert trace[offset:].startswith("Now I look for key 42") and j.first_retrieval("x = 42. Done.", "42") == -1
    bodies = [body for _, body in stub.requests]
    assert {b["model"] for b in bodies} == {"judge-m"} and all(b["temperature"] == 0.0 for b in bodies)
    assert j.describe() == {"model": "judge-m", "temperature": 0.0, "prompts": 2}
    # helpers
    assert read_json('a {"x": 1} then {"y": 2}') == {"y": 2} and read_json("none") is None
    assert [trace[a:b] for a, b in segments(trace)][:3] == [
        "Let me solve it.",
        "x = 42.",
        "Now I look for key 42 in the table.",
    ]
    assert fallback_entails("Paris is the capital of France.", "the capital of france") is True
    assert fallback_entails("Paris is the capital of France.", "Berlin is big") is False
    assert make_judge(None) is None and make_judge({"model": None}) is None
    with pytest.raises(RecallmError, match=r"eval.judge has unknown keys \['modle'\]"):
        make_judge({"model": "m", "modle": "x"})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = make_judge({"base_url": f"http://127.0.0.1:{port}/v1", "model": "m", "api_key_env": None, "retries": 0})
    with pytest.raises(RecallmError, match=rf"judge endpoint http://127.0.0.1:{port}/v1: a request failed for good"):
        dead.longqa("q", ["a"], "b")


def test_judged_helmet_metrics(data, renderer, judge):
    j, stub = judge
    bench = helmet(data, judge=j, lengths=[4096], per_cell=2, tasks=["narrativeqa", "infbench_sum", "alce_qampari"])
    assert bench.describe()["judge"]["model"] == "judge-m" and bench.specs()
    narrative = [bench.build(Spec(4096, "helmet", i, "narrativeqa"), renderer) for i in range(2)]
    summ = bench.build(Spec(4096, "helmet", 0, "infbench_sum"), renderer)
    qampari = bench.build(Spec(4096, "helmet", 0, "alce_qampari"), renderer)
    i = int(qampari.reference["question"].split()[-1].rstrip("?"))
    outputs = [
        "</think>\nAnswer: hero of the story",
        "</think>\nAnswer: garble",
        "</think>\nSummary: A summary. Two sentences.",
        f"</think>\nitem{i}a [2], item{i}b [1]",
    ]
    examples = [*narrative, summ, qampari]
    scores = bench.score_batch(examples, [gen(t) for t in outputs], [None] * 4)
    assert scores[0].score == 1.0 and scores[0].metrics["judged"] == 1.0
    assert scores[1].metrics["judged"] == 0.0 and scores[1].score == scores[1].metrics["rougeL_f1"]  # unreadable
    assert scores[2].score == 0.5 and scores[2].metrics["judge_recall"] == 0.5 and scores[2].metrics["judged"] == 1.0
    assert scores[3].metrics["citation_rec"] == 0.5 and scores[3].metrics["judged"] == 1.0  # item b is in doc 2, not 1
    table = bench.summarize([
        {"task": e.spec.task, "length": 4096, "score": s.score, "metrics": s.metrics} for e, s in zip(examples, scores, strict=True)
    ])  # fmt: skip
    assert table["judge"] == "judge-m" and table["judged_share"]["narrativeqa"] == 0.5


def test_lost_in_thought_injection_located_by_the_judge(renderer, judge):
    j, stub = judge
    bench = make("lost_in_thought", j, lengths=[512], per_cell=1, key_type="toy", value_type="toy")
    assert bench.describe()["locator"]["model"] == "judge-m" and bench.locator == "judge"
    rr = bench.build(Spec(512, "lost_in_thought", 0, "reasoning_retrieval"), renderer)
    key, value = rr.reference["key"], rr.reference["value"]
    looked = gen(f"So x = {key}. Fine.\nNow I look up {key} in it. It is zz.</think>\nAnswer: zz")
    never = gen(f"So x = {key}.</think>\nAnswer: zz")
    wrong = gen("So x = 1.</think>\nAnswer: zz")
    follow = bench.followup_batch([rr, _copy(rr), _copy(rr)], [looked, never, wrong])
    assert follow[0].prefix.startswith(f"So x = {key}. Fine.\n") and "Now I look" not in follow[0].prefix
    assert follow[0].prefix.endswith(f"Looking up key {key} in the dictionary: Key {key}: ") and follow[1:] == [
        None,
        None,
    ]
    examples = [rr, _copy(rr)]
    bench.followup_batch(examples, [looked, never])
    s0 = bench.score(examples[0], looked, gen(f"{value} ok"))
    s1 = bench.score(examples[1], never, None)
    assert s0.metrics == {"accuracy": 0.0, "math": 1.0, "accuracy_given_math": 0.0, "attempted": 1.0,
                          "located_by_judge": 1.0, "injected": 1.0}  # fmt: skip
    assert s1.metrics["attempted"] == 0.0 and "injected" not in s1.metrics
    records = [
        {"task": "reasoning_retrieval", "length": 512, "index": i, "output_tokens": 9,
         "spans": {"count": 0, "verbatim": 0}, "metrics": s.metrics}
        for i, s in enumerate([s0, s1])
    ]  # fmt: skip
    row = bench.summarize(records)["by_length"]["512"]
    assert row["coverage"] == 0.5 and row["injected"] == 1.0 and bench.summarize(records)["locator"] == "judge"
    capped = make(
        "lost_in_thought", j, lengths=[512], per_cell=1, key_type="toy", value_type="toy", injection_examples=1
    )
    assert capped.summarize(records)["by_length"]["512"]["coverage"] == 1.0  # only the first math-correct example


def _copy(example):
    from recallm.eval.types import Example

    return Example(example.spec, example.messages, example.prompt_text, example.prompt_tokens, dict(example.reference))


def test_records_of_another_layout_are_one_line(data, renderer, tmp_path):
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"qid": "1", "query": "q", "ctxs": [{"id": "1", "text": "t"}]}) + "\n")  # no labels
    bench = helmet(data, lengths=[4096], per_cell=1, tasks=["msmarco_rerank"],
                   task_params={"msmarco_rerank": {"path": str(odd), "shots": 0}})  # fmt: skip
    with pytest.raises(
        RecallmError, match=r"an item of .*odd.jsonl is not in the expected layout \(KeyError: 'label'\)"
    ):
        bench.build(Spec(4096, "helmet", 0, "msmarco_rerank"), renderer)
