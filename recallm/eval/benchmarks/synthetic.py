"""Registered ``data_gen`` tasks, generated afresh at chosen lengths and scored like in-domain.

The in-domain benchmark reads validation cells written at data time; this one builds prompts of
a synthetic task (``task`` and its ``params``, as in a mixture entry) at the benchmark's
``lengths`` on the spot, from the suite's seed — so the prompts are fresh (never in the training
data, whose rows are seeded from the data run's seed) and can be longer than anything trained
on (length generalisation: the tiny pipeline's 1x and 4x cells). Scored with
``rewards.score_response`` and the run's reward config, the training reward's own settings: the
example's score is the answer reward, the composite reward and its components are metrics.
One task (``task``, ``params``) or several (``tasks: [{task, params}, ...]``, ``per_cell`` prompts
of each at every length: a mixture benchmark, e.g. the SmolLM2 experiment's retrieval tasks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from data_gen.fit import PromptRenderer
from recallm.config import MAX_COUNT, typed
from recallm.errors import RecallmError
from recallm.eval.benchmarks.base import Benchmark, BenchmarkOptions, score_with_reward
from recallm.eval.types import Example, Generation, Score, Spec, parse_length

__all__ = ["SyntheticTask", "answer_diagnostics"]


@dataclass(frozen=True)
class SyntheticEntry:
    """One of ``eval.benchmarks.synthetic.tasks``."""

    task: str
    """a registered ``data_gen`` task name"""
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SyntheticOptions(BenchmarkOptions):
    """The schema of ``eval.benchmarks.synthetic`` (``SyntheticTask``'s options): ``task`` and
    ``params``, or ``tasks`` (a list of ``SyntheticEntry``)."""

    task: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    tasks: list[Any] | None = None
    per_cell_at: dict[Any, Any] | None = None
    """``{length: n}``: ``n`` prompts per task at that length instead of ``per_cell`` (more prompts where a
    difference must be measured precisely, e.g. the longest length; the first ``per_cell`` are the same
    prompts either way)"""


class SyntheticTask(Benchmark):
    """See module doc. Options: ``task`` (a registered task name), ``params`` (its parameters)."""

    name = "synthetic"
    min_length = 16
    Options = SyntheticOptions

    def __init__(self, cfg, settings) -> None:
        super().__init__(cfg, settings)
        from data_gen.base import make_task
        from rewards import load_reward_config

        entries = self.cfg["tasks"]
        if entries is None:
            if not self.cfg["task"]:
                raise RecallmError("benchmark synthetic: task (or tasks) is required (a data_gen task name, e.g. toy_lookup)")
            entries = [{"task": self.cfg["task"], "params": self.cfg["params"]}]
        elif self.cfg["task"]:
            raise RecallmError("benchmark synthetic: give task or tasks, not both")
        if not isinstance(entries, (list, tuple)) or not entries:
            raise RecallmError(f"benchmark synthetic: tasks must be a non-empty list of {{task, params}}, got {entries!r}")
        self.reward_config = load_reward_config(settings.reward_config)
        self.tasks = {}
        for i, raw in enumerate(entries):
            entry = typed(SyntheticEntry, raw, f"eval.benchmarks.synthetic.tasks[{i}]")
            params = entry.params
            task = make_task(entry.task, **params)
            if task.name in self.tasks:
                raise RecallmError(f"benchmark synthetic: task {task.name!r} is listed twice")
            for length in self.lengths:
                task.check_length(length)
            if task.category not in self.reward_config.categories:
                raise RecallmError(f"benchmark synthetic: the reward config has no category {task.category!r}")
            self.tasks[task.name] = task
        self.per_cell_at: dict[int, int] = {}
        for raw_length, raw_n in (self.cfg["per_cell_at"] or {}).items():
            length = parse_length(raw_length, "eval.benchmarks.synthetic.per_cell_at")
            if length not in self.lengths:
                raise RecallmError(
                    f"eval.benchmarks.synthetic.per_cell_at: {raw_length} is not one of the lengths {self.lengths}"
                )
            if isinstance(raw_n, bool) or not isinstance(raw_n, int) or not 1 <= raw_n <= MAX_COUNT:
                raise RecallmError(
                    f"eval.benchmarks.synthetic.per_cell_at.{raw_length} must be an integer in [1, {MAX_COUNT}] (as "
                    f"per_cell), got {raw_n!r}"
                )
            self.per_cell_at[length] = raw_n

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if not out.get("per_cell_at"):  # (absent when unset: runs from before the option keep their fingerprint)
            out.pop("per_cell_at", None)
        return out

    @property
    def task(self):
        """The task, when there is one (the single-task form)."""
        return next(iter(self.tasks.values()))

    def specs(self) -> list[Spec]:
        if self.per_cell is None:
            raise RecallmError("benchmark synthetic: per_cell is required")
        return [
            Spec(n, self.name, i, name)
            for name in self.tasks
            for n in self.lengths
            for i in range(self.per_cell_at.get(n, self.per_cell))
        ]

    def build(self, spec: Spec, renderer: PromptRenderer) -> Example:
        from data_gen.generate import draft_row

        rng = self.rng(spec.task, spec.length, spec.index)
        row = draft_row(
            self.tasks[spec.task], renderer, spec.length, rng, seed=rng.getrandbits(63), tolerance=self.settings.tolerance
        )
        reference = {"ground_truth": row.ground_truth, "data_source": row.data_source}
        if "key" in row.trace_info:  # key-value and math retrieval: the key the answer is stored under
            reference["key"] = str(row.trace_info["key"])
        return self.example_from_row(spec, row, reference)

    def score(self, example: Example, generation: Generation, followup: Generation | None) -> Score:
        score = score_with_reward(example, generation, self.reward_config, self.settings.answer_region)
        score.metrics.update(answer_diagnostics(example, generation.text, score))
        return score


def answer_diagnostics(example: Example, output: str, score: Score) -> dict[str, float]:
    """What an answer says about how it was made, for tasks with one answer stored under a key
    (key-value and math retrieval); the report sorts wrong answers into kinds by them:

    * ``key_in_output``: the key the answer is stored under appears (as a whole number) in the
      output before its final answer — for math retrieval, the key was computed right;
    * ``answer_in_prompt``: the answer (4 characters or more) occurs verbatim in the prompt — a
      wrong one was copied from another entry of the context;
    * ``answer_similarity``: ``difflib``'s ratio of the answer to the reference answer (1: equal) — a
      wrong one with a high ratio is a garbled copy of the right entry.
    """
    import difflib
    import re

    key = example.reference.get("key")
    if key is None or not score.gold or len(score.gold) != 1:
        return {}
    answer = (score.answer or "").strip()
    cut = max(output.rfind("</think>"), output.rfind("Answer:"))
    before = output[:cut] if cut >= 0 else output
    return {
        "key_in_output": float(re.search(rf"(?<![\d-]){re.escape(key)}(?!\d)", before) is not None),
        "answer_in_prompt": float(len(answer) >= 4 and answer in example.prompt_text),
        "answer_similarity": difflib.SequenceMatcher(None, answer, score.gold[0].strip()).ratio() if answer else 0.0,
    }
