"""Stands in for a project command while ``tests/integration/test_docs.py`` runs the manual's shell blocks:
``python tests/docs_shim.py PROG ARGS...``. A quick command (``tests.docs_blocks.runs_for_real``) is run for
real (its exit code is the shim's); any other line is appended, as JSON, to ``$DOCS_SHIM_LOG`` with the
block it came from (``$DOCS_BLOCK``) and checked afterwards by the test without running. Imports nothing
heavy: it starts once per command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.docs_blocks import runs_for_real  # noqa: E402


def main() -> int:
    prog, args = sys.argv[1], sys.argv[2:]
    if runs_for_real(prog, args):
        real = Path(sys.executable).parent / prog
        os.execv(str(real), [prog, *args])
    with open(os.environ["DOCS_SHIM_LOG"], "a") as log:
        record = {"block": os.environ.get("DOCS_BLOCK", "?"), "prog": prog, "args": args, "cwd": os.getcwd()}
        log.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
