"""GRPO saves and stops on a signal: what a scheduler sends before it takes the machine away.

SLURM's warning (``#SBATCH --signal=B:USR1@600`` in ``slurm/grpo*.sbatch``) reaches the batch shell,
which sends SIGTERM to ``recallm-grpo`` (``recallm_on_warning`` in ``slurm/common.sh``); ``scancel``
sends SIGTERM too. verl's trainer runs in a Ray actor, not in ``recallm-grpo``'s process, so the
request travels through a file:

1. ``recallm-grpo`` (:func:`stop_on_signals`, around the run) turns SIGTERM and SIGUSR1 into the
   stop file ``<trainer.default_local_dir>/.recallm-stop`` (``recallm.paths.STOP_FILE``; its path
   reaches verl's processes as :data:`STOP_ENV`; the checkpoint directory is the one place every node of a run shares; a launch
   removes a stale one before it starts). A second signal ends it at once, as it would have without
   us. ``ray.init`` in the driver installs two SIGTERM handlers of Ray's own, which would replace
   ours: a Python one (``sys.exit``), kept out by making Ray's ``set_sigterm_handler`` do nothing
   while the run goes on, and its C++ crash handler (a stack trace, then abort: seen under SLURM),
   kept out of this process by ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER``, which Ray reads when the driver
   connects (Ray's workers keep theirs).
2. In the trainer (``recallm.grpo.worker_hooks`` installs :func:`install`): verl asks, after every actor
   update, whether its deadline is near (``should_save_ckpt_esi``); the wrapped question also says yes
   once the stop file exists, so verl saves that step whatever ``trainer.save_freq`` says (it must be
   > 0: verl saves nothing otherwise), and ``recallm.grpo.checkpoints`` checksums it. The step ends as
   usual (its metrics logged), and before the next one starts (``_start_profiling``, the first thing
   verl's loop does in a step) the trainer raises :class:`Stopped`.
3. ``recallm-grpo`` says in one line which step was saved and exits 128 + the signal's number, as a
   process killed by it would; the job requeues, and the next run (``trainer.resume_mode=auto``)
   continues from that step.

A run whose last step is under way when the signal arrives just finishes. The time the stop takes is
one step and one save: the sbatch scripts wait that long (``RECALLM_SAVE_WAIT``, the signal's lead
less a minute) before they requeue.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from recallm.paths import STOP_FILE, step_name

__all__ = ["STOP_ENV", "SIGNALS", "Stopped", "stop_file", "stop_requested", "stop_on_signals", "stopped_by", "install"]

STOP_ENV = "RECALLM_STOP_FILE"
#: the signals that stop a run after a checkpoint
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Stopped(Exception):
    """Raised in verl's trainer once the step saved for a stop request has ended."""

    def __init__(self, step: int) -> None:
        self.step = step
        super().__init__(f"stopped after step {step}: checkpoint {step_name(step)} saved")

    def __reduce__(self):  # (crosses from the Ray actor to the driver)
        return (Stopped, (self.step,))


def stop_file(checkpoint_dir: str | Path) -> Path:
    """The stop file of the run that writes ``checkpoint_dir``."""
    return Path(checkpoint_dir) / STOP_FILE


def stop_requested() -> bool:
    path = os.environ.get(STOP_ENV)
    return bool(path) and os.path.exists(path)


@contextlib.contextmanager
def stop_on_signals(path: Path) -> Iterator[dict[str, int]]:
    """While the run goes on: SIGTERM or SIGUSR1 writes ``path`` (the trainer saves and stops); a second
    signal ends this process at once. Yields ``{"signal": number}`` once one arrived. The file is
    removed at the end."""
    received: dict[str, int] = {}
    previous = {}

    def handler(signum, frame) -> None:
        if received:  # the second one: no more waiting
            os._exit(128 + signum)
        received["signal"] = signum
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{signal.Signals(signum).name}\n")
        print(
            f"[recallm] {signal.Signals(signum).name}: the trainer saves at the end of this step, then stops",
            flush=True,
        )

    path.unlink(missing_ok=True)  # a stale one (a run killed after its stop request) must not stop this one
    for sig in SIGNALS:
        previous[sig] = signal.signal(sig, handler)
    ray_utils, ray_constants = _ray_modules()
    ray_setter = getattr(ray_utils, "set_sigterm_handler", None)
    no_crash_handler = getattr(ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", None)
    if ray_setter is not None:
        ray_utils.set_sigterm_handler = lambda handler: None  # ray.init keeps ours (module doc)
    if no_crash_handler is not None:
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # (module doc)
    try:
        yield received
    finally:
        if ray_setter is not None:
            ray_utils.set_sigterm_handler = ray_setter
        if no_crash_handler is not None:
            ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = no_crash_handler
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)
        path.unlink(missing_ok=True)


def _ray_modules():
    try:
        import ray._private.ray_constants as ray_constants
        import ray._private.utils as ray_utils
    except ImportError:
        return None, None
    return ray_utils, ray_constants


def stopped_by(exc: BaseException) -> Stopped | None:
    """The :class:`Stopped` an error from Ray carries (Ray raises the actor's exception as an instance
    of its class, or keeps it as ``cause``), else None."""
    for candidate in (getattr(exc, "cause", None), exc.__cause__, exc):
        if isinstance(candidate, Stopped) and hasattr(candidate, "step"):
            return candidate
    return None


# --------------------------------------------------------------------------- in verl's trainer
_pending: list[int] = []  # set once the stop request made verl save


def _wrap_trainer(module) -> None:
    esi = getattr(module, "should_save_ckpt_esi", None)
    cls = getattr(module, "RayPPOTrainer", None)
    start = getattr(cls, "_start_profiling", None)
    if esi is None or start is None or getattr(esi, "_recallm_stop", False):
        return

    def should_save_ckpt_esi(*args, **kwargs):
        if stop_requested():
            _pending.append(1)
            return True
        return esi(*args, **kwargs)

    def _start_profiling(self, *args, **kwargs):
        if _pending:
            if self.config.trainer.save_freq > 0:  # (verl saved the step before this one)
                raise Stopped(self.global_steps - 1)
            _pending.clear()
            print("[recallm] stop requested, but trainer.save_freq <= 0: verl saves nothing; going on", flush=True)
        return start(self, *args, **kwargs)

    should_save_ckpt_esi._recallm_stop = True  # type: ignore[attr-defined]
    module.should_save_ckpt_esi = should_save_ckpt_esi
    cls._start_profiling = _start_profiling


def install() -> None:
    """Wrap verl's trainer (``recallm.grpo.worker_hooks``, in every verl process; acts where ``STOP_ENV`` is set)."""
    from recallm.grpo.cpu.patches import after_import

    after_import("verl.trainer.ppo.ray_trainer", _wrap_trainer)
