"""`recallm-doctor`: print what is installed and what a CPU run and a GPU run will use.

recallm-doctor                 # versions, devices, driver, the recall processor, problems for a GPU run
recallm-doctor --json          # the same as JSON
recallm-doctor --require gpu   # exit 2 with one line if a GPU run is not ready (for job scripts)

argparse, not Hydra (``recallm.cli.common``): it reads the installation, not a config, and must
answer even in an environment where Hydra or the config tree is broken.
"""

from __future__ import annotations

import argparse
import sys

from recallm.errors import RecallmError, cli_errors


@cli_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="recallm-doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--require", choices=["gpu"], help="fail (exit 2) unless a GPU run is ready")
    p.add_argument("--no-processor", action="store_true", help="do not import vLLM to build the recall processor")
    args = p.parse_args(argv)
    from recallm.doctor import as_json, gpu_problems, inspect_environment, report

    env = inspect_environment(check_processor=not args.no_processor)
    print(as_json(env) if args.json else report(env), flush=True)
    if args.require == "gpu":
        problems = gpu_problems(env)
        if problems:
            raise RecallmError(f"not ready for a GPU run: {'; '.join(problems)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
