"""User-facing errors and the one place that turns them into a one-line CLI failure."""

from __future__ import annotations

import functools
import logging
import re
import sys
from collections.abc import Callable
from typing import TypeVar

__all__ = ["RecallmError", "cli_errors", "EXIT_USAGE"]

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


def cli_errors(fn: F) -> F:
    """Decorate a CLI entry point: user errors become ``error: <message>`` on stderr, exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _MISSING as exc:  # a `???` config value nobody set
            logging.getLogger("recallm").debug("missing config value", exc_info=True)
            m = re.search(r"Missing mandatory value: ?([\w.\[\]]+)", str(exc))
            key = m.group(1) if m else getattr(exc, "full_key", None) or "a required value"
            print(f"error: config value {key} is required: set it on the command line ({key}=...)", file=sys.stderr)
            sys.exit(EXIT_USAGE)
        except (RecallmError, FileNotFoundError, NotADirectoryError) as exc:
            logging.getLogger("recallm").debug("user error", exc_info=True)
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"error: {msg}", file=sys.stderr)
            sys.exit(EXIT_USAGE)

    return wrapper  # type: ignore[return-value]
