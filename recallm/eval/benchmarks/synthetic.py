"""Any registered ``data_gen`` task, generated afresh at chosen lengths and scored like in-domain.

The in-domain benchmark reads validation cells written at data time; this one builds prompts of
a synthetic task (``task`` and its ``params``, as in a mixture entry) at the benchmark's
``lengths`` on the spot, from the suite's seed — so the prompts are fresh (never in the training
data, whose rows are seeded from the data run's seed) and can be longer than anything trained
on (length generalisation: the tiny pipeline's 1x and 4x cells). Scored with
``rewards.score_response`` and the run's reward config, the training reward's own settings: the
example's score is the answer reward, the composite reward and its components are metrics.
"""

from __future__ import annotations

from collections.abc import Mapping

from data_gen.fit import PromptRenderer
from recallm.errors import RecallmError
from recallm.eval.benchmarks.base import Benchmark, score_with_reward
from recallm.eval.types import Example, Generation, Score, Spec

__all__ = ["SyntheticTask"]


class SyntheticTask(Benchmark):
    """See module doc. Options: ``task`` (a registered task name), ``params`` (its parameters)."""

    name = "synthetic"
    min_length = 16
    options = {"task": None, "params": {}}

    def __init__(self, cfg, settings) -> None:
        super().__init__(cfg, settings)
        from data_gen.base import make_task
        from rewards import load_reward_config

        if not self.cfg["task"]:
            raise RecallmError("benchmark synthetic: task is required (a data_gen task name, e.g. toy_lookup)")
        params = self.cfg["params"] or {}
        if not isinstance(params, Mapping):
            raise RecallmError(f"benchmark synthetic: params must be a mapping, got {params!r}")
        self.task = make_task(str(self.cfg["task"]), **dict(params))
        for length in self.lengths:
            self.task.check_length(length)
        self.reward_config = load_reward_config(settings.reward_config)
        if self.task.category not in self.reward_config.categories:
            raise RecallmError(f"benchmark synthetic: the reward config has no category {self.task.category!r}")

    def specs(self) -> list[Spec]:
        if self.per_cell is None:
            raise RecallmError("benchmark synthetic: per_cell is required")
        return [Spec(n, self.name, i, self.task.name) for n in self.lengths for i in range(self.per_cell)]

    def build(self, spec: Spec, renderer: PromptRenderer) -> Example:
        from data_gen.generate import draft_row

        rng = self.rng(spec.task, spec.length, spec.index)
        row = draft_row(
            self.task, renderer, spec.length, rng, seed=rng.getrandbits(63), tolerance=self.settings.tolerance
        )
        return self.example_from_row(spec, row, {"ground_truth": row.ground_truth, "data_source": row.data_source})

    def score(self, example: Example, generation: Generation, followup: Generation | None) -> Score:
        return score_with_reward(example, generation, self.reward_config)
