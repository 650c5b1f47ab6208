"""The config sections read through their schema dataclasses (``recallm.config.typed``): an unknown
key and a value of the wrong type are one line naming the key, in every section; and a shipped
YAML restates no schema default (the dataclass holds it: ARCHITECTURE.md, "Config schemas")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from recallm.errors import RecallmError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GEN = {"max_new_tokens": 8}


def _one_line(call, pattern: str) -> str:
    with pytest.raises(RecallmError, match=pattern) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


# ------------------------------------------------------------------ eval: backend, suite, benchmarks
def test_backend_section():
    from recallm.eval.backends import BackendSettings, make_backend

    assert BackendSettings.from_mapping({}) == BackendSettings()
    _one_line(lambda: make_backend({"name": "hf", "batch_sise": 2}, "m", None), r"^backend has unknown keys \['batch_sise'\]")
    _one_line(lambda: make_backend({"name": "hf", "batch_size": "two"}, "m", None), r"^backend\.batch_size must be an integer, got 'two'")
    _one_line(lambda: make_backend({"name": "hf", "batch_size": 0}, "m", None), r"^backend\.batch_size must be >= 1, got 0")
    _one_line(lambda: make_backend({"name": "tgi"}, "m", None), r"^backend\.name: unknown backend 'tgi'")
    _one_line(lambda: make_backend({"name": "openai"}, "m", None), r"backend\.served_model")


def test_model_sections_of_an_rlm():
    from recallm.rlm.models import ModelSection, make_model

    engine = ModelSection(name="hf", batch_size=3).engine_values()
    assert engine["name"] == "hf" and engine["batch_size"] == 3 and "replies" not in engine and "rlm" not in engine
    _one_line(lambda: make_model({"name": "hf", "devise": "cpu"}, "sub"), r"^sub has unknown keys \['devise'\]")
    _one_line(lambda: make_model({"name": "openai", "timeout": "soon"}, "root"), r"^root\.timeout must be a number, got 'soon'")
    _one_line(lambda: make_model({"name": "scripted", "replies": "x"}, "root"), r"^root\.replies must be a list, got 'x'")
    _one_line(lambda: make_model({"name": "gpt"}, "root"), r"^root\.name must be one of hf, vllm, openai, scripted, got 'gpt'")
    _one_line(lambda: make_model({"name": "openai", "served_model": "m", "max_tokens_key": "n"}, "root"),
              r"^root\.max_tokens_key must be one of max_tokens, max_completion_tokens")  # fmt: skip


def test_eval_suite_and_benchmark_sections():
    from recallm.eval.benchmarks import make_benchmarks

    ruler = {"lengths": [512], "per_cell": 1}
    _one_line(lambda: make_benchmarks({"generation": GEN, "benchmarks": {"ruler": ruler}, "sed": 1}),
              r"^eval has unknown keys \['sed'\]")  # fmt: skip
    _one_line(lambda: make_benchmarks({"generation": GEN, "benchmarks": {"ruler": ruler}, "tolerance": "tight"}),
              r"^eval\.tolerance must be a number, got 'tight'")  # fmt: skip
    cases = [
        ("ruler", {**ruler, "haystack": "x"}, r"^eval\.benchmarks\.ruler has unknown keys \['haystack'\]"),
        ("ruler", {**ruler, "per_cell": "one"}, r"^eval\.benchmarks\.ruler\.per_cell must be an integer, got 'one'"),
        ("ruler", {**ruler, "task_params": [1]}, r"^eval\.benchmarks\.ruler\.task_params must be a mapping"),
        ("lost_in_thought", {**ruler, "injection": "yes"}, r"lost_in_thought\.injection must be true or false, got 'yes'"),
        ("lost_in_thought", {**ruler, "key_digit": 4}, r"lost_in_thought has unknown keys \['key_digit'\]"),
        ("helmet", {**ruler, "helmet_dir": ["a"]}, r"^eval\.benchmarks\.helmet\.helmet_dir must be a string, got \['a'\]"),
        ("helmet", {**ruler, "helmetdir": "a"}, r"^eval\.benchmarks\.helmet has unknown keys \['helmetdir'\]"),
        ("helmet_json_kv", {**ruler, "tasks": ["json_kv"]}, r"^eval\.benchmarks\.helmet_json_kv has unknown keys \['tasks'\]"),
        ("in_domain", {"data_dirs": "x"}, r"^eval\.benchmarks\.in_domain has unknown keys \['data_dirs'\]"),
        ("synthetic", {**ruler, "tasks": [{"task": "toy_lookup", "param": {}}]},
         r"^eval\.benchmarks\.synthetic\.tasks\[0\] has unknown keys \['param'\]"),
        ("synthetic", {**ruler, "tasks": "toy_lookup"}, r"^eval\.benchmarks\.synthetic\.tasks must be a list"),
    ]  # fmt: skip
    for name, cfg, pattern in cases:
        _one_line(lambda name=name, cfg=cfg: make_benchmarks({"generation": GEN, "benchmarks": {name: cfg}}), pattern)


# --------------------------------------------------------------------------------------- the reward
def test_reward_sections():
    from rewards import load_reward_config

    cfg = load_reward_config(overrides=["data_sources.multi_niah.tau=0.5"])
    assert cfg.for_row("retrieval", "multi_niah").tau == 0.5  # an override keeps the category's other values
    assert cfg.for_row("retrieval", "multi_niah").free_spans == 6
    cases = [
        ("weights.formt=0.2", r"^reward\.weights has unknown keys \['formt'\]"),
        ("weights.format=heavy", r"^reward\.weights\.format must be a number, got 'heavy'"),
        ("overlong.enable=maybe", r"^reward\.overlong\.enable must be true or false, got 'maybe'"),
        ("recall_rewrd=false", r"^reward has unknown keys \['recall_rewrd'\]"),
        ("categories.icl.tua=0.5", r"^reward\.categories\.icl has unknown keys \['tua'\]"),
        ("categories.icl.top_k=two", r"^reward\.categories\.icl\.top_k must be an integer, got 'two'"),
        ("data_sources.multi_niah.free_span=3", r"^reward\.data_sources\.multi_niah has unknown keys \['free_span'\]"),
        ("data_sources.multi_niah.free_spans=many", r"^reward\.data_sources\.multi_niah\.free_spans must be an integer"),
    ]
    for override, pattern in cases:
        _one_line(lambda override=override: load_reward_config(overrides=[override]), pattern)


def test_the_reward_stays_torch_free():
    import subprocess
    import sys

    code = "import sys, rewards, data_gen.generate; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ------------------------------------------------------------------------------ data and pipeline
def test_mixture_sections():
    from data_gen.generate import schedule_from_config

    entry = {"task": "kv_retrieval", "count": 2, "lengths": 300}
    cases = [
        ({"train": {"entries": [entry]}, "sed": 1}, r"^data has unknown keys \['sed'\]"),
        ({"train": {"entries": [entry]}, "seed": "zero"}, r"^data\.seed must be an integer, got 'zero'"),
        ({"train": {"entries": [entry], "length": 300}}, r"^data\.train has unknown keys \['length'\]"),
        ({"train": {"entries": [{**entry, "cnt": 1}]}}, r"^train\.entries\[0\] has unknown keys \['cnt'\]"),
        ({"train": {"entries": [{**entry, "count": "2"}]}}, None),  # a number written as a string is read
        ({"train": {"entries": [{**entry, "count": 2.5}]}}, r"^train\.entries\[0\]\.count must be an integer"),
        ({"train": {"entries": [entry]}, "val": {"per_cel": 1}}, r"^data\.val has unknown keys \['per_cel'\]"),
        ({"train": {"entries": [entry]}, "sft": {"count": "x"}}, r"^data\.sft\.count must be an integer, got 'x'"),
        ({"train": {"entries": [entry]}, "sft": {"val_fraction": 1}}, r"^data\.sft\.val_fraction must be in \[0, 1\)"),
    ]
    for cfg, pattern in cases:
        if pattern is None:
            assert schedule_from_config(cfg).jobs[0].count == 2
            continue
        _one_line(lambda cfg=cfg: schedule_from_config(cfg), pattern)


def _experiment(**changes) -> dict:
    exp = yaml.safe_load((CONFIGS / "experiment" / "tiny_cpu.yaml").read_text())
    exp.update(changes)
    return exp


def test_experiment_sections(tmp_path):
    from recallm.pipeline import Experiment, experiment_stages, read_experiment

    assert isinstance(read_experiment(_experiment()), Experiment)
    ev = _experiment()["eval"]
    cases = [
        (_experiment(paralel=2), r"^experiment has unknown keys \['paralel'\]"),
        (_experiment(parallel="two"), r"^experiment\.parallel must be an integer, got 'two'"),
        (_experiment(model={"pth": None}), r"^experiment\.model has unknown keys \['pth'\]"),
        (_experiment(model={"plain_base": "yes"}), r"^experiment\.model\.plain_base must be true or false"),
        (_experiment(grpo={"recipe": "tiny_cpu"}), r"^experiment\.grpo\.val_file is required"),
        (_experiment(eval={**ev, "batchsize": 2}), r"^experiment\.eval has unknown keys \['batchsize'\]"),
        (_experiment(eval={**ev, "runs": {"r": {"variant": "recall", "constrained": False}}}),
         r"^experiment\.eval\.runs\.r has unknown keys \['constrained'\]"),
        (_experiment(eval={**ev, "runs": {"r": {"variant": "recall", "recall_constrained": "no"}}}),
         r"^experiment\.eval\.runs\.r\.recall_constrained must be true or false, got 'no'"),
        (_experiment(variants={"recall": {"sft": [], "grp": []}}), r"^experiment\.variants\.recall has unknown keys \['grp'\]"),
        (_experiment(variants={"recall": {"sft": "x=1"}}), r"^experiment\.variants\.recall\.sft must be a list"),
    ]  # fmt: skip
    for exp, pattern in cases:
        _one_line(lambda exp=exp: experiment_stages(exp, tmp_path), pattern)


def test_result_metric_section(tmp_path):
    from recallm.pipeline import result_line

    exp = _experiment(result={"metrics": {"acc": {"run": "recall", "benchmark": "synthetic", "lenght": 360}}})
    _one_line(lambda: result_line(exp, tmp_path, {}), r"^experiment\.result\.metrics\.acc has unknown keys \['lenght'\]")
    exp = _experiment(result={"metrics": {"acc": {"grpo": "recall", "last": "ten"}}})
    _one_line(lambda: result_line(exp, tmp_path, {}), r"^experiment\.result\.metrics\.acc\.last must be an integer")


# --------------------------------------------------------------------------- each default held once
def _defaults(cls) -> dict:
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }


def _same(a, b) -> bool:
    """Equal as config values: a tuple default is the YAML's list; a settings dataclass its mapping."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        a = dataclasses.asdict(a)
    return (list(a) if isinstance(a, tuple) else a) == (list(b) if isinstance(b, tuple) else b)


