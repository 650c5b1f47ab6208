"""SLURM batch scripts, run through a fake srun/scontrol/ray world (tests/slurm_harness.py): the
commands each launches on one node and on two, the requeue on SLURM's warning signal, and the
deadline verl saves a checkpoint before."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests import REPO_ROOT
from tests.slurm_harness import FakeCluster, alive

SLURM = REPO_ROOT / "slurm"
SCRIPTS = sorted(p.name for p in SLURM.glob("*.sbatch"))
MINE = ["sft.sbatch", "grpo.sbatch", "grpo_multinode.sbatch"]
JOB = "123457"


def _blocks(lo: int = 32768, hi: int = 60999) -> list[int]:
    """The first ports of the 200-port blocks in 10000-65535 that avoid the ephemeral range lo-hi."""
    return [*range(10000, lo - 199, 200), *range(max(hi + 1, 10000), 65536 - 199, 200)]


BLOCKS = _blocks()
BASE = BLOCKS[int(JOB) % len(BLOCKS)]


def _option(args, name):
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    assert len(values) == 1, (name, args)
    return values[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse_and_request_requeue(script):
    path = SLURM / script
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    text = path.read_text()
    assert "#SBATCH --requeue" in text and "resume" in text
    assert "#SBATCH --open-mode=append" in text  # a requeued job appends to its log


@pytest.mark.parametrize("script", ["grpo.sbatch", "grpo_multinode.sbatch"])
def test_signal_lead_matches_the_deadline(script):
    text = (SLURM / script).read_text()
    lead = re.search(r"#SBATCH --signal=B:USR1@(\d+)", text).group(1)
    assert re.search(rf"^SIGNAL_LEAD={lead}\b", text, re.M), "the deadline given to verl must be the signal's time"


def test_grpo_single_node(tmp_path):
    cluster = FakeCluster(tmp_path, ["gpu-1"], ips={"gpu-1": "192.0.2.5"})
    run = cluster.run(
        "grpo.sbatch",
        "grpo=qwen2.5_7b",
        "trainer.default_local_dir=/runs/x",
        SLURM_JOB_ID=JOB,
        SLURM_GPUS_ON_NODE="4",
        SLURM_CPUS_PER_TASK="48",
        SLURM_JOB_END_TIME="2000000000",
    )
    assert run.returncode == 0, run.stderr
    (driver,) = run.named("recallm-grpo")
    assert driver["args"] == [
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=4",
        "trainer.resume_mode=auto",
        "grpo=qwen2.5_7b",
        "trainer.default_local_dir=/runs/x",
    ]
    # the plan of the run, with the job's GPUs, before anything starts (recallm-plan --require-fit)
    (plan,) = run.named("recallm-plan")
    assert plan["args"] == [
        "grpo", "--gpus", "4", "--nodes", "1", "grpo=qwen2.5_7b", "trainer.default_local_dir=/runs/x", "--require-fit"
    ]
    assert run.calls.index(plan) < run.calls.index(run.named("ray")[0])
    # a one-node Ray cluster with every port in the job's block; the driver joins it
    (head,) = run.named("ray")
    assert head["node"] == "gpu-1" and head["args"][:2] == ["start", "--head"] and "--block" in head["args"]
    assert _option(head["args"], "port") == str(BASE) and _option(head["args"], "node-ip-address") == "192.0.2.5"
    ports = [int(a.split("=")[1]) for a in head["args"] if re.match(r"--[a-z-]*port=", a)]
    assert len(ports) == 11 and all(BASE <= p < BASE + 200 for p in ports), ports
    # Ray gets the CPUs SLURM gave the job, not the node's
    assert _option(head["args"], "num-cpus") == "48" and _option(head["args"], "num-gpus") == "4"
    assert _option(head["args"], "temp-dir") == f"/tmp/ray-recallm-{JOB}"
    poll = ["-m", "recallm.grpo.cluster", "--address", f"192.0.2.5:{BASE}", "--nodes", "1", "--gpus", "4"]
    assert [c["args"] for c in run.named("python")] == [[*poll, "--timeout", "600"]]
    assert driver["env"]["RAY_ADDRESS"] == f"192.0.2.5:{BASE}"
    # verl saves before SLURM's warning (the job's end minus the signal's lead)
    assert driver["env"]["MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"] == str(2000000000 - 600)
    assert driver["env"]["WANDB_MODE"] == "offline"
    assert driver["env"]["WANDB_DIR"] == str(cluster.repo / "outputs" / "wandb")
    assert not (cluster.repo / "logs").exists()  # the log directory is slurm/logs/, in the checkout
    assert not run.named("scontrol") or all(c["args"][0] == "show" for c in run.named("scontrol"))
    assert not alive(head["pid"]), "the job stops its Ray node when it ends"


@pytest.mark.parametrize("script", SCRIPTS)
def test_log_directory_exists_in_a_fresh_checkout(script):
    # SLURM opens --output before the script runs: its directory must come with the checkout
    (output,) = re.findall(r"^#SBATCH --output=(\S+)$", (SLURM / script).read_text(), re.M)
    directory = SLURM.parent / Path(output).parent
    assert Path(output).parent == Path("slurm/logs") and directory.is_dir()
    root = SLURM.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout: cannot check what a clone contains")
    tracked = subprocess.run(["git", "ls-files", str(directory)], cwd=root, capture_output=True, text=True)
    assert tracked.stdout.split() == ["slurm/logs/.gitignore"], tracked.stdout
    # the logs themselves are ignored, the directory's .gitignore is not
    ignored = subprocess.run(["git", "check-ignore", "-q", "slurm/logs/recallm-grpo-7.out"], cwd=root)
    assert ignored.returncode == 0
    assert subprocess.run(["git", "check-ignore", "-q", "slurm/logs/.gitignore"], cwd=root).returncode == 1


def test_end_time_from_scontrol_and_user_settings_win(tmp_path):
    cluster = FakeCluster(tmp_path, ["gpu-1"])
    run = cluster.run(
        "grpo.sbatch",
        SLURM_JOB_ID=JOB,
        FAKE_END_TIME="2031-05-04T03:02:01",
        WANDB_MODE="online",
        RECALLM_NET_IFACE="ib0",
        NCCL_SOCKET_IFNAME="mlx5",
    )
    assert run.returncode == 0, run.stderr
    (driver,) = run.named("recallm-grpo")
    end = int(subprocess.run(["date", "-d", "2031-05-04T03:02:01", "+%s"], capture_output=True, text=True).stdout)
    assert driver["env"]["MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"] == str(end - 600)
    assert driver["env"]["WANDB_MODE"] == "online"
    assert driver["env"]["NCCL_SOCKET_IFNAME"] == "mlx5" and driver["env"]["GLOO_SOCKET_IFNAME"] == "ib0"
    # no time limit known: no deadline, and the log says so
    run = FakeCluster(tmp_path / "nolimit", ["gpu-1"]).run("grpo.sbatch", SLURM_JOB_ID=JOB)
    (driver,) = run.named("recallm-grpo")
    assert "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP" not in driver["env"]
    assert "end time is unknown" in run.stdout


def test_grpo_two_nodes(tmp_path):
    nodes = ["gpu-a", "gpu-b"]
    cluster = FakeCluster(tmp_path, nodes, ips={"gpu-a": "192.0.2.10", "gpu-b": "192.0.2.11"})
    run = cluster.run(
        "grpo_multinode.sbatch",
        "grpo=qwen2.5_7b",
        SLURM_JOB_ID=JOB,
        SLURM_GPUS_ON_NODE="8",
        SLURM_CPUS_PER_TASK="96",
        SLURM_JOB_END_TIME="2000000000",
    )
    assert run.returncode == 0, run.stderr
    names = [c["name"] for c in run.calls if c["name"] in ("ray", "python", "recallm-grpo")]
    # Ray nodes started in the background, the cluster polled until ready, then the driver
    assert sorted(names) == ["python", "python", "ray", "ray", "recallm-grpo"]
    assert names[-1] == "recallm-grpo"
    (head,) = [c for c in run.named("ray") if "--head" in c["args"]]
    (worker,) = [c for c in run.named("ray") if "--head" not in c["args"]]
    address = f"192.0.2.10:{BASE}"  # the head's non-loopback address (hostname -I lists 127.0.1.1 first)
    assert head["node"] == "gpu-a" and worker["node"] == "gpu-b"
    assert head["args"][:2] == ["start", "--head"] and "--block" in head["args"]
    assert _option(head["args"], "node-ip-address") == "192.0.2.10"
    assert head["args"][:2] == ["start", "--head"]
    assert _option(head["args"], "port") == str(BASE)
    assert _option(worker["args"], "address") == address
    for call in (head, worker):
        assert _option(call["args"], "num-cpus") == "96" and _option(call["args"], "num-gpus") == "8"
        assert _option(call["args"], "temp-dir") == f"/tmp/ray-recallm-{JOB}" + ("-gpu-b" if call is worker else "")
        ports = [int(a.split("=")[1]) for a in call["args"] if re.match(r"--[a-z-]*port=", a)]
        assert all(BASE <= p < BASE + 200 for p in ports), ports
    assert int(_option(head["args"], "max-worker-port")) == BASE + 109
    assert int(_option(worker["args"], "max-worker-port")) == BASE + 199
    # the head's ports and a worker node's are disjoint: two SLURM nodes on one machine do not collide
    assert not _node_ports(head) & _node_ports(worker)
    # the head first (1 node, its GPUs), then the whole cluster
    assert [c["args"] for c in run.named("python")] == [
        ["-m", "recallm.grpo.cluster", "--address", address, "--nodes", n, "--gpus", g, "--timeout", "600"]
        for n, g in (("1", "8"), ("2", "16"))
    ]
    calls = run.calls
    assert calls.index(worker) > calls.index(run.named("python")[0]), "workers join once the head is up"
    (driver,) = run.named("recallm-grpo")
    assert driver["node"] == "HEAD" and driver["env"]["RAY_ADDRESS"] == address
    assert driver["args"][:3] == ["trainer.nnodes=2", "trainer.n_gpus_per_node=8", "trainer.resume_mode=auto"]
    assert driver["args"][-1] == "grpo=qwen2.5_7b"
    assert driver["env"]["MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"] == str(2000000000 - 600)
    for call in run.named("ray"):  # the job stops its Ray nodes when it ends
        assert not alive(call["pid"]), call


def _node_ports(call) -> set[int]:
    """Every port one ``ray start`` may take: its own and its worker processes' range."""
    args = call["args"]
    used = {int(a.split("=")[1]) for a in args if re.match(r"--[a-z-]*port=", a) and "worker-port" not in a}
    return used | set(range(int(_option(args, "min-worker-port")), int(_option(args, "max-worker-port")) + 1))


