"""The RULER tasks that can be generated offline (Hsieh et al., 2024; NVIDIA/RULER).

Eleven of RULER's thirteen tasks (the two QA tasks need SQuAD / HotpotQA), with RULER's task
definitions and default parameters, written here from its description; prompts are fitted to the
target length with the model's tokenizer and chat template (``data_gen.fit``):

* ``niah_single_1/2/3``, ``niah_multikey_1/2/3``, ``niah_multivalue``, ``niah_multiquery`` -
  needles ``One of the special magic {numbers|uuids} for {key} is: {value}.`` in a haystack of
  ``noise`` (one repeated paragraph), ``essay`` (English-word sentences from ``data_gen.text``:
  RULER's Paul Graham essays cannot be downloaded here) or ``needle`` (other needles). Keys are
  word pairs, numbers or UUIDs; values numbers or UUIDs. Multi-key: 4 needles with different
  keys, one asked; multi-value: one key with 4 values; multi-query: 4 keys, all asked.
* ``vt`` (variable tracking) - a chain ``VAR A = 12345``, ``VAR B = VAR A``, ... (4 hops, in
  order) in noise; the answer is every variable that holds the value.
* ``cwe`` (common words extraction) - a numbered word list in which 10 words appear 30 times and
  the others 3 (6 and 1 below 4K tokens, as RULER); the answer is the 10 common words.
* ``fwe`` (frequent words extraction) - coded words drawn from a Zipf distribution (alpha 2)
  with ``....`` as the most frequent noise word; the answer is the 3 most frequent coded words,
  counted in the final prompt (ties at the third place are broken by turning an occurrence of
  the tied words into noise).

Scoring is RULER's: ``string_match_all`` (the fraction of references found, case-insensitive
substring) on the post-processed answer region of the output (after ``</think>``).
Per-task parameters can be overridden: ``task_params: {cwe: {freq_cw: 20}}``.
"""

from __future__ import annotations

import itertools
import random
import string
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from data_gen.base import Draft, Piece
from data_gen.fit import PromptRenderer, build_row
from data_gen.text import cities, first_names, haystack, number_str, uuid_str, words
from recallm.errors import RecallmError
from recallm.eval.benchmarks.base import Benchmark, EvalTask
from recallm.eval.scoring import answer_region, ruler_postprocess, string_match_all, string_match_part
from recallm.eval.types import Example, Generation, Score, Spec

__all__ = ["Ruler", "RULER_TASKS", "NOISE", "NEEDLE"]

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
}
_CHOICES = {
    "haystack": ("noise", "essay", "needle"),
    "key_type": ("words", "numbers", "uuids"),
    "value_type": ("numbers", "uuids"),
}
FWE_NOISE = "...."


def _fresh(make, used: set[str]) -> str:
    value = make()
    while value in used:
        value = make()
    used.add(value)
    return value


def _cwe_vocabulary() -> list[str]:
    pool = {w.lower() for w in words()} | {n.lower() for n in first_names()} | {c.lower() for c in cities()}
    return sorted(w for w in pool if w.isalpha() and len(w) >= 4)  # short words would match by accident


class Ruler(Benchmark):
    """See module doc. Options: ``tasks`` (default: all eleven), ``task_params`` (per-task overrides)."""

    name = "ruler"
    min_length = 256
    options = {"tasks": list(RULER_TASKS), "task_params": {}}

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
        return {**super().describe(), "params": {t: p for t, (_, p) in self.params.items()}}

    def specs(self) -> list[Spec]:
        if self.per_cell is None:
            raise RecallmError(f"benchmark {self.name}: per_cell is required")
        return [Spec(n, self.name, i, task) for task in self.tasks for n in self.lengths for i in range(self.per_cell)]

    def build(self, spec: Spec, renderer: PromptRenderer) -> Example:
        kind, params = self.params[spec.task]
        rng = self.rng(spec.task, spec.length, spec.index)
        draft = getattr(self, f"_{kind}")(params, rng, spec.length)
        task = EvalTask(f"ruler/{spec.task}", "retrieval", min_tokens=self.min_length)
        row = build_row(
            task, draft, renderer, spec.length, rng, seed=rng.getrandbits(63), tolerance=self.settings.tolerance
        )
        answers = [str(a) for a in row.ground_truth["answers"]]
        return self.example_from_row(spec, row, {"answers": answers, "metric": "all"})

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