def _restated(section: dict | None, cls, leave: tuple[str, ...] = ()) -> dict:
    """The keys of ``section`` (a YAML section whose schema is ``cls``) set to ``cls``'s default;
    ``leave``: keys that are other sections (a group's, another schema's)."""
    defaults = _defaults(cls)
    return {k: v for k, v in (section or {}).items() if k not in leave and k in defaults and _same(defaults[k], v)}


_RLM_SECTIONS = ("tasks", "root", "sub", "rlm", "subcalls", "sandbox", "budget", "sft_data")


def _registered_sections() -> list[tuple[str, str, dict, type, tuple[str, ...]]]:
    """(file, section, the YAML's section, schema, keys left to other schemas) of every section whose
    schema Hydra knows (``recallm/cli/schemas.py``)."""
    from data_gen.generate import DataRun
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

    def load(name: str) -> dict:
        return yaml.safe_load((CONFIGS / name).read_text())

    rlm, ev, train = load("rlm.yaml"), load("eval.yaml"), load("rlm_train.yaml")
    own = ("defaults", "hydra")
    train_rlm = train["recallm"]["rlm"]
    return [
        ("sft.yaml", "(own keys)", load("sft.yaml"), SFTRun, (*own, "sft", "model", "data", "deepspeed")),
        ("eval.yaml", "(own keys)", ev, EvalRun, (*own, "eval", "backend", "reward")),
        ("data.yaml", "(own keys)", load("data.yaml"), DataRun, (*own, "data")),
        ("pipeline.yaml", "(own keys)", load("pipeline.yaml"), PipelineRun, (*own, "experiment")),
        ("rlm.yaml", "(own keys)", rlm, RLMRun, (*own, *_RLM_SECTIONS)),
        ("rlm.yaml", "tasks", rlm["tasks"], TaskRun, ()),
        ("rlm.yaml", "sft_data", rlm["sft_data"], SFTDataSettings, ()),
        ("rlm.yaml", "root", rlm["root"], ModelSection, ()),
        ("rlm.yaml", "sub", rlm["sub"], ModelSection, ()),
        ("rlm.yaml", "rlm", rlm["rlm"], RLMSettings, ()),
        ("rlm.yaml", "subcalls", rlm["subcalls"], SubCallSettings, ()),
        ("rlm.yaml", "sandbox", rlm["sandbox"], SandboxLimits, ()),
        ("rlm.yaml", "budget", rlm["budget"], BudgetLimits, ()),
        ("eval.yaml", "backend", ev["backend"], BackendSettings, ()),
        ("rlm_train.yaml", "recallm.rlm", train_rlm, RLMTrainSettings, ("rlm", "subcalls", "sandbox", "budget")),
        ("rlm_train.yaml", "recallm.rlm.rlm", train_rlm["rlm"], RLMSettings, ()),
        ("rlm_train.yaml", "recallm.rlm.subcalls", train_rlm["subcalls"], SubCallSettings, ()),
        ("rlm_train.yaml", "recallm.rlm.sandbox", train_rlm["sandbox"], SandboxLimits, ()),
        ("rlm_train.yaml", "recallm.rlm.budget", train_rlm["budget"], BudgetLimits, ()),
    ]


