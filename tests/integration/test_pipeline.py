"""The pipeline runner (stages resume after an interruption or a failure) and the experiment plan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from recallm.errors import RecallmError
from recallm.pipeline import Pipeline, Stage, StageJob, experiment_env, experiment_stages, result_line


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def count_job(out: Path, name: str) -> StageJob:
    """Appends one line to ``out/<name>.runs`` each time it runs."""
    return StageJob(name, py(f"open({str(out / (name + '.runs'))!r}, 'a').write('x\\n')"))


def runs(out: Path, name: str) -> int:
    path = out / f"{name}.runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_failed_stage_resumes_without_redoing_done_jobs(tmp_path):
    gate = tmp_path / "gate"
    flaky = StageJob(
        "b/flaky",
        py(f"""
            import pathlib, sys
            open({str(tmp_path / "b.runs")!r}, 'a').write('x\\n')
            if not pathlib.Path({str(gate)!r}).exists():
                print('ValueError: the gate is closed'); sys.exit(3)
        """),
    )
    stages = [
        Stage("a", [count_job(tmp_path, "a1"), count_job(tmp_path, "a2")], parallel=2),
        Stage("b", [flaky, count_job(tmp_path, "b2")], parallel=1),
        Stage("c", [count_job(tmp_path, "c1")]),
    ]
    pipe = Pipeline(tmp_path / "run", stages, threads=2)
    messages: list[str] = []
    with pytest.raises(
        RecallmError, match=r"stage b: b/flaky failed \(exit 3\); see .*b-flaky.log: ValueError: the gate"
    ):
        pipe.run(echo=messages.append)
    assert pipe.status() == {"a1": True, "a2": True, "b/flaky": False, "b2": False, "c1": False}
    assert runs(tmp_path, "c1") == 0  # nothing after the failed stage ran
    gate.touch()
    messages.clear()
    state = Pipeline(tmp_path / "run", stages, threads=2).run(echo=messages.append)
    assert "[1/3] a: done earlier, skipped" in messages
    assert [runs(tmp_path, n) for n in ("a1", "a2", "b", "b2", "c1")] == [1, 1, 2, 1, 1]
    assert all(pipe.status().values()) and set(state["stage_seconds"]) == {"a", "b", "c"}
    # redo drops a stage's done marks; only runs just the named stages
    Pipeline(tmp_path / "run", stages).run(redo=["c"], echo=messages.append)
    assert [runs(tmp_path, n) for n in ("a1", "b2", "c1")] == [1, 1, 2]
    Pipeline(tmp_path / "run", stages).run(redo=["a"], only=["a"], echo=messages.append)
    assert [runs(tmp_path, n) for n in ("a1", "b2", "c1")] == [2, 1, 2]
    with pytest.raises(RecallmError, match="unknown stage 'd'"):
        pipe.run(redo=["d"])


def test_jobs_share_the_threads_and_fresh_jobs_start_clean(tmp_path):
    out = tmp_path / "fresh_out"
    out.mkdir()
    (out / "stale").write_text("old")
    jobs = [
        StageJob(f"t{i}", py(f"import os; open({str(tmp_path / f't{i}')!r}, 'w').write(os.environ['OMP_NUM_THREADS'])"))
        for i in range(2)
    ]
    check = f"import os, sys; sys.exit(os.path.exists({str(out / 'stale')!r}))"
    fresh = StageJob("fresh", py(check), outputs=[out], fresh=True)
    Pipeline(tmp_path / "run", [Stage("t", jobs, parallel=2), Stage("f", [fresh])], threads=4).run(echo=lambda m: None)
    assert [(tmp_path / f"t{i}").read_text() for i in range(2)] == ["2", "2"]
    assert not out.exists()  # a fresh job's outputs are removed before it runs


def test_experiment_env_reaches_every_job(tmp_path, monkeypatch):
    # the toy demo's pins: torch's, MKL's and oneDNN's AVX2 code for every job of the run
    assert experiment_env(experiment()) == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    }
    assert experiment_env(experiment(env=None)) == {}
    assert experiment_env(experiment(env={"A_FLAG": True, "N": 2})) == {"A_FLAG": "true", "N": "2"}
    with pytest.raises(RecallmError, match="experiment.env: '1BAD' is not an environment variable name"):
        experiment_env(experiment(env={"1BAD": "x"}))
    with pytest.raises(RecallmError, match="experiment.env.X: a string or a number"):
        experiment_env(experiment(env={"X": None}))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")  # the experiment's value wins over the caller's
    monkeypatch.setenv("RECALLM_KEPT", "yes")
    out = tmp_path / "env.json"
    names = ("ATEN_CPU_CAPABILITY", "RECALLM_KEPT")
    job = StageJob(
        "probe", py(f"import os, json; open({str(out)!r}, 'w').write(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))")
    )
    Pipeline(tmp_path / "run", [Stage("p", [job])], env=experiment_env(experiment())).run(echo=lambda m: None)
    assert json.loads(out.read_text()) == {"ATEN_CPU_CAPABILITY": "avx2", "RECALLM_KEPT": "yes"}


def test_redo_moves_a_resuming_jobs_outputs_aside(tmp_path):
    # a resuming job (an SFT run) would find its finished outputs and do nothing: redo moves them aside
    out = tmp_path / "ckpt"
    code = f"""
        import pathlib
        out = pathlib.Path({str(out)!r})
        if not (out / 'final').exists():
            out.mkdir(exist_ok=True); (out / 'final').write_text('trained')
            open({str(tmp_path / 'train.runs')!r}, 'a').write('x\\n')
    """
    stages = [Stage("train", [StageJob("train", py(code), outputs=[out])])]
    messages: list[str] = []
    Pipeline(tmp_path / "run", stages).run(echo=messages.append)
    saved = json.loads((tmp_path / "run" / "pipeline.json").read_text())
    saved["stage_seconds"]["train"] = 1e6  # the old run's time must not count towards the redone stage
    (tmp_path / "run" / "pipeline.json").write_text(json.dumps(saved))
    state = Pipeline(tmp_path / "run", stages).run(redo=["train"], echo=messages.append)
    assert runs(tmp_path, "train") == 2  # trained again, not resumed from the old final
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("ckpt.before-redo-")]
    assert len(aside) == 1 and (aside[0] / "final").read_text() == "trained"  # nothing written is lost
    assert any(m.startswith("redo train: moved") for m in messages)
    assert set(state["stage_seconds"]) == {"train"} and state["stage_seconds"]["train"] < 1e6


def test_redo_keeps_every_output_and_names_the_later_stages_it_leaves(tmp_path):
    # a fresh job (export) deletes what it finds before it runs: a redo moves its finished output aside
    # first; two redos within one second do not collide; the later done stages are named
    out, exported = tmp_path / "ckpt", tmp_path / "model"
    train = f"import pathlib; p = pathlib.Path({str(out)!r}); p.mkdir(exist_ok=True); (p / 'w').write_text('x')"
    export = f"import pathlib; pathlib.Path({str(exported)!r}).write_text(open({str(out / 'w')!r}).read())"
    stages = [
        Stage("train", [StageJob("train", py(train), outputs=[out])]),
        Stage("export", [StageJob("export", py(export), outputs=[exported], fresh=True)]),
        Stage("eval", [count_job(tmp_path, "eval")]),
    ]
    Pipeline(tmp_path / "run", stages).run(echo=lambda m: None)
    messages: list[str] = []
    for _ in range(2):
        Pipeline(tmp_path / "run", stages).run(redo=["export"], echo=messages.append)
    asides = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("model.before-redo-"))
    assert len(asides) == 2 and all((tmp_path / name).read_text() == "x" for name in asides)
    assert exported.read_text() == "x" and runs(tmp_path, "eval") == 1
    assert messages.count("redo: the later stages eval are done and kept (built from the old outputs); "
                          "add them to redo=[...] to build them again") == 2  # fmt: skip
    messages.clear()
    Pipeline(tmp_path / "run", stages).run(redo=["train", "eval"], echo=messages.append)
    assert any("the later stages export are done and kept" in m for m in messages)  # between the two
    assert runs(tmp_path, "eval") == 2


def test_corrupt_state_is_one_line(tmp_path):
    (tmp_path / "pipeline.json").write_text("{oops")
    with pytest.raises(RecallmError, match=r"pipeline.json is corrupt .*delete it"):
        Pipeline(tmp_path, [Stage("a", [count_job(tmp_path, "a")])]).status()
    with pytest.raises(RecallmError, match="job names repeat"):
        Pipeline(tmp_path, [Stage("a", [count_job(tmp_path, "a")]), Stage("b", [count_job(tmp_path, "a")])])


RUNNER = """
import sys, time
from pathlib import Path
from recallm.pipeline import StageJob, Pipeline, Stage
tmp = Path(sys.argv[1])
slow = "import time, pathlib; pathlib.Path(%r).write_text('started'); time.sleep(60)" % str(tmp / "slow.started")
if len(sys.argv) > 2:
    slow = "open(%r, 'w').write('ran')" % str(tmp / "slow.done")
