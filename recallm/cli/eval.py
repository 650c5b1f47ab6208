"""`recallm-eval`: evaluate a model on the benchmark suites, or compare runs in a report.

    recallm-eval                                        # tiny suite, tiny default model, HF on the CPU
    recallm-eval eval=paper model_path=/runs/recallm-qwen backend.name=vllm out_dir=/runs/eval/recallm-qwen
    recallm-eval eval=paper model_path=/models/recallm-qwen backend.name=openai backend.served_model=recallm \\
        backend.base_url=http://gpu-node:8000/v1 out_dir=/runs/eval/served
    recallm-eval backend.recall_constrained=false out_dir=outputs/eval/no-mask     # the "no logit masking" ablation
    recallm-eval benchmarks=[ruler] eval.benchmarks.ruler.per_cell=5                 # one benchmark of the suite
    recallm-eval mode=report runs=[outputs/eval/a,outputs/eval/b] report_dir=outputs/eval/report
    recallm-eval eval=paper eval.data_root=/data eval.judge.model=gemma-3-27b-it eval.judge.base_url=http://judge:8001/v1 \\
        model_path=/runs/recallm-qwen backend.name=vllm paper_model=RecaLLM-Qwen2.5-7B out_dir=/runs/eval/qwen

The recipe is ``recallm.eval.app`` (what is checked before the first token is generated, how a
rerun resumes). Mistakes are one ``error: ...`` line and exit code 2; the command line and the
settings' types, ranges and kinds of path are checked before anything is written.
"""

from __future__ import annotations

import sys

from recallm.cli.common import hydra_command
from recallm.errors import cli_errors
from recallm.eval import app
from recallm.eval.app import EvalRun, check

__all__ = ["EvalRun", "check", "run", "main"]

#: the recipe, its user errors turned into one line on stderr and exit code 2
run = cli_errors(app.run)


main = hydra_command(
    "eval",
    run,
    check=check,
    open_keys=("backend.rlm",),  # backend=rlm takes the RLM's own settings
    quiet=("transformers", "httpx", "httpcore", "matplotlib"),
)


if __name__ == "__main__":
    sys.exit(main())
