"""Your own model's runs (docs/tutorial-own-model.md): names derived from the model directory, the own-model
config groups composing with nothing of the tiny default's, and every problem of a launch at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from recallm.errors import Problems, RecallmError, collect, raise_problems
from recallm.paths import CONFIG_DIR, model_label, model_name, package_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "path, name, label",
    [
        ("tiny", "tiny", "tiny"),
        ("/cache/models/smollm2-135m-instruct-recallm", "smollm2-135m-instruct-recallm", "smollm2-135m-instruct-recallm"),
        ("models/smollm2/", "smollm2", "smollm2"),
        ("outputs/sft/smollm2/full/final", "smollm2", "smollm2-sft-full"),
        ("outputs/sft/smollm2/embed/final", "smollm2", "smollm2-sft-embed"),
        ("outputs/grpo/smollm2/global_step_2/actor/huggingface", "smollm2", "smollm2-grpo-step2"),
        ("outputs/grpo/smollm2/global_step_2/actor", "smollm2", "smollm2-grpo-step2"),
        ("/models/llama/hf", "hf", "hf"),  # a directory of one's own named hf (no verl checkpoint beside it)
    ],
)
def test_model_names(path, name, label):
    assert (model_name(path), model_label(path)) == (name, label)


def test_exported_grpo_run_is_named_after_the_run(tmp_path):
    run = tmp_path / "outputs" / "grpo" / "mine"
    (run / "global_step_2").mkdir(parents=True)
    (run / "hf").mkdir()
    assert (model_name(run / "hf"), model_label(run / "hf")) == ("mine", "mine-grpo")


def test_an_adapter_is_labelled_with_its_model_and_lora(tmp_path):
    """An evaluated LoRA adapter was filed as `adapter-hf` (issue 38): it is its model's run, stage and `lora`."""
    sft_adapter = tmp_path / "outputs" / "sft" / "mine" / "full" / "final" / "adapter"
    kept = tmp_path / "outputs" / "grpo" / "mine" / "hf" / "adapter"
    for adapter in (sft_adapter, kept):
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text("{}")
    (tmp_path / "outputs" / "grpo" / "mine" / "global_step_2").mkdir()
    assert (model_name(sft_adapter), model_label(sft_adapter)) == ("mine", "mine-sft-full-lora")
    assert (model_name(kept), model_label(kept)) == ("mine", "mine-grpo-lora")
    assert model_label(tmp_path / "models" / "adapter") == "adapter"  # a directory of one's own named adapter


def test_every_sft_recipe_takes_every_lora_key_without_a_plus():
    """`sft.lora.*` works on every recipe (the own-model recipe needed `+sft.lora.rank`): each recipe file lists the
    keys of recallm.sft.settings.LoraSettings."""
    import dataclasses

    from omegaconf import OmegaConf

    from recallm.sft.settings import LoraSettings

    keys = {f.name for f in dataclasses.fields(LoraSettings)}
    for recipe in sorted((CONFIG_DIR / "sft").glob("*.yaml")):
        lora = OmegaConf.load(recipe).get("lora") or {}
        assert set(lora) == keys, f"{recipe.name}: sft.lora has {sorted(lora)}, LoraSettings {sorted(keys)}"


def _compose(config: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config, overrides=overrides)


def test_own_groups_file_every_stage_under_the_model_name():
    model = "/cache/models/smollm2-135m-instruct-recallm"
    data = _compose("data", ["data=own_cpu", f"tokenizer={model}"])
    assert data.out_dir == "outputs/data/smollm2-135m-instruct-recallm"
    sft = _compose("sft", ["sft=own_cpu", f"model.path={model}"])
    assert sft.out_dir == "outputs/sft/smollm2-135m-instruct-recallm"
    assert sft.train_file == f"{data.out_dir}/sft/train.jsonl" and sft.val_file == f"{data.out_dir}/sft/val.jsonl"
    assert dict(sft.model) == {"name": "smollm2-135m-instruct-recallm", "path": model}  # no tiny architecture
    assert sft.sft.max_length is None  # the data's longest trace (check_config)
    final = "outputs/sft/smollm2-135m-instruct-recallm/full/final"
    grpo = _compose("grpo", ["grpo=own_cpu", f"actor_rollout_ref.model.path={final}"])
    assert grpo.trainer.experiment_name == "smollm2-135m-instruct-recallm"
    assert grpo.trainer.default_local_dir == "outputs/grpo/smollm2-135m-instruct-recallm"
    assert grpo.data.train_files == f"{data.out_dir}/train.parquet"
    assert grpo.data.max_response_length is None  # the data's (recallm.grpo.app.data_lengths)
    ev = _compose("eval", ["eval=own_cpu", f"model_path={final}"])
    assert ev.out_dir == "outputs/eval/own_cpu/smollm2-135m-instruct-recallm-sft-full-hf"
    assert ev.eval.benchmarks.in_domain.data_dir == data.out_dir
    # the tiny recipe names its run after its model too (the default path gives the old name)
    assert _compose("grpo", []).trainer.default_local_dir == "outputs/grpo/tiny_cpu"
    assert _compose("eval", []).out_dir == "outputs/eval/tiny/tiny-hf"


