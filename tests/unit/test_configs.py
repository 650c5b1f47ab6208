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
