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
from collections import Counter
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

__all__ = ["Ruler", "RULER_TASKS", "NOISE", "NEEDLE", "load_essays", "load_squad", "load_hotpotqa"]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {kind} for {key} is: {value}."
_ANSWER_LINE = "Give the answer on a final line that starts with `Answer:`."

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
    "fwe": ("fwe", {"alpha": 2.0, "vocab_size": 1000, "word_length": 6}),
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
    "fwe": {"alpha": 2.0, "vocab_size": 1000, "word_length": 6},
    "qa": {"dataset": "squad"},
}
_CHOICES = {
    "haystack": ("noise", "essay", "needle"),
    "key_type": ("words", "numbers", "uuids"),
    "value_type": ("numbers", "uuids"),
    "dataset": ("squad", "hotpotqa"),
}
FWE_NOISE = "...."
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
        out = {**super().describe(), "params": {t: p for t, (_, p) in self.params.items()}}
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

    def build(self, spec: Spec, renderer: PromptRenderer) -> Example:
        kind, params = self.params[spec.task]
        rng = self.rng(spec.task, spec.length, spec.index)
        target = self.target(spec.length)
        if kind == "qa":
            draft = self._qa(params, rng, spec.index)
        else:
            draft = getattr(self, f"_{kind}")(params, rng, target)
        task = EvalTask(f"ruler/{spec.task}", "retrieval", min_tokens=self.min_length)
        row = build_row(task, draft, renderer, target, rng, seed=rng.getrandbits(63), tolerance=self.settings.tolerance)
        answers = [str(a) for a in row.ground_truth["answers"]]
        reference = {"answers": answers, "metric": "part" if kind == "qa" else "all"}
        if params.get("haystack") == "essay":
            reference["haystack"] = "essay" if self.cfg["haystack_path"] else "generated"
        return self.example_from_row(spec, row, reference)

    def summarize(self, records) -> dict[str, Any]:
        essay = [t for t in self.tasks if self.params[t][1].get("haystack") == "essay"]
        return {"haystack": self.haystack_source, "essay_tasks": essay} if essay else {}

    def score(self, example: Example, generation: Generation, followup: Generation | None) -> Score:
        prediction = ruler_postprocess(answer_region(generation.text, self.settings.answer_region))
        answers = example.reference["answers"]
        metric = string_match_all if example.reference.get("metric", "all") == "all" else string_match_part
        value = metric(prediction, answers)
        return Score(score=value, correct=value == 1.0, answer=prediction or None, metrics={})

    # --- drafts ---------------------------------------------------------------------------------

    def _niah(self, p: Mapping[str, Any], rng: random.Random, length: int) -> Draft:
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
            separator = " "
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
        return Draft(
            instruction=(
                f"Some special magic {kind} are hidden within the following text. Make sure to memorize them. "
                f"I will quiz you about the {kind} afterwards."
            ),
            question=f"What are all the special magic {kind} for {query} mentioned in the provided text? {_ANSWER_LINE}",
            placed=placed,
            distractors=stream,
            answers=answers,
            augmentations={"haystack": p["haystack"]},
            separator=separator,
            question_position="end",
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
            instruction="Answer the question based on the given documents.",
            question=f"Question: {qa['query']} {_ANSWER_LINE}",
            placed=[Piece(docs[i], gold=True, meta={"doc": docs[i]}) for i in qa["docs"]],
            distractors=others(),
            answers=list(qa["answers"]),
            augmentations={"dataset": p["dataset"]},
            header="The following are given documents.\n\n",
            footer="\n\nAnswer the question based on the given documents.",
            separator="\n\n",
            question_position="end",
            evidence=False,
            finalize=numbered,
        )

    def _vt(self, p: Mapping[str, Any], rng: random.Random, length: int) -> Draft:
        used: set[str] = set()
        values: set[str] = set()
        chains = []
        for _ in range(p["num_chains"]):
            value = _fresh(lambda: number_str(rng, 5), values)
            names = [
                _fresh(lambda: "".join(rng.choices(string.ascii_uppercase, k=5)), used)
                for _ in range(p["num_hops"] + 1)
            ]
            statements = [f"VAR {names[0]} = {value}."] + [
                f"VAR {names[h]} = VAR {names[h - 1]}." for h in range(1, len(names))
            ]
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
        return Draft(
            instruction="Memorize and track the chain(s) of variable assignment hidden in the following text.",
            question=f"Question: Find all variables that are assigned the value {value} in the text above. {_ANSWER_LINE}",
            placed=placed,
            distractors=(Piece(NOISE) for _ in itertools.count()),
            answers=list(names),
            augmentations={"num_chains": p["num_chains"], "num_hops": p["num_hops"]},
            separator=" ",
            question_position="end",
            finalize=in_order,
        )

    def _cwe(self, p: Mapping[str, Any], rng: random.Random, length: int) -> Draft:
        freq_cw = p["freq_cw"] if p["freq_cw"] is not None else (30 if length >= 4096 else 6)
        freq_ucw = p["freq_ucw"] if p["freq_ucw"] is not None else (3 if length >= 4096 else 1)
        if freq_cw <= freq_ucw:
            raise RecallmError(f"ruler cwe: freq_cw ({freq_cw}) must be above freq_ucw ({freq_ucw})")
        vocab = _cwe_vocabulary()
        rng.shuffle(vocab)
        common = vocab[: p["num_cw"]]
        rest = vocab[p["num_cw"] :]

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
            instruction=(
                "Below is a numbered list of words. In these words, some appear more often than others. "
                "Memorize the ones that appear most often."
            ),
            question=f"Question: What are the {p['num_cw']} most common words in the above list? {_ANSWER_LINE}",
            placed=[Piece(w, meta={"word": w}) for w in common for _ in range(freq_cw)],
            distractors=uncommon(),
            answers=list(common),
            augmentations={"freq_cw": freq_cw, "freq_ucw": freq_ucw},
            separator=" ",
            question_position="end",
            evidence=False,
            finalize=numbered,
        )

    def _fwe(self, p: Mapping[str, Any], rng: random.Random, length: int) -> Draft:
        import numpy as np

        used: set[str] = set()
        vocab = [FWE_NOISE] + [
            _fresh(lambda: "".join(rng.choices(string.ascii_lowercase, k=p["word_length"])), used)
            for _ in range(p["vocab_size"])
        ]
        weights = np.arange(1, len(vocab) + 1, dtype=np.float64) ** -float(p["alpha"])
        weights /= weights.sum()
        np_rng = np.random.default_rng(rng.getrandbits(64))
        rank = {word: i for i, word in enumerate(vocab)}

        def stream() -> Iterator[Piece]:
            while True:
                for i in np_rng.choice(len(vocab), size=1024, p=weights).tolist():
                    yield Piece(vocab[i])

        def top_three(pieces: list[Piece]) -> dict[str, Any]:
            counts = Counter(piece.text for piece in pieces if piece.text != FWE_NOISE)
            ranked = sorted(counts, key=lambda w: (-counts[w], rank[w]))
            if len(ranked) < 4:
                raise RecallmError("ruler fwe: the prompt holds fewer than 4 distinct coded words")
            top, third = ranked[:3], counts[ranked[2]]
            tied = {w for w in ranked[3:] if counts[w] == third}
            for word in tied:  # a tie at the third place: one occurrence of each tied word becomes noise
                piece = next(piece for piece in reversed(pieces) if piece.text == word)
                piece.text = FWE_NOISE
            return {"answers": top}

        return Draft(
            instruction=(
                "Read the following coded text and track the frequency of each coded word. "
                "Find the three most frequently appeared coded words."
            ),
            question=(
                "Question: Do not provide any explanation. Please ignore the dots '....'. "
                f"What are the three most frequently appeared words in the above coded text? {_ANSWER_LINE}"
            ),
            placed=[],
            distractors=stream(),
            answers=[],
            augmentations={"alpha": p["alpha"]},
            separator=" ",
            question_position="end",
            keep_order=True,
            evidence=False,
            finalize=top_three,
        )


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
        positive("vocab_size")
        positive("word_length")
        if params["vocab_size"] < 4 or not float(params["alpha"]) > 0:
            raise RecallmError(f"ruler.task_params.{task}: vocab_size must be >= 4 and alpha > 0")