stages = [
    Stage("first", [StageJob("first", [sys.executable, "-c", "open(%r, 'a').write('x')" % str(tmp / "first.runs")])]),
    Stage("slow", [StageJob("slow", [sys.executable, "-c", slow])]),
]
Pipeline(tmp / "run", stages).run()
print("FINISHED")
"""


def _command_lines() -> list[str]:
    """Every process's command line, from /proc (``ps`` is not on every machine)."""
    lines = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    lines.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:  # it ended meanwhile
                pass
    return lines


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_pipeline_resumes_stage_by_stage(tmp_path, stop):
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Ctrl-C's default action in the runner, as in a terminal: a suite started in the background by a
    # non-interactive shell (`nohup make test &`) inherits SIGINT ignored, and so would the runner
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 60
    while not (tmp_path / "slow.started").exists():
        assert time.time() < deadline and proc.poll() is None, "the slow job never started"
        time.sleep(0.1)
    time.sleep(0.5)  # the stage has run a measurable while (the pipeline records tenths of a second)
    proc.send_signal(stop)  # Ctrl-C (or a scheduler's SIGTERM) while the second stage runs
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "FINISHED" not in out
    state = json.loads((tmp_path / "run" / "pipeline.json").read_text())
    assert state["jobs"]["first"]["done"] and "slow" not in state["jobs"]
    assert state["stage_seconds"]["slow"] >= 0.4  # the interrupted stage's time is counted
    # the slow job's process group was stopped with the runner
    time.sleep(0.5)
    assert not [args for args in _command_lines() if "slow.started" in args]
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "again"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "FINISHED" in done.stdout and "first: done earlier, skipped" in done.stdout
    assert (tmp_path / "first.runs").read_text() == "x" and (tmp_path / "slow.done").read_text() == "ran"


