"""The benchmark generators (deterministic by seed, fitted to length, gold present) and their scoring."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from data_gen.fit import PromptRenderer
from recallm.errors import RecallmError
from recallm.eval.benchmarks import make_benchmarks
from recallm.eval.benchmarks.ruler import RULER_TASKS, TOKENS_TO_GENERATE
from recallm.eval.scoring import injection_prefix
from recallm.eval.types import Generation, Spec

S, E = "<|start_recall|>", "<|end_recall|>"
GEN = {"max_new_tokens": 8}


@pytest.fixture(scope="module")
def renderer(tiny_dir):
    from recallm.tokens import load_tokenizer

    return PromptRenderer(load_tokenizer(tiny_dir))


def make(name, seed=0, **cfg):
    return make_benchmarks({"seed": seed, "generation": GEN, "benchmarks": {name: cfg}})[0]


def gen(text, n_tokens=5):
    return Generation(text=text, n_tokens=n_tokens, finish_reason="stop")


# --------------------------------------------------------------------------- lost in thought

ENTRY = {"lines": r"^Key (-?\d+): (\w+)$", "csv": r"^(-?\d+),(\w+)$", "json": r'^  "(-?\d+)": "(\w+)",?$'}


def entries(text, fmt):
    return re.findall(ENTRY[fmt], text, flags=re.MULTILINE)


def solve(question: str) -> int:
    m = re.search(r"solve for x: (\d+)x \+ (\d+) - (\d+)x = (\d+)\.", question)
    if m:
        a, b, d, c = map(int, m.groups())
        assert (c - b) % (a - d) == 0
        return (c - b) // (a - d)
    m = re.search(r"compute \((\d+) \+ (\d+)\) \* (\d+) ([+-]) (\d+)\.", question)
    a, b, c, sign, d = m.groups()
    return (int(a) + int(b)) * int(c) + (int(d) if sign == "+" else -int(d))


def test_lost_in_thought_pairs_share_one_dictionary(renderer):
    bench = make("lost_in_thought", lengths=[512, 1024], per_cell=4, key_type="toy", value_type="toy")
    specs = bench.specs()
    assert len(specs) == 2 * 4 * 2 and len({s.example_id for s in specs}) == len(specs)
    for length in (512, 1024):
        for i in range(4):
            rr = bench.build(Spec(length, "lost_in_thought", i, "reasoning_retrieval"), renderer)
            r = bench.build(Spec(length, "lost_in_thought", i, "retrieval"), renderer)
            ref = rr.reference
            assert ref == r.reference and ref["format"] == ("lines", "csv", "json")[i % 3]
            assert abs(rr.prompt_tokens - length) <= 0.05 * length  # the reasoning prompt is fitted
            assert rr.prompt_tokens == renderer.length(rr.prompt_text)
            dictionary = entries(rr.prompt_text, ref["format"])
            assert len(dictionary) > 10 and dictionary == entries(
                r.prompt_text, ref["format"]
            )  # same lines, same order
            assert (ref["key"], ref["value"]) in dictionary and len({k for k, _ in dictionary}) == len(dictionary)
            assert solve(rr.prompt_text) == int(ref["key"])  # the math problem's answer is the key
            assert f"Your key: {ref['key']}" in r.prompt_text and "Math problem:" in rr.prompt_text
            question_at = r.prompt_text.index("Your key: ")
            first_entry = r.prompt_text.index(("Key " if ref["format"] == "lines" else "") + dictionary[0][0])
            assert (question_at < first_entry) == (i < 3)  # query before the dictionary, then after
    again = make("lost_in_thought", lengths=[512], per_cell=1, key_type="toy", value_type="toy")
    other = make("lost_in_thought", seed=1, lengths=[512], per_cell=1, key_type="toy", value_type="toy")
    spec = Spec(512, "lost_in_thought", 0, "reasoning_retrieval")
    assert again.build(spec, renderer).prompt_text == bench.build(spec, renderer).prompt_text
    assert other.build(spec, renderer).prompt_text != bench.build(spec, renderer).prompt_text


def test_lost_in_thought_scoring_and_injection(renderer):
    bench = make("lost_in_thought", lengths=[512], per_cell=1, key_type="toy", value_type="toy")
    rr = bench.build(Spec(512, "lost_in_thought", 0, "reasoning_retrieval"), renderer)
    r = bench.build(Spec(512, "lost_in_thought", 0, "retrieval"), renderer)
    key, value, fmt = rr.reference["key"], rr.reference["value"], rr.reference["format"]
    assert fmt == "lines"

    right = bench.score(r, gen(f"I look it up.</think>\nAnswer: {value}"), None)
    assert (right.score, right.correct, right.answer, right.metrics) == (1.0, True, value, {"accuracy": 1.0})
    assert bench.score(r, gen("no think block Answer: " + value), None).score == 0.0  # reasoning never closed
    assert bench.followup(r, gen(f"x = {key}")) is None  # retrieval has no injection

    out = gen(f"The answer is x = {key}. I remember {key}.</think>\nAnswer: wrong")
    follow = bench.followup(rr, out)
    assert follow.prefix == f"The answer is x = {key}\nLooking up key {key} in the dictionary: Key {key}: "
    assert follow.prefix.endswith(injection_prefix(fmt, key)) and follow.max_new_tokens == 32
    scored = bench.score(rr, out, gen(f"{value}\nSo"))
    located = {"attempted": 1.0, "located_by_judge": 0.0}  # no judge: located by string matching
    assert scored.metrics == {"accuracy": 0.0, "math": 1.0, "accuracy_given_math": 0.0, "injected": 1.0, **located}
    scored = bench.score(rr, gen(f"x = {key}.</think>\nAnswer: {value}"), gen("zzz"))
    assert scored.metrics == {"accuracy": 1.0, "math": 1.0, "accuracy_given_math": 1.0, "injected": 0.0, **located}
    wrong_key = str(int(key) + 1)
    assert bench.followup(rr, gen(f"x = {wrong_key}")) is None
    assert bench.score(rr, gen(f"x = {wrong_key}</think>Answer: no"), None).metrics == {"accuracy": 0.0, "math": 0.0}
    # a key first stated inside a recall span: the span is closed before the injection
    follow = bench.followup(rr, gen(f"Found {S}{key}: {value}{E}"))
    assert follow.prefix.startswith(f"Found {S}{key}{E}\nLooking up key")
    off = make("lost_in_thought", lengths=[512], per_cell=1, key_type="toy", value_type="toy", injection=False)
    assert off.followup(rr, out) is None


def _rec(length, task, acc, tokens, spans, **metrics):
    return {
        "length": length,
        "task": task,
        "output_tokens": tokens,
        "spans": {"count": spans, "verbatim": spans},
        "metrics": {"accuracy": acc, **metrics},
    }


def test_lost_in_thought_table_is_hand_computed():
    bench = make("lost_in_thought", lengths=[4096], per_cell=1)
    records = [
        _rec(4096, "retrieval", 1.0, 10, 1),
        _rec(4096, "reasoning_retrieval", 0.0, 30, 0, math=1.0, accuracy_given_math=0.0, injected=1.0),
        _rec(4096, "retrieval", 1.0, 20, 0),
        _rec(4096, "reasoning_retrieval", 1.0, 50, 2, math=1.0, accuracy_given_math=1.0, injected=1.0),
        _rec(65536, "retrieval", 0.0, 10, 0),
        _rec(65536, "reasoning_retrieval", 0.0, 40, 0, math=0.0),
    ]
    table = bench.summarize(records)
    short = table["by_length"]["4096"]
    assert short == {
        "retrieval": 1.0,
        "reasoning_retrieval": 0.5,
        "reasoning_retrieval_given_math": 0.5,
        "injected": 1.0,
        "coverage": None,  # (no record says whether a retrieval attempt was located)
        "math": 1.0,
        "relative_gap_pct": 50.0,
        "reasoning_tokens": 25.0,
        "recall_usage_retrieval": 0.5,
        "recall_usage_reasoning": 0.5,
        "pairs": 2,
    }
    long = table["by_length"]["65536"]
    assert long["retrieval"] == 0.0 and long["relative_gap_pct"] is None and long["injected"] is None
    assert long["reasoning_tokens"] == 30.0 and long["pairs"] == 1
    assert table["buckets"]["short"] == {**short, "lengths": [4096]} and table["buckets"]["long"]["math"] == 0.0


# --------------------------------------------------------------------------- RULER


@pytest.fixture(scope="module")
def ruler(renderer):
    offline = [t for t in RULER_TASKS if not t.startswith("qa_")]  # (the QA tasks read data: test_eval_helmet.py)
    bench = make("ruler", lengths=[2048], per_cell=1, tasks=offline)  # (CWE's worked example alone: ~1,300 tokens)
    return bench, {task: bench.build(Spec(2048, "ruler", 0, task), renderer) for task in bench.tasks}


def test_ruler_prompts_are_fitted_and_hold_their_answers(ruler, renderer):
    bench, examples = ruler
    assert len(examples) == 11
    for task, ex in examples.items():
        # fitted to the cell less RULER's tokens_to_generate, within 5% or short of it by less than one haystack
        # piece (a UUID needle is ~80 tiny tokens)
        budget = 2048 - TOKENS_TO_GENERATE[RULER_TASKS[task][0]]
        assert budget - 90 <= ex.prompt_tokens <= 1.05 * budget, task
        assert ex.prompt_tokens == renderer.length(ex.prompt_text)
        answers = ex.reference["answers"]
        assert answers and all(a in ex.prompt_text for a in answers), task
    needle = re.compile(r"One of the special magic (?:numbers|uuids) for (\S+) is: (\S+)\.")
    for task in (
        "niah_single_1",
        "niah_single_2",
        "niah_single_3",
        "niah_multikey_1",
        "niah_multivalue",
        "niah_multiquery",
    ):
        ex = examples[task]
        found = needle.findall(ex.prompt_text)
        keys = {k for k, _ in found}
        expected_keys = {"niah_multikey_1": 4, "niah_multiquery": 4}.get(task, 1)
        assert len(keys) == expected_keys, task
        asked = [v for k, v in found if k in ex.prompt_text.rsplit("\nWhat ", 1)[1]]
        assert sorted(asked) == sorted(ex.reference["answers"]), task
    assert len(examples["niah_multivalue"].reference["answers"]) == 4
    assert len(needle.findall(examples["niah_multikey_2"].prompt_text)) > 5  # a haystack of needles
    assert "uuids" in examples["niah_multikey_3"].prompt_text
    # variable tracking: the chain is in order and its head holds the asked value
    vt = examples["vt"]
    names = vt.reference["answers"]
    positions = [vt.prompt_text.index(f"VAR {n} =") for n in names]
    assert positions == sorted(positions) and len(names) == 5
    heads = re.findall(r"VAR ([A-Z]+) = (\d+)\n", vt.prompt_text)  # RULER's lines: "VAR A = 12345", "VAR B = VAR A "
    assert [len(n) for n, _ in heads] == [3, 5] and f"VAR {names[1]} = VAR {names[0]} \n" in vt.prompt_text
    value = heads[1][1]  # (the first chain is the worked example's, with 3-letter names)
    assert f"assigned the value {value} in the text above." in vt.prompt_text
    # common words: numbered 1..N, the 10 common words 6 times each below 4K tokens, the others once
    cwe = examples["cwe"]
    items = re.findall(r"(\d+)\. ([a-z\-]+)", cwe.prompt_text.rsplit("most often.", 1)[1].split("Question:")[0])
    assert cwe.prompt_text.count("Question: What are the 10 most common words in the above list?") == 2  # one-shot
    assert [int(n) for n, _ in items] == list(range(1, len(items) + 1))
    counts = Counter(w for _, w in items)
    assert len(cwe.reference["answers"]) == 10 and all(counts[w] == 6 for w in cwe.reference["answers"])
    assert max(c for w, c in counts.items() if w not in cwe.reference["answers"]) == 1
    # frequent words: the 3 answers are strictly the most frequent coded words
    fwe = examples["fwe"]
    words = fwe.prompt_text.split("coded words. ")[1].split("\nQuestion:")[0].split(" ")
    counts = Counter(w for w in words if w != "...")  # freq_words_extraction.py's noise word
    top = fwe.reference["answers"]
    assert len(top) == 3 and min(counts[w] for w in top) > max(c for w, c in counts.items() if w not in top)
    assert counts[top[0]] > counts[top[1]] > counts[top[2]] and Counter(words)["..."] > counts[top[0]]  # Zipf ranks


def test_ruler_is_deterministic_and_scored_as_ruler(ruler, renderer):
    bench, examples = ruler
    again = make("ruler", lengths=[2048], per_cell=1, tasks=["niah_multivalue", "fwe"])
    other = make("ruler", seed=3, lengths=[2048], per_cell=1, tasks=["niah_multivalue"])
    spec = Spec(2048, "ruler", 0, "niah_multivalue")
    assert again.build(spec, renderer).prompt_text == examples["niah_multivalue"].prompt_text
    assert again.build(Spec(2048, "ruler", 0, "fwe"), renderer).prompt_text == examples["fwe"].prompt_text
    assert other.build(spec, renderer).prompt_text != examples["niah_multivalue"].prompt_text
    ex = examples["niah_multivalue"]
    a = ex.reference["answers"]
    score = bench.score(ex, gen(f"They are {a[0]}, {a[1]} and {a[2]}{E}</think>\nAnswer: {a[0]}, {a[2]}, {a[3]}"), None)
    assert score.score == 0.75 and not score.correct  # only the answer region counts
    assert bench.score(ex, gen("</think>Answer: " + " ".join(a).upper()), None).score == 1.0
    assert bench.score(ex, gen(" ".join(a)), None).score == 0.0  # never left the think block


def test_ruler_settings_are_checked(renderer):
    with pytest.raises(RecallmError, match="unknown tasks"):
        make("ruler", lengths=[1024], per_cell=1, tasks=["qa_3"])
    with pytest.raises(RecallmError, match=r"task_params.cwe: unknown keys \['freq'\]"):
        make("ruler", lengths=[1024], per_cell=1, task_params={"cwe": {"freq": 3}})
    with pytest.raises(RecallmError, match="haystack must be one of"):
        make("ruler", lengths=[1024], per_cell=1, task_params={"niah_single_1": {"haystack": "poems"}})
    bench = make("ruler", lengths=[1024], per_cell=1, tasks=["cwe"], task_params={"cwe": {"freq_cw": 2, "freq_ucw": 2}})
    with pytest.raises(RecallmError, match="freq_cw"):
        bench.build(Spec(1024, "ruler", 0, "cwe"), renderer)
    bench = make("ruler", lengths=[256], per_cell=1, tasks=["cwe"])
    with pytest.raises(RecallmError, match="cwe cannot reach a prompt of 136 tokens"):  # 256 less 120 to generate
        bench.build(Spec(256, "ruler", 0, "cwe"), renderer)


# --------------------------------------------------------------------------- HELMET json_kv


def test_helmet_json_kv(renderer):
    import json

    bench = make("helmet_json_kv", lengths=[512, 2048], per_cell=6)
    ex = bench.build(Spec(2048, "helmet_json_kv", 1, "json_kv"), renderer)
    key, value = ex.reference["key"], ex.reference["value"]
    assert ex.prompt_tokens <= 2048 - 100  # HELMET keeps 100 tokens free for json_kv's answer
    text = ex.messages[-1]["content"]  # HELMET's template: the object, the instruction, two demonstrations, the key
    obj = json.loads(text.split("JSON data:\n")[1].split("\n\nExtract the value")[0])
    assert obj[key] == value and len(obj) == ex.reference["pairs"] > 4
    assert text.endswith(f'Key: "{key}"') and text.count("Corresponding value:") == 2
    depths = [list(json.loads(bench.build(Spec(2048, "helmet_json_kv", i, "json_kv"), renderer).messages[-1]["content"]
                          .split("JSON data:\n")[1].split("\n\nExtract")[0])) for i in range(6)]  # fmt: skip
    keys = [bench.build(Spec(2048, "helmet_json_kv", i, "json_kv"), renderer).reference["key"] for i in range(6)]
    assert [d.index(k) for d, k in zip(depths, keys, strict=True)] == [
        round(i / 5 * (len(d) - 1)) for i, d in enumerate(depths)
    ]
    again = make("helmet_json_kv", lengths=[512, 2048], per_cell=6)
    assert again.build(Spec(2048, "helmet_json_kv", 1, "json_kv"), renderer).prompt_text == ex.prompt_text
    assert bench.score(ex, gen(f"ok</think>\nAnswer: {value}"), None).score == 1.0
    assert bench.score(ex, gen(f"ok</think>\nAnswer: ({value.upper()})."), None).score == 1.0
    assert bench.score(ex, gen(f"ok</think>\nAnswer: {value[:-1]}"), None).score == 0.0
    assert bench.score(ex, gen(f"{value}</think>\nAnswer: none"), None).score == 0.0
    assert bench.describe() == {"lengths": [512, 2048], "per_cell": 6, "prompt": "helmet", "scoring": "helmet-2"}


# --------------------------------------------------------------------------- in-domain


def write_val(renderer, root, category="retrieval", length=512, n=3, mutate=None):
    from data_gen.base import make_task
    from data_gen.generate import generate_rows
    from data_gen.io import row_record, write_parquet

    task = make_task("kv_retrieval", key_type="toy", value_type="toy", formats=["lines"])
    rows = generate_rows(task, renderer, length, n, seed=0)
    records = [row_record(r, i, f"val/{category}_{length}", store_prompt_text=True) for i, r in enumerate(rows)]
    for record in records:
        (mutate or (lambda r: None))(record)
    write_parquet(records, root / "val" / f"{category}_{length}.parquet")
    return rows


def test_in_domain_scores_with_the_training_reward(renderer, tmp_path):
    from rewards import load_reward_config, score_response

    rows = write_val(renderer, tmp_path)
    bench = make("in_domain", data_dir=str(tmp_path), per_cell=2)
    specs = bench.specs()
    assert [s.example_id for s in specs] == ["in_domain/retrieval/512/0", "in_domain/retrieval/512/1"]
    ex = bench.build(specs[1], renderer)
    row = rows[1]
    assert ex.prompt_text == row.prompt_text and ex.prompt_tokens == row.prompt_tokens
    gold, value = row.gold[0]["text"], row.answers[0]
    response = f"I look it up: {S}{gold}{E} so the value is {value}.\n</think>\n\nAnswer: {value}"
    scored = bench.score(ex, gen(response, n_tokens=40), None)
    expected = score_response(
        response, row.ground_truth, prompt_text=row.prompt_text, n_tokens=40, data_source=row.data_source
    )
    assert scored.score == 1.0 and scored.correct and scored.answer == value
    assert scored.metrics["reward"] == expected.score and scored.metrics["recall"] == expected.recall > 0
    assert bench.score(ex, gen(response.replace(f"Answer: {value}", "Answer: nothing")), None).score == 0.0
    # the reward settings are the run's, passed through (here: everything past 4 tokens is overlong: a cap of
    # 5 tokens, the penalty over the last 1)
    strict = make_benchmarks(
        {"generation": GEN, "benchmarks": {"in_domain": {"data_dir": str(tmp_path)}}},
        reward_config={"overlong": {"max_response_length": 5, "buffer": 1}},
    )[0]
    strict.specs()
    scored = strict.score(strict.build(specs[1], renderer), gen(response, n_tokens=40), None)
    assert scored.score == 1.0 and scored.metrics["reward"] == 0.0
    assert load_reward_config().overlong.onset == 4096


def test_in_domain_errors(renderer, tmp_path):
    with pytest.raises(RecallmError, match="no validation directory"):
        make("in_domain", data_dir=str(tmp_path)).specs()
    write_val(renderer, tmp_path, n=1)
    with pytest.raises(RecallmError, match=r"missing parquet .*val/retrieval_1024.parquet"):
        make("in_domain", data_dir=str(tmp_path), categories=["retrieval"], lengths=[1024]).specs()
    with pytest.raises(RecallmError, match=r"missing parquet .*val/icl_<length>.parquet"):
        make("in_domain", data_dir=str(tmp_path), categories=["icl"]).specs()
    with pytest.raises(RecallmError, match="unknown categories"):
        make("in_domain", data_dir=str(tmp_path), categories=["nope"]).specs()
    with pytest.raises(RecallmError, match="data_dir is required"):
        make("in_domain")

    def other_template(record):
        record["extra_info"]["prompt_text"] = "<|im_start|>system\nx<|im_end|>\n" + record["extra_info"]["prompt_text"]

    other = tmp_path / "other"
    write_val(renderer, other, n=1, mutate=other_template)
    bench = make("in_domain", data_dir=str(other))
    with pytest.raises(RecallmError, match="another chat template"):
        bench.build(bench.specs()[0], renderer)


# --------------------------------------------------------------------------- suites


def test_make_benchmarks_checks_everything_up_front():
    ok = {"lengths": [512], "per_cell": 1}
    with pytest.raises(RecallmError, match="unknown benchmark 'rulr'"):
        make_benchmarks({"generation": GEN, "benchmarks": {"rulr": ok}})
    with pytest.raises(RecallmError, match="unknown benchmark 'babilong'"):
        make_benchmarks({"generation": GEN, "benchmarks": {"ruler": ok}}, only=["babilong"])
    for bad, pattern in (("abc", "bad length 'abc'"), (0, "lengths must be positive"), (100, "bad length 100")):
        with pytest.raises(RecallmError, match=pattern):
            make("ruler", lengths=[bad], per_cell=1)
    with pytest.raises(RecallmError, match="per_cell is required"):
        make("helmet_json_kv", lengths=[512]).specs()
    with pytest.raises(RecallmError, match="unknown keys"):
        make("helmet_json_kv", lengths=[512], per_cell=1, depth=3)
    with pytest.raises(RecallmError, match="no benchmark to run"):
        make_benchmarks({"generation": GEN, "benchmarks": {"ruler": {**ok, "enabled": False}}})
    with pytest.raises(RecallmError, match="eval.generation is required"):
        make_benchmarks({"benchmarks": {"ruler": ok}})
    only = make_benchmarks(
        {"generation": GEN, "benchmarks": {"ruler": {**ok, "enabled": False}, "helmet_json_kv": ok}}, only=["ruler"]
    )
    assert [b.name for b in only] == ["ruler"]
    ruler = make("ruler", lengths=["1K", 2048], per_cell=1, generation={"max_new_tokens": 16, "temperature": 0.6})
    assert (
        ruler.lengths == [1024, 2048] and ruler.generation.max_new_tokens == 16 and ruler.generation.temperature == 0.6
    )


@pytest.mark.parametrize("suite", ["tiny", "paper", "toy"])
def test_shipped_suites_build(suite):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from recallm.paths import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="eval", overrides=[f"eval={suite}"])
    benches = make_benchmarks(OmegaConf.to_container(cfg.eval, resolve=True), reward_config=cfg.reward)
    names = {b.name for b in benches}
    if suite == "paper":
        assert names == {"lost_in_thought", "ruler", "helmet", "in_domain"}
        ruler = next(b for b in benches if b.name == "ruler")
        assert ruler.lengths == [4096, 8192, 16384, 32768, 65536, 131072] and ruler.generation.max_new_tokens == 8192
        assert ruler.tasks == list(RULER_TASKS) and len(ruler.tasks) == 13 and ruler.per_cell == 100
        assert ruler.cfg["squad_path"] == "data/ruler/squad.json" and ruler.cfg["haystack_path"].endswith("Essays.json")
        lit = next(b for b in benches if b.name == "lost_in_thought")
        assert (lit.generation.max_new_tokens, lit.generation.temperature, lit.generation.top_p) == (10240, 0.6, 0.95)
        assert lit.lengths == [4096, 16384, 32768, 65536, 98304, 131072] and lit.cfg["injection_examples"] == 200
        helmet = next(b for b in benches if b.name == "helmet")
        assert helmet.lengths == [8192, 16384, 32768, 65536, 131072] and len(helmet.task_names) == 21
        assert helmet.per_cell_of("nq") == 100 and helmet.per_cell_of("clinic150") == 500
        assert helmet.generation.max_new_tokens == 10240 and helmet.cfg["helmet_dir"] == "data/HELMET"
        # the 128K cells are fitted to 125K, so that there is room to generate within 131,072 positions
        # lost in thought and in-domain: the 128K cells fitted to 125K (room to generate within 131,072 positions);
        # RULER and HELMET: upstream's cell, the prompt leaving the task's generation budget free
        assert all(b.target(131072) == 128000 for b in benches if b.name in ("lost_in_thought", "in_domain"))
        assert ruler.target(131072) == 131072 and helmet.target(131072) == 131072
    elif suite == "toy":
        assert names == {"synthetic", "in_domain"}
        synthetic = next(b for b in benches if b.name == "synthetic")
        assert synthetic.lengths == [360, 1440] and synthetic.task.name == "toy_lookup"
        assert all(b.generation.greedy for b in benches)
    else:
        assert names == {"lost_in_thought", "ruler", "helmet_json_kv"}
        assert all(b.generation.greedy for b in benches)


# --------------------------------------------------------------------------- synthetic (any data_gen task)


def test_synthetic_task_fresh_prompts_at_any_length(renderer):
    bench = make("synthetic", task="toy_lookup", params={"pairs": None}, lengths=[360, 1440], per_cell=3)
    specs = bench.specs()
    assert [s.example_id for s in specs][:2] == ["synthetic/toy_lookup/360/0", "synthetic/toy_lookup/360/1"]
    assert len(specs) == 6
    texts = set()
    for spec in specs:
        ex = bench.build(spec, renderer)
        texts.add(ex.prompt_text)
        assert abs(ex.prompt_tokens - spec.length) <= bench.settings.tolerance * spec.length + 5
        q = int(re.search(r"q = (\d+) ; key = q \+ 1", ex.prompt_text).group(1))
        lines = dict(re.findall(r"^(\d+): (\w+)$", ex.prompt_text, flags=re.M))
        assert lines[str(q + 1)] == ex.reference["ground_truth"]["answers"][0]
    assert len(texts) == 6
    spec = specs[4]
    same = make("synthetic", task="toy_lookup", params={"pairs": None}, lengths=[360, 1440], per_cell=3)
    other = make("synthetic", seed=5, task="toy_lookup", params={"pairs": None}, lengths=[360, 1440], per_cell=3)
    assert same.build(spec, renderer).prompt_text == bench.build(spec, renderer).prompt_text
    assert other.build(spec, renderer).prompt_text != bench.build(spec, renderer).prompt_text


def test_synthetic_task_scores_with_the_training_reward(renderer):
    bench = make("synthetic", task="toy_lookup", params={"pairs": None}, lengths=[360], per_cell=1)
    ex = bench.build(bench.specs()[0], renderer)
    q = int(re.search(r"q = (\d+)", ex.prompt_text).group(1))
    value = ex.reference["ground_truth"]["answers"][0]
    right = f"key = {q + 1} {S}{q + 1}: {value}{E}</think>\nAnswer: {value}"
    scored = bench.score(ex, gen(right, n_tokens=12), None)
    assert scored.correct and scored.score == 1.0 and scored.answer == value and scored.metrics["recall"] == 1.0
    wrong_line = f"key = {q} {S}{q}: x{E}</think>\nAnswer: {value}x"
    scored = bench.score(ex, gen(wrong_line, n_tokens=12), None)
    assert not scored.correct and scored.score == 0.0 and scored.metrics["recall"] == 0.0
    no_answer = bench.score(ex, gen(f"key = {q + 1} {S}{q + 1}: {value}{E}", n_tokens=12), None)
    assert not no_answer.correct and no_answer.answer is None


def test_synthetic_task_settings_are_checked():
    with pytest.raises(RecallmError, match=r"task \(or tasks\) is required"):
        make("synthetic", lengths=[360], per_cell=1)
    with pytest.raises(RecallmError, match="unknown task|no task|not a registered"):
        make("synthetic", task="nope", lengths=[360], per_cell=1)
    with pytest.raises(RecallmError, match="cannot reach"):
        make("synthetic", task="toy_lookup", params={"pairs": None}, lengths=[5000], per_cell=1)
    with pytest.raises(RecallmError, match="params must be a mapping"):
        make("synthetic", task="toy_lookup", params=[1], lengths=[360], per_cell=1)
    with pytest.raises(RecallmError, match="per_cell is required"):
        make("synthetic", task="toy_lookup", lengths=[360]).specs()


def test_synthetic_per_cell_at_one_length(renderer):
    """More prompts at one length; the first per_cell prompts there are the same prompts either way, and the
    option stays out of the fingerprint when unset."""
    kw = dict(task="toy_lookup", params={"pairs": None}, lengths=[360, "1K"])
    bench = make("synthetic", per_cell=2, per_cell_at={"1K": 5}, **kw)
    ids = [s.example_id for s in bench.specs()]
    assert ids == [f"synthetic/toy_lookup/360/{i}" for i in range(2)] + [f"synthetic/toy_lookup/1024/{i}" for i in range(5)]
    plain = make("synthetic", per_cell=2, **kw)
    spec = bench.specs()[3]  # 1024/1
    assert plain.build(spec, renderer).prompt_text == bench.build(spec, renderer).prompt_text
    assert "per_cell_at" not in plain.describe() and bench.describe()["per_cell_at"] == {"1K": 5}
    with pytest.raises(RecallmError, match="per_cell_at: 2048 is not one of the lengths"):
        make("synthetic", per_cell=2, per_cell_at={2048: 5}, **kw)
    for bad in (0, -1, 9 * 10**18, True, 2.0, "3"):
        with pytest.raises(RecallmError, match=r"per_cell_at.360 must be an integer in \[1, 1000000000\]"):
            make("synthetic", per_cell=2, per_cell_at={360: bad}, **kw)
    with pytest.raises(RecallmError, match="per_cell_at"):
        make("synthetic", per_cell=2, per_cell_at={"lots": 5}, **kw)


def test_smollm2_suite_takes_more_prompts_at_the_longest_length():
    """The SmolLM2 experiment's suite: 24 prompts per task and length, and the override its results page gives
    for a +-0.08 interval at 2,048 tokens (no ``+``: the suite lists the key)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from recallm.paths import config_dir

    def specs(*overrides):
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose(config_name="eval", overrides=["eval=smollm2", *overrides])
        (bench,) = make_benchmarks(OmegaConf.to_container(cfg.eval, resolve=True), reward_config=cfg.reward)
        return Counter(s.length for s in bench.specs())

    assert specs() == {256: 72, 1024: 72, 2048: 72}
    assert specs("eval.benchmarks.synthetic.per_cell_at={2048:72}") == {256: 72, 1024: 72, 2048: 216}


