"""HELMET's JSON key-value retrieval (``json_kv``, Yen et al., 2025), generated offline.

A JSON object of random UUID keys mapped to random UUID values, on one line as ``json.dumps``
writes it (``{"k1": "v1", "k2": "v2", ...}``), fitted to the target length; one key is asked.
Scored as HELMET scores it: ``substring_exact_match`` - the normalised value is a substring of
the normalised answer region of the output (after ``</think>``).
"""

from __future__ import annotations

import itertools
from typing import Any

from data_gen.base import Draft, Piece
from data_gen.fit import PromptRenderer, build_row
from data_gen.text import uuid_str
from recallm.eval.benchmarks.base import Benchmark, EvalTask
from recallm.eval.scoring import answer_region, substring_exact_match
from recallm.eval.types import Example, Generation, Score, Spec

__all__ = ["HelmetJsonKV"]

INSTRUCTION = (
    "Extract the value corresponding to the specified key in the JSON object below. "
    "Finish with a final line of the form `Answer: <value>`."
)


class HelmetJsonKV(Benchmark):
    """See module doc. No options of its own."""

    name = "helmet_json_kv"
    task = "json_kv"
    min_length = 128
    options: dict[str, Any] = {}

    def specs(self) -> list[Spec]:
        from recallm.errors import RecallmError

        if self.per_cell is None:
            raise RecallmError(f"benchmark {self.name}: per_cell is required")
        return [Spec(n, self.name, i, self.task) for n in self.lengths for i in range(self.per_cell)]

    def build(self, spec: Spec, renderer: PromptRenderer) -> Example:
        rng = self.rng(spec.task, spec.length, spec.index)
        used: set[str] = set()

        def fresh() -> str:
            value = uuid_str(rng)
            while value in used:
                value = uuid_str(rng)
            used.add(value)
            return value

        key, value = fresh(), fresh()
        draft = Draft(
            instruction=INSTRUCTION,
            question=f'Key: "{key}"\nCorresponding value:',
            placed=[Piece(f'"{key}": "{value}"', gold=True)],
            distractors=(Piece(f'"{fresh()}": "{fresh()}"') for _ in itertools.count()),
            answers=[value],
            augmentations={},
            header="JSON data:\n{",
            separator=", ",
            footer="}",
            question_position="end",
        )
        task = EvalTask(f"helmet/{self.task}", "retrieval", min_tokens=self.min_length)
        row = build_row(
            task, draft, renderer, spec.length, rng, seed=rng.getrandbits(63), tolerance=self.settings.tolerance
        )
        return self.example_from_row(spec, row, {"key": key, "value": value})

    def score(self, example: Example, generation: Generation, followup: Generation | None) -> Score:
        region = answer_region(generation.text, self.settings.answer_region)
        value = substring_exact_match(region, [example.reference["value"]])
        return Score(score=value, correct=value == 1.0, answer=region.strip() or None, metrics={})
