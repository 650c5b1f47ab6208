"""Conformance with the upstream benchmarks: for every metric and post-processing step, cases whose expected
values were worked out by reading upstream's code (file and line next to each group), and golden renderings of
every prompt template against upstream's template text.

Upstream, at the commits the manual's evaluation protocol page (docs/guide/evaluation-protocol.md) names:
  RULER  = NVIDIA/RULER c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a
  HELMET = princeton-nlp/HELMET 4526dfbdc512bd9ff721da336bff4e3e75ecfd27
"""

from __future__ import annotations

import math

import pytest

from recallm.eval import scoring as m
from recallm.eval.types import Generation, Spec

# --------------------------------------------------------------------------- RULER: metrics


# RULER scripts/eval/synthetic/constants.py L24-31: string_match_part / string_match_all are
# `r.lower() in pred.lower()`, averaged over the references (all) or maxed (part); x100 per task.
@pytest.mark.parametrize(
    ("prediction", "references", "all_", "part"),
    [
        ("The numbers are 1234567 and 7654321.", ["1234567", "7654321"], 1.0, 1.0),
        ("x123y", ["12"], 1.0, 1.0),  # inside a longer run: upstream counts it
        ("42", ["4", "2", "9"], 2 / 3, 1.0),
        ("PARIS", ["paris", "lyon"], 0.5, 1.0),
        ("", ["a"], 0.0, 0.0),
        ("abc", ["", "zzz"], 0.5, 1.0),  # the empty reference is in every string
    ],
)
def test_ruler_string_match(prediction, references, all_, part):
    assert m.string_match_all(prediction, references) == pytest.approx(all_)
    assert m.string_match_part(prediction, references) == part


# RULER scripts/eval/evaluate.py L50-58 postprocess_pred: strip, control characters -> "\n", strip.
@pytest.mark.parametrize(
    ("raw", "clean"), [("  a\tb\x00c  ", "a\nb\nc"), ("\n\nans\n", "ans"), ("x\x1fy", "x\ny"), ("é\x7f", "é\x7f")]
)
def test_ruler_postprocess(raw, clean):
    assert m.ruler_postprocess(raw) == clean


# --------------------------------------------------------------------------- RULER: prompts

# RULER scripts/data/synthetic/constants.py L27, L33, L39, L45, L51 (templates; the answer prefixes L28-52 are
# not used: the paper prompts through chat templates) and niah.py L193-198 (the singular form).
RULER_NIAH_ONE = (
    "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you about "
    "the number afterwards.\n<CTX>\nWhat is the special magic number for able-bear mentioned in the provided text?"
)
RULER_NIAH_MANY = (
    "Some special magic uuids are hidden within the following text. Make sure to memorize it. I will quiz you about "
    "the uuids afterwards.\n<CTX>\nWhat are all the special magic uuids for a, b, and c mentioned in the provided text?"
)
RULER_VT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n<CTX>\nQuestion: Find "
    "all variables that are assigned the value 12345 in the text above."
)
RULER_CWE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
    "appear most often.\n<CTX>\nQuestion: What are the 10 most common words in the above list?"
)
RULER_FWE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. <CTX>\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are "
    "the three most frequently appeared words in the above coded text?"
)
RULER_QA = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
    "\n\nThe following are given documents.\n\n<CTX>\n\nAnswer the question based on the given documents. Only give "
    "me the answer and do not output any other words.\n\nQuestion: who?"
)


