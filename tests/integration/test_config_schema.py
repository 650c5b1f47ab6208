"""Typed configs (``recallm.config.typed``), the app schemas against every shipped config, and the
one command-line helper of the Hydra apps (``recallm.cli.common.hydra_command``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recallm.config import typed
from recallm.errors import RecallmError
from recallm.paths import config_dir


@dataclass(frozen=True)
class _Inner:
    size: int = field(default=2, metadata={"min": 1})


@dataclass(frozen=True)
class _Outer:
    name: str
    rate: float = 0.5
    flag: bool = False
    mode: str = field(default="a", metadata={"choices": ("a", "b")})
    cap: int | None = None
    items: list[str] = field(default_factory=list)
    inner: _Inner = field(default_factory=_Inner)
    extra: Any = None

    def __post_init__(self) -> None:
        if self.rate > 1:
            raise RecallmError(f"rate must be <= 1, got {self.rate}")


def test_typed_builds_and_converts():
    got = typed(_Outer, {"name": 7, "rate": 1, "cap": None, "items": ["x"], "inner": {"size": 3}}, "sec")
    assert got == _Outer(name="7", rate=1.0, cap=None, items=["x"], inner=_Inner(3))
    assert typed(_Outer, OmegaConf.create({"name": "n", "rate": None}), "sec").rate == 0.5  # null: the default


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"name": "n", "rat": 1}, r"sec has unknown keys \['rat'\]; known: \["),
        ({"rate": 0.1}, r"sec\.name is required"),
        ({"name": "n", "rate": "fast"}, r"sec\.rate must be a number, got 'fast'"),
        ({"name": "n", "cap": 2.5}, r"sec\.cap must be an integer, got 2\.5"),
        ({"name": "n", "flag": "yes"}, r"sec\.flag must be true or false, got 'yes'"),
        ({"name": "n", "mode": "c"}, r"sec\.mode must be one of a, b, got 'c'"),
        ({"name": "n", "items": "x"}, r"sec\.items must be a list, got 'x'"),
        ({"name": "n", "inner": {"size": 0}}, r"sec\.inner\.size must be >= 1, got 0"),
        ({"name": "n", "inner": {"sise": 1}}, r"sec\.inner has unknown keys \['sise'\]"),
        ({"name": "n", "rate": 2}, r"sec\.rate must be <= 1, got 2"),
        ([1, 2], r"sec must be a mapping"),
    ],
)
def test_typed_refuses_with_one_line(cfg, message):
    with pytest.raises(RecallmError, match=message) as err:
        typed(_Outer, cfg, "sec")
    assert "\n" not in str(err.value)


def test_top_level_schema_names_keys_without_a_prefix():
    with pytest.raises(RecallmError, match=r"^the config has unknown keys \['nme'\]"):
        typed(_Outer, {"nme": 1}, "")
    with pytest.raises(RecallmError, match=r"^mode must be one of a, b"):
        typed(_Outer, {"name": "n", "mode": "z"}, "")


# --------------------------------------------------------------------- the apps' schemas, every config
CONFIGS = config_dir()


def _compose(primary: str, overrides: list[str] = ()) -> dict:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name=primary, overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=False)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


@pytest.mark.parametrize("recipe", _options("sft"))
def test_every_sft_recipe_fits_the_schema(recipe):
    from recallm.sft.settings import SFTRun

    cfg = _compose("sft", [f"sft={recipe}"])
    run = typed(SFTRun, {k: v for k, v in cfg.items() if k not in ("train_file", "val_file", "out_dir")}
                | {"train_file": "t", "val_file": None, "out_dir": "o"}, "")  # fmt: skip
    assert run.sft.stage("embed").lr > 0 and run.sft.stage("full").num_epochs > 0


def test_sft_schema_refuses_a_misspelt_recipe_key():
    from recallm.sft.settings import SFTRun

    cfg = _compose("sft")
    cfg["sft"]["grad_clp"] = 1.0
    with pytest.raises(RecallmError, match=r"sft has unknown keys \['grad_clp'\]"):
        typed(SFTRun, cfg | {"train_file": "t", "out_dir": "o"}, "")
    cfg["sft"].pop("grad_clp")
    cfg["sft"]["full"]["lr"] = 0
    with pytest.raises(RecallmError, match=r"^sft\.full\.lr must be > 0, got 0"):
        typed(SFTRun, cfg | {"train_file": "t", "out_dir": "o"}, "")


@pytest.mark.slow  # composes every option of the app (verl's tree for GRPO/RLM training)
@pytest.mark.parametrize(
    "primary, schema, group",
    [
        ("pipeline", "recallm.cli.pipeline:PipelineRun", "experiment"),
        ("data", "recallm.cli.data:DataRun", "data"),
        ("eval", "recallm.cli.eval:EvalRun", "eval"),
        ("rlm", "recallm.cli.rlm:RLMRun", None),
    ],
)
def test_every_app_config_fits_its_schema(primary, schema, group):
    import importlib

    module, _, name = schema.partition(":")
    cls = getattr(importlib.import_module(module), name)
    for option in _options(group) if group else [None]:
        cfg = _compose(primary, [f"{group}={option}"] if option else [])
        typed(cls, OmegaConf.create(cfg), "")
    with pytest.raises(RecallmError, match=r"the config has unknown keys \['surplus'\]"):
        typed(cls, {**_compose(primary), "surplus": 1}, "")


@pytest.mark.slow  # composes every option of the app (verl's tree for GRPO/RLM training)
def test_rlm_task_and_sft_data_sections_fit_their_schemas():
    from recallm.rlm.sft_data import SFTDataSettings
    from recallm.rlm.tasks import TaskRun, TaskSet

    cfg = OmegaConf.create(_compose("rlm"))
    OmegaConf.resolve(cfg)
    tasks = typed(TaskRun, cfg.tasks, "tasks")
    assert tasks.specs() and tasks.task_kwargs()["needles"] == cfg.tasks.needles
    sft_data = typed(SFTDataSettings, cfg.sft_data, "sft_data")
    assert sft_data.paths() == list(cfg.sft_data.trajectories)
    with pytest.raises(RecallmError, match=r"tasks has unknown keys \['lenghts'\]"):
        typed(TaskRun, {"lenghts": [1]}, "tasks")
    pytest.importorskip("verl")  # rlm_train composes verl's config
    for option in _options("rlm_train"):
        train = _compose("rlm_train", [f"rlm_train={option}"])
        for split, spec in train["recallm"]["rlm"]["data"].items():
            typed(TaskSet, spec, f"recallm.rlm.data.{split}")


@pytest.mark.slow  # composes every option of the app (verl's tree for GRPO/RLM training)
def test_grpo_recallm_section_fits_its_schema():
    pytest.importorskip("verl")
    from recallm.grpo.app import compose
    from recallm.grpo.settings import settings_of

    for option in _options("grpo"):
        rm = settings_of(compose([f"grpo={option}"]))
        assert rm.reward_manager and rm.reward["categories"]
    for platform in _options("grpo/platform"):  # each platform of configs/grpo/platform/ names itself
        assert settings_of(compose([f"grpo/platform={platform}"])).platform == platform
    cfg = compose([])
    cfg.recallm.check_data = "maybe"
    with pytest.raises(RecallmError, match=r"recallm\.check_data must be true or false, got 'maybe'"):
        settings_of(cfg)
    cfg = compose([])
    cfg.recallm.platform = "tpu"
    with pytest.raises(RecallmError, match=r"recallm\.platform must be one of gpu, cpu, vllm_cpu, got 'tpu'"):
        settings_of(cfg)


# ---------------------------------------------------------------------------- one command-line helper
def test_hydra_command_reads_modes_flags_and_subcommands(capsys):
    from recallm.cli.common import hydra_command

    seen: list = []

    def run(cfg, status=False):  # hydra_run=False: the config composed (once) and checked
        seen.append(((cfg.mode, cfg.trajectory, cfg.progress), status))
        return 0

    def sub(argv):
        seen.append(("sub", argv))
        return 0

    main = hydra_command(
        "rlm", run, modes=("run", "show"), positional={"show": "trajectory"}, subcommands={"train": sub},
        flags={"--status": "which jobs are done"}, hydra_run=False,
    )  # fmt: skip
    main(["show", "a b.jsonl", "--status"])
    main(["train", "x=1", "--print-config"])
    main(["progress=false"])
    assert seen == [
        (("show", "a b.jsonl", True), True),  # mode=show trajectory='a b.jsonl'
        ("sub", ["x=1", "--print-config"]),
        (("run", None, False), False),  # progress=false
    ]
    with pytest.raises(SystemExit) as exit_:  # the overrides are checked before run is called
        main(["progres=false"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "progres" in err and err.count("\n") == 1, err
    assert len(seen) == 3


@pytest.mark.parametrize("config_name", ["data", "sft", "eval", "pipeline", "score", "annotate", "decoding_demo", "rlm"])
def test_a_hydra_command_composes_once(config_name, tmp_path, monkeypatch):
    """Every command Hydra runs composes its config one time: the composition that checked the command line
    is the one Hydra's run hands to the command, with its output directory, ``.hydra/`` files and job log."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.hydra_config import HydraConfig

    from recallm.cli.common import hydra_command

    calls, seen = [], []
    original = ConfigLoaderImpl.load_configuration

    def counted(self, *args, **kwargs):
        calls.append(kwargs.get("config_name", args[0] if args else None))
        return original(self, *args, **kwargs)

    def run(cfg):
        seen.append(("hydra" in cfg, HydraConfig.get().runtime.output_dir, HydraConfig.get().job.name))
        return 0

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counted)
    main = hydra_command(config_name, run)
    main([f"hydra.run.dir={tmp_path / 'hydra'}"])
    assert calls == [config_name]
    assert seen == [(False, str(tmp_path / "hydra"), "test_config_schema")]
    files = sorted(p.name for p in (tmp_path / "hydra" / ".hydra").iterdir())
    assert files == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert (tmp_path / "hydra" / ".hydra" / "overrides.yaml").read_text().strip() == "[]"  # hydra.* is Hydra's own
    assert (tmp_path / "hydra" / "test_config_schema.log").exists()


