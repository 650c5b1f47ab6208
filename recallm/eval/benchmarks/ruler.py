"""RULER (Hsieh et al., 2024; NVIDIA/RULER): all thirteen tasks.

RULER's task definitions and default parameters, written here from its description; prompts are
fitted to the target length with the model's tokenizer and chat template (``data_gen.fit``):

* ``niah_single_1/2/3``, ``niah_multikey_1/2/3``, ``niah_multivalue``, ``niah_multiquery`` -
  needles ``One of the special magic {numbers|uuids} for {key} is: {value}.`` in a haystack of
  ``noise`` (one repeated paragraph), ``essay`` or ``needle`` (other needles). Keys are word
  pairs, numbers or UUIDs; values numbers or UUIDs. Multi-key: 4 needles with different keys,
  one asked; multi-value: one key with 4 values; multi-query: 4 keys, all asked.
* The ``essay`` haystack: RULER uses Paul Graham's essays. ``haystack_path`` reads them from a
  local copy - RULER's ``PaulGrahamEssays.json`` (``{"text": ...}``, written by its
  ``download_paulgraham_essay.py``), a ``.txt`` file, or a directory of ``.txt`` files (name
  order) - as RULER does: whitespace collapsed, cut into sentences, read from the start (and
  again from the start when a long context needs more). Without it the haystack is generated
  offline (English-word sentences from ``data_gen.text``), and the summary and report say so.
* ``vt`` (variable tracking) - a chain ``VAR A = 12345``, ``VAR B = VAR A``, ... (4 hops, in
  order) in noise; the answer is every variable that holds the value.
* ``cwe`` (common words extraction) - a numbered word list in which 10 words appear 30 times and
  the others 3 (6 and 1 below 4K tokens, as RULER); the answer is the 10 common words.
* ``fwe`` (frequent words extraction) - coded words drawn from a Zipf distribution (alpha 2)
  with ``....`` as the most frequent noise word; the answer is the 3 most frequent coded words,
  counted in the final prompt (ties at the third place are broken by turning an occurrence of
  the tied words into noise).
* ``qa_1`` (SQuAD) and ``qa_2`` (HotpotQA) - a question and documents ``Document {i}:\n...``:
  the question's own documents (SQuAD: its paragraph, then the other paragraphs of its article;
  HotpotQA: all ten paragraphs of the distractor setting, ``title\ntext``) and random documents
  of the rest of the data set up to the length, in random order. Questions are taken in the
  file's order (unanswerable SQuAD questions skipped), as RULER does. Local copies:
  ``squad_path`` (SQuAD 2.0 ``dev-v2.0.json``) and ``hotpotqa_path`` (HotpotQA
  ``hotpot_dev_distractor_v1.json``, or the Hugging Face ``hotpot_qa`` distractor layout).

Scoring is RULER's: ``string_match_all`` (the fraction of references found, case-insensitive
substring) for every task but QA, ``string_match_part`` (any reference found) for QA, on the
post-processed answer region of the output (after ``</think>``). Per-task parameters can be
overridden: ``task_params: {cwe: {freq_cw: 20}}``.
"""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from data_gen.base import Draft, Piece
from data_gen.fit import PromptRenderer, build_row
from data_gen.text import cities, first_names, haystack, number_str, uuid_str, words
from recallm.errors import RecallmError
from recallm.eval.benchmarks.base import Benchmark, BenchmarkOptions, EvalTask
from recallm.eval.scoring import answer_region, ruler_postprocess, string_match_all, string_match_part
from recallm.eval.types import Example, Generation, Score, Spec

__all__ = [
    "Ruler",
    "RULER_TASKS",
    "NOISE",
    "NEEDLE",
    "NIAH_TEMPLATE",
    "VT_TEMPLATE",
    "CWE_TEMPLATE",
    "FWE_TEMPLATE",
    "QA_TEMPLATE",
    "niah_template",
    "load_essays",
    "load_squad",
    "load_hotpotqa",
]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {kind} for {key} is: {value}."
ANSWER_LINE = "Give the answer on a final line that starts with `Answer:`."

