"""The RLM's process sandbox (see ``repl``): model-written code never runs in the host interpreter."""

from recallm.rlm.sandbox.repl import *  # noqa: F403
from recallm.rlm.sandbox.repl import __all__  # noqa: F401
