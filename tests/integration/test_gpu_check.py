"""scripts/gpu_check.sh, the device check, in its CPU dry mode: the same code as on a GPU (masked
forward vs processed log-probs, generate with and without the processor, the vLLM processor core on
device logits, the SFT step's config through run_sft), small sizes. It has not run on a GPU here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from tests import REPO_ROOT

ROOT = REPO_ROOT


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_dry_mode_end_to_end(tmp_path):
    """The shell entry point, as a GPU machine runs it, with --device cpu (the SFT step is checked below)."""
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu_check.sh"),
            "--device",
            "cpu",
            "--quick",
            "--skip",
            "deepspeed",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "PYTHON": sys.executable},
    )
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert last.startswith("RESULT ") and " ok=1 " in last + " "
    fields = dict(kv.split("=", 1) for kv in last.split()[1:])
    res = json.loads(out.read_text())
    assert fields["device"] == "cpu" and res["checks"] == "logprobs:1,processor:1"
    # fp32: the masked forward gives the rollout's processed log-probs, inside and outside spans
    assert res["lp_fp32_gap_in_spans"] <= 1e-4 and res["lp_fp32_gap_outside"] <= 1e-4
    assert res["lp_bf16_gap_in_spans"] <= 0.1 and res["spans"] > 0 and res["verbatim"] == 1.0
    assert res["proc_equal_to_cpu_path"] is True and res["proc_step_vs_fill"] > 0
    assert res["gen_ratio_tiny"] > 0 and res["gen_ratio_smollm2"] == "absent"


def test_sft_step_config_runs_through_run_sft(tiny_dir, tmp_path):
    """The config the device check hands to torchrun: one step of the stage-2 recipe (plain Trainer here;
    DeepSpeed ZeRO-2 on CPUs is covered by tests/integration/test_sft.py)."""
    gpu_check = _module()
    cfg = gpu_check.sft_step_config(tiny_dir, tmp_path, torch.device("cpu"), "none")
    assert json.loads(cfg.read_text())["deepspeed"] is None
    assert gpu_check._run_sft_step(str(cfg)) == 0
    stats = json.loads((tmp_path / "sft" / "full" / "final" / "recallm_sft.json").read_text())
    assert stats["steps"] == 1
    with_ds = json.loads(gpu_check.sft_step_config(tiny_dir, tmp_path, torch.device("cuda"), "zero2.json").read_text())
    assert with_ds["deepspeed"] == {"file": "zero2.json"} and with_ds["sft"]["bf16"] is True
    records = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert all(r["completion_ids"].count(r["completion_ids"][20]) >= 1 for r in records)  # the span opens there


def test_no_cuda_is_one_result_line():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1 and proc.stdout.strip().splitlines()[-1] == "RESULT ok=0 error=no_cuda_device"