def test_ruler_templates_render_as_upstream():
    from recallm.eval.benchmarks import ruler as r

    def render(template, **fields):
        return r.fill(template, **fields).replace("{context}", "<CTX>")

    assert render(r.niah_template(1, 1), type_needle_v="number", query="able-bear") == RULER_NIAH_ONE
    assert render(r.niah_template(3, 1), type_needle_v="uuids", query="a, b, and c") == RULER_NIAH_MANY
    assert r.niah_template(1, 4) == r.NIAH_TEMPLATE  # multi-value: plural (num_q * num_v != 1)
    assert render(r.VT_TEMPLATE, query="12345") == RULER_VT
    assert r.CWE_TEMPLATE.replace("{context}", "<CTX>") == RULER_CWE
    assert r.FWE_TEMPLATE.replace("{context}", "<CTX>") == RULER_FWE
    assert render(r.QA_TEMPLATE, query="who?") == RULER_QA
    # niah.py L83 / L182 (needles; noise and needle haystacks one per line); qa.py L116, L145 (documents)
    assert r.NEEDLE.format(kind="numbers", key="k", value="1") == "One of the special magic numbers for k is: 1."
    # variable_tracking.py L110-112: the chain's lines; freq_words_extraction.py L81 (noise), L114 (vocabulary)
    assert r.FWE_NOISE == "..." and r.TOKENS_TO_GENERATE == {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}


def test_ruler_prompts_built_as_upstream(tiny_dir):
    """Whole prompts: the template around a haystack joined as upstream joins it, the worked examples first."""
    from data_gen.fit import PromptRenderer
    from recallm.eval.benchmarks import make_benchmarks
    from recallm.tokens import load_tokenizer

    renderer = PromptRenderer(load_tokenizer(tiny_dir))
    tasks = ["niah_single_1", "niah_multikey_2", "vt", "cwe", "fwe"]
    bench = make_benchmarks({"generation": {"max_new_tokens": 8}, "benchmarks": {
        "ruler": {"lengths": [2048], "per_cell": 1, "tasks": tasks}}})[0]  # fmt: skip
    user = {t: bench.build(Spec(2048, "ruler", 0, t), renderer).messages[-1]["content"] for t in tasks}
    head, _, question = RULER_NIAH_ONE.partition("<CTX>")
    noise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    s1 = user["niah_single_1"]
    assert s1.startswith(head) and s1.split("\n")[1] == noise
    assert s1.rsplit("\n", 1)[1].startswith("What is the special magic number for ") and question.endswith("text?")
    assert all(
        line == noise or line.startswith("One of the special magic numbers for ") for line in s1.split("\n")[1:-1]
    )
    mk2 = user["niah_multikey_2"].split("\n")[1:-1]  # niah.py L171-182: a haystack of other needles, one per line
    assert len(mk2) > 5 and all(line.startswith("One of the special magic numbers for ") for line in mk2)
    # variable_tracking.py L218, L265: the worked example (template + answer prefix + its answer), a blank line, the task
    vt = user["vt"]
    assert vt.count("Memorize and track the chain(s)") == 2 and "variables are assigned the value " in vt
    assert "they are:  " in vt and "\n\nMemorize and track the chain(s)" in vt
    # common_words_extraction.py L116-129: the worked example (answer prefix and numbered answer), "\n", the task
    cwe = user["cwe"]
    assert cwe.count("appear most often.\n1. ") == 2 and "list are: 1. " in cwe and "\nBelow is a numbered list" in cwe
    fwe = user["fwe"]
    assert fwe.startswith("Read the following coded text") and " coded words. " in fwe and " ... " in fwe
    assert "Give the answer on a final line" not in "".join(user.values())  # answer_line is off by default


# --------------------------------------------------------------------------- HELMET: metrics


# HELMET utils.py L25-40 normalize_answer, L80-82 substring_exact_match_score, L75-77 exact match, L47-67 f1_score
# (yes/no/noanswer must match exactly), L85-99 max over golds (a list of alias lists is flattened).
@pytest.mark.parametrize(
    ("prediction", "golds", "em", "f1", "sub"),
    [
        ("The Eiffel Tower!", ["eiffel tower"], 1.0, 1.0, 1.0),
        ("It is the Eiffel Tower in Paris", ["Eiffel Tower"], 0.0, 2 * (2 / 6) * 1 / (2 / 6 + 1), 1.0),
        ("yes", ["no"], 0.0, 0.0, 0.0),
        ("no answer", ["noanswer"], 0.0, 0.0, 0.0),
        ("Paris", [["Lyon", "paris"]], 1.0, 1.0, 1.0),
        ("", ["a"], 1.0, 0.0, 1.0),  # "a" is an article: both normalise to "" (EM and substring hold, F1 is 0)
    ],
)
def test_helmet_qa_metrics(prediction, golds, em, f1, sub):
    assert m.exact_match(prediction, golds) == em
    assert m.token_f1(prediction, golds) == pytest.approx(f1)
    assert m.substring_exact_match(prediction, m._as_list(golds)) == sub