def _ports(run):
    return set().union(*(_node_ports(call) for call in run.named("ray")))


@pytest.mark.parametrize("script", ["grpo.sbatch", "grpo_multinode.sbatch"])
def test_two_jobs_on_one_node_get_disjoint_ports(tmp_path, script):
    used = {}
    for job in ("500", "501", "700", str(500 + len(BLOCKS))):
        cluster = FakeCluster(tmp_path / job, ["gpu-a", "gpu-b"], ips={"gpu-a": "192.0.2.10"})
        run = cluster.run(script, SLURM_JOB_ID=job)
        assert run.returncode == 0, run.stderr
        used[job] = _ports(run)
        assert all(10000 <= p <= 32767 or 61000 <= p <= 65535 for p in used[job]), "outside the ephemeral range"
    assert not used["500"] & used["501"] and not used["500"] & used["700"]  # 500 and 700 shared a block before
    # the documented residual rule: ids that differ by a multiple of the number of blocks share one
    assert used["500"] == used[str(500 + len(BLOCKS))]
    run = FakeCluster(tmp_path / "pinned", ["gpu-a"]).run(script, SLURM_JOB_ID="500", RECALLM_PORT_BASE="40000")
    assert run.returncode == 0, run.stderr
    assert _option(run.named("ray")[0]["args"], "port") == "40000"
    assert not _ports(run) & used["500"]


