"""recallm.eval.stats on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recallm.errors import RecallmError
from recallm.eval.stats import mcnemar_exact, paired_bootstrap, pairs_needed, wilson_interval


@pytest.mark.parametrize(
    ("a_only", "b_only", "p"),
    [
        (5, 0, 2 / 2**5),  # 2 * P(X <= 0), X ~ Bin(5, 1/2)
        (10, 0, 2 / 2**10),
        (3, 1, 2 * (1 + 4) / 16),  # 2 * (C(4,0) + C(4,1)) / 2^4 = 0.625
        (1, 3, 0.625),  # symmetric
        (2, 2, 1.0),  # 2 * 11/16 capped at 1
        (0, 0, 1.0),  # no discordant prompt: nothing against the null
        (12, 2, 2 * (1 + 14 + 91) / 2**14),  # 0.012939...
    ],
)
def test_mcnemar_exact_matches_the_binomial_tail(a_only, b_only, p):
    concordant = [(1, 1)] * 7 + [(0, 0)] * 4  # concordant prompts do not enter the test
    pairs = [(1, 0)] * a_only + [(0, 1)] * b_only + concordant
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    result = mcnemar_exact(a, b)
    assert (result.a_only, result.b_only) == (a_only, b_only)
    assert result.p_value == pytest.approx(p, rel=1e-12)


def test_paired_bootstrap_degenerate_and_two_point_cases():
    same = paired_bootstrap([1, 0, 1, 1], [1, 0, 1, 1])
    assert (same.diff, same.low, same.high, same.n) == (0.0, 0.0, 0.0, 4)
    better = paired_bootstrap([1, 1, 1], [0, 0, 0])
    assert (better.mean_a, better.mean_b, better.diff, better.low, better.high) == (1.0, 0.0, 1.0, 1.0, 1.0)
    # d = [1, 0]: a resample's mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, so the 2.5th and
    # 97.5th percentiles are 0 and 1
    two = paired_bootstrap([1, 0], [0, 0], resamples=4000, seed=3)
    assert (two.diff, two.low, two.high) == (0.5, 0.0, 1.0)


def test_paired_bootstrap_keeps_the_pairing():
    """b = a: every prompt's difference is 0 however different the accuracies of the prompts are,
    so the interval is a point; resampling a and b apart would give a wide one."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, 300)
    result = paired_bootstrap(a, a.copy())
    assert result.low == result.high == 0.0


def test_stratified_bootstrap_resamples_within_strata():
    # stratum x: every prompt +1, stratum y: every prompt 0; pooled 0.5 in every stratified resample
    a, b = [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]
    strata = ["x", "x", "x", "y", "y", "y"]
    stratified = paired_bootstrap(a, b, strata=strata)
    assert (stratified.diff, stratified.low, stratified.high) == (0.5, 0.5, 0.5)
    plain = paired_bootstrap(a, b)
    assert plain.low < 0.5 < plain.high  # without strata the share of x prompts varies


def test_bootstrap_interval_is_the_normal_one_for_many_prompts():
    rng = np.random.default_rng(1)
    a = rng.random(800) < 0.7
    b = np.where(rng.random(800) < 0.8, a, ~a)  # 20% discordant
    d = a.astype(float) - b.astype(float)
    result = paired_bootstrap(a, b, resamples=20000)
    normal = 1.959964 * d.std() / math.sqrt(len(d))
    assert result.half_width == pytest.approx(normal, rel=0.08)
    assert result.low < result.diff < result.high


def test_wilson_interval_known_values():
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0


def test_pairs_needed():
    # 30% only a right, 5% only b right: variance 0.35 - 0.25^2 = 0.2875; (1.96 / 0.08)^2 = 600.2
    assert pairs_needed(0.30, 0.05, 0.08) == 173
    assert pairs_needed(0.0, 0.0, 0.08) == 1


@pytest.mark.parametrize(
    "call",
    [
        lambda: paired_bootstrap([1, 0], [1]),
        lambda: paired_bootstrap([], []),
        lambda: paired_bootstrap([1.0, float("nan")], [0, 0]),
        lambda: paired_bootstrap([1, 0], [1, 0], strata=["x"]),
        lambda: paired_bootstrap([1, 0], [1, 0], level=1.0),
        lambda: mcnemar_exact([[1, 0]], [[1, 0]]),
        lambda: wilson_interval(3, 2),
        lambda: pairs_needed(0.7, 0.5, 0.08),
    ],
)
def test_bad_input_is_one_clear_error(call):
    with pytest.raises(RecallmError):
        call()
