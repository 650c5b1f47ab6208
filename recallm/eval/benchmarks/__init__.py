"""The benchmarks: lost in thought, in-domain validation cells, RULER (13 tasks), HELMET (7 categories; and
its json_kv alone), any synthetic data_gen task at new lengths.

``make_benchmarks(suite, only=..., reward_config=...)`` builds the enabled benchmarks of a suite
(``configs/eval/<suite>.yaml``) and checks every setting before anything is generated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recallm.config import MAX_SEED
from recallm.errors import RecallmError
from recallm.eval.benchmarks.base import Benchmark, BenchmarkOptions, BenchmarkSettings, Followup
from recallm.eval.benchmarks.helmet import Helmet, HelmetJsonKV
from recallm.eval.benchmarks.in_domain import InDomain
from recallm.eval.benchmarks.lost_in_thought import LostInThought
from recallm.eval.benchmarks.ruler import Ruler
from recallm.eval.benchmarks.synthetic import SyntheticTask
from recallm.eval.types import parse_length

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "BenchmarkOptions",
    "BenchmarkSettings",
    "Followup",
    "SuiteSettings",
    "make_benchmarks",
]

BENCHMARKS: dict[str, type[Benchmark]] = {
    cls.name: cls for cls in (LostInThought, InDomain, Ruler, Helmet, HelmetJsonKV, SyntheticTask)
}


@dataclass(frozen=True)
class SuiteSettings:
    """The schema of a benchmark suite, the ``eval`` section (``configs/eval/<suite>.yaml``; read with
    ``recallm.config.typed``). The suite-wide defaults are ``BenchmarkSettings``'."""

    name: str | None = None
    seed: int = field(default=BenchmarkSettings.seed, metadata={"min": 0, "max": MAX_SEED})
    tolerance: float = field(default=BenchmarkSettings.tolerance, metadata={"min": 0, "max": 0.5})
    """prompts are fitted to length +- this fraction"""
    answer_region: str = BenchmarkSettings.answer_region
    system_prompt: str | None = None
    generation: dict[str, Any] | None = None
    """required: every benchmark's generation settings (``recallm.eval.types.GenerationSettings``)"""
    benchmarks: dict[str, Any] = field(default_factory=dict)
    """name -> the benchmark's section (its ``Options`` schema)"""
    judge: dict[str, Any] | None = None
    """``recallm.eval.judge.make_judge``"""
    fit_lengths: Any = None
    """``{nominal length: fitted prompt length}`` (``parse_fit_lengths``)"""
    data_root: str | None = None
    """where the local copies live (the suite's paths interpolate it)"""


def parse_fit_lengths(value: Any) -> dict[int, int]:
    """``eval.fit_lengths``: ``{nominal length: fitted prompt length}`` (``{128K: 125K}``)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RecallmError(f"eval.fit_lengths must be a mapping such as {{128K: 125K}}, got {value!r}")
    return {parse_length(k, "eval.fit_lengths"): parse_length(v, "eval.fit_lengths") for k, v in value.items()}


def make_benchmarks(
    suite: Mapping[str, Any], *, only: Sequence[str] | None = None, reward_config: Any = None, judge: Any = None
) -> list[Benchmark]:
    """The benchmarks of ``suite`` that are enabled (or, with ``only``, exactly those named).
    ``judge``: a ``recallm.eval.judge.Judge`` (default: the one ``suite["judge"]`` describes, or
    none)."""
    from recallm.config import typed

    settings_ = typed(SuiteSettings, suite, "eval")
    configs = settings_.benchmarks
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
        names = [name for name, cfg in configs.items() if (cfg or {}).get("enabled", BenchmarkOptions.enabled)]
    if not names:
        raise RecallmError("no benchmark to run: enable one in eval.benchmarks or name them with benchmarks=[...]")
    if not settings_.generation:
        raise RecallmError("eval.generation is required (max_new_tokens, temperature, top_p)")
    from recallm.eval.judge import make_judge, make_nli

    if judge is None:
        judge = make_judge(settings_.judge)
    nli = make_nli(settings_.judge, judge) if any(n == "helmet" for n in names) else None
    settings = BenchmarkSettings(
        seed=settings_.seed,
        answer_region=settings_.answer_region,
        tolerance=settings_.tolerance,
        generation=settings_.generation,
        reward_config=reward_config,
        judge=judge,
        nli=nli,
        fit_lengths=parse_fit_lengths(settings_.fit_lengths),
    )
    return [BENCHMARKS[name](configs.get(name) or {}, settings) for name in names]
