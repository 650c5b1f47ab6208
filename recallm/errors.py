"""User-facing errors and the one place that turns them into a one-line CLI failure."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import TypeVar

__all__ = ["RecallmError", "cli_errors", "EXIT_USAGE"]

EXIT_USAGE = 2

F = TypeVar("F", bound=Callable[..., object])


class RecallmError(ValueError):
    """A mistake in what the user gave us (path, model, config value). The message names the
    bad value and what was expected; CLIs print it as one line, without a traceback."""


def cli_errors(fn: F) -> F:
    """Decorate a CLI entry point: user errors become ``error: <message>`` on stderr, exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (RecallmError, FileNotFoundError, NotADirectoryError) as exc:
            logging.getLogger("recallm").debug("user error", exc_info=True)
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"error: {msg}", file=sys.stderr)
            sys.exit(EXIT_USAGE)

    return wrapper  # type: ignore[return-value]