# HELMET utils.py L121-130 parse_output: the line after the (case-insensitive) prefix, a repeated prefix stripped,
# else the first line.
@pytest.mark.parametrize(
    ("output", "prefix", "parsed"),
    [
        ("Reasoning...\nAnswer: Paris\nmore", "Answer:", "Paris"),
        ("answer: answer: Paris", "Answer:", "Paris"),
        ("Paris\nsecond line", "Answer:", "Paris"),
        ("label: 12", "label:", "12"),
        ("Answer: 12", "label:", "Answer: 12"),  # ICL: only "label:" is read
    ],
)
def test_helmet_parse_output(output, prefix, parsed):
    assert m.helmet_parse_output(output, prefix) == parsed


# HELMET scripts/eval_gpt4_longqa.py L16-27: the LongQA judge reads the output with newlines turned into spaces,
# after "Answer:" (everything after it), else the whole output.
@pytest.mark.parametrize(
    ("output", "read"),
    [("Thinking\nAnswer: the north\npole", "the north pole"), ("no prefix\nat all", "no prefix at all")],
)
def test_helmet_longqa_judge_input(output, read):
    assert m.judge_answer(output) == read


# HELMET utils.py L133-161 parse_rankings: brackets, colons and "id" removed, the longest "a > b > c" chain, earlier
# ids score higher, repeats keep their first place.
def test_helmet_parse_rankings():
    assert m.parse_rankings("Ranking: [ID: 3] > [ID: 1] > 2 > 3") == {"3": 4.0, "1": 3.0, "2": 2.0}
    assert m.parse_rankings("none") == {"none": 1.0}


# HELMET data.py L579-598 (infbench choice): exact match of the output or its parse; the "A. option" answer counts as a
# substring of the raw output.
def test_helmet_icl_and_choice_scoring(tiny_dir):
    from recallm.eval.benchmarks.helmet.benchmark import Helmet
    from recallm.eval.benchmarks.helmet.tasks import TASKS
    from recallm.eval.types import Example

    bench = Helmet.__new__(Helmet)
    bench.tasks = dict(TASKS)
    bench.settings = type("S", (), {"answer_region": "after_think", "judge": None, "nli": None})()

    def score(task, text, answers):
        ex = Example(Spec(4096, "helmet", 0, task), [], "", 1, {"answers": answers})
        return bench._score_one(ex, Generation(text, 1, "stop")).score

    # data.py L452-457: ICL scores only parse_output(pred, "label:")
    assert score("trec_coarse", "</think>\nlabel: 3", ["3"]) == 1.0
    assert score("trec_coarse", "</think>\nAnswer: 3", ["3"]) == 0.0
    assert score("trec_coarse", "</think>\nThe label is 3.\nlabel: 3", ["3"]) == 1.0
    assert score("infbench_choice", "</think>I pick B. the cat", ["B", "B. the cat"]) == 1.0
    assert score("infbench_choice", "</think>Answer: B", ["B", "B. the cat"]) == 1.0
    # eval.py L105-109 (--thinking): the text after the LAST </think>, or the whole output without one
    assert score("json_kv", "</think>no</think>\nvalue-x", ["value-x"]) == 1.0
    assert score("json_kv", "still thinking: value-x", ["value-x"]) == 1.0
    # data.py L506-512: ruler_recall is the share of answers that are substrings of the output
    assert score("ruler_niah_mv", "</think>1 and 2", ["1", "2", "3", "4"]) == 0.5