# RULER's task templates (scripts/data/synthetic/constants.py), without the answer prefixes: the paper prompts every
# task through the model's chat template (§5.2), where the answer is the model's own turn. ``{context}`` is filled by
# the fitted haystack; the other fields before fitting.
NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} "
    "mentioned in the provided text?"
)
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: "
    "Find all variables that are assigned the value {query} in the text above."
)
VT_ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the "
    "value {query}, they are: "
)
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
    "appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
)
CWE_ANSWER_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What "
    "are the three most frequently appeared words in the above coded text?"
)
QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given documents. "
    "Only give me the answer and do not output any other words.\n\nQuestion: {query}"
)
#: RULER's tokens_to_generate per task kind: the cell's prompt holds at most its length minus this
TOKENS_TO_GENERATE = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}


def niah_template(num_queries: int, num_values: int) -> str:
    """RULER's NIAH template, made singular as ``niah.py`` does when one value is asked."""
    if num_queries * num_values != 1:
        return NIAH_TEMPLATE
    text = NIAH_TEMPLATE.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")
    return text


def fill(template: str, **fields: Any) -> str:
    """``template`` with every field but ``{context}`` filled (``str.format`` semantics)."""
    return template.format(context="{context}", **fields)


#: task -> (kind, default parameters); RULER's synthetic.yaml settings
RULER_TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "niah_single_1": ("niah", {"haystack": "noise", "key_type": "words", "value_type": "numbers"}),
    "niah_single_2": ("niah", {"haystack": "essay", "key_type": "words", "value_type": "numbers"}),
    "niah_single_3": ("niah", {"haystack": "essay", "key_type": "words", "value_type": "uuids"}),
    "niah_multikey_1": ("niah", {"haystack": "essay", "key_type": "words", "value_type": "numbers", "num_keys": 4}),
    "niah_multikey_2": ("niah", {"haystack": "needle", "key_type": "words", "value_type": "numbers"}),
    "niah_multikey_3": ("niah", {"haystack": "needle", "key_type": "uuids", "value_type": "uuids"}),
    "niah_multivalue": ("niah", {"haystack": "essay", "key_type": "words", "value_type": "numbers", "num_values": 4}),
    "niah_multiquery": (
        "niah",
        {"haystack": "essay", "key_type": "words", "value_type": "numbers", "num_keys": 4, "num_queries": 4},
    ),
    "vt": ("vt", {"num_chains": 1, "num_hops": 4}),
    "cwe": ("cwe", {"num_cw": 10, "freq_cw": None, "freq_ucw": None}),
    "fwe": ("fwe", {"alpha": 2.0, "vocab_size": None, "word_length": 6}),
    "qa_1": ("qa", {"dataset": "squad"}),
    "qa_2": ("qa", {"dataset": "hotpotqa"}),
}
_KIND_DEFAULTS = {
    "niah": {
        "haystack": "essay",
        "key_type": "words",
        "value_type": "numbers",
        "num_keys": 1,
        "num_values": 1,
        "num_queries": 1,
    },
    "vt": {"num_chains": 1, "num_hops": 4},
    "cwe": {"num_cw": 10, "freq_cw": None, "freq_ucw": None},
    "fwe": {"alpha": 2.0, "vocab_size": None, "word_length": 6},
    "qa": {"dataset": "squad"},
}
_CHOICES = {
    "haystack": ("noise", "essay", "needle"),
    "key_type": ("words", "numbers", "uuids"),
    "value_type": ("numbers", "uuids"),
    "dataset": ("squad", "hotpotqa"),
}
FWE_NOISE = "..."  # freq_words_extraction.py's noise word (its template says '....')
GENERATED_HAYSTACK = "generated English-word sentences (offline default; RULER uses Paul Graham's essays)"
_QA_SOURCES = {
    "squad": (
        "squad_path",
        "SQuAD 2.0 (RULER qa_1)",
        "SQuAD 2.0's dev-v2.0.json (https://rajpurkar.github.io/SQuAD-explorer/; RULER's "
        "download_qa_dataset.sh fetches it); set eval.benchmarks.ruler.squad_path, or drop qa_1 from tasks",
    ),
    "hotpotqa": (
        "hotpotqa_path",
        "HotpotQA (RULER qa_2)",
        "HotpotQA's hotpot_dev_distractor_v1.json (https://hotpotqa.github.io/; RULER's download_qa_dataset.sh "
        "fetches it); set eval.benchmarks.ruler.hotpotqa_path, or drop qa_2 from tasks",
    ),
}
_ESSAY_HINT = (
    "RULER's PaulGrahamEssays.json (scripts/data/synthetic/json/download_paulgraham_essay.py of NVIDIA/RULER), "
    "a .txt file or a directory of .txt files; or haystack_path=null for the generated haystack"
)
_CACHE: dict[tuple[str, str], Any] = {}  # loaded essays and QA sets, per path
#: options added after runs were fingerprinted: left out of the fingerprint while unset
_NEW_OPTIONS = ("haystack_path", "squad_path", "hotpotqa_path")