# ------------------------------------------------------------- schemas registered with Hydra (ConfigStore)
def test_registered_schemas_give_every_key_and_refuse_with_one_line():
    from recallm.config import check_overrides

    rlm = _compose("rlm", ["rlm.max_depth=2", "root.timeout=30", "sandbox.wall_s=5"])
    assert rlm["rlm"]["max_depth"] == 2 and rlm["rlm"]["root_max_new_tokens"] == 256  # the YAML's choice
    assert rlm["rlm"]["max_iterations"] == 20 and rlm["sub"]["recall_constrained"] is True  # default; YAML's
    assert rlm["root"]["timeout"] == 30 and rlm["budget"]["max_subcalls"] == 1000
    assert _compose("eval")["backend"]["batch_size"] == 4
    cases = [
        ("eval", ["backend.batch_size=abc"], r"^backend\.batch_size must be an integer, got 'abc'$"),
        ("rlm", ["rlm.max_depth=x"], r"^rlm\.max_depth must be an integer, got 'x'$"),
        ("rlm", ["root.nme=1"], r"root\.nme.*Key 'nme' not in 'ModelSection'"),
        ("rlm", ["+budget.max_token=1"], r"unknown setting budget\.max_token"),
    ]
    for primary, overrides, pattern in cases:
        with pytest.raises(RecallmError, match=pattern) as err:
            check_overrides(primary, overrides)
        assert "\n" not in str(err.value)
    assert check_overrides("eval", ["backend.name=rlm", "+backend.rlm.root.name=scripted"], open_keys=("backend.rlm",))


