"""Every numeric setting has a range (issue 38): each int or float field of every settings dataclass a command
reads refuses a value far out of any sensible range, +-9e18 for an integer and +-1e300 for a float, with a
``RecallmError`` (its ``metadata`` ``min``/``max``, its own checks, or its ``from_mapping``'s) — unless its
metadata declares a range that holds the value (a seed's ``[0, MAX_SEED]``).

The dataclasses are found, not listed: from the schemas of each command's composed config (the shipped
recipes), every nested settings dataclass (and each entry of a ``dict[str, <dataclass>]``) is walked, so a
new field, section or schema is probed by default. The command-line side is test_cli_fuzz's (each command's
own numeric keys, far out of range, through the command)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from omegaconf import OmegaConf

from recallm.config import _hints, _mapping_entry, _section_type, typed
from recallm.errors import RecallmError

INT_PROBE, FLOAT_PROBE = 9 * 10**18, 1e300


def _compose(name: str, overrides: list[str]) -> Any:
    from recallm.config import check_overrides

    return OmegaConf.to_container(check_overrides(name, overrides), resolve=False)


def _resolved(name: str, overrides: list[str]) -> Any:
    from recallm.config import check_overrides

    cfg = check_overrides(name, overrides)
    return cfg


def _roots() -> Iterator[tuple[str, Any]]:
    """(where, an instance of a settings dataclass) for every schema the commands read, built from the shipped
    configs as the commands build them."""
    from data_gen.annotate import Checks
    from data_gen.generate import DataRun, Mixture, TrainEntry
    from recallm.eval.app import EvalRun
    from recallm.eval.backends import BackendSettings
    from recallm.eval.benchmarks import BENCHMARKS, SuiteSettings
    from recallm.eval.types import GenerationSettings
    from recallm.grpo.cpu.hf_generate import HFCPUSettings
    from recallm.grpo.settings import settings_of
    from recallm.pipeline import Experiment, PipelineRun
    from recallm.rlm.settings import RLMRun
    from recallm.rlm.train import RLMTrainSettings
    from recallm.sft.settings import SFTRecipe, SFTRun
    from rewards import load_reward_config

    sft = _resolved("sft", ["model.path=/models/m"])
    yield "", typed(SFTRun, OmegaConf.to_container(sft, resolve=True), "")
    for recipe in ("qwen2.5_7b", "own_cpu"):
        cfg = _resolved("sft", [f"sft={recipe}", "model.path=/models/m"])
        yield "sft", typed(SFTRecipe, OmegaConf.to_container(cfg.sft, resolve=True), "sft")
    for suite in ("paper", "toy"):
        cfg = _resolved("eval", [f"eval={suite}", "model_path=/models/m"])
        yield "", typed(EvalRun, OmegaConf.to_container(cfg, resolve=True), "")
        section = OmegaConf.to_container(cfg.eval, resolve=True)
        yield "eval", typed(SuiteSettings, section, "eval")
        yield "eval.generation", GenerationSettings.from_mapping(section["generation"])
        yield "backend", BackendSettings.from_mapping(OmegaConf.to_container(cfg.backend, resolve=True))
        for name, options in (section.get("benchmarks") or {}).items():
            if name in BENCHMARKS:
                yield f"eval.benchmarks.{name}", typed(BENCHMARKS[name].Options, options, f"eval.benchmarks.{name}")
    for mixture in ("paper", "tiny", "own_cpu"):
        extra = ["data.dataset_root=/data", "data.dense_model=/models/e", "data.wiki_corpus=/data/w"] if mixture == "paper" else []
        cfg = _resolved("data", [f"data={mixture}", "tokenizer=/models/m", *extra])
        yield "", typed(DataRun, OmegaConf.to_container(cfg, resolve=True), "")
        data = OmegaConf.to_container(cfg.data, resolve=True)
        yield "data", typed(Mixture, data, "data")
        for i, entry in enumerate(data["train"]["entries"]):
            yield f"data.train.entries[{i}]", typed(TrainEntry, entry, f"data.train.entries[{i}]")
    for experiment in ("tiny_cpu", "smollm2_cpu"):
        cfg = _resolved("pipeline", [f"experiment={experiment}"])
        yield "", typed(PipelineRun, OmegaConf.to_container(cfg, resolve=True), "")
        yield "experiment", typed(Experiment, OmegaConf.to_container(cfg.experiment, resolve=True), "experiment")
    cfg = _resolved("rlm", [])
    yield "", typed(RLMRun, OmegaConf.to_container(cfg, resolve=True), "")
    cfg = _resolved("rlm_train", [])
    yield "recallm.rlm", typed(RLMTrainSettings, OmegaConf.to_container(cfg.recallm.rlm, resolve=True), "recallm.rlm")
    cfg = _resolved("grpo", ["grpo=tiny_cpu"])
    yield "recallm", settings_of(cfg)
    yield "engine_kwargs.hf_cpu", HFCPUSettings.from_mapping(
        OmegaConf.to_container(cfg.actor_rollout_ref.rollout.engine_kwargs.get("hf_cpu") or {}, resolve=True)
    ) if hasattr(HFCPUSettings, "from_mapping") else typed(HFCPUSettings, {}, "engine_kwargs.hf_cpu")
    yield "reward", load_reward_config()
    yield "checks", typed(Checks, {}, "checks")


def _instances() -> Iterator[tuple[str, Any]]:
    """Every settings dataclass instance under the roots (nested sections, entries of dict sections), once per
    class and where."""
    seen: set[tuple[type, str]] = set()
    todo = list(_roots())
    while todo:
        where, inst = todo.pop()
        if (type(inst), where) in seen:
            continue
        seen.add((type(inst), where))
        yield where, inst
        hints = _hints(type(inst))
        for f in dataclasses.fields(inst):
            value = getattr(inst, f.name)
            key = f"{where}.{f.name}" if where else f.name
            if dataclasses.is_dataclass(value):
                todo.append((key, value))
            elif _mapping_entry(hints[f.name]) is not None and isinstance(value, dict):
                todo += [(f"{key}.{k}", v) for k, v in value.items() if dataclasses.is_dataclass(v)]


def _numeric(cls: type) -> list[tuple[dataclasses.Field, type]]:
    hints = _hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = _section_type(hints[f.name])
        if f.init and kind in (int, float) and not f.name.startswith("_"):
            out.append((f, kind))
    return out


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    reader = getattr(cls, "from_mapping", None)
    if reader is not None:
        try:
            return reader(values, where)
        except TypeError:  # (a from_mapping of another signature)
            return reader(values)
    return typed(cls, values, where)


def _cases() -> list[tuple[str, type, dict[str, Any], dataclasses.Field, type]]:
    cases, done = [], set()
    for where, inst in _instances():
        cls = type(inst)
        values = {f.name: _plain(getattr(inst, f.name)) for f in dataclasses.fields(inst) if f.init}
        for f, kind in _numeric(cls):
            if (cls, f.name) in done:
                continue
            done.add((cls, f.name))
            cases.append((f"{where}.{f.name}" if where else f.name, cls, values, f, kind))
    return cases


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


_CASES = _cases()


def test_the_walk_reaches_the_schemas():
    classes = {cls.__name__ for _, cls, _, _, _ in _CASES}
    for name in ("SFTRun", "LoraSettings", "GenerationSettings", "Mixture", "ValSection", "GRPOSettings",
                 "RLMSettings", "SandboxLimits", "OverlongSection", "CategoryReward", "Experiment"):  # fmt: skip
        assert name in classes, sorted(classes)


@pytest.mark.parametrize("key,cls,values,field,kind", _CASES, ids=[c[0] for c in _CASES])
def test_every_numeric_setting_has_a_range(key, cls, values, field, kind):
    probes = (INT_PROBE, -INT_PROBE) if kind is int else (FLOAT_PROBE, -FLOAT_PROBE)
    for probe in probes:
        declared = field.metadata.get("max" if probe > 0 else "min")
        if declared is not None and (declared >= probe if probe > 0 else declared <= probe):
            continue  # its declared range holds the probe
        with pytest.raises(RecallmError):
            _build(cls, {**values, field.name: probe}, key.rsplit(".", 1)[0] if "." in key else "")


del typing  # (imported for the hints the walker resolves)
