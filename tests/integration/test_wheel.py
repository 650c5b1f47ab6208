"""A wheel install works: the built wheel carries the config tree (recallm/configs), and in a fresh venv
(without the source checkout) every config of every app composes from it.

The fresh venv sees this environment's site-packages through a ``.pth`` line (torch, hydra and verl
are not installed again); the wheel is built without network when hatchling is installed here.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs inside the fresh venv: compose every primary config, every option of every group with each
# primary config that uses it, GRPO's config (verl's ppo_trainer + ours) and the RLM trainer's.
_COMPOSE_ALL = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    import recallm
    from recallm.cli.schemas import register
    from recallm.paths import config_dir

    register()

    configs = config_dir()
    composed = []
    for primary in sorted(p.stem for p in configs.glob("*.yaml")):
        with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
            OmegaConf.resolve(compose(config_name=primary))
        composed.append(primary)
        groups = {next(iter(d)) for d in OmegaConf.load(configs / f"{primary}.yaml").get("defaults", [])
                  if not isinstance(d, str)}
        for group in sorted(groups):
            for option in sorted((configs / group).glob("*.yaml")):
                with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
                    compose(config_name=primary, overrides=[f"{group}={option.stem}"])
                composed.append(f"{primary}:{group}={option.stem}")
    from recallm.grpo.app import compose as compose_grpo
    assert compose_grpo([]).recallm is not None
    assert compose_grpo(["grpo/platform=vllm_cpu"]).recallm.platform == "vllm_cpu"
    composed.append("grpo:verl")
    compose_grpo([], config_name="rlm_train")
    composed.append("rlm_train:verl")
    from rewards.config import load_reward_config
    load_reward_config()
    print(json.dumps({"recallm": recallm.__file__, "configs": str(configs), "composed": composed}))
    """
)


def _run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.slow
def test_wheel_carries_configs_and_composes_every_config(tmp_path):
    dist = tmp_path / "dist"
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []  # offline when it can
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", dist, ROOT])
    (wheel,) = dist.glob("recallm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        f"recallm/configs/{p.relative_to(ROOT / 'configs').as_posix()}"
        for p in (ROOT / "configs").rglob("*")
        if p.is_file()
    }
    assert shipped and shipped <= names, sorted(shipped - names)[:5]
    assert "recallm/eval/paper_reference.yaml" in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # this environment's packages, after the venv's own (the editable recallm's .pth is not processed)
    (site / "_parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel])

    out = _run([python, "-c", _COMPOSE_ALL], cwd=tmp_path).stdout.strip().splitlines()[-1]
    import json

    info = json.loads(out)
    assert Path(info["recallm"]).is_relative_to(venv), info["recallm"]  # the wheel, not the checkout
    assert Path(info["configs"]) == Path(info["recallm"]).parent / "configs"
    primaries = {p.stem for p in (ROOT / "configs").glob("*.yaml")}
    assert primaries <= set(info["composed"])
    assert {"grpo:verl", "rlm_train:verl"} <= set(info["composed"])
    options = {f"{p.parent.name}={p.stem}" for p in (ROOT / "configs").glob("*/*.yaml")}
    assert options <= {c.partition(":")[2] for c in info["composed"]}

    # an installed console script reads the packaged configs too
    help_text = _run([venv / "bin" / "recallm-pipeline", "--cfg", "job"], cwd=tmp_path).stdout
    assert "experiment:" in help_text