@pytest.mark.slow  # composes verl's tree
def test_rlm_train_section_is_registered_and_typed():
    """``recallm.rlm`` of rlm_train.yaml: RLMTrainSettings (registered), its four settings inside."""
    pytest.importorskip("verl")
    from recallm.config import check_overrides
    from recallm.grpo.app import compose
    from recallm.rlm.train import train_settings

    cfg = compose(["recallm.rlm.rlm.max_depth=2", "recallm.rlm.rlm.root_timeout_s=5"], config_name="rlm_train")
    section = train_settings(cfg.recallm.rlm)
    assert (section.rlm.max_depth, section.rlm.root_timeout_s, section.rlm.root_max_new_tokens) == (2, 5.0, 32)
    assert section.rlm.max_iterations == 2 and section.subcalls.max_prompt_chars == 100_000  # tiny_cpu; rlm_train.yaml
    assert section.sandbox.kill_grace_s == 2.0 and section.budget.max_tokens is None and section.sub["name"] == "policy"
    closed = {"closed": lambda key: key.split(".")[0] == "recallm"}
    cases = [
        (["recallm.rlm.rlm.max_depth=x"], r"^recallm\.rlm\.rlm\.max_depth must be an integer, got 'x'$"),
        (["recallm.rlm.subcalls.retries=1.5"], r"^recallm\.rlm\.subcalls\.retries must be an integer, got 1\.5$"),
        (["recallm.rlm.rlm.max_dept=1"], r"Key 'max_dept' not in 'RLMSettings'"),
        (["recallm.rlm.trajectory_dri=x"], r"Key 'trajectory_dri' not in 'RLMTrainSettings'"),
    ]
    for overrides, pattern in cases:
        with pytest.raises(RecallmError, match=pattern) as err:
            check_overrides("rlm_train", overrides, **closed)
        assert "\n" not in str(err.value)
    for section, pattern in [
        ({"out_dir": "o", "rlm": {"max_dept": 1}}, r"^recallm\.rlm\.rlm has unknown keys \['max_dept'\]"),
        ({"out_dir": "o", "rlm": {"max_depth": 9}}, r"^recallm\.rlm\.rlm\.max_depth must be in \[0, "),
        ({"out_dir": "o", "sandbox": {"wall_s": 0}}, r"^recallm\.rlm\.sandbox\.wall_s must be > 0"),
        ({"out_dir": "o", "subs": {}}, r"^recallm\.rlm has unknown keys \['subs'\]"),
        ({"rlm": {}}, r"^recallm\.rlm\.out_dir is required"),
    ]:
        with pytest.raises(RecallmError, match=pattern):
            train_settings(section)


def test_hf_cpu_settings_schema():
    from recallm.grpo.cpu.hf_generate import HFCPUSettings

    assert HFCPUSettings.from_engine_kwargs({"batch_wait_ms": 5}).batch_wait_ms == 5.0
    with pytest.raises(RecallmError, match=r"engine_kwargs\.hf_cpu has unknown keys \['thread'\]"):
        HFCPUSettings.from_engine_kwargs({"thread": 2})
    # the recall constraint is no setting of the rollout (it follows recallm.recall_constrained)
    with pytest.raises(RecallmError, match=r"engine_kwargs\.hf_cpu has unknown keys \['recall'\]"):
        HFCPUSettings.from_engine_kwargs({"recall": "on"})
    with pytest.raises(RecallmError, match=r"engine_kwargs\.hf_cpu\.max_batch_size must be an integer, got 'x'"):
        HFCPUSettings.from_engine_kwargs({"max_batch_size": "x"})