def load_essays(path: str) -> list[str]:
    """The sentences of the essays at ``path`` (see module doc), cached per path."""
    from pathlib import Path

    from data_gen.datasets.io import check_path
    from recallm.eval.scoring import split_sentences

    key = ("essay", str(Path(path).expanduser().resolve()))
    if key in _CACHE:
        return _CACHE[key]
    p = check_path(path, "the essay haystack", _ESSAY_HINT)
    files = sorted(p.rglob("*.txt")) if p.is_dir() else [p]
    texts = []
    for file in files:
        try:
            raw = file.read_text(encoding="utf-8")
            if file.suffix.lower() == ".json":
                import json

                raw = json.loads(raw)["text"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise RecallmError(
                f"the essay haystack: cannot read {file} ({type(exc).__name__}); {_ESSAY_HINT}"
            ) from None
        texts.append(str(raw))
    sentences = [s.strip() for s in split_sentences(" ".join(" ".join(texts).split())) if s.strip()]
    if len(sentences) < 2:
        raise RecallmError(f"the essay haystack: {p} holds no text; {_ESSAY_HINT}")
    _CACHE[key] = sentences
    return sentences


def load_squad(path: str) -> tuple[list[dict[str, Any]], list[str]]:
    """RULER's reading of SQuAD: (answerable questions in file order with their paragraph and the
    other paragraphs of their article, the sorted unique paragraphs)."""
    from data_gen.datasets.io import load_records

    name, hint = _QA_SOURCES["squad"][1:]
    key = ("squad", str(path))
    if key in _CACHE:
        return _CACHE[key]
    articles = load_records(path, dataset=name, hint=hint, split="dev")
    try:
        docs = sorted({p["context"] for a in articles for p in a["paragraphs"]})
        index = {c: i for i, c in enumerate(docs)}
        qas = []
        for article in articles:
            own = [index[p["context"]] for p in article["paragraphs"]]
            for para in article["paragraphs"]:
                for qa in para["qas"]:
                    answers = [a["text"] for a in qa.get("answers") or []]
                    if qa.get("is_impossible") or not answers:
                        continue
                    doc = index[para["context"]]
                    qas.append({"query": qa["question"], "answers": answers, "docs": [doc],
                                "more": [i for i in own if i != doc]})  # fmt: skip
    except (KeyError, TypeError) as exc:
        raise RecallmError(f"{name}: {path} is not in SQuAD's layout (missing {exc}); {hint}") from None
    if not qas:
        raise RecallmError(f"{name}: no answerable question in {path}; {hint}")
    _CACHE[key] = (qas, docs)
    return qas, docs


def load_hotpotqa(path: str) -> tuple[list[dict[str, Any]], list[str]]:
    """RULER's reading of HotpotQA: (questions in file order with all their paragraphs, the
    sorted unique paragraphs ``title\ntext``)."""
    from data_gen.datasets.io import load_records

    name, hint = _QA_SOURCES["hotpotqa"][1:]
    key = ("hotpotqa", str(path))
    if key in _CACHE:
        return _CACHE[key]
    records = load_records(path, dataset=name, hint=hint, split="dev")

    def paragraphs(context) -> list[str]:
        if isinstance(context, str):
            import json

            context = json.loads(context)
        if isinstance(context, dict):  # the Hugging Face layout
            context = list(zip(context.get("title") or [], context.get("sentences") or [], strict=False))
        return [f"{title}\n{''.join(sentences)}" for title, sentences in context]

    try:
        items = [(r["question"], [str(r["answer"])], paragraphs(r["context"])) for r in records]
    except (KeyError, TypeError, ValueError) as exc:
        raise RecallmError(
            f"{name}: {path} is not in HotpotQA's layout ({type(exc).__name__}: {exc}); {hint}"
        ) from None
    docs = sorted({d for _, _, ds in items for d in ds})
    index = {d: i for i, d in enumerate(docs)}
    qas = [{"query": q, "answers": a, "docs": [index[d] for d in ds], "more": []} for q, a, ds in items if ds]
    if not qas:
        raise RecallmError(f"{name}: no question in {path}; {hint}")
    _CACHE[key] = (qas, docs)
    return qas, docs


def _fresh(make, used: set[str]) -> str:
    value = make()
    while value in used:
        value = make()
    used.add(value)
    return value


def _cwe_vocabulary() -> list[str]:
    pool = {w.lower() for w in words()} | {n.lower() for n in first_names()} | {c.lower() for c in cities()}
    return sorted(w for w in pool if w.isalpha() and len(w) >= 4)  # short words would match by accident


@dataclass(frozen=True)
class RulerOptions(BenchmarkOptions):
    """The schema of ``eval.benchmarks.ruler`` (``Ruler``'s options)."""

    tasks: Any = field(default_factory=lambda: list(RULER_TASKS))
    """a task name or a list of them"""
    task_params: dict[str, Any] = field(default_factory=dict)
    """per task: overrides of its parameters (checked against the task's table, ``_check_params``)"""
    haystack_path: str | None = None
    squad_path: str | None = None
    hotpotqa_path: str | None = None
    answer_line: bool = False
    """append ``Give the answer on a final line that starts with `Answer:`.`` to RULER's prompts (the reasoning
    format's answer line; RULER's own templates end with the question)"""


class Ruler(Benchmark):
    """See module doc. Options: ``tasks`` (default: all thirteen), ``task_params`` (per-task
    overrides), ``haystack_path`` (the essays; null: generated), ``squad_path``, ``hotpotqa_path``."""

    name = "ruler"
    min_length = 256
    Options = RulerOptions

    def __init__(self, cfg, settings) -> None:
        super().__init__(cfg, settings)
        tasks = self.cfg["tasks"]
        self.tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        unknown = [t for t in self.tasks if t not in RULER_TASKS]
        if unknown or not self.tasks:
            raise RecallmError(f"ruler: unknown tasks {unknown}; known: {', '.join(RULER_TASKS)}")
        overrides = dict(self.cfg["task_params"] or {})
        bad = [t for t in overrides if t not in RULER_TASKS]
        if bad:
            raise RecallmError(f"ruler.task_params: unknown tasks {bad}; known: {', '.join(RULER_TASKS)}")
        self.params: dict[str, tuple[str, dict[str, Any]]] = {}
        for task in self.tasks:
            kind, defaults = RULER_TASKS[task]
            params = {**_KIND_DEFAULTS[kind], **defaults}
            extra = dict(overrides.get(task) or {})
            unknown_keys = sorted(set(extra) - set(params))
            if unknown_keys:
                raise RecallmError(f"ruler.task_params.{task}: unknown keys {unknown_keys}; known: {sorted(params)}")
            params.update(extra)
            _check_params(task, kind, params)
            self.params[task] = (kind, params)

    def describe(self) -> dict[str, Any]:
        out = {**super().describe(), "params": {t: p for t, (_, p) in self.params.items()}, "prompts": "ruler-2"}
        for key in _NEW_OPTIONS:
            if out.get(key) is None:
                out.pop(key, None)
        return out

    def specs(self) -> list[Spec]:
        from data_gen.datasets.io import check_path

        if self.per_cell is None:
            raise RecallmError(f"benchmark {self.name}: per_cell is required")
        for task in self.tasks:
            kind, params = self.params[task]
            if kind == "qa":
                option, name, hint = _QA_SOURCES[params["dataset"]]
                check_path(self.cfg[option], f"ruler {task}: {name}", hint)
        if self.cfg["haystack_path"] is not None:
            check_path(self.cfg["haystack_path"], "ruler: the essay haystack", _ESSAY_HINT)
        return [Spec(n, self.name, i, task) for task in self.tasks for n in self.lengths for i in range(self.per_cell)]

    @property
    def haystack_source(self) -> str:
        path = self.cfg["haystack_path"]
        return f"Paul Graham essays from {path}" if path else GENERATED_HAYSTACK

    def target(self, length: int) -> int:
        """RULER's cell of ``length`` tokens: the prompt and the task's ``tokens_to_generate`` fit in
        it (the suite's ``fit_lengths`` does not apply)."""
        return length

    def build(self, spec: Spec, renderer: PromptRenderer, budget: int | None = None) -> Example:
        """The example of ``spec``, its prompt fitted to ``budget`` tokens (default: the cell's length
        minus RULER's ``tokens_to_generate`` for the task)."""
        kind, params = self.params[spec.task]
        rng = self.rng(spec.task, spec.length, spec.index)
        target = budget if budget is not None else spec.length - TOKENS_TO_GENERATE[kind]
        self._renderer = renderer
        reference: dict[str, Any] = {"metric": "part" if kind == "qa" else "all"}
        if kind == "fwe":
            example = self._fwe(spec, params, rng, renderer, target)
            example.reference.update(reference)
            return example
        if kind == "qa":
            draft = self._qa(params, rng, spec.index)
        else:
            draft = getattr(self, f"_{kind}")(params, rng, target)
        if self.cfg["answer_line"]:
            draft.template += " " + ANSWER_LINE
        task = EvalTask(f"ruler/{spec.task}", "retrieval", min_tokens=self.min_length)
        row = build_row(task, draft, renderer, target, rng, seed=rng.getrandbits(63), tolerance=self.settings.tolerance)
        reference["answers"] = [str(a) for a in row.ground_truth["answers"]]
        if params.get("haystack") == "essay":
            reference["haystack"] = "essay" if self.cfg["haystack_path"] else "generated"
        return self.example_from_row(spec, row, reference)

    def protocol(self) -> dict[str, Any]:
        """How this run differs from RULER's protocol, as named options (the report's header)."""
        out: dict[str, Any] = {}
        if self.cfg["answer_line"]:
            out["answer_line"] = "on (the reasoning format's final Answer: line)"
        essay = [t for t in self.tasks if self.params[t][1].get("haystack") == "essay"]
        if essay and not self.cfg["haystack_path"]:
            out["haystack"] = "generated offline (RULER: Paul Graham's essays)"
        out["vocabulary"] = "data_gen's English words (RULER: wonderwords)"
        return out

    def summarize(self, records) -> dict[str, Any]:
        essay = [t for t in self.tasks if self.params[t][1].get("haystack") == "essay"]
        out: dict[str, Any] = {"haystack": self.haystack_source, "essay_tasks": essay} if essay else {}
        return {**out, "protocol": self.protocol()}

    def score(self, example: Example, generation: Generation, followup: Generation | None) -> Score:
        prediction = ruler_postprocess(answer_region(generation.text, self.settings.answer_region))
        answers = example.reference["answers"]
        metric = string_match_all if example.reference.get("metric", "all") == "all" else string_match_part
        value = metric(prediction, answers)
        return Score(score=value, correct=value == 1.0, answer=prediction or None, metrics={})

    # --- drafts ---------------------------------------------------------------------------------

    def _niah(self, p: Mapping[str, Any], rng: random.Random, length: int) -> Draft:
        """RULER's ``niah.py``: needles in noise (lines), other needles (lines) or essay sentences."""
        kind = "numbers" if p["value_type"] == "numbers" else "uuids"
        used_keys: set[str] = set()
        used_values: set[str] = set()

        def key() -> str:
            if p["key_type"] == "numbers":
                return _fresh(lambda: number_str(rng, 7), used_keys)
            if p["key_type"] == "uuids":
                return _fresh(lambda: uuid_str(rng), used_keys)
            vocab = words()
            return _fresh(
                lambda: f"{vocab[rng.randrange(len(vocab))].lower()}-{vocab[rng.randrange(len(vocab))].lower()}",
                used_keys,
            )

        def value() -> str:
            return _fresh(lambda: number_str(rng, 7) if kind == "numbers" else uuid_str(rng), used_values)

        keys = [key() for _ in range(p["num_keys"])]
        queried = keys[: p["num_queries"]]
        placed, answers = [], []
        for i, k in enumerate(keys):
            for _ in range(p["num_values"]):
                v = value()
                placed.append(Piece(NEEDLE.format(kind=kind, key=k, value=v), gold=i < len(queried), meta={"key": k}))
                if i < len(queried):
                    answers.append(v)
        if p["haystack"] == "noise":
            stream: Iterator[Piece] = (Piece(NOISE) for _ in itertools.count())
            separator = "\n"
        elif p["haystack"] == "essay":
            if self.cfg["haystack_path"]:
                sentences = load_essays(str(self.cfg["haystack_path"]))
                stream = (Piece(sentences[i % len(sentences)]) for i in itertools.count())
            else:
                stream = (Piece(s) for s in haystack(rng))
            separator = " "
        else:
            stream = (Piece(NEEDLE.format(kind=kind, key=key(), value=value())) for _ in itertools.count())
            separator = "\n"
        query = queried[0] if len(queried) == 1 else ", ".join(queried[:-1]) + ", and " + queried[-1]
        singular = p["num_queries"] * p["num_values"] == 1
        template = fill(niah_template(p["num_queries"], p["num_values"]), type_needle_v=kind[:-1] if singular else kind,
                        query=query)  # fmt: skip
        return Draft(
            instruction="",
            question=template.split("{context}\n", 1)[1],
            placed=placed,
            distractors=stream,
            answers=answers,
            augmentations={"haystack": p["haystack"]},
            separator=separator,
            template=template,
        )

    def _qa(self, p: Mapping[str, Any], rng: random.Random, index: int) -> Draft:
        option = _QA_SOURCES[p["dataset"]][0]
        loader = load_squad if p["dataset"] == "squad" else load_hotpotqa
        qas, docs = loader(str(self.cfg[option]))
        qa = qas[index % len(qas)]
        own = set(qa["docs"]) | set(qa["more"])
        more = list(qa["more"])
        rng.shuffle(more)

        def others() -> Iterator[Piece]:
            yield from (Piece(docs[i], meta={"doc": docs[i]}) for i in more)  # the article's other paragraphs first
            if len(own) >= len(docs):
                return
            while True:  # then random documents of the rest of the data set
                i = rng.randrange(len(docs))
                if i not in own:
                    yield Piece(docs[i], meta={"doc": docs[i]})

        shuffle_seed = rng.getrandbits(63)

        def numbered(pieces: list[Piece]) -> dict[str, Any]:
            # the documents in random order (the question's own ones included), numbered from 1; a piece keeps
            # its document in meta (fitting may render several times)
            texts = [piece.meta["doc"] for piece in pieces]
            random.Random(shuffle_seed).shuffle(texts)
            for i, (piece, text) in enumerate(zip(pieces, texts, strict=True)):
                piece.text = f"Document {i + 1}:\n{text}"
            return {}

        return Draft(
            instruction="",
            question=f"Question: {qa['query']}",
            placed=[Piece(docs[i], gold=True, meta={"doc": docs[i]}) for i in qa["docs"]],
            distractors=others(),
            answers=list(qa["answers"]),
            augmentations={"dataset": p["dataset"]},
            separator="\n\n",
            evidence=False,
            finalize=numbered,
            template=fill(QA_TEMPLATE, query=qa["query"]),
        )

    def _vt_chain(
        self, rng: random.Random, hops: int, width: int, value: str, used: set[str]
    ) -> tuple[list[str], list[str]]:
        names = [_fresh(lambda: "".join(rng.choices(string.ascii_uppercase, k=width)), used) for _ in range(hops + 1)]
        # variable_tracking.py: "VAR A = 12345", then "VAR B = VAR A " (its trailing space kept)
        return names, [f"VAR {names[0]} = {value}"] + [
            f"VAR {names[h]} = VAR {names[h - 1]} " for h in range(1, len(names))
        ]

    def _vt_example(self, p: Mapping[str, Any], rng: random.Random) -> str:
        """RULER's one-shot VT example: a chain of 3-letter variables (at most 10 hops) in as many
        noise lines as fit 500 tokens, the answer prefix and the answer; then its names and value
        are redrawn (``randomize_icl``)."""
        hops = min(10, int(p["num_hops"]))
        names, chain = self._vt_chain(rng, hops, 3, "12345", set())

        def text(n: int) -> str:
            lines = [NOISE] * n
            positions = sorted(rng.sample(range(n), len(chain))) if n >= len(chain) else list(range(len(chain)))
            for j, (at, statement) in enumerate(zip(positions, chain, strict=True)):
                lines.insert(at + j, statement)
            head = VT_TEMPLATE + VT_ANSWER_PREFIX
            return head.format(context="\n".join(lines), query="12345", num_v=hops + 1)

        lo, hi = 5, 5
        while self._renderer.count([text(hi * 2)])[0] <= 500 and hi < 4096:
            hi *= 2
        hi *= 2
        while lo < hi - 1:  # the most noise lines that keep the example within 500 tokens
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self._renderer.count([text(mid)])[0] <= 500 else (lo, mid)
        example = text(lo) + " " + " ".join(names) + "\n"
        fresh = ["".join(rng.choices(string.ascii_uppercase, k=3)) for _ in names]
        for old, new in zip(names, fresh, strict=True):
            example = example.replace(old, new)
        return example.replace("12345", number_str(rng, 5))

    def _vt(self, p: Mapping[str, Any], rng: random.Random, length: int) -> Draft:
        """RULER's ``variable_tracking.py`` (noise haystack): chains in noise lines, in order, after the
        one-shot example."""
        used: set[str] = set()
        values: set[str] = set()
        chains = []
        for _ in range(p["num_chains"]):
            value = _fresh(lambda: number_str(rng, 5), values)
            names, statements = self._vt_chain(rng, int(p["num_hops"]), 5, value, used)
            chains.append((value, names, statements))
        placed = [
            Piece(text, gold=c == 0, meta={"chain": c})
            for c, (_, _, statements) in enumerate(chains)
            for text in statements
        ]

        def in_order(pieces: list[Piece]) -> dict[str, Any]:
            for c, (_, _, statements) in enumerate(chains):
                slots = [piece for piece in pieces if piece.meta.get("chain") == c]
                for piece, text in zip(slots, statements, strict=True):
                    piece.text = text
            return {}

        value, names, _ = chains[0]
        example = self._vt_example(p, rng)
        return Draft(
            instruction="",
            question=f"Question: Find all variables that are assigned the value {value} in the text above.",
            placed=placed,
            distractors=(Piece(NOISE) for _ in itertools.count()),
            answers=list(names),
            augmentations={"num_chains": p["num_chains"], "num_hops": p["num_hops"]},
            separator="\n",
            finalize=in_order,
            template=example + "\n" + fill(VT_TEMPLATE, query=value),
        )

    def _cwe(self, p: Mapping[str, Any], rng: random.Random, length: int) -> Draft:
        """RULER's ``common_words_extraction.py``: a numbered word list after one worked example
        (40 words, 10 of them 10 times and the others 3; 20 words, 3 and 1, below 4K)."""
        small = length + TOKENS_TO_GENERATE["cwe"] < 4096
        freq_cw = p["freq_cw"] if p["freq_cw"] is not None else (6 if small else 30)
        freq_ucw = p["freq_ucw"] if p["freq_ucw"] is not None else (1 if small else 3)
        if freq_cw <= freq_ucw:
            raise RecallmError(f"ruler cwe: freq_cw ({freq_cw}) must be above freq_ucw ({freq_ucw})")
        vocab = _cwe_vocabulary()
        n_cw = p["num_cw"]
        shot_words, shot_cw, shot_ucw = (20, 3, 1) if small else (40, 10, 3)
        shot = rng.sample(vocab, shot_words)
        shot_list = shot[:n_cw] * shot_cw + shot[n_cw:] * shot_ucw
        rng.shuffle(shot_list)
        example = (
            (CWE_TEMPLATE + CWE_ANSWER_PREFIX).format(
                context=" ".join(f"{i + 1}. {w}" for i, w in enumerate(shot_list))
            )
            + " "
            + " ".join(f"{i + 1}. {w}" for i, w in enumerate(shot[:n_cw]))
        )
        rng.shuffle(vocab)
        common = vocab[:n_cw]
        rest = vocab[n_cw:]

        def uncommon() -> Iterator[Piece]:
            compounds = (f"{a}-{b}" for a, b in itertools.product(rest, repeat=2) if a != b)
            for word in itertools.chain(rest, compounds):
                for _ in range(freq_ucw):
                    yield Piece(word, meta={"word": word})

        shuffle_seed = rng.getrandbits(63)

        def numbered(pieces: list[Piece]) -> dict[str, Any]:
            # a piece keeps its own word (fitting may drop it); only the order in which words are shown is shuffled
            order = [piece.meta["word"] for piece in pieces]
            random.Random(shuffle_seed).shuffle(order)
            for i, (piece, word) in enumerate(zip(pieces, order, strict=True)):
                piece.text = f"{i + 1}. {word}"
            return {}

        return Draft(
            instruction="",
            question=f"Question: What are the {n_cw} most common words in the above list?",
            placed=[Piece(w, meta={"word": w}) for w in common for _ in range(freq_cw)],
            distractors=uncommon(),
            answers=list(common),
            augmentations={"freq_cw": freq_cw, "freq_ucw": freq_ucw},
            separator=" ",
            evidence=False,
            finalize=numbered,
            template=example + "\n" + CWE_TEMPLATE,
        )

    def _fwe(
        self, spec: Spec, p: Mapping[str, Any], rng: random.Random, renderer: PromptRenderer, budget: int
    ) -> Example:
        """RULER's ``freq_words_extraction.py``: a vocabulary of ``budget // 50`` coded words (the
        first one the noise ``...``), word ``k`` repeated ``int(n k^-alpha / zeta(alpha))`` times,
        shuffled; ``n`` the most words that fit; the answer the three words after the noise."""
        alpha = float(p["alpha"])
        size = int(p["vocab_size"]) if p["vocab_size"] is not None else max(4, budget // 50)
        used: set[str] = set()
        vocab = sorted(_fresh(lambda: "".join(rng.choices(string.ascii_lowercase, k=p["word_length"])), used)
                       for _ in range(size))  # fmt: skip
        rng.shuffle(vocab)
        vocab[0] = FWE_NOISE
        zeta = sum(k**-alpha for k in range(1, 100_000)) + 100_000 ** (1 - alpha) / (alpha - 1)
        order_seed = rng.getrandbits(63)

        def content(n: int) -> str:
            words_ = [w for k, w in enumerate(vocab, 1) for _ in range(int(n * k**-alpha / zeta))]
            random.Random(order_seed).shuffle(words_)
            text = FWE_TEMPLATE.format(context=" ".join(words_))
            return text + " " + ANSWER_LINE if self.cfg["answer_line"] else text

        def tokens(n: int) -> int:
            return renderer.length(renderer.render(content(n))[0])

        lo, hi = 0, max(8, budget // max(1, p["word_length"]))
        while tokens(hi) <= budget:
            lo, hi = hi, hi * 2
        while lo < hi - 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if tokens(mid) <= budget else (lo, mid)
        text = content(lo)
        if lo < 4 or int(lo * 4**-alpha / zeta) < 1:
            raise RecallmError(
                f"task ruler/fwe cannot reach a prompt of {budget} tokens: RULER's coded text needs more room"
            )
        prompt, _ = renderer.render(text)
        return Example(spec, renderer.messages(text), prompt, renderer.length(prompt), {"answers": vocab[1:4]})


def _check_params(task: str, kind: str, params: Mapping[str, Any]) -> None:
    def positive(name: str) -> None:
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RecallmError(f"ruler.task_params.{task}.{name} must be a positive integer, got {value!r}")

    for name, allowed in _CHOICES.items():
        if name in params and params[name] not in allowed:
            raise RecallmError(f"ruler.task_params.{task}.{name} must be one of {allowed}, got {params[name]!r}")
    if kind == "niah":
        for name in ("num_keys", "num_values", "num_queries"):
            positive(name)
        if params["num_queries"] > params["num_keys"]:
            raise RecallmError(f"ruler.task_params.{task}: num_queries cannot exceed num_keys")
    elif kind == "vt":
        positive("num_chains")
        positive("num_hops")
    elif kind == "cwe":
        positive("num_cw")
        for name in ("freq_cw", "freq_ucw"):
            if params[name] is not None:
                positive(name)
    elif kind == "fwe":
        if params["vocab_size"] is not None:
            positive("vocab_size")
        positive("word_length")
        if (params["vocab_size"] is not None and params["vocab_size"] < 4) or not float(params["alpha"]) > 1:
            raise RecallmError(f"ruler.task_params.{task}: vocab_size must be >= 4 (or null) and alpha > 1")