def test_port_blocks_follow_the_ephemeral_range():
    def blocks(**env):
        out = subprocess.run(
            ["bash", "-c", f"source {SLURM / 'common.sh'}; recallm_port_blocks; recallm_port_base"],
            env={"PATH": os.environ["PATH"], **env},
            capture_output=True,
            text=True,
        )
        return out.returncode, [int(x) for x in out.stdout.split()], out.stderr

    rc, out, _ = blocks(RECALLM_EPHEMERAL_RANGE="32768\t60999", SLURM_JOB_ID=JOB)
    assert rc == 0 and out[:-1] == BLOCKS and len(BLOCKS) == 135 and out[-1] == BASE
    rc, out, _ = blocks(RECALLM_EPHEMERAL_RANGE="49152 65535", SLURM_JOB_ID="7")  # IANA's range
    assert out[:-1] == _blocks(49152, 65535) and len(out[:-1]) == 195 and max(out[:-1]) + 199 < 49152
    rc, out, err = blocks(RECALLM_EPHEMERAL_RANGE="1024 65535")  # no room: one clear line
    assert rc == 1 and "no block of 200 ports" in err and "RECALLM_PORT_BASE" in err
    rc, out, err = blocks(RECALLM_PORT_BASE="80")
    assert rc == 1 and err.strip() == "[recallm] error: RECALLM_PORT_BASE=80 is not a port in 1024-65336"
    if os.path.exists("/proc/sys/net/ipv4/ip_local_port_range"):  # this machine's own range
        lo, hi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        rc, out, _ = blocks()
        assert out[:-1] == _blocks(lo, hi)


