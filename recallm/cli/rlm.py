"""`recallm-rlm`: Recursive Language Models - run a task set, write it, show a trajectory, export SFT data.

    recallm-rlm                                   # the tiny task set on the tiny default model (CPU, offline)
    recallm-rlm tasks.lengths=[8K,128K,1M] root.name=openai root.served_model=gpt-5 \\
        root.base_url=https://api.openai.com/v1 sub.name=openai sub.served_model=gpt-5-mini \\
        sub.base_url=https://api.openai.com/v1 out_dir=outputs/rlm/gpt5
    recallm-rlm generate out_dir=outputs/rlm/tasks                     # tasks.jsonl only
    recallm-rlm show outputs/rlm/tiny/trajectories/oolong-8192-0.jsonl # an HTML page next to it
    recallm-rlm export export.tokenizer_path=/models/recallm-qwen      # successful runs -> SFT jsonl
    recallm-rlm train                                                  # GRPO of the root (configs/rlm_train.yaml)

The first argument may name the mode (``run``, ``generate``, ``show``, ``export``, ``train``); ``show``
takes the trajectory as the next argument; ``train`` composes its own config (``recallm.rlm.train``). Everything else is a Hydra override of
``configs/rlm.yaml``. Settings, task names and lengths are checked before any model is loaded;
mistakes are one ``error: ...`` line and exit code 2. A rerun of ``run`` resumes.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from recallm.errors import RecallmError, cli_errors
from recallm.paths import CONFIG_DIR

log = logging.getLogger(__name__)

MODES = ("run", "generate", "show", "export")


def _container(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if node is not None else None


def _task_settings(cfg: DictConfig) -> tuple[list[tuple[str, int, int]], dict[str, Any], Any]:
    from recallm.rlm.tasks import TokenCounter, task_specs

    tasks = _container(cfg.tasks)
    known = {"name", "names", "lengths", "per_cell", "seed", "tolerance", "max_pair_users", "needles", "tokenizer_path"}
    unknown = sorted(set(tasks) - known)
    if unknown:
        raise RecallmError(f"tasks has unknown keys {unknown}; known: {sorted(known)}")
    specs = task_specs(tasks["names"], tasks["lengths"], tasks["per_cell"])
    counter = TokenCounter()
    if tasks.get("tokenizer_path"):
        from recallm.tokens import load_tokenizer

        counter = TokenCounter(load_tokenizer(Path(tasks["tokenizer_path"])))
    return specs, tasks, counter


def _task_kwargs(tasks: dict[str, Any], counter) -> dict[str, Any]:
    return {
        "seed": int(tasks.get("seed") or 0),
        "counter": counter,
        "tolerance": float(tasks.get("tolerance", 0.02)),
        "max_pair_users": None if tasks.get("max_pair_users") is None else int(tasks["max_pair_users"]),
        "needles": int(tasks.get("needles") or 2),
    }


def run_tasks_mode(cfg: DictConfig) -> dict[str, Any]:
    from recallm.rlm.budget import BudgetLimits
    from recallm.rlm.evaluate import run_tasks
    from recallm.rlm.models import make_model
    from recallm.rlm.runner import RLM, RLMSettings
    from recallm.rlm.sandbox import SandboxLimits
    from recallm.rlm.subcalls import SubCallSettings

    specs, tasks, counter = _task_settings(cfg)
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
            **_task_kwargs(tasks, counter),
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

    specs, tasks, counter = _task_settings(cfg)
    out = Path(cfg.out_dir) / "tasks.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    kwargs = _task_kwargs(tasks, counter)
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
    print(f"wrote {len(specs)} tasks ({counter.describe()}) to {out}")
    return out


def show_mode(cfg: DictConfig) -> Path:
    from recallm.rlm.show import write_html

    if not cfg.trajectory:
        raise RecallmError("show needs a trajectory: recallm-rlm show PATH.jsonl (or trajectory=PATH)")
    page = write_html(cfg.trajectory, cfg.html)
    print(f"wrote {page}")
    return page


def export_mode(cfg: DictConfig) -> dict[str, int]:
    from recallm.rlm.export import export_sft
    from recallm.tiny import resolve_model
    from recallm.tokens import load_tokenizer

    ex = _container(cfg.export)
    known = {"trajectories", "out_file", "tokenizer_path", "min_turns", "max_turn_chars"}
    unknown = sorted(set(ex) - known)
    if unknown:
        raise RecallmError(f"export has unknown keys {unknown}; known: {sorted(known)}")
    tokenizer_path = ex.get("tokenizer_path")
    if not tokenizer_path:
        if not cfg.root.model_path:
            raise RecallmError("export needs export.tokenizer_path (the tokenizer of the model to train)")
        tokenizer_path = resolve_model(str(cfg.root.model_path), Path(cfg.models_dir))
    paths = ex["trajectories"]
    paths = [paths] if isinstance(paths, str) else list(paths)
    counts = export_sft(
        paths,
        load_tokenizer(Path(tokenizer_path)),
        ex["out_file"],
        min_turns=int(ex.get("min_turns", 2)),
        max_turn_chars=int(ex.get("max_turn_chars", 100_000)),
    )
    print(f"wrote {counts['records']} SFT records from {counts['kept']} of {counts['trajectories']} trajectories "
          f"to {ex['out_file']} ({json.dumps(counts)})")  # fmt: skip
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
    if mode == "export":
        return export_mode(cfg)
    raise RecallmError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


@hydra.main(config_path=str(CONFIG_DIR), config_name="rlm", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    for name in ("transformers", "httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    run(cfg)


def _quote(value: str) -> str:
    if re.fullmatch(r"[\w./~:+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def rewrite_argv(argv: list[str]) -> list[str]:
    """``recallm-rlm show PATH ...`` -> ``recallm-rlm mode=show trajectory=PATH ...`` (module doc)."""
    args = list(argv)
    if args and args[0] in MODES:
        mode = args.pop(0)
        if mode == "show" and args and "=" not in args[0] and not args[0].startswith("-"):
            args[0] = f"trajectory={_quote(args[0])}"
        args.insert(0, f"mode={mode}")
    return args


@cli_errors
def train(argv: list[str]) -> int:
    """``recallm-rlm train ...``: GRPO of the RLM root (``recallm.rlm.train``, its own config)."""
    from recallm.rlm.train import main as train_main

    return train_main(argv)


def main() -> None:
    if sys.argv[1:2] == ["train"]:
        sys.exit(train(sys.argv[2:]))
    sys.argv[1:] = rewrite_argv(sys.argv[1:])
    _hydra_main()


if __name__ == "__main__":
    sys.exit(main())
