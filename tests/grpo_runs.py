"""Real ``recallm-grpo`` runs in the tests (CPU plugin, vLLM tier, SmolLM2): the data mixture,
the one command line (the ``hf_cpu`` rollout or verl's vLLM rollout), the run with its process
group killed on a timeout, verl's step metrics and the verbatim check of dumped spans."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from recallm.grpo.cpu import cpu_env
from recallm.tokens import END_RECALL, START_RECALL

MIX = {
    "seed": 0,
    "tolerance": 0.1,
    "store_prompt_text": True,
    "train": {
        "lengths": [256, 384],
        "entries": [
            {
                "task": "kv_retrieval",
                "count": 12,
                "params": {"key_type": "toy", "value_type": "toy", "formats": ["lines"]},
            },
            {
                "task": "math_retrieval",
                "count": 12,
                "params": {
                    "key_type": "toy",
                    "value_type": "toy",
                    "formats": ["lines"],
                    "problem_types": ["arithmetic"],
                },
            },
        ],
    },
}

_METRIC = re.compile(r"([\w/@.\-]+):(?:np\.\w+\()?([-+0-9.eE]+|nan|inf)\)?")

_ARR = "actor_rollout_ref"
# the rollout's own arguments, by rollout
_ROLLOUT_ARGS = {
    # forced spans every 8 tokens: spans in every step
    "hf_cpu": (
        f"{_ARR}.rollout.n=4",
        f"+{_ARR}.rollout.engine_kwargs.hf_cpu.force_every=8",
        f"+{_ARR}.rollout.engine_kwargs.hf_cpu.force_length=6",
    ),
    # the vllm_cpu platform (configs/grpo/platform/vllm_cpu.yaml: verl's vLLM rollout on vLLM's CPU build);
    # a logits processor biases toward opening spans (tests/vllm_tier/span_bias.py)
    "vllm": (
        "grpo/platform=vllm_cpu",
        f"{_ARR}.rollout.n=4",
        f"{_ARR}.rollout.max_num_seqs=16",
        f"{_ARR}.rollout.max_num_batched_tokens=2048",
        f"{_ARR}.rollout.agent.num_workers=1",
        f"+{_ARR}.rollout.engine_kwargs.vllm.logits_processors=[tests.vllm_tier.span_bias:StartRecallBiasV1]",
    ),
}
_EXPERIMENT = {"hf_cpu": "grpo_cpu", "vllm": "grpo_vllm_cpu"}


def _rollout_threads(rollout: str) -> tuple[str, ...]:
    """The ``hf_cpu`` server's threads: ``OMP_NUM_THREADS`` where it is set (one per pytest-xdist worker under
    ``make test``, tests/conftest.py), else the server's default (every core)."""
    threads = os.environ.get("OMP_NUM_THREADS")
    return (f"+{_ARR}.rollout.engine_kwargs.hf_cpu.threads={threads}",) if rollout == "hf_cpu" and threads else ()


def step_metrics(log: str) -> dict[int, dict[str, float]]:
    """verl's console logger lines ``step:N - key:value - ...`` as {N: {key: value}}."""
    steps: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        m = re.search(r"(?:^|\s)step:(\d+) - ", line)
        if not m:
            continue
        steps[int(m.group(1))] = {k: float(v) for k, v in _METRIC.findall(line[m.start() :])}
    return steps


def file_metrics(ckpt: Path) -> dict[int, dict[str, float]]:
    """verl's file logger's lines (``trainer.logger=[console,file]``: ``<trainer.default_local_dir>/metrics.jsonl``)
    as {step: {key: value}}: every step, whatever reached the console through Ray's log forwarding."""
    from recallm.paths import METRICS_FILE

    steps: dict[int, dict[str, float]] = {}
    for line in (ckpt / METRICS_FILE).read_text().splitlines():
        row = json.loads(line)
        steps[int(row["step"])] = {k: v for k, v in row["data"].items() if isinstance(v, (int, float))}
    return steps


def grpo_command(
    model: Path, data: Path, ckpt: Path, rollouts: Path, *extra: str, rollout: str = "hf_cpu", steps: int = 2
) -> list[str]:
    """``recallm-grpo`` (the launcher: tiny_cpu recipe, CPU plugin, reward manager, external_lib,
    metrics) for ``steps`` steps with a checkpoint every 2, with the ``hf_cpu`` rollout or
    (``rollout="vllm"``) verl's vLLM rollout; ``extra`` overrides last."""
    return [
        sys.executable,
        "-m",
        "recallm.cli.grpo",
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "data.max_response_length=48",
        "data.shuffle=False",
        f"{_ARR}.model.path={model}",
        f"{_ARR}.model.enable_gradient_checkpointing=False",
        f"{_ARR}.actor.ppo_mini_batch_size=4",
        f"{_ARR}.actor.ppo_micro_batch_size_per_gpu=8",
        f"{_ARR}.actor.optim.lr=1e-3",
        f"{_ARR}.actor.entropy_coeff=0.01",  # a gradient every step: a stale rollout model would show
        *_ROLLOUT_ARGS[rollout],
        *_rollout_threads(rollout),
        "trainer.project_name=recallm_test",
        f"trainer.experiment_name={_EXPERIMENT[rollout]}",
        f"trainer.default_local_dir={ckpt}",
        f"trainer.rollout_data_dir={rollouts}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=2",
        f"trainer.total_training_steps={steps}",
        "recallm.console=full",  # verl's step lines on stdout (step_metrics reads them)
        *extra,
    ]


def run_grpo(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, **cpu_env(), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)  # a local Ray cluster of its own, shut down when the driver exits
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray processes it started
        out, _ = proc.communicate()
        pytest.fail(f"verl did not finish in {timeout}s:\n{out[-5000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def run_grpo_stopped(cmd: list[str], cwd: Path, after_step: int, timeout: float = 900) -> subprocess.CompletedProcess:
    """``run_grpo``, with SIGTERM sent to ``recallm-grpo`` (what SLURM's warning makes the sbatch scripts
    send) once verl has logged step ``after_step``: the run saves the step under way and stops."""
    env = {**os.environ, **cpu_env(), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: list[str] = []
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        signalled = False
        for line in proc.stdout:
            lines.append(line)
            if not signalled and re.search(rf"(?:^|\s)step:{after_step} - ", line):
                proc.send_signal(signal.SIGTERM)
                signalled = True
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(lines)
    if not signalled:
        pytest.fail(f"verl never logged step {after_step}:\n{out[-5000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def check_spans(rollouts: Path, step: int) -> int:
    """Spans in the dumped rollouts (text decoded without special tokens: a token-level copy is
    still a text-level one) are verbatim copies of their context; returns how many there are."""
    count = 0
    for line in (rollouts / f"{step}.jsonl").read_text().splitlines():
        row = json.loads(line)
        context, output = row["input"], row["output"]
        for m in re.finditer(re.escape(START_RECALL) + r"(.*?)(?:" + re.escape(END_RECALL) + r"|$)", output, re.S):
            span = m.group(1)
            assert START_RECALL not in span
            assert span in context + output[: m.start()], (span, output)
            count += 1
    return count