# HELMET eval_alce.py L346-353 (claims: sentences of >= 5 characters; an output without any is skipped), L365-377 (a
# claim without citations or citing past the documents is unsupported; [0] is docs[-1]), L394-424 (precision),
# L440-481 (QAMPARI), L159-180 (STR-EM), L519-522 (newlines -> spaces).
def _nli_by_words(pairs):
    return [all(w in premise.lower() for w in claim.lower().rstrip(".").split()[:1]) for premise, claim in pairs]


@pytest.mark.parametrize(
    ("output", "rec", "prec"),
    [
        ("Paris is nice [1]. Berlin is big [2].", 1.0, 1.0),
        ("Paris is nice [2].", 0.0, 0.0),
        ("Paris is nice [0].", 0.0, 0.0),  # [0] -> docs[-1] (Berlin): judged, not supported
        ("Rome is old [0].", 1.0, 1.0),  # [0] -> docs[-1]... is Berlin: Rome not in it
        ("Berlin is big [3].", 1.0, 1.0),  # past the two shown documents: the item's third is judged
        ("Paris is nice [9].", 0.0, 0.0),  # past every document: unsupported, no citation counted
        ("Paris is nice [1][2].", 1.0, 0.5),  # [2] neither supports nor is needed
        ("Paris is nice. Berlin is big [2].", 0.5, 1.0),  # an uncited claim counts against recall only
    ],
)
def test_alce_citation_recall_and_precision(output, rec, prec):
    docs = ["Title: A\nParis", "Title: B\nBerlin", "Title: C\nBerlin again"]
    if output.startswith("Rome"):
        rec = prec = 0.0  # (docs[-1] is "Berlin again": Rome is not supported)
    scores = m.citation_scores(output, docs, _nli_by_words)
    assert scores == {"citation_rec": pytest.approx(rec), "citation_prec": pytest.approx(prec)}


def test_alce_edge_cases():
    docs = ["Title: A\nParis"]
    assert m.citation_scores("", docs, _nli_by_words) is None  # no claim: skipped, not 0
    assert m.citation_scores("Ok.", docs, _nli_by_words) is None  # claims under 5 characters are dropped
    # the trained English Punkt model: "Mr. Smith" does not end a sentence (an untrained splitter would make two)
    assert m.split_sentences("Mr. Smith went to Paris [1]. He stayed.") == [
        "Mr. Smith went to Paris [1].",
        "He stayed.",
    ]
    # QAMPARI: the claims are "question item"; recall@5 caps found answers at 5 over min(5, answers)
    q = m.qampari_scores("x [1], y [2], zz", [["x"], ["y", "why"], ["w"]])  # (citations removed first)
    assert q["qampari_rec_top5"] == pytest.approx(2 / 3) and q["qampari_prec"] == pytest.approx(2 / 3)
    many = [[str(i)] for i in range(8)]
    assert m.qampari_scores("0, 1, 2, 3, 4, 5", many)["qampari_rec_top5"] == 1.0
    assert m.asqa_str_em("It was 1990 [1] or 1991.", [{"short_answers": ["1990"]}, {"short_answers": ["1992"]}]) == (
        0.5,
        0.0,
    )


# NLTK's own doctest outputs for its trained English model (nltk/tokenize/punkt.py module docstring): the splitter
# ALCE and RULER call through nltk.sent_tokenize.
def test_punkt_english_reproduces_nltk_documented_splits():
    text = (
        "Punkt knows that the periods in Mr. Smith and Johann S. Bach\ndo not mark sentence boundaries.  And sometimes "
        "sentences\ncan start with non-capitalized words.  i is a good variable\nname."
    )
    assert m.split_sentences(text) == [
        "Punkt knows that the periods in Mr. Smith and Johann S. Bach\ndo not mark sentence boundaries.",
        "And sometimes sentences\ncan start with non-capitalized words.",
        "i is a good variable\nname.",
    ]