def test_yaml_sections_with_a_schema_restate_no_default():
    """A section whose schema Hydra knows (``recallm/cli/schemas.py``) sets only what it
    changes: a value equal to the dataclass default would be a second copy of it."""
    for file, name, section, cls, leave in _registered_sections():
        fields = {f.name for f in dataclasses.fields(cls)}
        assert set(section or {}) - set(leave) <= fields, (file, name)
        restated = _restated(section, cls, leave)
        assert not restated, f"{file}: {name} restates the defaults of {cls.__name__}: {restated}"
    rlm = yaml.safe_load((CONFIGS / "rlm.yaml").read_text())
    schemas = {"/schema/rlm_model@root", "/schema/rlm_model@sub", "/schema/rlm_settings@rlm",
               "/schema/rlm_subcalls@subcalls", "/schema/rlm_sandbox@sandbox", "/schema/rlm_budget@budget",
               "/schema/rlm_tasks@tasks", "/schema/rlm_sft_data@sft_data"}  # fmt: skip
    assert schemas <= set(rlm["defaults"])
    for app, schema in [("sft", "sft_run"), ("eval", "eval_run"), ("data", "data_run"),
                        ("pipeline", "pipeline_run"), ("rlm", "rlm_run")]:  # fmt: skip
        defaults = yaml.safe_load((CONFIGS / f"{app}.yaml").read_text())["defaults"]
        assert defaults[0] == f"/schema/{schema}@_here_", app  # first: the groups and _self_ merge onto it
    train = yaml.safe_load((CONFIGS / "rlm_train.yaml").read_text())["defaults"]
    assert "/schema/rlm_train@recallm.rlm" in train and train.index("/schema/rlm_train@recallm.rlm") < train.index("_self_")


