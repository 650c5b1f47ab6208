"""Lost in thought (paper §2, App. A.2-A.3, Table 4): retrieval before and after reasoning, on the same dictionary.

Every example is a *pair* of prompts over one key-value dictionary (CSV, JSON or lines; the
query before or after it; the layouts and generators of ``data_gen.tasks.kv``), shaped like the
paper's Figure 5 (the wording is ours, in two paraphrases):

* **retrieval** - the key is given (``Your key: 1837``); the model must give its value;
* **reasoning retrieval** - the dictionary is named (``data_table``, ``lookup_json``), and a math
  problem (a linear equation or an arithmetic expression, ``data_gen.tasks.kv.PROBLEM_TYPES``)
  gives the key; keys next to the answer are always in the dictionary, so a reasoning slip lands
  on a real but wrong entry.

The reasoning-retrieval prompt is fitted to the target length; the retrieval prompt then shows
the very same dictionary lines in the same order, with its own question.

Per output: **accuracy** (the final answer contains the value: the training reward's subEM);
for reasoning retrieval also **math** (the reasoning solved the problem: the integer it last states
as a result, ``x = -3328``, is the key - ``recallm.eval.scoring.math_solved``; a list of candidate
keys is not a solution) and, when
the math is right, the **injection** run of App. A.3: the point where the model *first attempts
to retrieve* the value is located - by the judge model (``eval.judge``, any OpenAI-compatible
endpoint; the paper used Gemma-3-27B-IT), or, without one, by string matching (right after the
first place the output states the key; labelled as such) - the output is cut there (a recall
span left open is closed), a short line restating the key and ending with the entry's exact
lexical prefix (``{key}: `` for lines, ``{key},`` for CSV, ``"{key}": "`` for JSON) is appended
and the model continues; **injected** is 1 when the value comes next. **attempted** is whether a
retrieval attempt was found (the judge may find none); its mean over the math-correct examples
is Table 4's coverage. As in the paper, the injection numbers are over at most
``injection_examples`` (200) math-correct examples per length (the first ones by index).

The summary's ``lost_in_thought`` table gives per length and for the paper's short (4K-32K) and
long (64K-128K) buckets (lengths outside them are in no bucket): retrieval, reasoning retrieval,
reasoning retrieval given correct math, injected, coverage, math accuracy, the relative gap
(retrieval - reasoning retrieval) / retrieval - for a bucket, of the bucket's means, as Table 4 -
the extra output tokens of reasoning, and recall usage (Table 4, Figures 2 and 4). Keys are signed
(``Key -3328: ...`` lines, Figure 5a) unless ``key_type`` says otherwise.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from data_gen.base import Draft, Piece, check_choice
from data_gen.fit import PromptRenderer, build_row
from data_gen.tasks.kv import KV_FORMATS, PAPER_PROBLEM_TYPES, PROBLEM_TYPES, VALUE_TYPES, KVDictionary
from recallm.config import MAX_COUNT, MAX_TOKENS
from recallm.errors import RecallmError
from recallm.eval.benchmarks.base import Benchmark, BenchmarkOptions, EvalTask, Followup
from recallm.eval.scoring import close_open_span, final_answer, find_key, injection_prefix, math_solved, value_follows
from recallm.eval.types import Example, Generation, Score, Spec
from recallm.tokens import THINK_END

__all__ = ["LostInThought", "SHORT_MIN", "SHORT_MAX", "LONG_MIN", "reasoning_part"]

RETRIEVAL, REASONING = "retrieval", "reasoning_retrieval"
SHORT_MIN, SHORT_MAX, LONG_MIN = 4096, 32768, 65536  # the paper's buckets: short = 4K-32K, long = 64K-128K

# (name in the prompt, how the instruction describes it, header before the entries); two paraphrases each
_TABLES = {
    "lines": ("the list", "a long list of key-value entries, one per line", ""),
    "csv": (
        "`data_table`",
        "a large lookup table called `data_table` (CSV: one key,value row per line)",
        "data_table:\n",
    ),
    "json": ("`lookup_json`", "a large JSON dictionary called `lookup_json`", "lookup_json:\n"),
}
RETRIEVAL_INSTRUCTIONS = (
    "Extract the value corresponding to the specified key in {desc} below. On the final line, output only: "
    "Answer: <the value>",
    "Below is {desc}. Find the entry with the key you are given and copy its value exactly. On the final line, "
    "output only: Answer: <the value>",
)
RETRIEVAL_QUESTION = "Your key: {key}"
REASONING_INSTRUCTIONS = (
    "Your task is to retrieve a value from {desc}. The key you need is not given directly: it is the integer answer "
    "of a math problem. Solve the math problem step by step, then look up the entry with that key. On the final "
    "line, output only: Answer: <the value>",
    "You will look up a value in {desc}. First work out the key: it is the answer to the math problem below, which "
    "you should solve step by step. Then find that key's entry. On the final line, output only: Answer: <the value>",
)
REASONING_QUESTION = {
    "linear": "Now solve the math problem, and give the value stored in {name} under its answer.\n\n"
    "Math problem: solve for x: {problem}.",
    "arithmetic": "Now solve the math problem, and give the value stored in {name} under its answer.\n\n"
    "Math problem: compute {problem}.",
}
LOCATORS = ("judge", "string")


@dataclass(frozen=True)
class LostInThoughtOptions(BenchmarkOptions):
    """The schema of ``eval.benchmarks.lost_in_thought`` (``LostInThought``'s options)."""

    formats: Any = field(default_factory=lambda: list(KV_FORMATS))
    query_positions: Any = field(default_factory=lambda: ["beginning", "end"])
    problem_types: Any = field(default_factory=lambda: list(PAPER_PROBLEM_TYPES))
    key_type: str = "signed"
    """``signed`` (keys +-1..10^d-1, as the paper's Figure 5a), ``int`` (positive d-digit keys) or ``toy``"""
    value_type: str = "alnum"
    key_digits: int = field(default=4, metadata={"min": 1, "max": 18})
    line_label: str = "Key "
    """before each key of the line layout (``Key -3328: LdO2I44vGR``, Figure 5a)"""
    near_keys: int = field(default=6, metadata={"min": 0, "max": MAX_COUNT})
    injection: bool = True
    injection_template: str = "\nLooking up key {key} in the dictionary: {prefix}"
    injection_max_new_tokens: int = field(default=32, metadata={"min": 1, "max": MAX_TOKENS})
    injection_examples: int = field(default=200, metadata={"min": 1, "max": MAX_COUNT})


class LostInThought(Benchmark):
    """See module doc. Options: ``formats``, ``query_positions`` (beginning / end), ``problem_types``,
    ``key_type`` (int / toy), ``value_type``, ``key_digits``, ``near_keys``, ``injection`` (on/off),
    ``injection_template`` (with ``{key}`` and ``{prefix}``), ``injection_max_new_tokens``."""

    name = "lost_in_thought"
    min_length = 128
    Options = LostInThoughtOptions

    def __init__(self, cfg, settings) -> None:
        super().__init__(cfg, settings)
        c = self.cfg
        self.formats = check_choice("lost_in_thought.formats", c["formats"], KV_FORMATS)
        self.positions = check_choice("lost_in_thought.query_positions", c["query_positions"], ("beginning", "end"))
        self.problem_types = check_choice("lost_in_thought.problem_types", c["problem_types"], tuple(PROBLEM_TYPES))
        check_choice("lost_in_thought.key_type", c["key_type"], ("int", "signed", "toy"))
        check_choice("lost_in_thought.value_type", c["value_type"], VALUE_TYPES)
        if not 2 <= int(c["key_digits"]) <= 12:
            raise RecallmError(f"lost_in_thought.key_digits must be in [2, 12], got {c['key_digits']}")
        self.dictionary = KVDictionary(c["key_type"], c["value_type"], int(c["key_digits"]), str(c["line_label"]))
        self.near = int(c["near_keys"])
        if not 0 <= self.near <= 50 or self.dictionary.key_hi - self.dictionary.key_lo < 4 * self.near + 4:
            raise RecallmError(
                f"lost_in_thought.near_keys must be in [0, 50] and small for the key range, got {self.near}"
            )
        template = str(c["injection_template"])
        if "{prefix}" not in template:
            raise RecallmError("lost_in_thought.injection_template must contain {prefix}")
        self._pairs: OrderedDict[tuple[int, int], dict[str, Example]] = OrderedDict()
        self._task = EvalTask(self.name, "reasoning_retrieval", min_tokens=self.min_length)

    @property
    def locator(self) -> str:
        """How the first retrieval attempt is found: ``judge`` or ``string`` (the fallback)."""
        return "judge" if self.settings.judge is not None else "string"

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["prompts"] = "A.2"  # the Figure-5-shaped prompts (earlier runs had others)
        out["solved"] = "stated-result"  # math_solved (earlier runs: the key anywhere in the output)
        if self.cfg["injection"]:
            out["locator"] = self.settings.judge.describe() if self.settings.judge is not None else "string"
        return out

    def specs(self) -> list[Spec]:
        if self.per_cell is None:
            raise RecallmError(f"benchmark {self.name}: per_cell is required")
        return [
            Spec(length, self.name, index, task)
            for length in self.lengths
            for index in range(self.per_cell)
            for task in (RETRIEVAL, REASONING)
        ]

    def build(self, spec: Spec, renderer: PromptRenderer) -> Example:
        key = (spec.length, spec.index)
        if key not in self._pairs:
            self._pairs[key] = self._build_pair(spec.length, spec.index, renderer)
            while len(self._pairs) > 4:
                self._pairs.popitem(last=False)
        return self._pairs[key][spec.task]

    def _build_pair(self, length: int, index: int, renderer: PromptRenderer) -> dict[str, Example]:
        rng = self.rng("pair", length, index)
        d = self.dictionary
        fmt = self.formats[index % len(self.formats)]
        position = self.positions[(index // len(self.formats)) % len(self.positions)]
        kind = rng.choice(self.problem_types)
        lo = d.key_lo + self.near if d.key_type == "signed" else max(d.key_lo, self.near + 1)
        x = rng.randint(lo, d.key_hi - self.near)
        problem, _ = PROBLEM_TYPES[kind](rng, x)
        key, value = str(x), d.value(rng)
        used = {key}
        placed = [Piece(d.line(fmt, key, value, d.label), gold=True, meta={"key": key})]
        for delta in range(1, self.near + 1):
            for k in (x - delta, x + delta):
                if d.key_lo <= k <= d.key_hi and str(k) not in used:
                    used.add(str(k))
                    placed.append(Piece(d.line(fmt, str(k), d.value(rng), d.label), meta={"key": str(k)}))
        header, sep, footer = d.frame(fmt)
        name, desc, label = _TABLES[fmt]
        header = label + header
        variant = rng.randrange(len(REASONING_INSTRUCTIONS))
        final: dict[str, list[Piece]] = {}

        def keep(pieces: list[Piece]) -> dict[str, Any]:
            final["pieces"] = [Piece(p.text, p.gold, meta=dict(p.meta)) for p in pieces]
            return {}

        augment = {"kv_format": fmt, "query_position": position, "problem_type": kind, "template": variant}
        common = {"header": header, "separator": sep, "footer": footer, "question_position": position}
        reasoning = Draft(
            instruction=REASONING_INSTRUCTIONS[variant].format(desc=desc),
            question=REASONING_QUESTION[kind].format(problem=problem, name=name),
            placed=placed,
            distractors=d.entries(rng, fmt, used),
            answers=[value],
            augmentations=augment,
            finalize=keep,
            **common,
        )
        seed = rng.getrandbits(63)
        tol = self.settings.tolerance
        row_rr = build_row(self._task, reasoning, renderer, self.target(length), rng, seed=seed, tolerance=tol)
        retrieval = Draft(
            instruction=RETRIEVAL_INSTRUCTIONS[variant].format(desc=desc),
            question=RETRIEVAL_QUESTION.format(key=key),
            placed=[],
            distractors=iter(final["pieces"]),
            answers=[value],
            augmentations=augment,
            keep_order=True,
            fit_length=False,
            **common,
        )
        row_r = build_row(
            self._task, retrieval, renderer, 2 * self.target(length) + 4096, rng, seed=seed, tolerance=tol
        )
        reference = {"key": key, "value": value, "format": fmt, "pair": f"{length}/{index}", **augment}
        return {
            REASONING: self.example_from_row(Spec(length, self.name, index, REASONING), row_rr, dict(reference)),
            RETRIEVAL: self.example_from_row(Spec(length, self.name, index, RETRIEVAL), row_r, dict(reference)),
        }

    def followup(self, example: Example, generation: Generation) -> Followup | None:
        return self.followup_batch([example], [generation])[0]

    def followup_batch(self, examples: Sequence[Example], generations: Sequence[Generation]) -> list[Followup | None]:
        """The injection continuations of a batch: for each reasoning-retrieval output whose math
        is right, cut at its first retrieval attempt (the judge's, asked concurrently, or the
        string-matching fallback) and append the injection. Records on the example how the cut
        was found (``reference["located"]``: judge / string / none)."""
        todo = []
        for i, (example, generation) in enumerate(zip(examples, generations, strict=True)):
            if example.spec.task == REASONING and self.cfg["injection"]:
                if math_solved(reasoning_part(generation.text), example.reference["key"]):
                    todo.append(i)
        cuts: dict[int, tuple[int | None, str]] = {}
        judge = self.settings.judge
        if judge is not None and todo:

            def locate(i: int) -> int | None:
                text = generations[i].text
                think = text.find(THINK_END)
                return judge.first_retrieval(text if think < 0 else text[:think], examples[i].reference["key"])

            for i, offset in zip(todo, judge.map(locate, todo), strict=True):
                cuts[i] = (offset, "judge") if offset is not None else (None, "string")
        out: list[Followup | None] = [None] * len(examples)
        for i in todo:
            offset, how = cuts.get(i, (None, "string"))
            text, ref = generations[i].text, examples[i].reference
            if how == "string":
                offset = find_key(text, ref["key"]).end()
            ref["located"] = how if offset >= 0 else "none"
            if offset < 0:
                continue
            prefix = injection_prefix(ref["format"], ref["key"], self.dictionary.label)
            injection = str(self.cfg["injection_template"]).format(key=ref["key"], prefix=prefix)
            out[i] = Followup(close_open_span(text[:offset]) + injection, int(self.cfg["injection_max_new_tokens"]))
        return out

    def score(self, example: Example, generation: Generation, followup: Generation | None) -> Score:
        from rewards.metrics import sub_em

        ref = example.reference
        answer = final_answer(generation.text, self.settings.answer_region)
        correct = sub_em(answer, [ref["value"]]) == 1.0
        metrics: dict[str, float] = {"accuracy": float(correct)}
        if example.spec.task == REASONING:
            math = math_solved(reasoning_part(generation.text), ref["key"])
            metrics["math"] = float(math)
            if math:
                metrics["accuracy_given_math"] = float(correct)
                located = ref.get("located")
                if located is not None:
                    metrics["attempted"] = float(located != "none")
                    metrics["located_by_judge"] = float(located == "judge")
                if followup is not None:
                    metrics["injected"] = float(value_follows(followup.text, ref["value"]))
        return Score(score=float(correct), correct=correct, answer=answer, metrics=metrics)

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        cells: dict[int, dict[str, list[Mapping[str, Any]]]] = {}
        for r in records:
            cells.setdefault(int(r["length"]), {}).setdefault(r["task"], []).append(r)
        cap = int(self.cfg["injection_examples"])
        by_length = {str(length): _table_row(tasks, cap) for length, tasks in sorted(cells.items())}
        if self.locator == "string":  # every math-correct output states the key: coverage is not measured
            for row in by_length.values():
                row["coverage"] = None
        buckets = {}
        for name, keep in (("short", lambda n: SHORT_MIN <= n <= SHORT_MAX), ("long", lambda n: n >= LONG_MIN)):
            rows = [by_length[str(n)] for n in sorted(cells) if keep(n)]
            if rows:  # (a run's lengths outside 4K-128K are in no bucket: the paper's rows are about those)
                buckets[name] = {
                    k: _mean([row[k] for row in rows if row.get(k) is not None]) for k in rows[0] if k != "pairs"
                } | {"pairs": sum(row["pairs"] for row in rows), "lengths": [n for n in sorted(cells) if keep(n)]}
                # Table 4's Rel. Gap: (R - RR) / R of the bucket's means, not a mean of per-length gaps
                buckets[name]["relative_gap_pct"] = _gap(
                    buckets[name]["retrieval"], buckets[name]["reasoning_retrieval"]
                )
        protocol = {}
        if self.cfg["injection"] and self.locator == "string":
            protocol["locator"] = "string matching (no judge; the paper: a judge model)"
        if self.cfg["key_type"] != "signed":
            protocol["keys"] = f"{self.cfg['key_type']} (the paper's Figure 5: signed)"
        return {"by_length": by_length, "buckets": buckets, "locator": self.locator, "injection_examples": cap,
                "protocol": protocol}  # fmt: skip


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _gap(retrieval: float | None, reasoning: float | None) -> float | None:
    """Table 4's relative gap (%): (retrieval - reasoning retrieval) / retrieval."""
    return (retrieval - reasoning) / retrieval * 100 if retrieval and reasoning is not None else None


def reasoning_part(output: str) -> str:
    """The reasoning of an output, where the math is solved: before ``</think>``; for a model that
    does not think, before its last ``Answer:``."""
    think = output.find(THINK_END)
    if think >= 0:
        return output[:think]
    answer = output.rfind("Answer:")
    return output[:answer] if answer >= 0 else output


def _metric(records: Sequence[Mapping[str, Any]], name: str) -> float | None:
    return _mean([float(r["metrics"][name]) for r in records if name in (r.get("metrics") or {})])


def _injection_sample(reas: Sequence[Mapping[str, Any]], cap: int) -> list[Mapping[str, Any]]:
    """The first ``cap`` math-correct reasoning outputs (by example index) - the paper's sample of
    at most 200 per length; each counts as attempted when a retrieval attempt was located (records
    without the field: when an injection was run)."""
    solved = [r for r in reas if (r.get("metrics") or {}).get("math") == 1.0]
    solved.sort(key=lambda r: int(r.get("index", 0)))
    return solved[:cap]


def _attempted(r: Mapping[str, Any]) -> float:
    metrics = r.get("metrics") or {}
    return float(metrics.get("attempted", 1.0 if "injected" in metrics else 0.0))


def _table_row(tasks: Mapping[str, Sequence[Mapping[str, Any]]], cap: int = 200) -> dict[str, Any]:
    retr, reas = tasks.get(RETRIEVAL, []), tasks.get(REASONING, [])
    sample = _injection_sample(reas, cap)
    injected = [r for r in sample if _attempted(r) and "injected" in (r.get("metrics") or {})]
    r_acc, rr_acc = _metric(retr, "accuracy"), _metric(reas, "accuracy")
    gap = _gap(r_acc, rr_acc)
    extra = None
    if retr and reas:
        extra = _mean([r["output_tokens"] for r in reas]) - _mean([r["output_tokens"] for r in retr])
    return {
        "retrieval": r_acc,
        "reasoning_retrieval": rr_acc,
        "reasoning_retrieval_given_math": _metric(reas, "accuracy_given_math"),
        "injected": _metric(injected, "injected"),
        "coverage": _mean([_attempted(r) for r in sample])
        if any("attempted" in (r.get("metrics") or {}) for r in sample)
        else None,
        "math": _metric(reas, "math"),
        "relative_gap_pct": gap,
        "reasoning_tokens": extra,
        "recall_usage_retrieval": _mean([float(r["spans"]["count"] > 0) for r in retr]),
        "recall_usage_reasoning": _mean([float(r["spans"]["count"] > 0) for r in reas]),
        "pairs": min(len(retr), len(reas)) if retr and reas else max(len(retr), len(reas)),
    }
