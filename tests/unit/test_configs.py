"""Every YAML under configs/ composes; the tiny model config builds a valid TinySpec."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recallm.paths import config_dir

CONFIGS = config_dir()
PRIMARY = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
GROUP_OPTIONS = sorted((p.parent.name, p.stem) for p in CONFIGS.glob("*/*.yaml"))


def _groups_of(primary: str) -> set[str]:
    defaults = OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{primary}.yaml")).get("defaults", [])
    return {next(iter(d)) for d in defaults if isinstance(d, dict)}


@pytest.mark.parametrize("primary", PRIMARY)
def test_primary_configs_compose(primary):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name=primary)
    OmegaConf.resolve(cfg)  # every interpolation resolves (hydra-only ones excluded by compose)


@pytest.mark.parametrize("group, option", GROUP_OPTIONS)
def test_every_group_option_composes(group, option):
    users = [p for p in PRIMARY if group in _groups_of(p)]
    assert users, f"configs/{group}/{option}.yaml is used by no primary config"
    for primary in users:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = compose(config_name=primary, overrides=[f"{group}={option}"])
        text = (CONFIGS / group / f"{option}.yaml").read_text()
        if "@package _global_" not in text:  # a global recipe sets keys all over the config
            assert cfg[group] is not None


def test_tiny_model_config_matches_spec():
    from dataclasses import fields

    from recallm.tiny import TinySpec

    cfg = OmegaConf.load(CONFIGS / "model" / "tiny.yaml")
    spec = TinySpec(**{f.name: cfg[f.name] for f in fields(TinySpec) if f.name in cfg})
    assert spec.hidden_size // spec.num_attention_heads >= 32
    assert Path(CONFIGS / "decoding_demo.yaml").is_file()


# --------------------------------------------------------------------------- headers: what uses each file
ROOT = CONFIGS.parent if (CONFIGS.parent / "pyproject.toml").is_file() else None
#: groups whose options recallm-pipeline passes to the commands it runs (data=, sft=, grpo=, eval=, model=)
PIPELINE_GROUPS = {"data", "sft", "grpo", "eval", "model"}


def _header(path: Path) -> str:
    """The comment block a config file opens with (Hydra's ``# @package`` line left out)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line)
    return "\n".join(lines)


def _commands_of_configs() -> dict[str, set[str]]:
    """Primary config -> the console scripts that compose it: pyproject's ``[project.scripts]`` and the
    ``hydra_command("<config>", ...)`` calls of their modules."""
    import re
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    out: dict[str, set[str]] = {}
    for script, target in scripts.items():
        source = (ROOT / (target.split(":")[0].replace(".", "/") + ".py")).read_text()
        for config in re.findall(r'hydra_command\(\s*"(\w+)"', source):
            out.setdefault(config, set()).add(script)
    return out


def _users_of_groups(commands: dict[str, set[str]]) -> dict[str, set[str]]:
    """Config group -> the commands that compose one of its options: through a primary's defaults list, or
    a group option's own (``grpo/platform`` from a GRPO or RLM-training recipe), or recallm-pipeline's."""

    def groups(file: Path) -> set[str]:
        defaults = OmegaConf.to_container(OmegaConf.load(file)).get("defaults") or []
        found = {str(next(iter(d))).removeprefix("override ").lstrip("/").partition("@")[0] for d in defaults if isinstance(d, dict)}
        return {g for g in found if (CONFIGS / g).is_dir()}

    users: dict[str, set[str]] = {g: {"recallm-pipeline"} for g in PIPELINE_GROUPS}
    for primary in PRIMARY:
        for group in groups(CONFIGS / f"{primary}.yaml"):
            users.setdefault(group, set()).update(commands.get(primary, set()))
            for option in (CONFIGS / group).glob("*.yaml"):
                for nested in groups(option):
                    users.setdefault(nested, set()).update(commands.get(primary, set()))
    return users


@pytest.mark.skipif(ROOT is None, reason="the source checkout's configs/ (a wheel's copy has no pyproject.toml)")
def test_every_config_header_says_which_command_uses_it():
    """A primary config opens with its command (`` # `recallm-sft`: ...``); a group option's header names a
    command that composes it (``recallm-sft sft=qwen2.5_7b``, ``recallm-pipeline experiment=...``). JSON files
    (DeepSpeed's) have no comments: their YAML twin documents them."""
    import re

    commands = _commands_of_configs()
    users = _users_of_groups(commands)
    problems = []
    for primary in PRIMARY:
        first = _header(CONFIGS / f"{primary}.yaml").split("\n")[0]
        if not commands.get(primary) or not any(first.startswith(f"# `{c}") for c in commands[primary]):
            problems.append(f"{primary}.yaml: the first line names none of {sorted(commands.get(primary, []))}")
    for path in sorted(CONFIGS.glob("*/**/*.yaml")):
        group = path.parent.relative_to(CONFIGS).as_posix()
        named = set(re.findall(r"recallm-[a-z][a-z-]*[a-z]", _header(path)))
        if not named & users.get(group, set()):
            problems.append(f"{path.relative_to(CONFIGS)}: the header names none of {sorted(users.get(group, []))}")
    assert not problems, "\n".join(problems)