def test_punkt_equals_nltk_sent_tokenize_where_its_data_is_installed():
    nltk = pytest.importorskip("nltk")
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        pytest.skip("nltk's punkt_tab data is not installed (python -m nltk.downloader punkt_tab)")
    text = "Dr. Watson met Mrs. Hudson at 3 p.m. on Jan. 5. They talked. U.S. officials agreed."
    assert m.split_sentences(text) == nltk.sent_tokenize(text)


# HELMET scripts/eval_gpt4_longqa.py L53-61 and eval_gpt4_summ.py L330-342 (parse_json: the last non-greedy {...}, or a
# fenced json block); L80-91 / L384-386: an unreadable verdict is dropped, never replaced; summ L389-391: recall =
# found / key points, precision = supported / sentences, f1 = fluency * 2RP / (R + P), unclipped.
def test_judge_verdicts_read_as_helmet():
    from recallm.eval.judge import helmet_json

    assert helmet_json('reason {"fluency": 1, "correctness": 2}') == {"fluency": 1, "correctness": 2}
    assert helmet_json('a {"x": 1} b {"y": 2}') == {"y": 2}
    assert helmet_json('a {"x": 1} b {not json}') is None  # only the last one is tried
    assert helmet_json('```json\n{"precision": 3}\n```', fenced=True) == {"precision": 3}
    assert helmet_json("no verdict") is None


# HELMET scripts/collect_results.py L52-58 (a category averages its tasks' reported metrics), L128 (NarrativeQA's
# judge score x 100/3); eval_alce.py L433-436 (citation means over the outputs that have claims).
def test_helmet_task_numbers_as_collect_results():
    from recallm.eval.benchmarks import make_benchmarks

    bench = make_benchmarks({"generation": {"max_new_tokens": 8}, "benchmarks": {
        "helmet": {"lengths": [8192], "per_cell": 1, "tasks": ["alce_asqa", "narrativeqa"]}}})[0]  # fmt: skip

    def rec(task, **metrics):
        return {"task": task, "length": 8192, "score": 0.0, "metrics": metrics}

    records = [
        rec("alce_asqa", str_em=1.0, citation_rec=1.0, citation_prec=0.5),
        rec("alce_asqa", str_em=0.0),  # no claim: left out of the citation means
        rec("narrativeqa", judge_score=1.0, rougeL_f1=0.2, judged=1.0),
        rec("narrativeqa", rougeL_f1=0.9, judged=0.0),  # unreadable verdict: dropped, not ROUGE
        rec("narrativeqa", judge_score=0.0, rougeL_f1=0.1, judged=1.0),
    ]
    table = bench.summarize(records)
    assert table["tasks"]["alce_asqa"]["8192"] == pytest.approx((0.5 + 1.0 + 0.5) / 3)
    assert table["tasks"]["narrativeqa"]["8192"] == pytest.approx(0.5)
    assert table["counts"]["narrativeqa"]["8192"] == {"n": 3, "dropped": 1}


# HELMET data.py L386-412 (balance_labels), L377 (nlu: train_test_split(test_size=0.1, seed=42)), L427-442 (the item's
# seed: sha256(text) + 42, labels permuting range(num_labels)); Hugging Face Dataset.shuffle / train_test_split.
def test_helmet_icl_sampling():
    import random

    from recallm.eval.benchmarks.helmet.tasks import ICL_LABELS, balance_labels, hf_train_test_split

    data = [{"label": i % 3, "i": i} for i in range(9)]
    picked = balance_labels(data, "label", 4, seed=7)
    assert len(picked) == 4 and {d["label"] for d in picked[:3]} == {0, 1, 2}  # a first round with every label
    rand = random.Random(7)  # upstream's draws, replayed: rounds = ceil(4 / 3) = 2, 2 % 3 = 2 picks per label
    expected = [[], []]
    for label in (0, 1, 2):
        items = [d for d in data if d["label"] == label]
        for j, idx in enumerate(rand.sample(range(3), 2)):
            expected[j].append(items[idx])
    for group in expected:
        rand.shuffle(group)
    assert picked == [d for g in expected for d in g][:4]
    train, test = hf_train_test_split(100, 0.1, 42)
    assert len(test) == math.ceil(0.1 * 100) and sorted(train + test) == list(range(100))
    assert ICL_LABELS == {"trec_coarse": 6, "trec_fine": 50, "banking77": 77, "clinic150": 151, "nlu": 68}