def test_interface_and_cluster_that_never_comes_up(tmp_path):
    cluster = FakeCluster(tmp_path, ["gpu-a", "gpu-b"])
    run = cluster.run(
        "grpo_multinode.sbatch",
        SLURM_JOB_ID=JOB,
        RECALLM_NET_IFACE="ib0",
        FAKE_IFACE_IP="198.51.100.7",
        FAKE_CLUSTER_RC="2",
    )
    assert run.returncode != 0
    assert not run.named("recallm-grpo"), "the driver must not start on a partial cluster"
    # the head's address from the interface (`ip -o -4 addr show dev ib0`)
    assert run.named("python")[0]["env"]["RAY_ADDRESS"] == f"198.51.100.7:{BASE}"
    assert "[recallm] Ray head gpu-a (198.51.100.7:" in run.stdout
    for call in run.named("ray"):
        assert not alive(call["pid"])
    # a head with only loopback addresses: a clear error, nothing started
    cluster = FakeCluster(tmp_path / "loop", ["gpu-a"], ips={"gpu-a": "127.0.0.1"})
    run = cluster.run("grpo_multinode.sbatch", SLURM_JOB_ID=JOB)
    assert run.returncode != 0 and "no non-loopback address for gpu-a" in run.stderr
    assert not run.named("ray") and not run.named("recallm-grpo")


@pytest.mark.parametrize(
    "script, driver",
    [("grpo.sbatch", "recallm-grpo"), ("grpo_multinode.sbatch", "recallm-grpo"), ("sft.sbatch", "torchrun")],
)
def test_requeue_on_warning_signal(tmp_path, script, driver):
    cluster = FakeCluster(
        tmp_path, ["gpu-a", "gpu-b"] if "multinode" in script else ["gpu-a"], ips={"gpu-a": "192.0.2.10"}
    )
    run = cluster.run_and_signal(script, "stage=full", SLURM_JOB_ID=JOB, SLURM_RESTART_COUNT="1")
    assert run.returncode == 0, run.stderr
    assert "restart 1" in run.stdout  # a requeued run says it resumes
    assert "requeueing job 123457" in run.stdout
    requeues = [c for c in run.named("scontrol") if c["args"][0] == "requeue"]
    assert [c["args"] for c in requeues] == [["requeue", JOB]]
    (started,) = run.named(driver)
    assert "resume=auto" in started["args"] or "trainer.resume_mode=auto" in started["args"]
    for call in run.named(driver) + run.named("ray"):  # nothing of the job is left running
        assert not alive(call["pid"]), call


