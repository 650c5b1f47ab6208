"""RecaLLM's config schemas, registered in Hydra's ConfigStore (group ``schema``) by :func:`register`.

Every command registers them before it composes its config (``recallm.cli.common.hydra_command``);
code that calls Hydra's ``compose()`` on ``eval.yaml`` or ``rlm.yaml`` itself calls :func:`register`
first (the tests' ``conftest.py`` does, for every test). They are registered here, in the CLI layer,
because the schemas come from the recipes (eval, rlm) that the layers below must not import. A shipped YAML puts a schema under one of its sections through
its defaults list (``- /schema/rlm_settings@rlm``) and then sets only the values it chooses; every
other key of the section exists with the dataclass's default, so ``rlm.max_depth=2`` works without
``+``, and Hydra refuses a key the dataclass does not have or a value of the wrong type
(``ARCHITECTURE.md``, "Config schemas"). What is registered here is the dataclass itself, never a copy.
"""

from __future__ import annotations

_registered = False


def register() -> None:
    """Register every schema (idempotent)."""
    global _registered
    if _registered:
        return
    from recallm.config import register_schema
    from recallm.eval.backends import BackendSettings
    from recallm.rlm.budget import BudgetLimits
    from recallm.rlm.models import ModelSection
    from recallm.rlm.runner import RLMSettings
    from recallm.rlm.sandbox import SandboxLimits
    from recallm.rlm.subcalls import SubCallSettings

    register_schema("eval_backend", BackendSettings)
    # a scripted model's keys (tests, benchmarks) stay `+root.replies=...` additions
    register_schema("rlm_model", ModelSection, plus_keys=("replies", "latency_s", "continuation"))
    register_schema("rlm_settings", RLMSettings)
    register_schema("rlm_subcalls", SubCallSettings)
    register_schema("rlm_sandbox", SandboxLimits)
    register_schema("rlm_budget", BudgetLimits)
    _registered = True
