"""In-domain evaluation: the validation cells written by ``recallm-data`` (``val/<category>_<length>.parquet``).

Each output is scored with ``rewards.score_response`` and the run's reward config - the very
settings training used (``configs/reward/*.yaml``, overridable as ``reward.*``): no lenient
shortcut. The example's score is the answer reward R_ans (the category's answer metric on the
parsed final answer); the full composite reward and every component are kept as metrics
(``reward``, ``format``, ``recall``, ...), so the summary has both per category x length.

Prompts are rendered from the rows' chat messages with the model's chat template; a row whose
stored prompt text differs (data generated with another tokenizer) is refused, as its gold
passages' character intervals would not match.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_gen.fit import PromptRenderer
from recallm.errors import RecallmError
from recallm.eval.benchmarks.base import Benchmark, BenchmarkOptions, score_with_reward
from recallm.eval.types import Example, Generation, Score, Spec

__all__ = ["InDomain", "find_cells"]

_OPEN_FILES = 12  # validation files kept in memory (the paper's mixture has 10 categories)
_CELL = re.compile(r"^(?P<category>[a-z0-9_]+?)(?:_(?P<length>\d+))?\.parquet$")


def _longest_prompt(path: Path) -> int:
    import pyarrow.parquet as pq

    try:
        extra = pq.read_table(path, columns=["extra_info"]).column("extra_info").to_pylist()
        return int(max((e["prompt_tokens"] for e in extra), default=0))
    except Exception as exc:  # pyarrow raises several types for a damaged file; a row may lack the field
        raise RecallmError(f"cannot read extra_info.prompt_tokens from {path}: {str(exc).splitlines()[0]}") from None


def find_cells(data_dir: Path) -> dict[tuple[str, int], Path]:
    """``(category, length) -> parquet`` of the validation cells under ``data_dir/val``: files
    ``<category>_<length>.parquet``, and ``<category>.parquet`` (the one cell of natural-length
    tasks, whose length is taken as its longest prompt)."""
    val = data_dir / "val"
    if not val.is_dir():
        raise RecallmError(
            f"in_domain: no validation directory {val}; generate it with `recallm-data` (its out_dir) "
            "and set eval.benchmarks.in_domain.data_dir"
        )
    cells = {}
    for path in sorted(val.glob("*.parquet")):
        m = _CELL.match(path.name)
        if m:
            length = int(m.group("length")) if m.group("length") else _longest_prompt(path)
            cells[(m.group("category"), length)] = path
    if not cells:
        raise RecallmError(f"in_domain: {val} holds no <category>_<length>.parquet files")
    return cells


@dataclass(frozen=True)
class InDomainOptions(BenchmarkOptions):
    """The schema of ``eval.benchmarks.in_domain`` (``InDomain``'s options)."""

    data_dir: str | None = None
    """required: a ``recallm-data`` out_dir"""
    categories: Any = None
    """a category or a list of them (None: every category found)"""


class InDomain(Benchmark):
    """See module doc. Options: ``data_dir`` (a ``recallm-data`` out_dir), ``categories`` (null:
    every category found). ``lengths`` null: every length found; ``per_cell`` null: every row."""

    name = "in_domain"
    min_length = 1
    needs_lengths = False
    Options = InDomainOptions

    def __init__(self, cfg, settings) -> None:
        super().__init__(cfg, settings)
        if not self.cfg["data_dir"]:
            raise RecallmError("benchmark in_domain: data_dir is required (a `recallm-data` out_dir holding val/)")
        self.data_dir = Path(str(self.cfg["data_dir"]))
        categories = self.cfg["categories"]
        self.categories = (
            None
            if categories is None
            else [str(c) for c in ([categories] if isinstance(categories, str) else categories)]
        )
        from rewards import load_reward_config

        self.reward_config = load_reward_config(settings.reward_config)
        self._cells: dict[tuple[str, int], Path] = {}
        self._rows: OrderedDict[Path, list] = OrderedDict()

    def specs(self) -> list[Spec]:
        import pyarrow.parquet as pq

        from data_gen.io import read_records
        from rewards import check_rows

        found = find_cells(self.data_dir)
        categories = self.categories or sorted({c for c, _ in found})
        lengths = self.lengths or sorted({n for _, n in found})
        unknown = [c for c in categories if c not in self.reward_config.categories]
        if unknown:
            raise RecallmError(
                f"in_domain: unknown categories {unknown}; the reward config knows {sorted(self.reward_config.categories)}"
            )
        val = self.data_dir / "val"
        missing: list[str] = []  # what was asked for explicitly must be there
        if self.categories and self.lengths:
            missing = [f"{c}_{n}.parquet" for c in categories for n in lengths if (c, n) not in found]
        elif self.categories:
            missing = [f"{c}_<length>.parquet" for c in categories if not any(fc == c for fc, _ in found)]
        elif self.lengths:
            missing = [f"<category>_{n}.parquet" for n in lengths if not any(fn == n for _, fn in found)]
        if missing:
            raise RecallmError(f"in_domain: missing parquet {val / missing[0]}")
        specs = []
        for category in categories:
            for length in lengths:
                path = found.get((category, length))
                if path is None:
                    continue
                try:
                    rows = pq.read_metadata(path).num_rows
                except Exception as exc:  # pyarrow raises several types for a damaged file
                    raise RecallmError(f"cannot read {path} as parquet: {str(exc).splitlines()[0]}") from None
                check_rows(read_records(path), self.reward_config)  # bad ground truth fails now, not mid-run
                self._cells[(category, length)] = path
                n = rows if self.per_cell is None else min(rows, self.per_cell)
                specs.extend(Spec(length, self.name, i, category) for i in range(n))
        if not specs:
            raise RecallmError(
                f"in_domain: no validation cells in {self.data_dir / 'val'} match categories={categories} "
                f"lengths={lengths}"
            )
        return specs

    def build(self, spec: Spec, renderer: PromptRenderer) -> Example:
        from data_gen.io import read_rows

        path = self._cells[(spec.task, spec.length)]
        if path not in self._rows:  # a few files at a time: examples of one length cycle through the categories
            self._rows[path] = read_rows(path, renderer.tokenizer)
            while len(self._rows) > _OPEN_FILES:
                self._rows.popitem(last=False)
        self._rows.move_to_end(path)
        row = self._rows[path][spec.index]
        prompt_text = renderer.tokenizer.apply_chat_template(row.messages, tokenize=False, add_generation_prompt=True)
        if row.prompt_text != prompt_text:
            raise RecallmError(
                f"{path}: row {spec.index} was rendered with another chat template than the model's; "
                "evaluate with the tokenizer the data was generated with, or regenerate the data"
            )
        return Example(
            spec=spec,
            messages=list(row.messages),
            prompt_text=prompt_text,
            prompt_tokens=renderer.length(prompt_text),
            reference={"ground_truth": row.ground_truth, "data_source": row.data_source, "task": row.task},
        )

    def score(self, example: Example, generation: Generation, followup: Generation | None) -> Score:
        return score_with_reward(example, generation, self.reward_config, self.settings.answer_region)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "data_dir": str(self.data_dir.resolve())}