def test_grpo_configs_find_verls_yaml_without_importing_verl():
    import omegaconf

    assert Path(package_dir("omegaconf")) == Path(omegaconf.__file__).parent
    for bad in ("no_such_package_here", "verl.trainer", "../verl"):
        with pytest.raises(RecallmError, match="is not installed"):
            package_dir(bad)
    code = (
        "import sys\n"
        "from recallm.cli.schemas import register\n"
        "from recallm.grpo.compose import compose\n"
        "register()\n"
        "assert compose([]).actor_rollout_ref.rollout.n >= 1 and compose([], config_name='rlm_train').trainer\n"
        "print(sorted(m for m in sys.modules if m == 'verl' or m.startswith('verl.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"  # verl's ppo_trainer composed, verl not imported


def test_collect_gathers_every_problem():
    def yields():
        yield "a=1 is wrong: use a=2"

    def raises():
        raise RecallmError("b=1 is wrong: use b=3")

    def many():
        raise Problems(["c", "d"])

    assert collect(yields, raises, many, lambda: None, lambda: "e") == [
        "a=1 is wrong: use a=2",
        "b=1 is wrong: use b=3",
        "c",
        "d",
        "e",
    ]
    raise_problems([])
    with pytest.raises(Problems, match=r"^x \(and 1 more\)$") as raised:
        raise_problems(["x", "y"])
    assert raised.value.problems == ["x", "y"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_data_refuses_an_empty_validation_split_with_the_other_problems(tmp_path):
    (tmp_path / "file").write_text("")
    done = _cli(
        "recallm.cli.data", "data=own_cpu", "tokenizer=/nope", "data.sft.count=24", f"out_dir={tmp_path / 'file'}", cwd=tmp_path
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 4, done.stderr
    assert lines[0].startswith("error: out_dir") and "is a file" in lines[0]
    assert lines[1].startswith("error: tokenizer directory /nope does not exist")
    assert lines[2] == (
        "error: data.sft.count=24 x data.sft.val_fraction=0.02 leaves no SFT validation traces (0.48 rounds to 0): "
        "use data.sft.count=26 or data.sft.val_fraction=0.03 (or data.sft.val_fraction=0 for none)"
    )
    assert lines[3] == "error: 3 problems; nothing was started"
    assert not (tmp_path / "outputs").exists()


def _traces(path: Path, n: int, length: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for _ in range(n):
            f.write(json.dumps({"prompt_ids": [1] * (length - 4), "completion_ids": [2] * 4}) + "\n")


def test_sft_reports_every_problem_with_a_working_value(tmp_path):
    from recallm.sft.train import check_config

    model = tmp_path / "mine"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    train = tmp_path / "data" / "sft" / "train.jsonl"
    _traces(train, 10, 80)
    (tmp_path / "data" / "sft" / "val.jsonl").write_text("")
    cfg = {
        "stage": "full",
        "train_file": str(train),
        "val_file": str(tmp_path / "data" / "sft" / "val.jsonl"),
        "out_dir": str(tmp_path / "out"),
        "model": {"name": "mine", "path": str(model)},
        "data": {"name": "mine"},
        "sft": {
            "max_length": None,
            "per_device_batch_size": 4,
            "global_batch_size": 10,
            "embed": {"steps": 8, "lr": 1e-2},
            "full": {"steps": 3, "lr": 1e-4, "warmup_steps": 4},
        },
    }
    with pytest.raises(Problems) as raised:
        check_config(cfg)
    found = raised.value.problems
    assert len(found) == 3, found
    assert found[0] == (
        "sft.global_batch_size=10 is not a multiple of sft.per_device_batch_size=4 x 1 process(es): use "
        "sft.global_batch_size=8 (or 12), or sft.per_device_batch_size=2"
    )
    assert found[1].startswith(f"val_file {tmp_path}/data/sft/val.jsonl has no traces: val_file=null")
    assert found[2] == (
        "sft.full.warmup_steps=4 is not below the stage's 3 steps: the peak learning rate sft.full.lr would never be "
        "reached; use sft.full.warmup_steps=1"
    )
    # fixed: max_length null is the data's longest trace, which the model's positions must hold
    cfg["sft"].update(global_batch_size=8, full={"steps": 3, "lr": 1e-4, "warmup_steps": 1})
    cfg["val_file"] = None
    with pytest.raises(RecallmError, match=r"^sft\.max_length=80 is longer than the model's 64 positions"):
        check_config(cfg)
    _traces(train, 10, 60)
    assert check_config(cfg).sft.max_length == 60


def test_sft_names_the_tiny_default_data_for_ones_own_model(tmp_path):
    """``model.path`` of one's own with the tiny default's data files: the line says what to set."""
    done = _cli("recallm.cli.sft", "stage=embed", f"model.path={tmp_path}", cwd=tmp_path)
    assert done.returncode == 2
    assert "train_file outputs/data/tiny/sft/train.jsonl does not exist" in done.stderr
    assert "it is the default of data=tiny (the tiny mixture), not data for model.path=" in done.stderr
    assert "or use sft=own_cpu" in done.stderr and "val_file outputs/data/tiny/sft/val.jsonl" in done.stderr


def test_a_key_the_recipe_does_not_set_says_to_add_it(tmp_path):
    done = _cli("recallm.cli.sft", "stage=full", "sft.full.steps=3", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: sft.full.steps is not set by the chosen config, so Hydra cannot override it: add it with "
        "+sft.full.steps=3"
    )


def _summary(folder: Path, prompt_max: int, completion_max: int, median: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(
        json.dumps(
            {
                "splits": {
                    "train": {"count": 4, "tasks": {"kv_retrieval": {"tokens_max": prompt_max}}},
                    "sft": {
                        "count": 4,
                        "completion_tokens_max": completion_max,
                        "completion_tokens_median": median,
                        "tokens_max": prompt_max + completion_max,
                    },
                }
            }
        )
    )


def test_grpo_takes_its_token_caps_from_the_data(tmp_path, capsys):
    from recallm.grpo.app import Prepared, data_lengths, length_warnings, problems, resolve_names

    data = tmp_path / "outputs" / "data" / "mine"
    _summary(data, prompt_max=383, completion_max=136, median=97)
    cfg = _compose(
        "grpo",
        ["grpo=own_cpu", "actor_rollout_ref.model.path=outputs/sft/mine/full/final", f"data.train_files={data}/train.parquet"],
    )
    run = Prepared()
    resolve_names(cfg, run)
    assert cfg.trainer.experiment_name == "mine" and cfg.trainer.default_local_dir == "outputs/grpo/mine"
    data_lengths(cfg, run)
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (384, 160)  # 136 + the buffer 16, to 16s
    assert run.derived["data.max_response_length"] == "the longest SFT trace, 136 tokens, + the overlong buffer 16"
    assert list(length_warnings(cfg)) == []
    # the tiny recipe's caps on this data: said before the run (a warning: short caps keep smoke runs short)
    cfg.data.max_response_length, cfg.data.max_prompt_length = 80, 300
    said = list(length_warnings(cfg))
    assert said[0].startswith("data.max_prompt_length=300 is shorter than the longest training prompt (383 tokens")
    assert said[1] == (
        "data.max_response_length=80 less the overlong buffer 16 (recallm.reward.overlong.buffer) leaves 64 tokens: "
        f"most of the SFT traces are longer (median 97, longest 136 tokens, {data}/summary.json), so the responses "
        "the model was taught to write are penalised or cut; data.max_response_length=160 fits them"
    )
    # no summary to take them from: what to set
    cfg.data.max_response_length = None
    cfg.data.train_files = str(tmp_path / "elsewhere" / "train.parquet")
    assert any(
        p.startswith("data.max_response_length is null and ") and "set data.max_response_length=<tokens>" in p
        for p in problems(cfg)
    )


def test_own_mixture_needs_ones_own_tokenizer(tmp_path):
    """``data=own_cpu`` without ``tokenizer=`` would write the tiny tokenizer's rows into outputs/data/tiny."""
    done = _cli("recallm.cli.data", "data=own_cpu", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: tokenizer=tiny with a mixture named after its model (data=own_cpu): set tokenizer=<your model dir> "
        "(the tiny default's mixture is data=tiny)"
    )
