"""`recallm-rlm`: Recursive Language Models - run a task set, write it, show a trajectory, turn runs into SFT data.

    recallm-rlm                                   # the tiny task set on the tiny default model (CPU, offline)
    recallm-rlm tasks.lengths=[8K,128K,1M] root.name=openai root.served_model=gpt-5 \\
        root.base_url=https://api.openai.com/v1 sub.name=openai sub.served_model=gpt-5-mini \\
        sub.base_url=https://api.openai.com/v1 out_dir=outputs/rlm/gpt5
    recallm-rlm generate out_dir=outputs/rlm/tasks                     # tasks.jsonl only
    recallm-rlm show outputs/rlm/tiny/trajectories/oolong-8192-0.jsonl # an HTML page next to it
    recallm-rlm to-sft sft_data.tokenizer_path=/models/recallm-qwen    # successful runs -> SFT jsonl
    recallm-rlm train                                                  # GRPO of the root (configs/rlm_train.yaml)

The first argument may name the mode (``run``, ``generate``, ``show``, ``to-sft``, ``train``); ``show``
takes the trajectory as the next argument; ``train`` composes its own config (``recallm.rlm.train``). Everything else is a Hydra override of
``configs/rlm.yaml`` (the command line is read by ``recallm.cli.common.hydra_command``, which turns
the mode word into ``mode=...``). Settings, task names and lengths are checked before any model is
loaded; mistakes are one ``error: ...`` line and exit code 2. A rerun of ``run`` resumes. The names ``to-sft``
had before 0.2.0 (``export``, ``mode=export``, ``export.<key>=...``) still work, with a one-line notice
(``old_names``; MIGRATION.md).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recallm.cli import common, renamed
from recallm.errors import RecallmError, cli_errors
from recallm.grpo.settings import closed as grpo_keys_closed
from recallm.rlm.settings import MODES, RLMRun

log = logging.getLogger(__name__)

def check(cfg: DictConfig) -> None:
    """The command's own keys, before anything is written (``recallm.cli.common``); the sections are
    checked by the mode that reads them."""
    from recallm.config import typed

    typed(RLMRun, cfg, "")


def _container(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if node is not None else None


def _task_settings(cfg: DictConfig) -> tuple[list[tuple[str, int, int]], dict[str, Any], Any]:
    from recallm.config import typed
    from recallm.rlm.tasks import TaskRun, TokenCounter

    tasks = _container(cfg.tasks)
    task_run = typed(TaskRun, tasks, "tasks")
    specs = task_run.specs()
    counter = TokenCounter()
    if task_run.tokenizer_path:
        from recallm.tokens import load_tokenizer

        counter = TokenCounter(load_tokenizer(Path(task_run.tokenizer_path)))
    return specs, tasks, {**task_run.task_kwargs(), "counter": counter}


def run_tasks_mode(cfg: DictConfig) -> dict[str, Any]:
    from recallm.rlm.budget import BudgetLimits
    from recallm.rlm.evaluate import run_tasks
    from recallm.rlm.models import make_model
    from recallm.rlm.runner import RLM, RLMSettings
    from recallm.rlm.sandbox import SandboxLimits
    from recallm.rlm.subcalls import SubCallSettings

    specs, tasks, task_kwargs = _task_settings(cfg)
    settings = RLMSettings.from_mapping(_container(cfg.rlm), "rlm")
    subcalls = SubCallSettings.from_mapping(_container(cfg.subcalls), "subcalls")
    sandbox = SandboxLimits.from_mapping(_container(cfg.sandbox), "sandbox")
    budget = BudgetLimits.from_mapping(_container(cfg.budget), "budget")
    root_cfg, sub_cfg = _container(cfg.root), _container(cfg.sub) or {}
    fingerprint = {
        "tasks": {k: v for k, v in tasks.items() if k != "name"},
        "root": root_cfg,
        "sub": sub_cfg if sub_cfg.get("name") else None,
        "rlm": _container(cfg.rlm),
        "subcalls": _container(cfg.subcalls),
        "sandbox": _container(cfg.sandbox),
        "budget": _container(cfg.budget),
    }
    root = make_model(root_cfg, "root", models_dir=cfg.models_dir)
    sub = make_model(sub_cfg, "sub", models_dir=cfg.models_dir) if sub_cfg.get("name") else None
    try:
        rlm = RLM(root, sub, settings=settings, subcalls=subcalls, sandbox=sandbox, budget=budget)
        print(
            f"RLM (depth {settings.max_depth}, root {root.name}, sub {(sub or root).name}) on {len(specs)} tasks "
            f"into {cfg.out_dir}; sandbox isolation: {rlm.isolation.describe()}"
        )
        summary = run_tasks(
            rlm,
            specs,
            cfg.out_dir,
            fingerprint=fingerprint,
            overwrite=bool(cfg.overwrite),
            parallel=int(cfg.parallel),
            limit=cfg.limit,
            progress=bool(cfg.progress),
            **task_kwargs,
        )
    finally:
        root.close()
        if sub is not None:
            sub.close()
    for task, entry in summary["tasks"].items():
        cells = "  ".join(f"{n}: {100 * c['score']:.1f}" for n, c in entry["by_length"].items())
        outcomes = ", ".join(f"{k} {v}" for k, v in entry["overall"]["outcomes"].items())
        print(f"{task:14} score (%) by length  {cells}   | outcomes: {outcomes}")
    if not summary.get("complete", True):
        print(f"incomplete: {summary['n_examples']} of {summary['planned']} tasks done; rerun to continue")
    print(f"wrote {Path(cfg.out_dir) / 'results.jsonl'}, summary.json and trajectories/")
    return summary


def generate_mode(cfg: DictConfig) -> Path:
    from recallm.rlm.tasks import make_task

    specs, _, kwargs = _task_settings(cfg)
    out = Path(cfg.out_dir) / "tasks.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for task, length, index in specs:
            ex = make_task(task, length, index, **kwargs)
            row = {
                "task_id": ex.task_id,
                "task": task,
                "length": length,
                "index": index,
                "tokens": ex.tokens,
                "query": ex.query,
                "reference": ex.reference,
                "context": ex.context,
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(specs)} tasks ({kwargs['counter'].describe()}) to {out}")
    return out


def show_mode(cfg: DictConfig) -> Path:
    from recallm.rlm.show import write_html

    if not cfg.trajectory:
        raise RecallmError("show needs a trajectory: recallm-rlm show PATH.jsonl (or trajectory=PATH)")
    page = write_html(cfg.trajectory, cfg.html)
    print(f"wrote {page}")
    return page


def to_sft_mode(cfg: DictConfig) -> dict[str, int]:
    from recallm.config import typed
    from recallm.rlm.sft_data import SFTDataSettings, write_sft_data
    from recallm.tiny import resolve_model
    from recallm.tokens import load_tokenizer

    ex = typed(SFTDataSettings, _container(cfg.sft_data), "sft_data")
    tokenizer_path = ex.tokenizer_path
    if not tokenizer_path:
        if not cfg.root.model_path:
            raise RecallmError("to-sft needs sft_data.tokenizer_path (the tokenizer of the model to train)")
        tokenizer_path = resolve_model(str(cfg.root.model_path), Path(cfg.models_dir))
    counts = write_sft_data(
        ex.paths(),
        load_tokenizer(Path(tokenizer_path)),
        ex.out_file,
        min_turns=ex.min_turns,
        max_turn_chars=ex.max_turn_chars,
    )
    print(f"wrote {counts['records']} SFT records from {counts['kept']} of {counts['trajectories']} trajectories "
          f"to {ex.out_file} ({json.dumps(counts)})")  # fmt: skip
    return counts


@cli_errors
def run(cfg: DictConfig):
    mode = cfg.mode
    if mode == "run":
        return run_tasks_mode(cfg)
    if mode == "generate":
        return generate_mode(cfg)
    if mode == "show":
        return show_mode(cfg)
    if mode == "to-sft":
        return to_sft_mode(cfg)
    raise RecallmError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


_POSITIONAL = {"show": "trajectory"}


def rewrite_argv(argv: list[str]) -> list[str]:
    """``recallm-rlm show PATH ...`` -> ``recallm-rlm mode=show trajectory=PATH ...`` (module doc)."""
    return common.rewrite_argv(argv, MODES, _POSITIONAL)


@cli_errors
def _train(cfg, print_config: bool = False) -> int:
    from recallm.rlm.train import main as train_main

    return train_main(cfg, print_config=print_config)


#: ``recallm-rlm train ...``: GRPO of the RLM root (``recallm.rlm.train``, its own config composed once
#: here; verl's keys are typed by verl's config, ours under ``recallm.`` are a closed set)
train = common.hydra_command(
    "rlm_train",
    _train,
    closed=grpo_keys_closed,
    flags={"--print-config": "print the composed and validated config, launch nothing"},
    hydra_run=False,
)


_OLD_KEY = re.compile(r"^(~|\+{0,2})export(?=[.=])")


def old_names(argv: list[str]) -> list[str]:
    """The names of ``to-sft`` before 0.2.0, rewritten to today's with one notice on stderr (MIGRATION.md):
    the mode word ``export`` and ``mode=export`` become ``to-sft``, the section ``export.<key>=...``
    ``sft_data.<key>=...``. ``recallm-rlm train``'s line is not touched."""
    args = list(argv)
    if args[:1] == ["train"]:
        return args
    old = False
    if args[:1] == ["export"]:
        args[0], old = "to-sft", True
    for i, arg in enumerate(args):
        if arg == "mode=export":
            args[i], old = "mode=to-sft", True
        elif match := _OLD_KEY.match(arg):
            args[i], old = f"{match.group(1)}sft_data{arg[match.end():]}", True
    if old:
        renamed.notice("recallm-rlm export", "recallm-rlm to-sft, and sft_data.<key> for export.<key>")
    return args


_main = common.hydra_command(
    "rlm",
    run,
    check=check,
    modes=MODES,
    positional=_POSITIONAL,
    subcommands={"train": train},
    quiet=("transformers", "httpx", "httpcore"),
)


def main(argv: list[str] | None = None) -> int | None:
    """``recallm-rlm``: its command line (``old_names`` rewritten), then ``recallm.cli.common.hydra_command``'s."""
    return _main(old_names(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
