"""An out-of-memory kill of a GRPO worker ends in one line naming the settings to lower
(``recallm.grpo.memory``, issue 38): the exceptions as Ray raises them (its memory monitor's, a worker killed by
the kernel's OOM killer), torch's, and what is not a memory kill (a crash, a bug) passing unchanged."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from recallm.errors import RecallmError
from recallm.grpo import memory


class OutOfMemoryError(Exception):  # (the name Ray's and torch's memory errors carry)
    pass


class ActorDiedError(Exception):
    pass


class RayTaskError(Exception):  # Ray wraps the worker's exception; the cause is its `cause`
    def __init__(self, message, cause):
        super().__init__(message)
        self.cause = cause


DIED = (
    "The actor died unexpectedly before finishing this task. Some common causes include: (1) the process was killed "
    "by the OOM killer due to high memory usage, (2) ray stop --force was called, or (3) the worker crashed"
)
CFG = OmegaConf.create(
    {
        "trainer": {"default_local_dir": "outputs/grpo/mine"},
        "recallm": {"console": "summary"},
        "actor_rollout_ref": {
            "actor": {"ppo_micro_batch_size_per_gpu": 8, "use_dynamic_bsz": False, "ppo_max_token_len_per_gpu": 16384},
            "ref": {"log_prob_micro_batch_size_per_gpu": 8},
            "rollout": {"log_prob_micro_batch_size_per_gpu": 8},
        },
    }
)


@pytest.mark.parametrize(
    "exc, killed, oom",
    [
        (OutOfMemoryError("Task was killed due to the node running low on memory."), False, True),
        (RayTaskError("ray::TaskRunner.run() failed", OutOfMemoryError("low")), False, True),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), False, True),
        (MemoryError(), False, True),
        (ActorDiedError(DIED), True, True),  # the kernel counted an OOM kill during the run
        (ActorDiedError(DIED), False, False),  # it did not: a crash, not memory
        (ValueError("a bug"), True, False),
    ],
    ids=["ray-monitor", "wrapped", "torch", "memoryerror", "died-oom-killed", "died-crashed", "other"],
)
def test_what_counts_as_a_memory_kill(exc, killed, oom):
    assert memory.is_out_of_memory(exc, killed=killed) is oom


def test_the_line_names_the_micro_batches_with_their_values():
    line = memory.out_of_memory_line(CFG)
    assert "\n" not in line and line.startswith("GRPO ran out of memory (a worker was killed): lower ")
    for key in ("actor.ppo_micro_batch_size_per_gpu=8", "ref.log_prob_micro_batch_size_per_gpu=8",
                "rollout.log_prob_micro_batch_size_per_gpu=8"):  # fmt: skip
        assert f"actor_rollout_ref.{key}" in line
    assert "(to 2;" in line and "outputs/grpo/mine/grpo.log" in line
    dynamic = OmegaConf.merge(CFG, {"actor_rollout_ref": {"actor": {"use_dynamic_bsz": True}}})
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384" in memory.out_of_memory_line(dynamic)


def test_the_guard_turns_a_kill_into_the_line_and_lets_anything_else_pass(monkeypatch):
    counts = iter([3, 4])  # /proc/vmstat's oom_kill rose during the run
    monkeypatch.setattr(memory, "oom_kills", lambda: next(counts))
    with pytest.raises(RecallmError, match="GRPO ran out of memory") as err:
        with memory.memory_guard(CFG):
            raise RayTaskError("ray::TaskRunner.run()", ActorDiedError(DIED))
    assert isinstance(err.value.__cause__, RayTaskError)  # (the log and --debug keep Ray's story)
    monkeypatch.setattr(memory, "oom_kills", lambda: 3)
    with pytest.raises(RayTaskError):
        with memory.memory_guard(CFG):
            raise RayTaskError("ray::TaskRunner.run()", ActorDiedError(DIED))


def test_the_kernels_count_of_oom_kills(tmp_path):
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 10\noom_kill 7\n")
    assert memory.oom_kills(str(vmstat)) == 7 and memory.oom_kills(str(tmp_path / "none")) is None
