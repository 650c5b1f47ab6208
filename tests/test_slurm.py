"""SLURM batch scripts: valid bash, and the command each launches (dry run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SLURM = Path(__file__).resolve().parents[1] / "slurm"


@pytest.mark.parametrize("script", sorted(p.name for p in SLURM.glob("*.sbatch")))
def test_scripts_parse_and_request_requeue(script):
    path = SLURM / script
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    text = path.read_text()
    assert "#SBATCH --requeue" in text and "resume" in text


def test_sft_launch_command():
    env = {**os.environ, "RECALLM_DRY_RUN": "1", "SLURM_GPUS_ON_NODE": "4", "RECALLM_REPO": str(SLURM.parent)}
    out = subprocess.run(
        ["bash", str(SLURM / "sft.sbatch"), "stage=full", "out_dir=/runs/x"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[1:] == [
        "--standalone",
        "--nproc_per_node",
        "4",
        "-m",
        "recallm.cli.sft",
        "deepspeed=zero2",
        "resume=auto",
        "stage=full",
        "out_dir=/runs/x",
    ]


def test_grpo_launch_commands():
    env = {
        **os.environ,
        "RECALLM_DRY_RUN": "1",
        "SLURM_GPUS_ON_NODE": "4",
        "RECALLM_REPO": str(SLURM.parent),
        "SLURM_NNODES": "3",
    }
    out = subprocess.run(
        ["bash", str(SLURM / "grpo.sbatch"), "grpo=qwen2.5_7b"], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0].endswith("recallm-grpo")
    assert out[1:] == ["trainer.nnodes=1", "trainer.n_gpus_per_node=4", "trainer.resume_mode=auto", "grpo=qwen2.5_7b"]
    out = subprocess.run(
        ["bash", str(SLURM / "grpo_multinode.sbatch"), "grpo=qwen2.5_7b"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0].startswith("head: ")
    assert out[1].split()[1:] == [
        "trainer.nnodes=3",
        "trainer.n_gpus_per_node=4",
        "trainer.resume_mode=auto",
        "grpo=qwen2.5_7b",
    ]


def test_eval_launch_commands():
    env = {**os.environ, "RECALLM_DRY_RUN": "1", "SLURM_GPUS_ON_NODE": "4", "RECALLM_REPO": str(SLURM.parent)}
    env.pop("CUDA_VISIBLE_DEVICES", None)

    def launch(*args, **extra):
        return subprocess.run(
            ["bash", str(SLURM / "eval.sbatch"), *args], env={**env, **extra}, capture_output=True, text=True
        )

    out = launch("model_path=/m", "out_dir=/o").stdout.splitlines()
    assert out[0].split()[:3] == ["eval", "(GPUs", "0,1,2,3):"] and out[0].split()[3].endswith("recallm-eval")
    assert out[0].split()[4:] == ["eval=paper", "backend.name=vllm", "backend.tensor_parallel_size=4", "model_path=/m",
                                  "out_dir=/o"]  # fmt: skip
    # a judge served on half of the node's GPUs, the evaluated model on the others, eval.judge pointed at it
    judge, run = launch("model_path=/m", RECALLM_JUDGE_MODEL="/models/gemma-3-27b-it").stdout.splitlines()
    assert judge.startswith("judge (GPUs 2,3): ") and judge.split()[3].endswith("vllm")
    assert judge.split()[4:] == ["serve", "/models/gemma-3-27b-it", "--served-model-name", "judge", "--host",
                                 "127.0.0.1", "--port", "8001", "--tensor-parallel-size", "2"]  # fmt: skip
    assert run.startswith("eval (GPUs 0,1): ") and "backend.tensor_parallel_size=2" in run.split()
    assert {"eval.judge.base_url=http://127.0.0.1:8001/v1", "eval.judge.model=judge"} <= set(run.split())
    bad = launch(RECALLM_JUDGE_MODEL="/x", RECALLM_JUDGE_GPUS="0,1,2,3")
    assert bad.returncode == 2 and "leaves no GPU for the evaluated model" in bad.stderr
