"""User-facing errors and the one place that turns them into a one-line CLI failure."""

from __future__ import annotations

import functools
import logging
import re
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["RecallmError", "Problems", "collect", "raise_problems", "cli_errors", "EXIT_USAGE"]

EXIT_USAGE = 2

F = TypeVar("F", bound=Callable[..., object])

try:
    from omegaconf.errors import InterpolationToMissingValueError, MissingMandatoryValue

    _MISSING: tuple[type[Exception], ...] = (MissingMandatoryValue, InterpolationToMissingValueError)
except ImportError:  # pragma: no cover - omegaconf is a dependency
    _MISSING = ()


class RecallmError(ValueError):
    """A mistake in what the user gave us (path, model, config value). The message names the
    bad value and what was expected; CLIs print it as one line, without a traceback."""


class Problems(RecallmError):
    """Every problem a launch's checks found, one line each (each naming its key and a value that would
    work): the CLI prints one ``error:`` line per problem, then exits 2. Raised by :func:`raise_problems`."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = [str(p).strip().splitlines()[0] for p in problems if str(p).strip()]
        first = self.problems[0] if self.problems else "no problems"
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        super().__init__(first + more)


def _missing_line(exc: BaseException) -> str:
    """The one line for a ``???`` config value nobody set (OmegaConf's ``MissingMandatoryValue``)."""
    m = re.search(r"Missing mandatory value: ?([\w.\[\]]+)", str(exc))
    key = m.group(1) if m else getattr(exc, "full_key", None) or "a required value"
    return f"config value {key} is required: set it on the command line ({key}=...)"


def collect(*checks: Callable[[], object]) -> list[str]:
    """Run every check and gather what they find: a check returns or yields problem lines (strings), or
    raises a ``RecallmError`` (one line; a :class:`Problems`, its lines). One check failing does not stop
    the others — a launch reports every problem at once (the pattern of every command's checks:
    ``recallm.grpo.app.problems``, ``recallm.sft.train.check_config``, ``recallm-data``'s)."""
    found: list[str] = []
    for check in checks:
        try:
            result = check()
            if isinstance(result, str):
                found.append(result)
            elif isinstance(result, (list, Iterator)):  # problem lines; any other return value is not a finding
                found.extend(str(p) for p in result)
        except Problems as exc:
            found.extend(exc.problems)
        except _MISSING as exc:  # a `???` value the check read: one problem among the others
            if (line := _missing_line(exc)) not in found:
                found.append(line)
        except (RecallmError, FileNotFoundError, NotADirectoryError) as exc:
            found.append(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    return found


def raise_problems(problems: list[str]) -> None:
    """Raise :class:`Problems` with ``problems`` (nothing when there are none); one problem is a plain
    one-line ``RecallmError`` too."""
    if problems:
        raise Problems(list(problems))


def cli_errors(fn: F) -> F:
    """Decorate a CLI entry point: user errors become ``error: <message>`` on stderr, exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _MISSING as exc:  # a `???` config value nobody set
            logging.getLogger("recallm").debug("missing config value", exc_info=True)
            print(f"error: {_missing_line(exc)}", file=sys.stderr)
            sys.exit(EXIT_USAGE)
        except Problems as exc:  # every problem of a launch's checks, one line each
            logging.getLogger("recallm").debug("user errors", exc_info=True)
            for problem in exc.problems:
                print(f"error: {problem}", file=sys.stderr)
            if len(exc.problems) > 1:
                print(f"error: {len(exc.problems)} problems; nothing was started", file=sys.stderr)
            sys.exit(EXIT_USAGE)
        except (RecallmError, FileNotFoundError, NotADirectoryError) as exc:
            logging.getLogger("recallm").debug("user error", exc_info=True)
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"error: {msg}", file=sys.stderr)
            sys.exit(EXIT_USAGE)

    return wrapper  # type: ignore[return-value]
