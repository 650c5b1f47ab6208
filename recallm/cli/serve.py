"""`recallm-serve`: serve a trained RecaLLM model with vLLM's OpenAI-compatible server, recall spans
constrained to verbatim copies of their context.

recallm-serve MODEL_DIR [--host 127.0.0.1] [--port 8000] [--served-model-name NAME] [--no-recall]
              [--print-command] [VLLM_SERVE_ARGS ...]

MODEL_DIR is a RecaLLM model directory (`recallm-create-model`, `recallm-sft`, `recallm-export`).
Every other argument goes to `vllm serve` unchanged (e.g. --tensor-parallel-size 2 --max-model-len
32768); `--hf-overrides` is merged with the base-architecture overrides the model needs. Point
`recallm-eval backend.name=openai backend.base_url=http://HOST:PORT/v1 backend.served_model=NAME` or
the RLM scaffold at it. Needs vLLM (the `gpu` extra; on a CPU, the vLLM tier's environment).

argparse, not Hydra (``recallm.cli.common``): every unknown argument is passed on to `vllm serve`
verbatim (``--flag value`` pairs a Hydra command line cannot carry), and the process becomes vLLM's.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shlex
import sys

from recallm.errors import RecallmError, cli_errors

log = logging.getLogger("recallm.serve")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recallm-serve", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="RecaLLM model directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="model name clients send (default: the directory name)")
    p.add_argument(
        "--no-recall",
        action="store_true",
        help="recall_constrained=false: serve without the recall processor (unconstrained)",
    )
    p.add_argument(
        "--max-n",
        type=int,
        default=None,
        help="completions one request may ask for (n, best_of); more is answered with a 400 (default 16)",
    )
    p.add_argument("--print-command", action="store_true", help="print the vllm serve command and exit")
    return p


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args, extra = _parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[recallm-serve] %(message)s")
    from recallm.serve import DEFAULT_MAX_N, ServeSettings, serve_command, serve_env

    settings = ServeSettings(
        args.model,
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        recall_constrained=not args.no_recall,
        max_n=DEFAULT_MAX_N if args.max_n is None else args.max_n,
    )
    command = serve_command(settings, extra)
    env = serve_env(settings)
    if args.print_command:
        print(" ".join([*(f"{k}={v}" for k, v in env.items()), *map(shlex.quote, command)]))
        return 0
    if importlib.util.find_spec("vllm") is None:
        raise RecallmError(
            "recallm-serve needs vLLM, which is not installed here: on a GPU node `pip install -e '.[gpu]'` "
            "(scripts/install_gpu.sh); on a CPU, scripts/test_vllm.sh builds an environment with vLLM's CPU build"
        )
    from recallm.engines import check_engines

    check_engines("serve")  # one line for a vLLM no tier tests (RECALLM_ALLOW_UNTESTED_ENGINES=1 overrides)
    log.info(
        "serving %s as %r on http://%s:%d/v1 (recall processor %s)",
        settings.model,
        settings.served_model_name,
        settings.host,
        settings.port,
        "on" if settings.recall_constrained else "OFF",
    )
    sys.stdout.flush()
    os.environ.update(env)
    os.execv(command[0], command)  # vLLM's own server from here on (signals, logs, exit code)
    return 0  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