def test_synthetic_answer_diagnostics_in_the_metrics(renderer):
    """The synthetic benchmark adds the answer diagnostics to a key-value score (its key given, the answer copied
    from the prompt) and none to a multi-needle one (no single key)."""
    niah = {"task": "multi_niah", "params": {"decoys": 0, "target_keys": 1, "values_per_key": 1, "value_types": ["number"]}}
    bench = make("synthetic", tasks=[{"task": "kv_retrieval"}, niah], lengths=[1024], per_cell=1)
    kv, niah = (bench.build(s, renderer) for s in bench.specs())
    key, value = kv.reference["key"], kv.reference["ground_truth"]["answers"][0]
    scored = bench.score(kv, gen(f"key {key}</think>\nAnswer: {value}", n_tokens=9), None)
    assert scored.gold == [value] and scored.metrics["key_in_output"] == 1.0 == scored.metrics["answer_in_prompt"]
    assert "key" not in niah.reference and "answer_similarity" not in bench.score(niah, gen("x", 1), None).metrics


def test_in_domain_reads_natural_length_cells(renderer, tmp_path):
    from data_gen.base import make_task
    from data_gen.generate import build_row
    from data_gen.io import row_record, write_parquet
    from recallm.eval.benchmarks.in_domain import find_cells

    task = make_task("toy_lookup", pairs=[3, 20])
    rows = [build_row(task, task.draft(random.Random(i)), renderer, 400, random.Random(i), seed=i) for i in range(3)]
    records = [row_record(r, i, "val/reasoning_retrieval", store_prompt_text=True) for i, r in enumerate(rows)]
    write_parquet(records, tmp_path / "val" / "reasoning_retrieval.parquet")
    longest = max(r.prompt_tokens for r in rows)
    assert find_cells(tmp_path) == {("reasoning_retrieval", longest): tmp_path / "val" / "reasoning_retrieval.parquet"}
    bench = make("in_domain", data_dir=str(tmp_path), per_cell=3)
    specs = bench.specs()
    assert {s.length for s in specs} == {longest} and len(specs) == 3
    assert bench.build(specs[2], renderer).prompt_text == rows[2].prompt_text
    (tmp_path / "val" / "retrieval.parquet").write_bytes(b"not parquet")
    with pytest.raises(RecallmError, match="retrieval.parquet"):
        find_cells(tmp_path)
