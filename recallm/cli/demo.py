"""`recallm-demo`: the old name of `recallm-decoding-demo` (renamed in 0.2.0; it prints a one-line notice, then
runs the decoding demo; removed in 0.3.0). `make demo` is the tiny pipeline, not this command (MIGRATION.md)."""

from __future__ import annotations

import sys

from recallm.cli.decoding_demo import main as _decoding_demo
from recallm.cli.renamed import alias

main = alias("recallm-demo", "recallm-decoding-demo", _decoding_demo)


if __name__ == "__main__":
    sys.exit(main())
