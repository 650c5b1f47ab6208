"""The paper's runs as experiments (``configs/experiment/paper_*.yaml``): each composes through
``recallm-pipeline``, names the five recipes (data, model, SFT, GRPO, eval) in one place, and lists its jobs
here, on a CPU, without running anything; every command it would run composes with the overrides it would get.
What the user brings stays ``???``, and every value still unset is named in one line."""

from __future__ import annotations

import pytest

from recallm.config import check_overrides
from recallm.paths import config_dir

PAPER = {
    # experiment: (model option, YaRN factor, GRPO step exported, paper model)
    "paper_qwen2.5_7b": ("qwen2.5_7b", "4.0", None, "RecaLLM-Qwen2.5-7B"),
    "paper_llama3.1_8b": ("llama3.1_8b", None, "60", "RecaLLM-Llama-3.1-8B"),
}
INPUTS = ("base_model", "sft_traces", "dataset_root", "dense_model", "eval_data_root")


def _line(name: str, tmp_path) -> list[str]:
    return [f"experiment={name}", f"run_dir={tmp_path / 'run'}"] + [
        f"experiment.inputs.{key}={tmp_path / key}" for key in INPUTS
    ]


def _after(argv: list[str], module: str) -> list[str]:
    """The overrides a job passes to ``module`` (after ``python -m module`` or torchrun's ``-m module``)."""
    return argv[argv.index(module) + 1 :]


@pytest.mark.parametrize("name", sorted(PAPER))
def test_a_paper_experiment_names_its_recipes_and_lists_its_jobs(name, tmp_path):
    from omegaconf import OmegaConf

    from recallm.pipeline import experiment_stages

    option, yarn, step, paper_model = PAPER[name]
    cfg = check_overrides("pipeline", _line(name, tmp_path))
    assert cfg.run_dir == str(tmp_path / "run")
    exp = OmegaConf.to_container(cfg.experiment, resolve=True)
    # the five recipes, in one place, each an option file that exists
    named = {"data": exp["data"], "model": exp["model"]["config"], "sft": exp["sft"],
             "grpo": exp["grpo"]["recipe"], "eval": exp["eval"]["suite"]}  # fmt: skip
    assert named == {"data": "paper", "model": option, "sft": option, "grpo": option, "eval": "paper"}
    for group, chosen in named.items():
        assert (config_dir() / group / f"{chosen}.yaml").is_file(), (group, chosen)

    stages = experiment_stages(exp, tmp_path / "run")
    assert [s.name for s in stages] == ["model", "data", "sft_embed", "sft_full", "plan", "grpo", "export", "eval", "report"]
    jobs = {j.name: j.argv for s in stages for j in s.jobs}
    run = (tmp_path / "run").resolve()
    model = jobs["model"]
    assert model[model.index("--base") + 1] == str((tmp_path / "base_model").resolve())
    assert (model[model.index("--yarn-factor") + 1] if "--yarn-factor" in model else None) == yarn
    sft = jobs["sft_embed/recall"]
    assert sft[2:5] == ["torch.distributed.run", "--standalone", "--nproc_per_node=4"]  # one process per GPU
    assert f"model={option}" in sft and "deepspeed=zero2" in sft
    assert f"train_file={(tmp_path / 'sft_traces').resolve() / 'train.jsonl'}" in sft  # recallm-annotate's traces
    export = jobs["export/recall"]
    assert (export[export.index("--step") + 1] if "--step" in export else None) == step
    assert _after(jobs["plan/recall"], "recallm.cli.plan")[:2] == ["grpo", "--require-fit"]
    assert _after(jobs["plan/recall"], "recallm.cli.plan")[2:] == _after(jobs["grpo/recall"], "recallm.cli.grpo")
    assert f"paper_model={paper_model}" in jobs["eval/recall"] and f"trainer.default_local_dir={run / 'grpo' / 'recall'}" in jobs["grpo/recall"]

    # every command composes with what the pipeline would pass it (nothing is run)
    data = check_overrides("data", _after(jobs["data"], "recallm.cli.data"))
    assert data.data.name == "paper" and data.data.dataset_root == str(tmp_path / "dataset_root")
    for stage in ("embed", "full"):
        sft_cfg = check_overrides("sft", _after(jobs[f"sft_{stage}/recall"], "recallm.cli.sft"))
        assert (sft_cfg.sft.name, sft_cfg.model.name, sft_cfg.stage) == (option, option, stage)
    ev = check_overrides("eval", _after(jobs["eval/recall"], "recallm.cli.eval"))
    assert (ev.eval.name, ev.backend.name, ev.eval.data_root) == ("paper", "vllm", str(tmp_path / "eval_data_root"))
    pytest.importorskip("verl")  # recallm-grpo composes verl's own config
    grpo = check_overrides("grpo", _after(jobs["grpo/recall"], "recallm.cli.grpo"))
    assert grpo.trainer.default_local_dir == str(run / "grpo" / "recall")


@pytest.mark.parametrize("name", sorted(PAPER))
def test_every_unset_value_of_a_paper_run_is_named_in_one_line(name, tmp_path, capsys, monkeypatch):
    from recallm.cli.pipeline import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([f"experiment={name}", "--status"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(err) == 1, err
    unset = ", ".join(["run_dir", *(f"experiment.inputs.{key}" for key in INPUTS)])
    assert err[0].startswith(f"error: required but not set: {unset} (set each on the command line"), err[0]
    with pytest.raises(SystemExit) as exc:  # one left
        main(_line(name, tmp_path)[:-1] + ["--dry-run"])
    assert "required but not set: experiment.inputs.eval_data_root (" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("name", sorted(PAPER))
def test_a_paper_runs_dry_run_prints_each_command_and_writes_nothing(name, tmp_path, capsys, monkeypatch):
    from recallm.cli.pipeline import main

    monkeypatch.chdir(tmp_path)
    assert main([*_line(name, tmp_path), "--dry-run"]) in (0, None)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"experiment {name}: 9 stages into {(tmp_path / 'run').resolve()} (nothing run)"
    commands = [line.split(": ", 1)[1] for line in out if line.startswith("  todo  ")]
    assert [c.split()[0] for c in commands] == ["recallm-create-model", "recallm-data", "torchrun", "torchrun",
                                                 "recallm-plan", "recallm-grpo", "recallm-export", "recallm-eval",
                                                 "recallm-eval"]  # fmt: skip
    assert main([*_line(name, tmp_path), "--status"]) in (0, None)
    assert capsys.readouterr().out.split() == ["todo", "model", "todo", "data", "todo", "sft_embed/recall", "todo",
                                               "sft_full/recall", "todo", "plan/recall", "todo", "grpo/recall", "todo",
                                               "export/recall", "todo", "eval/recall", "todo", "report"]  # fmt: skip
    assert not (tmp_path / "run").exists() and not (tmp_path / "outputs").exists()  # --status, --dry-run write nothing