# HELMET data.py L468-496 (load_ruler's Recall templates), L120-137 (json_kv: template, "Key: {key}\nCorresponding
# value: {value}" demonstrations), the task templates of load_qa L56, load_msmarco_rerank L263, load_icl L421.
def test_helmet_templates_render_as_upstream():
    from recallm.eval.benchmarks.helmet import tasks as t

    assert t.NIAH_ONE.format(type_needle_v="number", context="<CTX>", query="k") == (
        "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you about "
        "the number afterwards.\n<CTX>\nWhat is the special magic number for k mentioned in the provided text?"
    )
    assert t.NIAH_MANY.format(type_needle_v="numbers", context="<CTX>", query="k").startswith(
        "Some special magic numbers are hidden"
    )
    assert t.JSON_KV_TEMPLATE.format(context="<CTX>", demos="<D>", question='"k"') == (
        '<CTX>\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n<D>Key: "k"'
    )
    assert t.RAG_TEMPLATE.format(demos="", context="<CTX>", question="q?") == (
        "Use the given documents to write a concise and short answer to the question. Write your answer in the "
        "following format:\nAnswer: [answer]\n\n<CTX>\n\nQuestion: q?"
    )
    assert t.ICL_TEMPLATE.format(context="<CTX>", question="text") == (
        'Use the provided mapping from the text to label to assign a label to the text. Only output "label: {label}" '
        "and nothing else. \n\n<CTX>\n\ntext"
    )
    assert t.RERANK_TEMPLATE.format(demos="", context="<CTX>", question="q").endswith(
        "most relelvant to least relevant texts. Include all documents in the rankings. Write your answer using the "
        "unique IDs, with the following format:\nRanking: ID3 > ID1 > ID2\n\n<CTX>\n\nQuery: q"
    )


# --------------------------------------------------------------------------- the paper's lost in thought


# Table 4: Rel. Gap = (R - RR) / R of the bucket's means (the reference rows satisfy it: test_eval_report.py);
# "solved" = the reasoning's stated result is the key; Figure 5a's signed "Key -3328: ..." lines.
@pytest.mark.parametrize(
    ("reasoning", "key", "solved"),
    [
        ("17x = 34, so x = 2. Then 2 + 4826 = 4828... wait, x = 4827.", "4827", True),
        ("So x = -3328.", "-3328", True),
        ("The key could be 4826, 4827 or 4828.", "4827", False),  # a list of candidates is no solution
        ("x = 4826. Looking up 4827 nearby.", "4827", False),
        ("The answer is 2,880.", "2880", True),
        ("Result: \\boxed{-17}", "-17", True),
        ("I get 4827.", "4827", True),  # stated alone, no other candidate
        ("x = 3328", "-3328", False),
    ],
)
def test_lost_in_thought_solved(reasoning, key, solved):
    assert m.math_solved(reasoning, key) is solved


def test_lost_in_thought_signed_lines_and_gap():
    from data_gen.tasks.kv import KVDictionary
    from recallm.eval.benchmarks.lost_in_thought import _gap

    d = KVDictionary("signed", "alnum", 4, "Key ")
    assert (d.key_lo, d.key_hi) == (-9999, 9999) and d.line("lines", "-3328", "LdO2I44vGR", d.label) == (
        "Key -3328: LdO2I44vGR"
    )
    assert m.injection_prefix("lines", "-3328", "Key ") == "Key -3328: "
    assert m.injection_prefix("json", "-242", "Key ") == '"-242": "'
    assert _gap(80.6 / 100, 27.1 / 100) == pytest.approx(66.3, abs=0.1)  # Llama-3.1-8B-Instruct, Table 4 S (rounded)