def test_sft_single_node(tmp_path):
    cluster = FakeCluster(tmp_path, ["gpu-1"])
    run = cluster.run("sft.sbatch", "stage=full", "out_dir=/runs/x", SLURM_JOB_ID=JOB, SLURM_GPUS_ON_NODE="4")
    assert run.returncode == 0, run.stderr
    (driver,) = run.named("torchrun")
    assert driver["args"] == [
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
    assert driver["env"]["WANDB_MODE"] == "offline" and not (cluster.repo / "logs").exists()


def test_dry_run_prints_the_commands(tmp_path):
    cluster = FakeCluster(tmp_path, ["gpu-a", "gpu-b", "gpu-c"])
    env = {"RECALLM_DRY_RUN": "1", "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_ID": JOB}
    out = cluster.run("grpo_multinode.sbatch", "grpo=qwen2.5_7b", **env)
    assert out.returncode == 0 and not out.named("ray") and not out.named("recallm-grpo")
    lines = out.stdout.splitlines()
    assert lines[0] == f"head: gpu-a workers: gpu-b gpu-c ports: {BASE}-{BASE + 199}"
    assert lines[1].split()[1:] == [
        "trainer.nnodes=3",
        "trainer.n_gpus_per_node=4",
        "trainer.resume_mode=auto",
        "grpo=qwen2.5_7b",
    ]
    out = cluster.run("sft.sbatch", "stage=full", **env)
    assert out.stdout.split()[1:4] == ["--standalone", "--nproc_per_node", "4"] and not out.named("torchrun")


def test_wait_for_cluster_polls_until_every_gpu_is_there():
    from recallm.errors import RecallmError
    from recallm.grpo.cluster import wait_for_cluster

    class FakeRay:
        def __init__(self, views):
            self.views = list(views)
            self.inits = 0

        def init(self, **kwargs):
            self.inits += 1
            if self.inits == 1:
                raise ConnectionError("GCS not up yet")

        def nodes(self):
            return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    node = {"Alive": True, "Resources": {"GPU": 4.0, "CPU": 64.0}}
    dead = {"Alive": False, "Resources": {"GPU": 4.0}}
    ray = FakeRay([[node], [node, dead], [node, {"Alive": True, "Resources": {"CPU": 8.0}}], [node, node]])
    now = [0.0]

    def wait(ray, timeout):
        """2 nodes and 8 GPUs, polled every second on a fake clock that ``sleep`` advances."""
        now[0] = 0.0
        return wait_for_cluster(
            "192.0.2.10:20000",
            2,
            8,
            timeout=timeout,
            poll=1,
            ray_module=ray,
            clock=lambda: now[0],
            sleep=lambda s: now.__setitem__(0, now[0] + s),
        )

    view = wait(ray, 100)
    assert (view.nodes, view.gpus) == (2, 8.0) and ray.inits == 2 and now[0] == 4.0
    with pytest.raises(RecallmError, match=r"did not reach 2 node\(s\) and 8 GPU\(s\) within 10 s; last seen: 1 node"):
        wait(FakeRay([[node]]), 10)


def test_environment_is_not_leaked_into_the_checkout():
    # the harness copies slurm/ elsewhere: running the tests never creates logs/ here
    assert os.path.isdir(SLURM)


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


def test_eval_with_a_judge_server(tmp_path):
    cluster = FakeCluster(tmp_path, ["gpu-a"])
    judge_env = {"SLURM_JOB_ID": JOB, "SLURM_GPUS_ON_NODE": "4", "RECALLM_JUDGE_MODEL": "/models/judge"}
    # (the job polls until the stub server has started: a busy machine once ran the job to its end before it had)
    run = cluster.run(
        "eval.sbatch", "model_path=/m", "out_dir=/o", FAKE_JUDGE_UP="1", RECALLM_JUDGE_POLL="0.1", **judge_env
    )
    assert run.returncode == 0, run.stderr
    (judge,) = run.named("vllm")
    assert judge["args"][:2] == ["serve", "/models/judge"] and judge["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    (ev,) = run.named("recallm-eval")
    assert ev["env"]["CUDA_VISIBLE_DEVICES"] == "0,1" and "eval.judge.model=judge" in ev["args"]
    assert ev["env"]["WANDB_MODE"] == "offline"  # slurm/common.sh's setup, as the other scripts
    assert not alive(judge["pid"]), "the job stops its judge server when it ends"


@pytest.mark.parametrize("case", ["never_answers", "exits"])
def test_eval_fails_when_the_judge_does_not_come_up(tmp_path, case):
    cluster = FakeCluster(tmp_path, ["gpu-a"])
    extra = {"FAKE_JUDGE_EXIT": "1"} if case == "exits" else {}
    run = cluster.run(
        "eval.sbatch",
        "model_path=/m",
        SLURM_JOB_ID=JOB,
        SLURM_GPUS_ON_NODE="4",
        RECALLM_JUDGE_MODEL="/models/judge",
        RECALLM_JUDGE_WAIT="1",
        RECALLM_JUDGE_POLL="0.2",
        **extra,
    )
    assert run.returncode == 1
    assert not run.named("recallm-eval"), "no evaluation without the judge it was told to use"
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    expected = "exited before answering" if case == "exits" else "did not answer at http://127.0.0.1:8001/v1 within 1 s"
    assert len(errors) == 1 and expected in errors[0], run.stderr
    assert run.named("curl"), "the script polled the server"
    for call in run.named("vllm"):
        assert not alive(call["pid"])


def test_eval_requeues_on_warning_signal(tmp_path):
    cluster = FakeCluster(tmp_path, ["gpu-a"])
    run = cluster.run_and_signal(
        "eval.sbatch", "model_path=/m", SLURM_JOB_ID=JOB, SLURM_RESTART_COUNT="2", RECALLM_DRIVER="recallm-eval"
    )
    assert run.returncode == 0, run.stderr
    assert "restart 2" in run.stdout and "requeueing job 123457" in run.stdout
    assert [c["args"] for c in run.named("scontrol") if c["args"][0] == "requeue"] == [["requeue", JOB]]
    (ev,) = run.named("recallm-eval")
    assert not alive(ev["pid"])
