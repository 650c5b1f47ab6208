"""RecaLLM's config schemas, registered in Hydra's ConfigStore (group ``schema``) by :func:`register`.

Every command registers them before it composes its config (``recallm.cli.common.hydra_command``);
code that calls Hydra's ``compose()`` on a config itself calls :func:`register` first (the tests'
``conftest.py`` does, for every test; so does the wheel test). They are registered here, in the CLI
layer, because the schemas come from the commands and recipes (sft, eval, rlm) that the layers below
must not import. A primary config puts its command's schema first in its defaults list
(``- /schema/sft_run@_here_``: the config's own keys) and a section's under the section
(``- /schema/rlm_settings@rlm``), then sets only the values it chooses, and the keys whose value
interpolates another (``out_dir: outputs/data/${data.name}``: as a dataclass default, ``${...}``
would be a literal string to every caller that reads the dataclass without Hydra, so the dataclass
leaves such a key required or None and the YAML holds it); every other key exists with the
dataclass's default, so ``rlm.max_depth=2`` works without ``+``, and Hydra refuses a key the
dataclass does not have or a value of the wrong type (``ARCHITECTURE.md``, "Config schemas"). What
is registered is the dataclass itself, except that fields can be left out (``plus_keys``) or left
untyped for a config group to fill (``sections``; ``recallm.config.register_schema``).

It also registers the project's config resolvers (``recallm.paths.RESOLVERS``: ``${recallm.model_name:PATH}``,
the name a model directory files its runs under), which the own-model recipes use.
"""

from __future__ import annotations

_registered = False


def register() -> None:
    """Register every schema (idempotent)."""
    global _registered
    if _registered:
        return
    from data_gen.generate import DataRun
    from recallm.config import register_schema
    from recallm.eval.app import EvalRun
    from recallm.eval.backends import BackendSettings
    from recallm.pipeline import PipelineRun
    from recallm.rlm.budget import BudgetLimits
    from recallm.rlm.models import ModelSection
    from recallm.rlm.runner import RLMSettings
    from recallm.rlm.sandbox import SandboxLimits
    from recallm.rlm.settings import RLMRun
    from recallm.rlm.sft_data import SFTDataSettings
    from recallm.rlm.subcalls import SubCallSettings
    from recallm.rlm.tasks import TaskRun
    from recallm.rlm.train import RLMTrainSettings
    from recallm.sft.settings import SFTRun

    # each app's own keys (`- /schema/<app>_run@_here_`, first in its defaults list); the sections a
    # config group or another schema fills are left untyped here (typed reads them after composition)
    register_schema("sft_run", SFTRun, sections=("sft", "model", "data", "deepspeed"), plus_keys=("_callbacks",))
    # (curves: a mapping that may be null, which OmegaConf cannot set a mapping on when typed)
    register_schema("eval_run", EvalRun, sections=("eval", "backend", "reward", "curves", "compare"))
    register_schema("data_run", DataRun, sections=("data",))
    register_schema("pipeline_run", PipelineRun, sections=("experiment",))
    rlm_sections = ("tasks", "root", "sub", "rlm", "subcalls", "sandbox", "budget", "sft_data")
    register_schema("rlm_run", RLMRun, sections=rlm_sections)
    # sections
    register_schema("eval_backend", BackendSettings)
    # a scripted model's keys (tests, benchmarks) stay `+root.replies=...` additions
    register_schema("rlm_model", ModelSection, plus_keys=("replies", "latency_s", "continuation"))
    register_schema("rlm_settings", RLMSettings)
    register_schema("rlm_subcalls", SubCallSettings)
    register_schema("rlm_sandbox", SandboxLimits)
    register_schema("rlm_budget", BudgetLimits)
    register_schema("rlm_tasks", TaskRun)
    register_schema("rlm_sft_data", SFTDataSettings)
    register_schema("rlm_train", RLMTrainSettings)  # recallm.rlm of rlm_train.yaml, with the four above inside
    register_resolvers()
    _registered = True


def register_resolvers() -> None:
    """OmegaConf resolvers of ``recallm.paths.RESOLVERS`` (idempotent)."""
    from omegaconf import OmegaConf

    from recallm.paths import RESOLVERS

    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, lambda path, _fn=fn: _fn(str(path)))
