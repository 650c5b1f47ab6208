"""``recallm.decoding``'s draws: inverse-CDF sampling from one uniform number per row, and one random
stream per row (a request's seed, or the caller's generator)."""

from __future__ import annotations

import math

import torch

from recallm.decoding import RowStreams, inverse_cdf


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor([[math.log(p) if p > 0 else float("-inf") for p in probs]])


def test_inverse_cdf_takes_the_token_whose_interval_holds_the_draw():
    logits = _logits([0.1, 0.0, 0.6, 0.3])  # intervals [0, .1) [.1, .1) [.1, .7) [.7, 1)
    expected = {0.0: 0, 0.05: 0, 0.1 + 1e-9: 2, 0.69: 2, 0.7 + 1e-9: 3, 0.999: 3}
    for u, token in expected.items():
        assert inverse_cdf(logits, torch.tensor([u], dtype=torch.float64)).tolist() == [token], u
    # a draw that rounds up to the total takes the last token with probability, never an excluded one
    tail = _logits([0.5, 0.5, 0.0, 0.0])
    assert inverse_cdf(tail, torch.tensor([math.nextafter(1.0, 0.0)], dtype=torch.float64)).tolist() == [1]


def test_draws_follow_the_distribution_row_by_row():
    probs = [0.05, 0.0, 0.5, 0.25, 0.2]
    rows = 20_000
    logits = _logits(probs).expand(rows, -1)
    streams = RowStreams([7])
    uniforms = torch.cat([streams.next([0]) for _ in range(rows)])
    counts = torch.bincount(inverse_cdf(logits, uniforms), minlength=len(probs)).double() / rows
    assert counts[1] == 0  # an excluded token is never drawn
    for p, c in zip(probs, counts.tolist(), strict=True):
        assert abs(p - c) < 0.01, (probs, counts)


def test_each_row_has_its_own_stream_and_unseeded_rows_the_callers():
    together = RowStreams([5, 9, 5])
    draws = torch.stack([together.next([0, 1, 2]) for _ in range(4)])
    alone = [RowStreams([s]).next([0]) for s in (5, 9)]
    assert torch.equal(draws[:, 0], draws[:, 2])  # equal seeds, equal streams, whatever their neighbours
    assert not torch.equal(draws[:, 0], draws[:, 1])
    assert draws[0, 0] == alone[0][0] and draws[0, 1] == alone[1][0]
    single = RowStreams([9])
    assert torch.equal(torch.cat([single.next([0]) for _ in range(4)]), draws[:, 1])
    torch.manual_seed(5)
    state = torch.get_rng_state()
    caller = RowStreams([None])
    assert torch.equal(torch.cat([caller.next([0]) for _ in range(4)]), draws[:, 0])  # torch's generator, seeded 5
    assert not torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(5)
    RowStreams([3]).next([0])
    assert torch.equal(torch.get_rng_state(), state)  # a seeded row leaves the caller's generator alone


def test_block_width_weighs_the_drafts_against_the_slots_they_add():
    from recallm.decoding import WIDEN_COST, block_width

    eight = list(range(8))
    assert block_width([[], []], [1.0, 1.0]) == 1  # nothing drafted: one token a row
    assert block_width([eight], [1.0]) == 9  # alone and always taken: the whole draft
    assert block_width([eight], [0.5]) == 4  # 0.5 + 0.25 + 0.125 taken for 3 slots; a 4th slot would add 0.06
    assert block_width([eight] + [[]] * 15, [1.0] * 16) == 1  # 1 row of 16: 8 tokens are not worth 128 slots
    assert block_width([eight] * 5 + [[]] * 11, [1.0] * 16) == 9  # 5 rows of 16: 40 tokens for 128 slots
    assert block_width([eight[:2], eight], [1.0, 1.0]) == 9
    # the rule's threshold: exactly WIDEN_COST expected tokens per added slot still widens
    assert block_width([eight[:1]] + [[]] * 3, [WIDEN_COST * 4] + [1.0] * 3) == 2
    assert block_width([eight[:1]] + [[]] * 3, [WIDEN_COST * 3.9] + [1.0] * 3) == 1
