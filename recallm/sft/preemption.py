"""Save and stop on a signal: what a scheduler sends before it takes the machine away.

SLURM's warning (``#SBATCH --signal=B:USR1@300`` in ``slurm/sft.sbatch``) reaches the batch shell,
which sends SIGTERM to ``torchrun``; torchrun passes it to every training process (and SIGKILLs them
30 s later); ``scancel`` and a node's shutdown send SIGTERM too. :class:`SaveOnSignal` turns that
into: finish the current optimizer step, save a checkpoint (the Trainer's, DeepSpeed's state
included), stop. The stage then raises :class:`Stopped` instead of writing ``final``, and the next
run (``resume=auto``) continues from that checkpoint: the same steps, the same weights as a run that
was never stopped. Every process agrees on the step it stops after (a one-integer all-reduce per
step), so a collective save never waits for a process that has gone on training.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from transformers import TrainerCallback

__all__ = ["SaveOnSignal", "Stopped", "SIGNALS"]

#: the signals that stop a run after a checkpoint
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Stopped(Exception):
    """A run stopped by a signal after saving its checkpoint (not a mistake of the user's: ``recallm-sft``
    says so in one line and exits 128 + the signal's number, as a process killed by it would)."""

    def __init__(self, signum: int, step: int, checkpoint: str) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(
            f"stopped by {signal.Signals(signum).name} after step {step}: checkpoint {checkpoint} saved; "
            "run the same command again to continue from it (resume=auto)"
        )


class SaveOnSignal(TrainerCallback):
    """On SIGTERM or SIGUSR1: save at the end of the current step and stop training (module doc)."""

    def __init__(self, signals: tuple[int, ...] = SIGNALS) -> None:
        self.signals = signals
        self.received: int | None = None  # the signal this process received
        self.stopped: int | None = None  # the signal the run stopped for (agreed by every process)
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum

    def on_train_begin(self, args, state, control, **kwargs):
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handler)

    def on_train_end(self, args, state, control, **kwargs):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _agreed(self) -> int:
        import torch
        import torch.distributed as dist

        received = self.received or 0
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([received], dtype=torch.int64)
            if dist.get_backend() == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            received = int(flag.item())
        return received

    def on_step_end(self, args, state, control, **kwargs):
        signum = self._agreed()
        if signum:
            self.stopped = signum
            control.should_save = True
            control.should_training_stop = True
        return control