# --------------------------------------------------------------------------- the experiment


def experiment(**changes):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from recallm.paths import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="pipeline", overrides=["experiment=tiny_cpu"])
    exp = OmegaConf.to_container(cfg.experiment, resolve=True)
    exp.update(changes)
    return exp


def test_tiny_cpu_stages(tmp_path):
    stages = experiment_stages(experiment(), tmp_path)
    assert [s.name for s in stages] == ["model", "data", "sft_embed", "sft_full", "grpo", "export", "eval", "report"]
    jobs = {j.name: j for s in stages for j in s.jobs}
    assert set(jobs) >= {"sft_full/recall", "sft_full/norecall", "grpo/recall", "export/norecall", "eval/norecall"}
    assert "sft.strip_spans=true" in jobs["sft_full/norecall"].argv
    assert "sft.strip_spans=true" not in jobs["sft_full/recall"].argv
    # both variants train on the same data with the same recipe
    same = [a for a in jobs["sft_full/recall"].argv if a.startswith(("sft=", "train_file=", "model.path="))]
    assert same == [a for a in jobs["sft_full/norecall"].argv if a.startswith(("sft=", "train_file=", "model.path="))]
    assert f"model_path={tmp_path.resolve() / 'models' / 'norecall'}" in jobs["eval/norecall"].argv
    assert "backend.recall_constrained=false" in jobs["eval/recall_unconstrained"].argv
    assert jobs["export/recall"].fresh and jobs["report"].fresh
    # a GPU recipe's GRPO stage is preceded by recallm-plan --require-fit, on the same overrides
    exp = experiment()
    gpu = experiment_stages({**exp, "grpo": {**exp["grpo"], "recipe": "qwen2.5_7b"}}, tmp_path)
    names = [s.name for s in gpu]
    assert names.index("plan") == names.index("grpo") - 1
    plan_jobs = {j.name: j for s in gpu for j in s.jobs}
    plan_argv, grpo_argv = plan_jobs["plan/recall"].argv, plan_jobs["grpo/recall"].argv
    assert plan_argv[2:5] == ["recallm.cli.plan", "grpo", "--require-fit"] and plan_argv[5:] == grpo_argv[3:]
    no_grpo = experiment_stages(experiment(grpo=None), tmp_path)
    eval_job = next(j for s in no_grpo for j in s.jobs if j.name == "eval/recall")
    assert f"model_path={tmp_path.resolve() / 'sft' / 'recall' / 'full' / 'final'}" in eval_job.argv
    with pytest.raises(RecallmError, match="unknown variant 'other'"):
        experiment_stages(experiment(eval={"suite": "toy", "runs": {"x": {"variant": "other"}}}), tmp_path)
    with pytest.raises(RecallmError, match="not a key=value override: 'oops'"):
        experiment_stages(experiment(sft_overrides=["oops"]), tmp_path)
    with pytest.raises(RecallmError, match="experiment: variants is required"):
        experiment_stages(experiment(variants=None), tmp_path)
    with pytest.raises(RecallmError, match="not a model directory"):
        experiment_stages(experiment(model={"path": str(tmp_path)}), tmp_path)


