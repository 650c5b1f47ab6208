"""Statistics for comparing two models on the same prompts: small pure functions (numpy only).

* :func:`paired_bootstrap` — the difference of two accuracies (or mean scores) measured on the same
  prompts, with a percentile bootstrap interval that resamples *prompts* (each keeps both models'
  outcomes, so the pairing is kept); ``strata`` (e.g. the task of each prompt) resamples within
  each stratum, so that a pooled difference keeps the design's task balance.
* :func:`mcnemar_exact` — McNemar's exact test of two paired binary outcomes: under the null the
  discordant prompts (one model right, the other wrong) split 50/50, so the two-sided p-value is
  twice the binomial tail of the smaller count, capped at 1.
* :func:`wilson_interval` — a 95% interval for one proportion (a rate with its count).
* :func:`pairs_needed` — how many paired prompts a bootstrap interval of a given half-width needs,
  from a pilot's discordance (the normal approximation the bootstrap converges to).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from recallm.errors import RecallmError

__all__ = ["PairedDiff", "McNemar", "paired_bootstrap", "mcnemar_exact", "wilson_interval", "pairs_needed"]

Z95 = 1.959963984540054


@dataclass(frozen=True)
class PairedDiff:
    """``mean(a) - mean(b)`` over ``n`` paired prompts and its bootstrap interval ``[low, high]``."""

    n: int
    mean_a: float
    mean_b: float
    diff: float
    low: float
    high: float
    level: float = 0.95

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


@dataclass(frozen=True)
class McNemar:
    """Discordant counts (``a_only``: ``a`` right and ``b`` wrong; ``b_only``: the reverse) and the
    exact two-sided p-value."""

    a_only: int
    b_only: int
    p_value: float


def _paired(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise RecallmError(f"paired outcomes need two 1-D sequences of one length, got {x.shape} and {y.shape}")
    if not len(x):
        raise RecallmError("paired outcomes: nothing to compare (no prompts)")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise RecallmError("paired outcomes must be finite numbers")
    return x, y


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    strata: Sequence[object] | None = None,
    resamples: int = 10000,
    level: float = 0.95,
    seed: int = 0,
) -> PairedDiff:
    """``mean(a) - mean(b)`` and its percentile bootstrap interval over paired prompts (module doc).

    ``a[i]`` and ``b[i]`` are the two models' outcomes (1/0, or scores) on prompt ``i``. With
    ``strata`` each resample draws, within every stratum, as many prompts as it has (with
    replacement); the statistic is the mean over all prompts either way."""
    x, y = _paired(a, b)
    if not 0 < level < 1:
        raise RecallmError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise RecallmError(f"resamples must be >= 1, got {resamples}")
    d = x - y
    rng = np.random.default_rng(seed)
    if strata is None:
        groups = [np.arange(len(d))]
    else:
        if len(strata) != len(d):
            raise RecallmError(f"strata has {len(strata)} labels for {len(d)} prompts")
        labels: dict[object, list[int]] = {}
        for i, s in enumerate(strata):
            labels.setdefault(s, []).append(i)
        groups = [np.asarray(v) for _, v in sorted(labels.items(), key=lambda kv: str(kv[0]))]
    sums = np.zeros(resamples)
    for g in groups:
        draws = rng.integers(0, len(g), size=(resamples, len(g)))
        sums += d[g][draws].sum(axis=1)
    means = sums / len(d)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return PairedDiff(len(d), float(x.mean()), float(y.mean()), float(d.mean()), float(low), float(high), level)


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> McNemar:
    """McNemar's exact test on paired binary outcomes (truthy = right; module doc)."""
    x, y = _paired(a, b)
    right_a, right_b = x > 0.5, y > 0.5
    a_only = int(np.sum(right_a & ~right_b))
    b_only = int(np.sum(~right_a & right_b))
    n = a_only + b_only
    if n == 0:
        return McNemar(0, 0, 1.0)
    k = min(a_only, b_only)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return McNemar(a_only, b_only, min(1.0, 2 * tail))


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes / n`` (95% by default)."""
    if n < 1 or not 0 <= successes <= n:
        raise RecallmError(f"wilson_interval needs 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # (exactly 0 and 1 at the ends, without rounding)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def pairs_needed(a_only: float, b_only: float, half_width: float, z: float = Z95) -> int:
    """Paired prompts for a 95% interval of ``half_width`` on ``P(a) - P(b)``, from the shares of
    prompts where only ``a`` (``a_only``) or only ``b`` (``b_only``) is right: the variance of one
    prompt's difference is ``a_only + b_only - (a_only - b_only)**2``."""
    if not (0 <= a_only <= 1 and 0 <= b_only <= 1 and a_only + b_only <= 1) or half_width <= 0:
        raise RecallmError("pairs_needed: shares must be in [0, 1] with a sum <= 1, and half_width > 0")
    variance = a_only + b_only - (a_only - b_only) ** 2
    return max(1, math.ceil(variance * (z / half_width) ** 2))
