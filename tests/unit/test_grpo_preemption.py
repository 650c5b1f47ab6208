"""GRPO's save-and-stop on a signal (``recallm.grpo.preemption``): the driver's handler writes the stop
file (and keeps Ray from replacing it), verl's deadline question says yes once it exists, and the
trainer stops before the next step with the step it saved."""

from __future__ import annotations

import os
import signal
import sys
import types

import pytest

from recallm.grpo import preemption
from recallm.grpo.preemption import STOP_ENV, Stopped, stop_file, stop_on_signals, stopped_by


def _module(save_freq: int = 2):
    calls = []

    def should_save_ckpt_esi(max_steps_duration, save_ckpt_duration=60, redundant_time=0):
        calls.append("esi")
        return False

    class RayPPOTrainer:
        config = types.SimpleNamespace(trainer=types.SimpleNamespace(save_freq=save_freq))
        global_steps = 1

        def _start_profiling(self, do_profile):
            calls.append("step")

    return types.SimpleNamespace(should_save_ckpt_esi=should_save_ckpt_esi, RayPPOTrainer=RayPPOTrainer), calls


def _one_step(module, trainer) -> None:
    """What verl's loop does in a step, as far as the wrap sees it: start, ask about the deadline, save."""
    trainer._start_profiling(False)
    module.should_save_ckpt_esi(max_steps_duration=1.0)  # (true: verl saves global_step_<global_steps>)
    trainer.global_steps += 1


def test_the_stop_file_makes_verl_save_then_stops_before_the_next_step(tmp_path, monkeypatch):
    module, calls = _module()
    preemption._wrap_trainer(module)
    preemption._wrap_trainer(module)  # once only
    monkeypatch.setattr(preemption, "_pending", [])
    monkeypatch.setenv(STOP_ENV, str(tmp_path / ".recallm-stop"))
    trainer = module.RayPPOTrainer()
    _one_step(module, trainer)  # no stop requested: verl decides
    assert calls == ["step", "esi"]
    (tmp_path / ".recallm-stop").write_text("SIGUSR1\n")
    assert module.should_save_ckpt_esi(max_steps_duration=1.0) is True  # step 2 is saved
    trainer.global_steps += 1
    with pytest.raises(Stopped) as err:
        trainer._start_profiling(False)  # step 3 does not start
    assert err.value.step == 2 and "global_step_2 saved" in str(err.value)
    assert calls == ["step", "esi"]


def test_without_save_freq_there_is_no_save_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    module, calls = _module(save_freq=-1)
    preemption._wrap_trainer(module)
    monkeypatch.setattr(preemption, "_pending", [])
    monkeypatch.setenv(STOP_ENV, str(tmp_path / "stop"))
    (tmp_path / "stop").write_text("")
    trainer = module.RayPPOTrainer()
    _one_step(module, trainer)
    _one_step(module, trainer)
    assert calls == ["step", "step"] and "trainer.save_freq <= 0" in capsys.readouterr().out


def test_a_signal_writes_the_stop_file_and_ray_keeps_our_handler(tmp_path, capsys):
    ray_utils = pytest.importorskip("ray._private.utils")
    path = stop_file(tmp_path)
    path.write_text("stale")  # a run killed after its stop request: not this run's request
    before = signal.getsignal(signal.SIGTERM)
    from ray._private import ray_constants

    crash_handler_off = ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    with stop_on_signals(path) as received:
        assert not path.exists()
        assert ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER is True  # Ray's C++ handler would abort the driver
        ray_utils.set_sigterm_handler(lambda signum, frame: sys.exit(signum))  # what ray.init does
        os.kill(os.getpid(), signal.SIGTERM)
        assert received == {"signal": signal.SIGTERM} and path.read_text() == "SIGTERM\n"
    assert not path.exists() and signal.getsignal(signal.SIGTERM) is before
    assert ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER == crash_handler_off
    assert "SIGTERM: the trainer saves at the end of this step, then stops" in capsys.readouterr().out


def test_stopped_is_found_in_what_ray_raises():
    ray = pytest.importorskip("ray")
    err = ray.exceptions.RayTaskError("run", "traceback", Stopped(7)).as_instanceof_cause()
    assert stopped_by(err).step == 7
    assert stopped_by(RuntimeError("other")) is None
