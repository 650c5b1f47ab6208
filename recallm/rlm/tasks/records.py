"""Record lines of the OOLONG-style tasks (``Date: ... || User: <id> || Instance: <question>``): their
dates, users and questions, and the lines that fill a length (``oolong``, ``oolong_pairs``)."""

from __future__ import annotations

import datetime as _dt
import random
from collections.abc import Callable

from recallm.rlm.tasks.common import TokenCounter, fit
from recallm.rlm.tasks.questions import LABELS, question

__all__ = ["Record", "parse_record_date", "random_day", "long_date", "record_lines", "user_ids"]

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH_NAMES = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
    "December",
)  # fmt: skip


_FIRST_DAY, _LAST_DAY = _dt.date(2019, 1, 1), _dt.date(2024, 12, 28)


def random_day(rng: random.Random, lo: _dt.date = _FIRST_DAY, hi: _dt.date = _LAST_DAY) -> _dt.date:
    return lo + _dt.timedelta(days=rng.randint(0, max(0, (hi - lo).days)))


def _date_text(day: _dt.date) -> str:
    return f"{_MONTHS[day.month - 1]} {day.day:02d}, {day.year}"


def long_date(day: _dt.date) -> str:
    return f"{_MONTH_NAMES[day.month - 1]} {day.day}, {day.year}"


def parse_record_date(text: str) -> _dt.date:
    """The date of a record (``Mon DD, YYYY``)."""
    month, day, year = text.replace(",", "").split()
    return _dt.date(int(year), _MONTHS.index(month) + 1, int(day))


def _record(rng: random.Random, user: int, label: str, day: _dt.date | None = None) -> str:
    day = day or random_day(rng)
    return f"Date: {_date_text(day)} || User: {user} || Instance: {question(rng, label)}"


#: one record: (user, label, date)
Record = tuple[int, str, _dt.date]


def record_lines(
    rng: random.Random,
    length: int,
    counter: TokenCounter,
    tolerance: float,
    records_for: Callable[[int], list[Record]],
) -> tuple[list[str], list[Record]]:
    """Record lines filling ``length`` tokens, and the records they show. ``records_for(n)``
    returns ``n`` records (about: a generator may round)."""
    sample = "\n".join(_record(rng, 10000 + i, LABELS[i % len(LABELS)]) for i in range(120))
    per_record = len(sample) / 120 + 1
    aim = length * (1 - tolerance / 2)
    n = max(8, int(aim * counter.chars_per_token(sample) / per_record))
    for _ in range(3):  # re-aim on the records actually drawn (their mix moves the mean length)
        records = records_for(n)
        lines = [_record(rng, user, label, day) for user, label, day in records]
        tokens = counter.count("\n".join(lines))
        if length * (1 - tolerance) <= tokens <= length * (1 + tolerance):
            break
        n = max(8, round(n * aim / max(1, tokens)))
    kept = fit(lines, length, counter, tolerance, keep=set())
    return kept, records[: len(kept)]


def user_ids(rng: random.Random, n: int) -> list[int]:
    return rng.sample(range(10000, 10000 + max(90000, 20 * n)), n)
