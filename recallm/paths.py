"""Where the Hydra config tree lives, and the names runs of a model are filed under.

The tree is the top-level ``configs/`` of the source checkout; a wheel carries the same files as
``recallm/configs/`` (``pyproject.toml``: hatch's ``force-include``). The lookup takes, in order,
``$RECALLM_CONFIG_DIR``, the copy inside the installed package, the source checkout's ``configs/``
(editable installs and a plain checkout on ``sys.path``).

A model directory names the runs made from it (:func:`model_name`, :func:`model_label`; the config
files reach them as ``${recallm.model_name:PATH}`` and ``${recallm.model_label:PATH}``, resolvers the
commands register, ``recallm.cli.schemas``): the own-model recipes (``data=own_cpu``, ``sft=own_cpu``,
``grpo=own_cpu``, ``eval=own_cpu``) file data, checkpoints and results under the name of the model
they start from, so nothing of the tiny default's names is inherited and one model's stages find each
other's outputs.

A GRPO run directory (``trainer.default_local_dir``) is laid out by verl 0.9.1 and by RecaLLM's
launcher; its names are held here, the one home every reader and writer takes them from:
``global_step_<N>/`` per saved step (:func:`step_name`, :func:`step_dir`, :func:`step_of`, :func:`saved_steps`), verl's
tracker naming the step a resume starts from (:data:`TRACKER`, read by :func:`tracked_step`), the
per-step metrics log (:data:`METRICS_FILE`), the console log of a summary-mode run
(:data:`GRPO_LOG`) and the stop file a signal writes (:data:`STOP_FILE`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "CONFIG_DIR",
    "config_dir",
    "model_name",
    "model_label",
    "RESOLVERS",
    "package_dir",
    "TRACKER",
    "METRICS_FILE",
    "GRPO_LOG",
    "STOP_FILE",
    "step_name",
    "step_dir",
    "step_of",
    "saved_steps",
    "tracked_step",
    "is_grpo_run",
]

_PACKAGE = Path(__file__).resolve().parent


def _find_config_dir() -> Path:
    if os.environ.get("RECALLM_CONFIG_DIR"):
        return Path(os.environ["RECALLM_CONFIG_DIR"])
    for candidate in (_PACKAGE / "configs", _PACKAGE.parent / "configs"):
        if (candidate / "decoding_demo.yaml").is_file():
            return candidate
    return _PACKAGE / "configs"  # missing: config_dir() says so


#: the config tree: inside the installed wheel, or ``configs/`` of the source checkout (module doc)
CONFIG_DIR = _find_config_dir()


def config_dir() -> Path:
    """The config tree; raises with a clear message when it is missing."""
    if not (CONFIG_DIR / "decoding_demo.yaml").is_file():
        from recallm.errors import RecallmError

        raise RecallmError(
            f"config tree not found at {CONFIG_DIR}; install recallm as a wheel (it carries recallm/configs) or from "
            "its source tree (pip install -e .), or set RECALLM_CONFIG_DIR"
        )
    return CONFIG_DIR


# ------------------------------------------------------------------------------ a GRPO run directory
#: verl's tracker: the step of its last finished save, the one ``trainer.resume_mode=auto`` resumes from
#: (written last by verl's save; ``recallm.grpo.checkpoints`` rewrites it to the newest intact step)
TRACKER = "latest_checkpointed_iteration.txt"
#: the per-step metrics log (verl's ``file`` logger, appended across resumes; ``recallm.eval.curves`` reads it)
METRICS_FILE = "metrics.jsonl"
#: verl's and Ray's output of a run in ``recallm.console=summary`` (``recallm.grpo.console``)
GRPO_LOG = "grpo.log"
#: written when ``recallm-grpo`` is sent SIGTERM/SIGUSR1: verl's trainer saves and stops (``recallm.grpo.preemption``)
STOP_FILE = ".recallm-stop"
_STEP_PREFIX = "global_step_"
_STEP = re.compile(_STEP_PREFIX + r"(\d+)")


def step_name(step: int) -> str:
    """The name of the directory verl saves step ``step`` into: ``global_step_<step>``."""
    return f"{_STEP_PREFIX}{step}"


def step_dir(run_dir: str | os.PathLike, step: int) -> Path:
    """The directory verl saves step ``step`` of the run at ``run_dir`` into (:func:`step_name`)."""
    return Path(run_dir) / step_name(step)


def step_of(path: str | os.PathLike) -> int | None:
    """N of a ``global_step_N`` path, else None."""
    match = _STEP.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def saved_steps(run_dir: str | os.PathLike) -> dict[int, Path]:
    """The ``global_step_N`` directories under ``run_dir``, by step (none when it is not a directory)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return {}
    found = {}
    for child in run_dir.iterdir():
        step = step_of(child)
        if step is not None and child.is_dir():
            found[step] = child
    return found


