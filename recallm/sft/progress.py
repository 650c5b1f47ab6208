"""The training loss on the console at least every ``sft.logging_seconds``, and at the last step.

``transformers.Trainer`` logs every ``logging_steps`` optimizer steps; on a CPU, or with a real
model, that can be many minutes apart, and a run shorter than ``logging_steps`` logged no loss at
all. ``LogEverySeconds`` also asks for a log once ``seconds`` have passed since the last one, and
at the last step (each log averages the loss over the steps since the previous one, as the Trainer
does). The time is read on the main process and shared with the others (``agreed``): with several
processes the log gathers the loss from all of them, so they must decide alike.
"""

from __future__ import annotations

import time

from transformers import TrainerCallback

from recallm.sft.checkpoints import agreed

__all__ = ["LogEverySeconds"]


class LogEverySeconds(TrainerCallback):
    """See the module doc. ``seconds=None``: only the last step is added to ``logging_steps``."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.last = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = time.monotonic()
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.last = time.monotonic()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_log:  # logging_steps (the same decision on every process)
            return control
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            control.should_log = True
        elif self.seconds is not None and agreed(lambda: time.monotonic() - self.last >= self.seconds):
            control.should_log = True
        return control
