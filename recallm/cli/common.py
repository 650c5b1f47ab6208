"""What every Hydra command of the project does before Hydra runs it.

``run_hydra(config_name, hydra_main, check=...)`` composes the command line the way Hydra will
and checks it (``recallm.config.check_overrides``: the type of each override against the default
it replaces, settings nothing reads), then the command's own ``check(cfg)`` (required values,
ranges, kinds of path). A mistake is one ``error: ...`` line on stderr and exit code 2 — before
Hydra creates its output directory, so nothing at all is written. Command lines with Hydra's own
flags (``--help``, ``--cfg``, ``-m``, ...) go to Hydra unchecked.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from recallm.errors import cli_errors

__all__ = ["run_hydra", "precheck"]


@cli_errors
def precheck(
    config_name: str,
    argv: Sequence[str],
    check: Callable[[Any], None] | None = None,
    *,
    open_keys: Sequence[str] = (),
    closed: Callable[[str], bool] | None = None,
) -> Any:
    """Check a command line (module doc); returns the composed config."""
    from recallm.config import check_overrides

    cfg = check_overrides(config_name, argv, open_keys=open_keys, closed=closed)
    if check is not None:
        check(cfg)
    return cfg


def run_hydra(
    config_name: str,
    hydra_main: Callable[[], Any],
    check: Callable[[Any], None] | None = None,
    *,
    open_keys: Sequence[str] = (),
) -> None:
    """The body of a console script: ``precheck`` the arguments, then hand them to Hydra."""
    argv = sys.argv[1:]
    if not any(arg.startswith("-") for arg in argv):
        precheck(config_name, argv, check, open_keys=open_keys)
    hydra_main()