def test_the_restated_default_check_catches_each_section():
    """Each registered section, given one of its schema's defaults, fails the check above."""
    for file, name, section, cls, leave in _registered_sections():
        key, default = next((k, v) for k, v in _defaults(cls).items() if k not in leave and k not in (section or {}))
        copy = {**(section or {}), key: list(default) if isinstance(default, tuple) else default}
        assert _restated(copy, cls, leave) == {key: copy[key]}, (file, name, key)


def test_rlm_train_recipes_restate_nothing_of_the_base():
    """A recipe of configs/rlm_train/ sets, in the RLM's sections, only what differs from what
    rlm_train.yaml and the schemas give."""
    from recallm.rlm.budget import BudgetLimits
    from recallm.rlm.runner import RLMSettings
    from recallm.rlm.sandbox import SandboxLimits
    from recallm.rlm.subcalls import SubCallSettings

    base = yaml.safe_load((CONFIGS / "rlm_train.yaml").read_text())["recallm"]["rlm"]
    classes = {"rlm": RLMSettings, "subcalls": SubCallSettings, "sandbox": SandboxLimits, "budget": BudgetLimits}
    recipes = sorted((CONFIGS / "rlm_train").glob("*.yaml"))
    assert recipes
    for recipe in recipes:
        sections = (yaml.safe_load(recipe.read_text()).get("recallm") or {}).get("rlm") or {}
        for name, cls in classes.items():
            given = {**_defaults(cls), **(base.get(name) or {})}
            same = {k: v for k, v in (sections.get(name) or {}).items() if _same(given[k], v)}
            assert not same, f"rlm_train/{recipe.name}: recallm.rlm.{name} restates {same}"


