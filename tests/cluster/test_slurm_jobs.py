"""The checkout's sbatch scripts under a real SLURM (``slurm`` fixture: slurmctld + slurmd on this
machine), with the tiny model and the CPU overrides a machine without GPUs needs: ``--gpus-per-node=0``
and ``RECALLM_NGPUS=1`` (one training process), ``deepspeed=zero2_cpu`` for SFT, the CPU plugin's
environment for GRPO (``recallm.grpo.cpu.cpu_env``), ``backend.name=hf`` for eval. Each job ends
COMPLETED (the job-completion log: sacct needs slurmdbd) and its outputs are checked."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from tests.deepspeed_ops import torch_extensions_dir
from tests.grpo_runs import MIX as GRPO_MIX
from tests.grpo_runs import grpo_command, step_metrics

CPUS = str(len(os.sched_getaffinity(0)))
CPU_JOB = ("--gpus-per-node=0", f"--cpus-per-task={CPUS}")  # the scripts ask for 4 GPUs and 32-64 CPUs
EXT_DIR = torch_extensions_dir()  # DeepSpeed's C++ ops, shared with make test's (tests/deepspeed_ops.py)

SFT_MIX = {
    "seed": 0,
    "tolerance": 0.05,
    "train": {
        "lengths": [256, 320],
        "entries": [
            {"task": "kv_retrieval", "count": 24, "params": {"key_type": "toy", "value_type": "toy", "formats": ["lines"]}},
        ],
    },
    "sft": {"count": 24, "val_fraction": 0.2},
}


def sft_env() -> dict[str, str]:
    return {"RECALLM_NGPUS": "1", "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(EXT_DIR)}


def grpo_env() -> dict[str, str]:
    from recallm.grpo.cpu import cpu_env

    return {"RECALLM_NGPUS": "1", "RECALLM_NCPUS": "16", **cpu_env()}


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory, tiny_dir):
    from data_gen.generate import run_schedule, schedule_from_config

    out = tmp_path_factory.mktemp("sftdata")
    run_schedule(schedule_from_config(SFT_MIX), out, tiny_dir, workers=1, progress=False)
    return out / "sft" / "train.jsonl", out / "sft" / "val.jsonl"


@pytest.fixture(scope="module")
def grpo_data(tmp_path_factory, tiny_dir):
    from data_gen.generate import run_schedule, schedule_from_config

    out = tmp_path_factory.mktemp("grpodata")
    run_schedule(schedule_from_config(GRPO_MIX), out, tiny_dir, workers=1, progress=False)
    return out / "train.parquet"


def sft_args(sft_data, tiny_dir, out: Path, *extra: str) -> list[str]:
    return [
        f"train_file={sft_data[0]}",
        f"val_file={sft_data[1]}",
        f"out_dir={out}",
        f"model.path={tiny_dir}",
        "deepspeed=zero2_cpu",  # after the script's deepspeed=zero2 (GPU, CPU optimizer offload): the last one wins
        "sft.eval.steps=1000",
        "sft.eval.recall_prompts=0",
        *extra,
    ]


def grpo_args(tiny_dir, data, ckpt: Path, rollouts: Path, *extra: str, steps: int = 2) -> list[str]:
    # recallm-grpo's overrides as the CPU tests run it (tests/grpo_runs.py), without the interpreter
    return grpo_command(tiny_dir, data, ckpt, rollouts, *extra, steps=steps)[3:]


def no_ray_left(job) -> None:
    """Nothing of the job's Ray cluster (its temp directory /tmp/ray-recallm-<job id>) still runs."""
    tmp = f"/tmp/ray-recallm-{job.id}"
    left = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if tmp in cmd:
                left.append(f"{pid}: {cmd[:200]}")
    assert not left, left


