"""Names a user types that were renamed, kept working for one release (``MIGRATION.md`` lists every rename).

An old name prints one line on stderr, then does what the new name does::

    warning: recallm-demo is deprecated: use recallm-decoding-demo (renamed in 0.2.0; the old name works until 0.3.0, see MIGRATION.md)

The old console script ``recallm-demo`` is :func:`alias` of ``recallm-decoding-demo``'s ``main``
(``recallm.cli.demo``); the old ``recallm-rlm export`` subcommand and its ``export.*`` keys are rewritten
by ``recallm.cli.rlm``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["RENAMED_IN", "REMOVED_IN", "notice", "alias"]

#: the release that renamed them, and the one that drops the old names
RENAMED_IN = "0.2.0"
REMOVED_IN = "0.3.0"


def notice(old: str, new: str) -> None:
    """The one-line deprecation notice of an old name, on stderr."""
    print(
        f"warning: {old} is deprecated: use {new} (renamed in {RENAMED_IN}; the old name works until {REMOVED_IN}, "
        "see MIGRATION.md)",
        file=sys.stderr,
        flush=True,
    )


def alias(old: str, new: str, main: Callable[[list[str] | None], Any]) -> Callable[[list[str] | None], Any]:
    """The ``main`` of an old console script: the notice, then the new command's ``main`` on the same line."""

    def old_main(argv: list[str] | None = None) -> Any:
        notice(old, new)
        return main(argv)

    old_main.__doc__ = f"{old}: the old name of {new} (deprecated; see MIGRATION.md)"
    old_main.renames = new  # (the new command's name: the fuzz matrix fuzzes an alias through it)
    return old_main