# ------------------------------------------------------ each app's own keys: unknown keys, wrong types
@pytest.mark.parametrize(
    "app, overrides, pattern",
    [
        ("sft", ["foo=1"], r"^bad override: Could not override 'foo'\. \(Key 'foo' not in 'SFTRun'\)$"),
        ("sft", ["+foo=1"], r"^unknown setting foo: there is no setting foo, nothing would read it"),
        ("sft", ["max_step=3"], r"Key 'max_step' not in 'SFTRun'"),
        ("sft", ["max_steps=abc"], r"^max_steps must be an integer, got 'abc'$"),
        ("data", ["workers=abc"], r"^workers must be an integer, got 'abc'$"),
        ("data", ["data=tiny", "workers=abc"], r"^workers must be an integer, got 'abc'$"),
        ("data", ["worker=4"], r"Key 'worker' not in 'DataRun'"),
        ("data", ["+worker=4"], r"^unknown setting worker: .*did you mean workers\?"),
        ("data", ["progress=maybe"], r"^progress must be true or false, got 'maybe'$"),
        ("pipeline", ["threads=x"], r"^threads must be an integer, got 'x'$"),
        ("pipeline", ["thread=2"], r"Key 'thread' not in 'PipelineRun'"),
        ("eval", ["limit=abc"], r"^limit must be an integer, got 'abc'$"),
        ("eval", ["overwrite=yes"], r"^overwrite must be true or false, got 'yes'$"),
        ("eval", ["modell_path=x"], r"Key 'modell_path' not in 'EvalRun'"),
        ("rlm", ["parallel=x"], r"^parallel must be an integer, got 'x'$"),
        ("rlm", ["+paralel=2"], r"^unknown setting paralel: .*did you mean parallel\?"),
        ("rlm", ["tasks.per_cel=2"], r"Key 'per_cel' not in 'TaskRun'"),
        ("rlm", ["tasks.per_cell=x"], r"^tasks\.per_cell must be an integer, got 'x'$"),
        ("rlm", ["sft_data.min_turn=1"], r"Key 'min_turn' not in 'SFTDataSettings'"),
        ("rlm", ["sft_data.max_turn_chars=many"], r"^sft_data\.max_turn_chars must be an integer, got 'many'$"),
    ],
)
def test_an_apps_own_keys_refuse_with_one_line(app, overrides, pattern):
    from recallm.config import check_overrides

    _one_line(lambda: check_overrides(app, overrides), pattern)


def test_an_apps_own_keys_keep_their_defaults_and_overrides():
    """Each default comes from the schema (the YAML no longer lists it) and is overridden as before."""
    from recallm.config import check_overrides

    sft = check_overrides("sft", ["max_steps=3", "resume=never"])
    assert (sft.max_steps, sft.resume, sft.logger, sft.models_dir, sft.stage) == (3, "never", "console", "outputs/models", "embed")
    data = check_overrides("data", ["data=tiny", "workers=4"])
    assert (data.workers, data.tokenizer, data.progress, data.out_dir) == (4, "tiny", True, "outputs/data/tiny")
    pipeline = check_overrides("pipeline", ["redo=[eval,report]"])
    assert list(pipeline.redo) == ["eval", "report"] and pipeline.only is None and pipeline.threads is None
    ev = check_overrides("eval", ["mode=report", "runs=[a,b]"])
    assert (ev.mode, list(ev.runs), ev.model_path, ev.report, ev.report_dir) == ("report", ["a", "b"], "tiny", True, "outputs/eval/report")
    rlm = check_overrides("rlm", ["parallel=3", "tasks.per_cell=2"])
    assert (rlm.parallel, rlm.mode, rlm.tasks.per_cell, rlm.tasks.needles, rlm.tasks.name) == (3, "run", 2, 2, "tiny")
    assert (rlm.sft_data.min_turns, rlm.sft_data.max_turn_chars, rlm.sft_data.out_file) == (2, 100_000, "outputs/rlm/tiny/sft.jsonl")


@pytest.mark.parametrize("app", ["sft", "data", "pipeline", "eval", "rlm", "rlm_train"])
def test_a_composed_config_pickles(app):
    """A config composed on registered schemas refers to their classes: it must survive the plain
    pickle (multiprocessing), not only cloudpickle (Ray)."""
    import pickle

    from recallm.config import check_overrides

    cfg = check_overrides(app, [])
    assert pickle.loads(pickle.dumps(cfg)) == cfg