@pytest.mark.slow
def test_sft_embed_then_full(slurm, sft_data, tiny_dir, tmp_path):
    """sft.sbatch twice: the embed stage, then the full stage (``--dependency=afterok``: SLURM starts it
    once the first has COMPLETED), DeepSpeed ZeRO-2 on the CPU through the script's torchrun."""
    from transformers import AutoModelForCausalLM

    import recallm.modeling  # noqa: F401
    from recallm.sft.freeze import changed_outside_rows, frozen_snapshot
    from recallm.tokens import RecallTokenIds

    out, logs = tmp_path / "sft", tmp_path / "logs"
    embed = slurm.submit("sft.sbatch", "stage=embed", *sft_args(sft_data, tiny_dir, out, "max_steps=3", "sft.save_steps=3"),
                         options=CPU_JOB, logs=logs, env=sft_env())
    full = slurm.submit("sft.sbatch", "stage=full", *sft_args(sft_data, tiny_dir, out, "max_steps=4", "sft.save_steps=2"),
                        options=(*CPU_JOB, f"--dependency=afterok:{embed.id}"), logs=logs, env=sft_env())
    assert slurm.wait(embed, timeout=900) == "COMPLETED", embed.text()[-6000:]
    assert slurm.wait(full, timeout=600) == "COMPLETED", full.text()[-6000:]
    assert slurm.completions(embed) == ["COMPLETED"] and slurm.completions(full) == ["COMPLETED"]
    assert "torchrun" not in embed.text() or "error" not in embed.text().lower()
    assert (out / "embed" / "checkpoint-3" / "global_step3").is_dir()  # DeepSpeed's own state
    initial = AutoModelForCausalLM.from_pretrained(tiny_dir)
    embedded = AutoModelForCausalLM.from_pretrained(out / "embed" / "final")
    rows = list(RecallTokenIds.from_config(initial.config).as_config().values())
    assert changed_outside_rows(frozen_snapshot(initial), embedded, rows) == []
    assert not torch.equal(embedded.get_input_embeddings().weight[rows], initial.get_input_embeddings().weight[rows])
    assert json.loads((out / "full" / "final" / "recallm_sft.json").read_text())["init"] == str(out / "embed" / "final")
    state = json.loads((out / "full" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    trained = AutoModelForCausalLM.from_pretrained(out / "full" / "final")
    assert not torch.equal(trained.model.layers[0].mlp.up_proj.weight, embedded.model.layers[0].mlp.up_proj.weight)


def same_weights(a: Path, b: Path) -> None:
    from transformers import AutoModelForCausalLM

    import recallm.modeling  # noqa: F401

    x, y = AutoModelForCausalLM.from_pretrained(a), AutoModelForCausalLM.from_pretrained(b)
    for (name, p), (_, q) in zip(x.state_dict().items(), y.state_dict().items(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_sft_preempted_saves_requeues_and_resumes(slurm, sft_data, tiny_dir, tmp_path):
    """SLURM's warning (``scancel --signal=USR1 --batch``: what ``--signal=B:USR1@300`` sends before the time
    limit) during training: the script stops recallm-sft (SIGTERM through torchrun: it ends its step and saves),
    requeues the job; the same job id runs again, resumes once, from that step, and ends with the weights of
    the same job never interrupted."""
    common = ("stage=full", f"init_from={tiny_dir}", "max_steps=8", "sft.save_steps=1000", "sft.logging_steps=1")
    logs = tmp_path / "logs"
    whole = slurm.submit("sft.sbatch", *sft_args(sft_data, tiny_dir, tmp_path / "whole", *common), options=CPU_JOB,
                         logs=logs, env=sft_env())
    assert slurm.wait(whole, timeout=900) == "COMPLETED", whole.text()[-6000:]
    out = tmp_path / "preempted"
    job = slurm.submit("sft.sbatch", *sft_args(sft_data, tiny_dir, out, *common), options=CPU_JOB, logs=logs,
                       env=sft_env())
    slurm.wait_log(job, r"\{'loss'", timeout=900)  # training: step 1 logged
    slurm.run("scancel", "--signal=USR1", "--batch", job.id)
    slurm.wait_log(job, r"restart 1\)", timeout=300)  # requeued, running again under the same id
    assert slurm.wait(job, timeout=900) == "COMPLETED", job.text()[-6000:]
    log = job.text()
    stops = re.findall(r"stopped by SIGTERM after step (\d+): checkpoint (\S+) saved", log)
    resumes = sorted(set(re.findall(r"resuming from (\S+checkpoint-(\d+))", log)))  # the print and the log line
    assert len(stops) == 1 and len(resumes) == 1, log[-6000:]
    step = int(stops[0][0])
    assert 0 < step < 8 and resumes[0] == (str(out / "full" / f"checkpoint-{step}"), str(step))
    assert "warning signal: stopping the run" in log
    assert slurm.completions(job)[-1] == "COMPLETED" and len(slurm.completions(job)) == 2, slurm.completions(job)
    assert json.loads((out / "full" / "checkpoint-8" / "trainer_state.json").read_text())["global_step"] == 8
    same_weights(tmp_path / "whole" / "full" / "final", out / "full" / "final")


@pytest.mark.slow
def test_sft_hard_scancel_then_resubmit_resumes_from_a_complete_checkpoint(slurm, sft_data, tiny_dir, tmp_path):
    """A hard ``scancel`` mid-run (SIGTERM to every process of the job, SIGKILL ``KillWait`` later, no requeue),
    then the same command submitted again: it resumes from a checkpoint that verifies against its manifest
    (``recallm.sft.checkpoints``), never from a partial one, and ends at the last step."""
    from recallm.errors import RecallmError
    from recallm.sft.checkpoints import check_checkpoint

    common = ("stage=full", f"init_from={tiny_dir}", "max_steps=8", "sft.save_steps=2", "sft.logging_steps=1")
    out, logs = tmp_path / "sft", tmp_path / "logs"
    first = slurm.submit("sft.sbatch", *sft_args(sft_data, tiny_dir, out, *common), options=CPU_JOB, logs=logs,
                         env=sft_env())
    slurm.wait_log(first, r"(?s)\{'loss'.*\{'loss'.*\{'loss'", timeout=900)  # step 3: checkpoint-2 written
    slurm.run("scancel", first.id)
    assert slurm.wait(first, timeout=120) == "CANCELLED"
    kept = {p.name: p for p in (out / "full").glob("checkpoint-*")}
    assert kept and not (out / "full" / "final").exists()
    complete = set()
    for name, path in kept.items():
        try:
            check_checkpoint(path)
            complete.add(name)
        except RecallmError:  # a partial one: the rerun must not take it
            pass
    second = slurm.submit("sft.sbatch", *sft_args(sft_data, tiny_dir, out, *common), options=CPU_JOB, logs=logs,
                          env=sft_env())
    assert slurm.wait(second, timeout=900) == "COMPLETED", second.text()[-6000:]
    resumed = sorted(set(re.findall(r"resuming from \S+/(checkpoint-\d+)", second.text())))
    newest = max(complete, key=lambda n: int(n.split("-")[1]))
    assert resumed == [newest], (resumed, sorted(kept), sorted(complete))
    assert json.loads((out / "full" / "checkpoint-8" / "trainer_state.json").read_text())["global_step"] == 8


@pytest.mark.slow
def test_grpo(slurm, grpo_data, tiny_dir, tmp_path):
    """grpo.sbatch: Ray started by the script (``ray start --head`` through srun, the job's port block),
    recallm-grpo joining it, two steps, a checkpoint; the job stops its Ray node."""
    ckpt, rollouts = tmp_path / "ckpt", tmp_path / "rollouts"
    job = slurm.submit("grpo.sbatch", *grpo_args(tiny_dir, grpo_data, ckpt, rollouts), options=CPU_JOB,
                       logs=tmp_path / "logs", env=grpo_env())
    assert slurm.wait(job, timeout=600) == "COMPLETED", job.text()[-8000:]
    assert slurm.completions(job) == ["COMPLETED"]
    log = job.text()
    assert "Ray cluster at" in log and "is up: 1 node(s), 1 GPU(s)" in log
    metrics = step_metrics(log)
    assert sorted(metrics) == [1, 2], log[-6000:]
    assert all(m["training/rollout_probs_diff_max"] < 1e-3 for m in metrics.values())
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (ckpt / "global_step_2" / "actor").is_dir()
    no_ray_left(job)


def _ray_processes_by_node(job) -> dict[str, set[str]]:
    """The job's Ray actor processes (``ray::<class>``) now, by the raylet that started them, the raylet
    named by its node manager port (every node of the job has its own)."""
    nodes: dict[str, set[str]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            raylet = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if cmd.startswith("ray::") and "raylet" in raylet and f"ray-recallm-{job.id}" in raylet:
            port = re.search(r"--node_manager_port=(\d+)", raylet)
            nodes.setdefault(port.group(1) if port else "?", set()).add(cmd.split()[0].split(".")[0])
    return nodes


@pytest.mark.slow
def test_grpo_on_two_ray_nodes(slurm, grpo_data, tiny_dir, tmp_path):
    """grpo_multinode.sbatch on two SLURM nodes (the partition ``two``: two slurmd on this machine): the script
    starts Ray's head on the first node and a worker node on the second through srun (separate raylets, each
    on its own ports), ``trainer.nnodes=2`` x one logical GPU: the actor's ranks (verl's placement group per
    node) and the two rollout replicas run on both raylets, the weights reach each replica (the rollout's and
    the actor's log-probs agree after an update), a checkpoint; then the same job submitted again resumes from
    it for a third step."""
    ckpt, rollouts, logs = tmp_path / "ckpt", tmp_path / "rollouts", tmp_path / "logs"
    options = ("--partition=two", "--nodes=2", "--gpus-per-node=0", f"--cpus-per-task={CPUS}")
    job = slurm.submit("grpo_multinode.sbatch", *grpo_args(tiny_dir, grpo_data, ckpt, rollouts), options=options,
                       logs=logs, env=grpo_env())
    slurm.wait_log(job, r"(?:^|\s)step:1 - ", timeout=900)
    placed = _ray_processes_by_node(job)  # while step 2 runs
    assert slurm.wait(job, timeout=900) == "COMPLETED", job.text()[-8000:]
    log = job.text()
    assert "is up: 2 node(s), 2 GPU(s)" in log, log[-6000:]
    assert len(placed) == 2, placed  # two raylets: the head's and the worker node's
    for node, classes in placed.items():
        assert {"ray::WorkerDict", "ray::HFCPUServer"} <= classes, (node, placed)
    metrics = step_metrics(log)
    assert sorted(metrics) == [1, 2], log[-6000:]
    assert all(m["training/rollout_probs_diff_max"] < 1e-3 for m in metrics.values())
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    no_ray_left(job)
    again = slurm.submit("grpo_multinode.sbatch", *grpo_args(tiny_dir, grpo_data, ckpt, rollouts, steps=3),
                         options=options, logs=logs, env=grpo_env())
    assert slurm.wait(again, timeout=900) == "COMPLETED", again.text()[-8000:]
    log = again.text()
    assert "resume:       global_step_2 (checksums verified)" in log
    metrics = step_metrics(log)
    assert sorted(metrics) == [3] and metrics[3]["training/rollout_probs_diff_max"] < 1e-3, log[-6000:]
    no_ray_left(again)


def _logged_steps(log: str) -> list[int]:
    return sorted(int(n) for n in re.findall(r"(?:^|\s)step:(\d+) - ", log))


@pytest.mark.slow
def test_grpo_preempted_saves_requeues_and_resumes(slurm, grpo_data, tiny_dir, tmp_path):
    """SLURM's warning (``scancel --signal=USR1 --batch``: what ``--signal=B:USR1@600`` sends before the time
    limit) during GRPO: the script sends SIGTERM to recallm-grpo, which ends the step under way, saves it
    (checksummed) and stops (``recallm.grpo.preemption``) although ``trainer.save_freq`` would not save it;
    the job requeues, the same job id runs again, resumes once, from that step, and ends at the last
    step with every step trained and logged once, and with the final weights of the same job never
    interrupted, with no flag (the rollout samples every response from a stream of its own, seeded by its step,
    prompt and index: ``seed_per_request``, on by default)."""
    from recallm.grpo.checkpoints import check_step

    def args(ckpt: Path) -> list[str]:  # saves only step 4
        return grpo_args(tiny_dir, grpo_data, ckpt, ckpt.with_name("rollouts"), "trainer.save_freq=100", steps=4)

    whole = slurm.submit("grpo.sbatch", *args(tmp_path / "whole" / "ckpt"), options=CPU_JOB, logs=tmp_path / "logs",
                         env=grpo_env())
    assert slurm.wait(whole, timeout=900) == "COMPLETED", whole.text()[-8000:]
    ckpt = tmp_path / "preempted" / "ckpt"
    job = slurm.submit("grpo.sbatch", *args(ckpt), options=CPU_JOB, logs=tmp_path / "logs", env=grpo_env())
    slurm.wait_log(job, r"(?:^|\s)step:1 - ", timeout=900)
    slurm.run("scancel", "--signal=USR1", "--batch", job.id)
    slurm.wait_log(job, r"restart 1\)", timeout=600)  # requeued, running again under the same id
    assert slurm.wait(job, timeout=900) == "COMPLETED", job.text()[-8000:]
    log = job.text()
    stops = re.findall(r"stopped by SIGTERM after step (\d+): checkpoint (\S+) saved", log)
    resumes = re.findall(r"resume: +global_step_(\d+) \(checksums verified\)", log)
    assert len(stops) == 1 and resumes == [stops[0][0]], log[-8000:]
    step = int(stops[0][0])
    assert 1 <= step < 4 and stops[0][1] == str(ckpt / f"global_step_{step}")
    assert f"Resuming from {ckpt / f'global_step_{step}'}" in log
    assert "warning signal: stopping the run" in log
    assert _logged_steps(log) == [1, 2, 3, 4], log[-8000:]  # none lost, none done twice
    assert slurm.completions(job)[-1] == "COMPLETED" and len(slurm.completions(job)) == 2, slurm.completions(job)
    assert check_step(ckpt / f"global_step_{step}") and check_step(ckpt / "global_step_4")
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    no_ray_left(job)
    # the same final weights as the job never interrupted (the trained shards, compared tensor by tensor)
    shard = Path("global_step_4") / "actor" / "model_world_size_1_rank_0.pt"
    ours, theirs = (torch.load(d / shard, weights_only=False) for d in (ckpt, tmp_path / "whole" / "ckpt"))
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        local = getattr(tensor, "to_local", lambda t=tensor: t)()
        other = getattr(theirs[name], "to_local", lambda t=theirs[name]: t)()
        torch.testing.assert_close(local, other, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_grpo_hard_scancel_then_resubmit_resumes_from_a_verified_checkpoint(slurm, grpo_data, tiny_dir, tmp_path):
    """A hard ``scancel`` of a GRPO job mid-run (SIGTERM to every process of the job, SIGKILL ``KillWait`` later,
    no requeue), then the same command submitted again: it resumes from the newest step that verifies against
    the checksums written after its save (``recallm.grpo.checkpoints``), never a partial one, and ends at the
    last step."""
    from recallm.errors import RecallmError
    from recallm.grpo.checkpoints import check_step
    from recallm.grpo.retention import saved_steps

    ckpt, rollouts, logs = tmp_path / "ckpt", tmp_path / "rollouts", tmp_path / "logs"
    args = grpo_args(tiny_dir, grpo_data, ckpt, rollouts, "trainer.save_freq=1", steps=4)
    first = slurm.submit("grpo.sbatch", *args, options=CPU_JOB, logs=logs, env=grpo_env())
    slurm.wait_log(first, r"(?:^|\s)step:2 - ", timeout=900)  # global_step_2 saved, step 3 under way
    slurm.run("scancel", first.id)
    assert slurm.wait(first, timeout=120) == "CANCELLED"
    complete = []
    for step, path in sorted(saved_steps(ckpt).items()):
        try:
            check_step(path)
            complete.append(step)
        except RecallmError:  # cut short: the rerun must not take it
            pass
    assert complete and 2 in complete
    second = slurm.submit("grpo.sbatch", *args, options=CPU_JOB, logs=logs, env=grpo_env())
    assert slurm.wait(second, timeout=900) == "COMPLETED", second.text()[-8000:]
    log = second.text()
    resumed = re.findall(r"resume: +global_step_(\d+) \(checksums verified\)", log)
    assert resumed == [str(max(complete))], (resumed, complete, log[-4000:])
    assert _logged_steps(log) == list(range(max(complete) + 1, 5))
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4" and check_step(ckpt / "global_step_4")
    no_ray_left(second)


@pytest.mark.slow
def test_eval(slurm, tiny_dir, tmp_path):
    """eval.sbatch with the CPU suite (RECALLM_SUITE=tiny) and the HF backend (``backend.name=hf`` after the
    script's vllm), no judge."""
    out = tmp_path / "eval"
    job = slurm.submit(
        "eval.sbatch",
        f"model_path={tiny_dir}",
        f"out_dir={out}",
        "backend.name=hf",
        "progress=false",
        "benchmarks=[lost_in_thought,helmet_json_kv]",
        "eval.benchmarks.lost_in_thought.lengths=[512]",
        "eval.benchmarks.lost_in_thought.per_cell=1",
        "eval.benchmarks.helmet_json_kv.lengths=[512]",
        "eval.generation.max_new_tokens=12",
        options=CPU_JOB,
        logs=tmp_path / "logs",
        env={"RECALLM_NGPUS": "1", "RECALLM_SUITE": "tiny"},  # the script runs eval=paper by default
    )
    assert slurm.wait(job, timeout=600) == "COMPLETED", job.text()[-6000:]
    assert slurm.completions(job) == ["COMPLETED"]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {r["benchmark"] for r in rows} == {"lost_in_thought", "helmet_json_kv"}
