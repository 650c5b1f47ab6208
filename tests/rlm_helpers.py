"""What the RLM tests share: the isolation for tests that are not about the sandbox, sandbox
limits for quick cells, a ``repl`` reply, an ``RLM`` over scripted models with generous budgets,
the events of a run, and a readiness wait."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from recallm.rlm.budget import BudgetLimits
from recallm.rlm.models import ScriptedModel
from recallm.rlm.runner import RLM, RLMSettings
from recallm.rlm.sandbox import SandboxLimits, detect_isolation
from recallm.rlm.subcalls import SubCallSettings

LIMITS = SandboxLimits(cpu_s=5, wall_s=1, memory_mb=512, kill_grace_s=0.5)


def isolation() -> str:
    """The sandbox isolation for a test that is not about the sandbox: the strongest that works on
    this machine (bubblewrap where it is installed, the product's default; else recallm's own
    namespaces, else none), so that such a test does not depend on which one exists. Where none
    works the test is skipped with the reason. The sandbox's own tests (``test_rlm_sandbox.py``,
    ``adversarial/test_sandbox.py``) run every mode that works and skip the others."""
    found = detect_isolation()
    if found.kind == "unavailable":
        pytest.skip(f"no sandbox isolation works on this machine: {found.detail}")
    return found.kind


def isolation_override(key: str = "rlm.isolation") -> str:
    """``isolation()`` as a command-line override of ``key``."""
    return f"{key}={isolation()}"


def repl(code: str, after: str = "", *, lead: str = "Let me work.\n") -> str:
    """A root reply: ``lead``, one ```` ```repl ```` block of ``code``, then ``after``."""
    return f"{lead}```repl\n{code}\n```\n{after}"


def make(root, sub=None, *, budget=None, subcalls=None, limits=LIMITS, max_wall_s: float = 60, **settings) -> RLM:
    """An ``RLM`` over scripted models (a list of replies or a ``ScriptedModel``), at most 6 turns,
    a pool of 8 with 5 s per sub-call and no retry, and a budget generous but for ``max_wall_s``."""
    settings.setdefault("max_iterations", 6)
    settings.setdefault("isolation", isolation())
    return RLM(
        root if isinstance(root, ScriptedModel) else ScriptedModel(root),
        sub,
        settings=RLMSettings(**settings),
        subcalls=subcalls or SubCallSettings(pool_size=8, timeout_s=5, retries=0),
        sandbox=limits,
        budget=budget or BudgetLimits(max_tokens=10**6, max_subcalls=100, max_wall_s=max_wall_s),
    )


def events_of(result, kind: str, rlm: str = "0") -> list[dict]:
    return [e for e in result.events if e["event"] == kind and e.get("rlm") == rlm]


def wait_for(predicate: Callable[[], bool], what: str, limit_s: float = 120.0) -> None:
    """Poll until ``predicate()`` (a readiness wait and a hang guard, not a timing assertion)."""
    end = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.005)