def test_smollm2_cpu_plan(tmp_path):
    """The real-model experiment: GRPO for the recall model only, the recall runs on its SFT model and the
    GRPO run on the exported GRPO model, the bfloat16 prefill, the paired comparisons passed to the report,
    and a RESULT line of every run's accuracy by length and the paired difference at the longest."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from recallm.paths import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="pipeline", overrides=["experiment=smollm2_cpu"])
    exp = OmegaConf.to_container(cfg.experiment, resolve=True)
    stages = experiment_stages(exp, tmp_path)
    root = tmp_path.resolve()
    assert [s.name for s in stages] == ["model", "data", "sft_embed", "sft_full", "grpo", "export", "eval", "report"]
    jobs = {j.name: j for s in stages for j in s.jobs}
    assert "grpo/recall" in jobs and "grpo/norecall" not in jobs and "export/norecall" not in jobs
    assert f"actor_rollout_ref.model.path={root / 'sft' / 'recall' / 'full' / 'final'}" in jobs["grpo/recall"].argv
    model_of = {
        name.split("/")[1]: next(a for a in job.argv if a.startswith("model_path="))
        for name, job in jobs.items()
        if name.startswith("eval/")
    }
    assert model_of == {
        "base": f"model_path={root / 'base'}",
        "recall": f"model_path={root / 'sft' / 'recall' / 'full' / 'final'}",
        "recall_unconstrained": f"model_path={root / 'sft' / 'recall' / 'full' / 'final'}",
        "norecall": f"model_path={root / 'sft' / 'norecall' / 'full' / 'final'}",
        "grpo": f"model_path={root / 'models' / 'recall'}",
    }
    assert all("backend.prefill_dtype=bfloat16" in jobs[f"eval/{run}"].argv for run in model_of)
    assert "compare=[[recall,norecall],[recall,recall_unconstrained],[grpo,recall]]" in jobs["report"].argv
    assert exp["result"]["metrics"]["diff_longest"] == {
        "run": "recall", "versus": "norecall", "benchmark": "synthetic", "length": 2048
    }  # fmt: skip
    bad = {**exp, "eval": {**exp["eval"], "compare": [["recall", "nothing"]]}}
    with pytest.raises(RecallmError, match="compare\\[0\\]: no evaluation run 'nothing'"):
        experiment_stages(bad, tmp_path)
    twin = {**exp, "variants": {**exp["variants"], "twin": {"sft_from": "recall", "rl": False}}}
    with pytest.raises(RecallmError, match="sft_from with rl: false"):
        experiment_stages(twin, tmp_path)


def test_result_line(tmp_path):
    exp = experiment()
    for run, acc in (("recall", {"360": 0.9, "1440": 0.6}), ("norecall", {"360": 0.8, "1440": 0.1})):
        (tmp_path / "eval" / run).mkdir(parents=True)
        summary = {"benchmarks": {"synthetic": {"by_length": {k: {"all": {"correct": v}} for k, v in acc.items()}}}}
        (tmp_path / "eval" / run / "summary.json").write_text(json.dumps(summary))
    line = result_line(exp, tmp_path, {"stage_seconds": {"a": 60, "b": 1140}})
    assert line == "RESULT acc_recall_4x=0.600 acc_norecall_4x=0.100 acc_recall_1x=0.900 minutes=20.0"
    (tmp_path / "eval" / "norecall" / "summary.json").write_text("{}")
    with pytest.raises(RecallmError, match=r"result acc_norecall_4x: cannot read it from .*norecall/summary.json"):
        result_line(exp, tmp_path, {})


def test_status_says_which_jobs_run_and_progress_lines_are_plain_text(tmp_path):
    """--status showed running jobs as `todo`, and the heartbeat's progress lines carried a progress bar's escape
    codes (issue 38): a job started by the pipeline that holds the run directory is `running`, one whose pipeline
    is gone `todo`; the last line of a job's log reaches the console without escape or control characters."""
    import threading

    from recallm import pipeline as pipeline_module

    gate = tmp_path / "gate"
    slow = StageJob("slow", py(f"""
        import pathlib, sys, time
        sys.stderr.write('\\x1b[A\\x1b[2Kgenerating:  50%|\\x1b[32m#####\\x1b[0m| 5/10\\r')
        sys.stderr.flush()
        while not pathlib.Path({str(gate)!r}).exists():
            time.sleep(0.05)
    """))  # fmt: skip
    pipe = Pipeline(tmp_path / "run", [Stage("a", [count_job(tmp_path, "first")]), Stage("b", [slow])], threads=1)
    runner = threading.Thread(target=pipe.run, kwargs={"echo": lambda message: None})
    runner.start()
    try:
        log = tmp_path / "run" / "logs" / "slow.log"
        deadline = time.time() + 60
        while not (log.is_file() and "\x1b[2K" in log.read_text(errors="replace")):  # (the job's own line)
            assert time.time() < deadline and runner.is_alive()
            time.sleep(0.1)
        states = {}
        other = threading.Thread(target=lambda: states.update(pipe.states()))  # (another writer: not the lock's thread)
        other.start()
        other.join()
        assert states == {"first": "done", "slow": "running"}
        line = pipeline_module._last_progress(log)
        assert line == "generating:  50%|#####| 5/10", repr(line)
    finally:
        gate.write_text("open")
        runner.join(timeout=60)
    assert pipe.states() == {"first": "done", "slow": "done"}
    state = json.loads((tmp_path / "run" / "pipeline.json").read_text())
    state["jobs"]["slow"] = {"started": 1.0, "log": "x"}  # started by a pipeline that is gone: to do again
    (tmp_path / "run" / "pipeline.json").write_text(json.dumps(state))
    assert pipe.states() == {"first": "done", "slow": "todo"}