def tracked_step(run_dir: str | os.PathLike) -> int | None:
    """The step verl's tracker names: None when there is no tracker, -1 when there is one that does not
    read as a step (empty or half-written after a kill while verl rewrote it, binary, a directory)."""
    tracker = Path(run_dir) / TRACKER
    if not tracker.exists():
        return None
    try:
        return int(tracker.read_text().strip())
    except (OSError, ValueError):  # (UnicodeDecodeError is a ValueError)
        return -1


def is_grpo_run(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a GRPO run directory (verl's tracker or a saved step in it)."""
    return (Path(path) / TRACKER).is_file() or bool(saved_steps(path))


# --------------------------------------------------------------------------------- names of runs
#: the directories the project's stages write a model into, under the run's own directory:
#: ``<sft out_dir>/<stage>/final``, ``<grpo run>/hf`` (``recallm-export``'s usual ``--out``), a
#: verl checkpoint ``<grpo run>/global_step_<N>/actor[/huggingface]``
_STAGE_DIRS = {"final": "", "hf": "grpo", "huggingface": "", "actor": ""}


def _split(path: str | os.PathLike) -> tuple[str, str]:
    """(the run's name, the stage the directory is of) for a model directory (:func:`model_label`)."""
    text = str(path).rstrip("/\\")
    if text in ("", "tiny"):
        return "tiny", ""
    parts = list(Path(os.path.expanduser(text)).parts)
    stage: list[str] = []
    while len(parts) > 1:
        last = parts[-1]
        if last == "hf" and not is_grpo_run(Path(*parts[:-1])):
            break  # a directory of one's own named hf
        if last == "adapter" and (Path(*parts) / "adapter_config.json").is_file():  # a LoRA adapter of the model above
            stage.insert(0, "lora")
            parts.pop()
            continue
        if last in _STAGE_DIRS:
            if _STAGE_DIRS[last]:
                stage.insert(0, _STAGE_DIRS[last])
            parts.pop()
        elif last in ("embed", "full") and all(s == "lora" for s in stage):
            stage.insert(0, f"sft-{last}")
            parts.pop()
        elif (step := step_of(last)) is not None:
            stage.insert(0, f"grpo-step{step}")
            parts.pop()
        else:
            break
    name = parts[-1] if parts else text
    if name in (".", "..", "/"):
        name = Path(text).resolve().name or "model"
    return name, "-".join(dict.fromkeys(stage))


def model_name(path: str | os.PathLike) -> str:
    """The name a model directory files its runs under: the directory's own name, or, for a directory
    one of the stages wrote, the run's — ``outputs/sft/smollm2/full/final``, ``outputs/grpo/smollm2/hf``
    and ``outputs/grpo/smollm2/global_step_2/actor/huggingface`` are all ``smollm2``; ``tiny`` (the
    embedded default) is ``tiny``."""
    return _split(path)[0]


def model_label(path: str | os.PathLike) -> str:
    """:func:`model_name` with the stage the directory is of, to keep the results of one model's stages
    apart: ``smollm2`` (the base), ``smollm2-sft-full``, ``smollm2-grpo``, ``smollm2-grpo-step2``, and a LoRA
    adapter directory of one of them (``outputs/sft/smollm2/full/final/adapter``) ``smollm2-sft-full-lora``."""
    name, stage = _split(path)
    return f"{name}-{stage}" if stage else name


def package_dir(name: str | os.PathLike) -> str:
    """The directory of the installed top-level package ``name``, found without importing it.

    ``configs/grpo.yaml`` and ``configs/rlm_train.yaml`` find verl's YAML tree with it
    (``file://${recallm.package_dir:verl}/trainer/config``): Hydra's ``pkg://verl.trainer.config``
    imports verl (tensordict, torch's compiler) to find a directory of YAML files, 2.4 s of every
    ``recallm-grpo --help`` and ``recallm-plan grpo``."""
    import importlib.util

    from recallm.errors import RecallmError

    text = str(name)
    spec = importlib.util.find_spec(text) if text.isidentifier() else None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise RecallmError(f"the package {text} is not installed (a config needs its files)")
    return str(Path(locations[0]))


#: the config resolvers of this module: ``${recallm.model_name:PATH}``, ``${recallm.model_label:PATH}``,
#: ``${recallm.package_dir:NAME}``
RESOLVERS = {"recallm.model_name": model_name, "recallm.model_label": model_label, "recallm.package_dir": package_dir}
