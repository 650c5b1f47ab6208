"""Recursive Language Models (Zhang, Kraska & Khattab, 2025): the prompt lives in a sandboxed
Python REPL; a root model explores it with code and calls sub-models from that code.

* ``runner`` - the root loop (``RLM``, ``RLMSettings``, ``RLMResult``, ``RootSession`` for loops
  driven from outside); depth 0-3;
* ``sandbox`` + ``worker`` + ``protocol`` - the REPL process, its limits and isolation
  (bubblewrap, or recallm's own namespaces in ``confine``), the whole process tree as one unit
  (``proctree``: found, capped and killed together), and the pipe protocol its sub-calls travel over;
* ``subcalls`` + ``budget`` + ``cancel`` - one bounded pool for every model call of a task,
  timed, retried and cancellable sub-calls, under a per-task budget;
* ``models`` - the models (in-process HF / vLLM with batched requests, OpenAI-compatible servers,
  a scripted model);
* ``trajectory`` / ``show`` / ``export`` - JSONL trajectories, their HTML pages, SFT data;
* ``tasks`` / ``evaluate`` - S-NIAH, OOLONG-like, OOLONG-Pairs-like and MRCR-like tasks with
  scorers, and a resumable task-set runner; ``eval_backend`` - ``recallm-eval backend.name=rlm``;
* ``train`` + ``agent_loop`` + ``worker_hooks`` - GRPO of the root through verl's multi-turn agent loop.

CLI: ``recallm-rlm`` (``recallm.cli.rlm``).
"""

from recallm.rlm.budget import Budget, BudgetExhausted, BudgetLimits
from recallm.rlm.models import BackendModel, ChatModel, Reply, ScriptedModel, make_model
from recallm.rlm.runner import RLM, RLMResult, RLMSettings
from recallm.rlm.sandbox import Sandbox, SandboxLimits, detect_isolation
from recallm.rlm.subcalls import SubCallSettings

__all__ = [
    "RLM",
    "RLMResult",
    "RLMSettings",
    "Budget",
    "BudgetExhausted",
    "BudgetLimits",
    "ChatModel",
    "BackendModel",
    "ScriptedModel",
    "Reply",
    "make_model",
    "Sandbox",
    "SandboxLimits",
    "detect_isolation",
    "SubCallSettings",
]
