"""Aggregation: majority vote and top-N vote over a long list of ballots.

Ballots come in blocks with a fixed composition (each candidate's count per block is fixed,
the winner(s) ahead by the vote margin), shuffled within the block; the context is a whole
number of blocks, so the ranking holds at every length. Varied per example: vote margin,
candidate count, candidate category (names, places, letters, numbers). No gold evidence: the
recall reward is ``always`` (penalties still apply).
"""

from __future__ import annotations

import random
import string
from typing import Any

from data_gen.base import Draft, Piece, Row, Task, register
from data_gen.tasks.kv import _check_choice
from data_gen.tasks.niah import _range
from data_gen.text import cities, first_names

__all__ = ["MajorityVote", "TopNVote", "CANDIDATE_TYPES"]

CANDIDATE_TYPES = ("names", "places", "letters", "numbers")


def _candidates(rng: random.Random, kind: str, n: int) -> list[str]:
    if kind == "names":
        pool = first_names()
    elif kind == "places":
        pool = cities()
    elif kind == "letters":
        pool = tuple(string.ascii_uppercase)
    else:
        pool = tuple(str(i) for i in range(10, 1000))
    return rng.sample(pool, n)


class _Votes(Task):
    category = "aggregation"
    min_tokens = 128
    top = 1
    question_text = ""

    def __init__(
        self,
        candidates=None,
        margin=(1, 3),
        candidate_types=CANDIDATE_TYPES,
        question_positions=("end", "beginning", "both"),
        data_source: str | None = None,
    ) -> None:
        super().__init__(data_source)
        self.candidates = _range("candidates", candidates if candidates is not None else (self.top + 2, self.top + 7))
        self.margin = _range("margin", margin)
        if self.candidates[0] < self.top + 1 or self.margin[0] < 1:
            from recallm.errors import RecallmError

            raise RecallmError(
                f"{self.name} needs at least {self.top + 1} candidates and a margin of at least 1, "
                f"got candidates={candidates} margin={margin}"
            )
        self.candidate_types = _check_choice("candidate_types", candidate_types, CANDIDATE_TYPES)
        self.question_positions = _check_choice("question_positions", question_positions, ("end", "beginning", "both"))

    def draft(self, rng: random.Random) -> Draft:
        kind = rng.choice(self.candidate_types)
        n = rng.randint(*self.candidates)
        margin = rng.randint(*self.margin)
        names = _candidates(rng, kind, n)
        # per-block counts: strictly decreasing by `margin` over the top + 1 places, the rest below
        base = 1
        counts = {}
        tail = names[self.top + 1 :]
        for c in tail:
            counts[c] = rng.randint(0, base)
        floor = max(counts.values(), default=0) + margin
        for rank, c in enumerate(reversed(names[: self.top + 1])):
            counts[c] = floor + rank * margin
        block = [c for c, k in counts.items() for _ in range(k)]

        def blocks():
            voter = 1
            while True:
                ballots = block[:]
                rng.shuffle(ballots)
                lines = []
                for c in ballots:
                    lines.append(f"Ballot {voter}: {c}")
                    voter += 1
                yield Piece("\n".join(lines))

        ranking = sorted(names, key=lambda c: -counts[c])
        instruction, which = self.pick_instruction(rng)
        return Draft(
            instruction=instruction,
            question=self.question_text,
            placed=[],
            distractors=blocks(),
            answers=ranking[: self.top],
            augmentations={"candidate_type": kind, "candidates": n, "margin": margin, "instruction": which},
            question_position=self.pick_question_position(rng, self.question_positions),
            keep_order=True,
            evidence=False,
            trace_info={"counts_per_block": counts, "block_size": len(block), "ranking": ranking},
        )

    def trace(self, row: Row, rng: random.Random) -> list[tuple[str, Any]]:
        info = row.trace_info
        n_blocks = row.n_pieces
        totals = [f"{c}: {info['counts_per_block'][c] * n_blocks}" for c in info["ranking"]]
        return [
            ("text", f"Counting every ballot ({info['block_size'] * n_blocks} in all): " + ", ".join(totals) + "."),
        ]


@register
class MajorityVote(_Votes):
    name = "majority_vote"
    top = 1
    instructions = (
        "Below is a long list of ballots. Count them and determine which candidate received the most votes.",
        "Each line below records one vote. Tally all of them and name the candidate with the highest count.",
        "The following ballots were cast in an election. Work out who won the most votes.",
        "Read every ballot below and report the single candidate that appears most often.",
    )

    question_text = "Question: which candidate received the most votes? Answer with the candidate only."


@register
class TopNVote(_Votes):
    name = "top_n_vote"
    top = 3
    instructions = (
        "Below is a long list of ballots. Count them and determine the three candidates with the most votes.",
        "Each line below records one vote. Tally all of them and name the three candidates with the highest counts.",
        "The following ballots were cast in an election. Work out which three candidates received the most votes.",
        "Read every ballot below and report the three candidates that appear most often.",
    )

    question_text = (
        "Question: which three candidates received the most votes? List them separated by commas, most votes first."
    )

    def answer_text(self, row: Row) -> str:
        return ", ".join(row.answers)
