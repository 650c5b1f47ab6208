"""The code blocks of the manual (``README.md`` and ``docs/**/*.md``), and what a test does with each.

* ```` ```python ```` blocks run, in order, in one namespace per page (``tests/integration/test_readme.py``).
* ```` ```bash ```` / ```` ```sh ```` blocks run in bash, in order, one bash per page
  (``tests/integration/test_docs.py``), with the project's commands replaced on ``PATH`` by
  ``tests/docs_shim.py``: a quick command runs for real (``--help``, ``recallm-plan``, ``--plan``,
  ``--status``, ``--print-command``, ``recallm-decoding-demo``, ``recallm-doctor``); any other is recorded and then
  checked without running — a Hydra command's line composed with every override checked (``main.compose``),
  an argparse command's flags parsed, an ``sbatch`` script's overrides composed for the command it runs,
  ``make`` targets dry-run (``make -n``), a benchmark or module named exists (``.venv/bin/`` prefixes are
  dropped and ``source .venv/bin/activate`` does nothing: the shims are the commands). Only a few other programs are on
  ``PATH`` (:data:`ALLOWED`): a block that needs anything else fails, unless it is marked.
* ```` ```console ```` blocks (``$ command`` then the lines it prints) run for real, and every line shown
  must be a line of what the command prints (the troubleshooting page's error lines); ``…`` in a shown line
  stands for any text (a path that differs from machine to machine). ``models/tiny`` and ``models/tiny-base``
  (the tiny model without the recall tokens) exist where they run.
* A block right after ``<!-- not run: REASON -->`` is not run; ``test_docs.py`` lists them.
* Other languages (``text``, ``yaml``, ``json``, none) are not code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests import REPO_ROOT

#: the programs a shell block may use besides the project's commands (the shims)
ALLOWED = (
    "basename", "cat", "cp", "dirname", "du", "env", "false", "grep", "head", "ls", "mkdir", "mv", "nice",
    "nproc", "printf", "rm", "sed", "seq", "sleep", "tail", "tee", "test", "time", "touch", "true", "truncate",
    "wc", "python3",
)  # fmt: skip

#: the programs the shim stands in for (besides every recallm-* command)
SHIMMED = ("sbatch", "torchrun", "make", "python")

SHELL = ("bash", "sh", "shell")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>```+|~~~+)(?P<lang>[\w+-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.M | re.S)  # fmt: skip


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the first line of code
    lang: str
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every Markdown page of docs/."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        start = m.start()
        before = text[:start].rstrip("\n").splitlines()
        previous = before[-1] if before else ""
        marked = NOT_RUN.match(previous)
        indent = len(m.group("indent"))
        code = "\n".join(line[indent:] for line in m.group("code").splitlines()) + "\n"
        line = text.count("\n", 0, start) + 2
        out.append(Block(path, line, m.group("lang").lower(), code, marked.group(1) if marked else None))
    return out


def all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in blocks(path)]


# ------------------------------------------------------------------------------- what a command line is
#: a command that runs for real in the docs test (quick, and its output is the point)
def runs_for_real(prog: str, args: list[str]) -> bool:
    if not prog.startswith("recallm-"):
        return False
    if "--help" in args or "-h" in args or "--cfg" in args:  # Hydra's --cfg prints the config, runs no job
        return True
    if prog in ("recallm-plan", "recallm-decoding-demo"):
        return True
    if prog in ("recallm-grpo", "recallm-sft") and "--plan" in args:
        return True
    if prog == "recallm-pipeline" and ("--status" in args or "--dry-run" in args):
        return True
    if prog == "recallm-serve" and "--print-command" in args:
        return True
    if prog == "recallm-doctor" and "--require" not in args:
        return True
    return False


#: the command an sbatch script runs and what the script puts before the user's overrides (slurm/*.sbatch: CMD)
SBATCH_COMMANDS = {
    "sft.sbatch": ("recallm-sft", ["deepspeed=zero2", "resume=auto"]),
    "grpo.sbatch": ("recallm-grpo", ["trainer.nnodes=1", "trainer.resume_mode=auto"]),
    "grpo_multinode.sbatch": ("recallm-grpo", ["trainer.resume_mode=auto"]),
    "eval.sbatch": ("recallm-eval", ["eval=paper", "backend.name=vllm"]),
    "rlm_train.sbatch": ("recallm-rlm", ["train", "trainer.nnodes=1", "trainer.resume_mode=auto"]),
}
