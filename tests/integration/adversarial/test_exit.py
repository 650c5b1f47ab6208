"""A process that closes its models while one is still generating exits cleanly (issue 31):
``recallm-rlm`` used to abort with exit 134 ("terminate called without an active exception")
after writing its results, because an abandoned generation was still running in torch on the
engine's daemon thread when the interpreter exited."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys, threading, time
from recallm.rlm.models import make_model

model = make_model({"name": "hf", "model_path": sys.argv[1], "max_new_tokens": 4000}, "root")
entered = threading.Event()
generate = model.backend.generate

def spy(*args, **kwargs):  # the engine thread is in the backend's generate (torch) from here on
    entered.set()
    return generate(*args, **kwargs)

model.backend.generate = spy
box = {}

def call():
    try:
        box["reply"] = model.complete([{"role": "user", "content": "hello " * 200}], max_new_tokens=4000)
    except BaseException as exc:
        box["error"] = exc

caller = threading.Thread(target=call, daemon=True)  # as the RLM's abandoned sub-calls and root turns
caller.start()
assert entered.wait(300), "the generation did not start"
time.sleep(0.5)
model.close()
caller.join(10)
print("outcome:", type(box.get("error")).__name__ if "error" in box else "reply" if "reply" in box else "running",
      flush=True)
"""


@pytest.mark.slow
def test_closing_a_model_mid_generation_then_exiting_is_exit_0(tiny_dir):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_dir)], capture_output=True, text=True, timeout=600
    )
    assert "outcome:" in done.stdout, done.stdout + done.stderr[-3000:]
    # the generation was still running when the model was closed: it was stopped, not finished
    assert "outcome: Cancelled" in done.stdout, done.stdout
    assert "terminate called" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
