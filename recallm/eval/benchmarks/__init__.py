"""The benchmarks: lost in thought, in-domain validation cells, RULER (offline subset), HELMET json_kv,
any synthetic data_gen task at new lengths.

``make_benchmarks(suite, only=..., reward_config=...)`` builds the enabled benchmarks of a suite
(``configs/eval/<suite>.yaml``) and checks every setting before anything is generated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from recallm.errors import RecallmError
from recallm.eval.benchmarks.base import Benchmark, BenchmarkSettings, Followup
from recallm.eval.benchmarks.helmet import HelmetJsonKV
from recallm.eval.benchmarks.in_domain import InDomain
from recallm.eval.benchmarks.lost_in_thought import LostInThought
from recallm.eval.benchmarks.ruler import Ruler
from recallm.eval.benchmarks.synthetic import SyntheticTask

__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkSettings", "Followup", "make_benchmarks"]

BENCHMARKS: dict[str, type[Benchmark]] = {
    cls.name: cls for cls in (LostInThought, InDomain, Ruler, HelmetJsonKV, SyntheticTask)
}

_SUITE_KEYS = ("name", "seed", "tolerance", "answer_region", "system_prompt", "generation", "benchmarks")


def make_benchmarks(
    suite: Mapping[str, Any], *, only: Sequence[str] | None = None, reward_config: Any = None
) -> list[Benchmark]:
    """The benchmarks of ``suite`` that are enabled (or, with ``only``, exactly those named)."""
    unknown_keys = sorted(set(suite) - set(_SUITE_KEYS))
    if unknown_keys:
        raise RecallmError(f"eval suite has unknown keys {unknown_keys}; known: {list(_SUITE_KEYS)}")
    configs = dict(suite.get("benchmarks") or {})
    known = ", ".join(BENCHMARKS)
    for name in configs:
        if name not in BENCHMARKS:
            raise RecallmError(f"unknown benchmark {name!r} in eval.benchmarks; known: {known}")
    if only is not None:
        names = [only] if isinstance(only, str) else list(only)
        for name in names:
            if name not in BENCHMARKS:
                raise RecallmError(f"unknown benchmark {name!r}; known: {known}")
        if len(set(names)) != len(names):
            raise RecallmError(f"benchmarks repeat: {names}")
    else:
        names = [name for name, cfg in configs.items() if (cfg or {}).get("enabled", True)]
    if not names:
        raise RecallmError("no benchmark to run: enable one in eval.benchmarks or name them with benchmarks=[...]")
    if not suite.get("generation"):
        raise RecallmError("eval.generation is required (max_new_tokens, temperature, top_p)")
    settings = BenchmarkSettings(
        seed=int(suite.get("seed", 0) or 0),
        answer_region=str(suite.get("answer_region", "after_think")),
        tolerance=float(suite.get("tolerance", 0.05)),
        generation=dict(suite["generation"]),
        reward_config=reward_config,
    )
    return [BENCHMARKS[name](configs.get(name) or {}, settings) for name in names]
