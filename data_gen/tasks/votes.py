"""Aggregation: majority vote and top-N vote over a long list of ballots.

A first block of ballots sets the ranking up (each of the top N + 1 candidates ahead of the
next by the vote margin, the rest below), then single ballots follow, drawn so that every
prefix keeps that ranking: however many ballots fit the target length, the answer holds. Varied per example: vote margin,
candidate count, candidate category (names, places, letters, numbers). No gold evidence: the
recall reward is ``always`` (penalties still apply).
"""

from __future__ import annotations

import random
import re
import string
from typing import Any

from data_gen.base import Draft, Piece, Row, Task, check_choice, int_range, register
from data_gen.text import cities, first_names

__all__ = ["MajorityVote", "TopNVote", "CANDIDATE_TYPES"]

_BALLOT = re.compile(r"^Ballot \d+: (.+)$", re.MULTILINE)

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
        self.candidates = int_range("candidates", candidates if candidates is not None else (self.top + 2, self.top + 7))
        self.margin = int_range("margin", margin)
        if self.candidates[0] < self.top + 1 or self.margin[0] < 1:
            from recallm.errors import RecallmError

            raise RecallmError(
                f"{self.name} needs at least {self.top + 1} candidates and a margin of at least 1, "
                f"got candidates={candidates} margin={margin}"
            )
        self.candidate_types = check_choice("candidate_types", candidate_types, CANDIDATE_TYPES)
        self.question_positions = check_choice("question_positions", question_positions, ("end", "beginning", "both"))

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
        chain = names[: self.top + 1]  # must stay strictly ordered, `margin` apart

        def ballots():
            voter = 1
            running = dict(counts)
            first = [c for c, k in counts.items() for _ in range(k)]  # one block sets the margins up
            rng.shuffle(first)
            yield Piece("\n".join(f"Ballot {voter + i}: {c}" for i, c in enumerate(first)))
            voter += len(first)
            weights = {c: counts[c] + 1 for c in names}
            while True:  # then single ballots, each keeping the ranking (so any prefix keeps it)
                allowed = []
                for c in names:
                    if c in chain[1:]:
                        i = chain.index(c)
                        ok = running[c] + 1 <= running[chain[i - 1]] - margin
                    elif c not in chain:
                        ok = running[c] + 1 < running[chain[-1]]
                    else:
                        ok = True
                    if ok:
                        allowed.append(c)
                pick = rng.choices(allowed, weights=[weights[c] for c in allowed])[0]
                running[pick] += 1
                yield Piece(f"Ballot {voter}: {pick}")
                voter += 1

        ranking = sorted(names, key=lambda c: -counts[c])
        instruction, which = self.pick_instruction(rng)
        return Draft(
            instruction=instruction,
            question=self.question_text,
            placed=[],
            distractors=ballots(),
            answers=ranking[: self.top],
            augmentations={"candidate_type": kind, "candidates": n, "margin": margin, "instruction": which},
            question_position=self.pick_question_position(rng, self.question_positions),
            keep_order=True,
            evidence=False,
            trace_info={"ranking": ranking},
        )

    def trace(self, row: Row, rng: random.Random) -> list[tuple[str, Any]]:
        votes = _BALLOT.findall(row.prompt_text)
        counts = {c: votes.count(c) for c in row.trace_info["ranking"]}
        totals = ", ".join(f"{c}: {n}" for c, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        return [("text", f"Counting every ballot ({len(votes)} in all): {totals}.")]


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
