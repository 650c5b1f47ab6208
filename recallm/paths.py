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
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["CONFIG_DIR", "config_dir", "model_name", "model_label", "RESOLVERS"]

_PACKAGE = Path(__file__).resolve().parent


def _find_config_dir() -> Path:
    if os.environ.get("RECALLM_CONFIG_DIR"):
        return Path(os.environ["RECALLM_CONFIG_DIR"])
    for candidate in (_PACKAGE / "configs", _PACKAGE.parent / "configs"):
        if (candidate / "demo.yaml").is_file():
            return candidate
    return _PACKAGE / "configs"  # missing: config_dir() says so


#: the config tree: inside the installed wheel, or ``configs/`` of the source checkout (module doc)
CONFIG_DIR = _find_config_dir()


def config_dir() -> Path:
    """The config tree; raises with a clear message when it is missing."""
    if not (CONFIG_DIR / "demo.yaml").is_file():
        from recallm.errors import RecallmError

        raise RecallmError(
            f"config tree not found at {CONFIG_DIR}; install recallm as a wheel (it carries recallm/configs) or from "
            "its source tree (pip install -e .), or set RECALLM_CONFIG_DIR"
        )
    return CONFIG_DIR


# --------------------------------------------------------------------------------- names of runs
#: the directories the project's stages write a model into, under the run's own directory:
#: ``<sft out_dir>/<stage>/final``, ``<grpo run>/hf`` (``recallm-export``'s usual ``--out``), a
#: verl checkpoint ``<grpo run>/global_step_<N>/actor[/huggingface]``
_STAGE_DIRS = {"final": "", "hf": "grpo", "huggingface": "", "actor": ""}
_STEP = re.compile(r"global_step_(\d+)")


def _is_grpo_run(path: Path) -> bool:
    """A verl checkpoint directory (``trainer.default_local_dir``)."""
    return (path / "latest_checkpointed_iteration.txt").is_file() or any(path.glob("global_step_*"))


def _split(path: str | os.PathLike) -> tuple[str, str]:
    """(the run's name, the stage the directory is of) for a model directory (:func:`model_label`)."""
    text = str(path).rstrip("/\\")
    if text in ("", "tiny"):
        return "tiny", ""
    parts = list(Path(os.path.expanduser(text)).parts)
    stage: list[str] = []
    while len(parts) > 1:
        last = parts[-1]
        if last == "hf" and not _is_grpo_run(Path(*parts[:-1])):
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
        elif m := _STEP.fullmatch(last):
            stage.insert(0, f"grpo-step{m.group(1)}")
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


#: the config resolvers of this module: ``${recallm.model_name:PATH}``, ``${recallm.model_label:PATH}``
RESOLVERS = {"recallm.model_name": model_name, "recallm.model_label": model_label}
