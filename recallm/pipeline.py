"""The whole recipe as one resumable run: ``recallm-pipeline experiment=<name>``.

An experiment (``configs/experiment/*.yaml``) names the pieces — the model, the data mixture,
the SFT recipe, the GRPO recipe, the evaluation suite — and the *variants* trained side by side
on the same data with the same budget (the recall model and its no-recall ablation). The
pipeline runs the project's own commands, in order, under one run directory::

    <run_dir>/model            recallm-create-model --tiny | --base PATH | --fetch NAME  (or a RecaLLM model directory)
    <run_dir>/base             recallm-create-model --plain  (GGUF bases, ``plain_base``: the untrained baseline)
    <run_dir>/data             recallm-data
    <run_dir>/sft/<variant>    recallm-sft stage=embed, then stage=full      (variants in parallel; under torchrun
                               with ``sft_processes`` > 1; the traces: the data stage's, or ``sft_data``)
    <run_dir>/grpo/<variant>   recallm-grpo                                   (one at a time; a GPU recipe's
                               run is checked by ``recallm-plan grpo --require-fit`` first: stage ``plan``)
    <run_dir>/models/<variant> recallm-export (the GRPO checkpoint as a Hugging Face directory)
    <run_dir>/eval/<run>       recallm-eval (one run per evaluated model and decoding)
    <run_dir>/report           recallm-eval mode=report (every run side by side)
    <run_dir>/logs/<job>.log   each command's output
    <run_dir>/pipeline.json    which jobs are done, and how long each took

A job counts as done once its command exits 0; a rerun skips done jobs and restarts the others,
which continue from their own checkpoints (data shards, SFT checkpoints, GRPO checkpoints, eval
results). Jobs whose command cannot resume (export) start from an empty output. Ctrl-C stops the
running jobs; nothing done is lost. Jobs of one stage run side by side (``parallel``), each with
its share of the CPU threads.

The CPU experiments (``tiny_cpu``, ``toy_rl``, ``smollm2_cpu``) run here; the paper's runs
(``paper_qwen2.5_7b``, ``paper_llama3.1_8b``) are the same stages on one node of GPUs, with what the
user brings named once under ``experiment.inputs`` (``???`` until set: ``recallm-pipeline`` names every
one still unset in one line) and their jobs listed without running anything (``--dry-run``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recallm.config import MAX_BATCH, MAX_COUNT, MAX_SEED, MAX_WORKERS, typed
from recallm.errors import RecallmError
from recallm.paths import METRICS_FILE

__all__ = [
    "StageJob",
    "Stage",
    "Pipeline",
    "PipelineRun",
    "Experiment",
    "read_experiment",
    "experiment_stages",
    "command_line",
    "result_line",
]

STATE_FILE = "pipeline.json"
_HEARTBEAT_S = 30.0


def _tool(name: str) -> list[str]:
    """The command line of one of our console scripts, run with this interpreter."""
    module = {
        "recallm-create-model": "recallm.cli.create_model",
        "recallm-data": "recallm.cli.data",
        "recallm-sft": "recallm.cli.sft",
        "recallm-grpo": "recallm.cli.grpo",
        "recallm-export": "recallm.cli.export",
        "recallm-eval": "recallm.cli.eval",
        "recallm-plan": "recallm.cli.plan",
    }[name]
    return [sys.executable, "-m", module]


def _sft_tool(processes: int) -> list[str]:
    """``recallm-sft``'s command line: one process, or ``processes`` under torchrun (one per GPU)."""
    if processes <= 1:
        return _tool("recallm-sft")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return [*launcher, "-m", "recallm.cli.sft"]


def command_line(argv: Sequence[str]) -> str:
    """A job's command as a person types it: our commands by their console-script names (``recallm-sft``
    for ``python -m recallm.cli.sft``), ``torchrun`` for ``python -m torch.distributed.run``."""
    args = list(argv)
    if args[:2] == [sys.executable, "-m"] and len(args) > 2:
        module = args[2]
        if module == "torch.distributed.run":
            args = ["torchrun", *args[3:]]
        elif module.startswith("recallm.cli."):
            args = ["recallm-" + module.rsplit(".", 1)[1].replace("_", "-"), *args[3:]]
    return shlex.join(args)


def _paper_scale(recipe: str) -> bool:
    """A GRPO recipe that runs on GPUs (its file chooses the ``gpu`` platform): planned before launch."""
    from recallm.paths import CONFIG_DIR

    path = CONFIG_DIR / "grpo" / f"{recipe}.yaml"
    return path.is_file() and "/grpo/platform: gpu" in path.read_text()


@dataclass
class StageJob:
    """One command and the paths it writes. ``fresh``: it cannot resume, so ``outputs`` left by an
    unfinished run are removed before it reruns; the others resume from their outputs. ``redo``
    moves every job's outputs aside first (``<path>.before-redo-<time>``: nothing a finished run
    wrote is lost) and says where."""

    name: str
    argv: list[str]
    outputs: list[Path] = field(default_factory=list)
    fresh: bool = False


@dataclass
class Stage:
    name: str
    jobs: list[StageJob]
    parallel: int = 1


def _state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE_FILE
    if not path.is_file():
        return {"jobs": {}}
    try:
        state = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise RecallmError(f"{path} is corrupt (not UTF-8 text); delete it to rerun every stage") from None
    except json.JSONDecodeError as exc:
        raise RecallmError(f"{path} is corrupt ({exc.msg}); delete it to rerun every stage") from None
    except RecursionError:
        raise RecallmError(f"{path} is corrupt (nested too deeply); delete it to rerun every stage") from None
    except OSError as exc:
        raise RecallmError(f"{path} cannot be read ({exc.strerror})") from None
    bad = None
    if not isinstance(state, dict) or not isinstance(state.get("jobs"), dict):
        bad = "no mapping of jobs"
    elif any(not isinstance(v, dict) for v in state["jobs"].values()):
        bad = "a job entry that is not a mapping"
    else:
        for key in ("stage_seconds", "stage_cpu_seconds"):
            if not isinstance(state.get(key, {}), dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in state.get(key, {}).values()
            ):
                bad = f"{key} that are not numbers"
                break
    if bad:
        raise RecallmError(f"{path} is not a pipeline state file ({bad}); delete it to rerun every stage")
    return state


def _save_state(run_dir: Path, state: Mapping[str, Any]) -> None:
    from recallm.io import write_json_atomic

    write_json_atomic(run_dir / STATE_FILE, state)


def _last_progress(log: Path) -> str:
    """The last progress-bar or log line of a job's output (for the heartbeat)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 4096))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    pieces = [p.strip() for p in _plain_text(tail).split("\n") if p.strip()]
    return pieces[-1][:120] if pieces else ""


_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _plain_text(text: str) -> str:
    """A job's log as lines of plain text: carriage returns (progress bars redrawing) end lines, and the
    terminal's escape sequences (colours, cursor moves: tqdm's ``ESC[A``) and other control characters go."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text.replace("\r", "\n")))


class Pipeline:
    """Runs stages of jobs with resume (see module doc)."""

    def __init__(
        self,
        run_dir: Path,
        stages: Sequence[Stage],
        *,
        threads: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.stages = list(stages)
        self.threads = threads or os.cpu_count() or 1
        self.env = dict(env or {})
        names = [j.name for s in self.stages for j in s.jobs]
        if len(set(names)) != len(names):
            raise RecallmError(f"pipeline job names repeat: {names}")

    def status(self) -> dict[str, bool]:
        done = _state(self.run_dir)["jobs"]
        return {j.name: bool(done.get(j.name, {}).get("done")) for s in self.stages for j in s.jobs}

    def states(self) -> dict[str, str]:
        """Each job's state: ``done``; ``running`` (started, not finished, and a pipeline holds the run
        directory now); ``todo`` (an interrupted start included)."""
        from recallm.io import check_unlocked

        jobs = _state(self.run_dir)["jobs"]
        try:
            check_unlocked(self.run_dir)
            live = False
        except RecallmError:  # a pipeline runs in this run directory now
            live = True

        def state(name: str) -> str:
            entry = jobs.get(name, {})
            if entry.get("done"):
                return "done"
            return "running" if live and entry.get("started") else "todo"

        return {j.name: state(j.name) for s in self.stages for j in s.jobs}

    def run(self, *, redo: Sequence[str] = (), only: Sequence[str] | None = None, echo=print) -> dict[str, Any]:
        """Run what is not done yet. Ctrl-C or SIGTERM (a scheduler's stop, `kill`) stops the running
        jobs' process groups and saves the state: the jobs run in their own sessions, so a pipeline
        that died without stopping them would leave them running."""
        from recallm.io import lock_dir

        _state(self.run_dir)  # a damaged state file is refused before the lock file is written
        with lock_dir(self.run_dir, "recallm-pipeline"):  # one pipeline per run directory
            if threading.current_thread() is not threading.main_thread():
                return self._run(redo, only, echo)
            previous = signal.signal(signal.SIGTERM, _terminate)
            try:
                return self._run(redo, only, echo)
            finally:
                signal.signal(signal.SIGTERM, previous)

    def _run(self, redo: Sequence[str], only: Sequence[str] | None, echo) -> dict[str, Any]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        state = _state(self.run_dir)
        known = {s.name for s in self.stages}
        for name in [*redo, *(only or [])]:
            if name not in known:
                raise RecallmError(f"unknown stage {name!r}; the stages are {', '.join(s.name for s in self.stages)}")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for stage in self.stages:
            if stage.name in redo:
                for job in stage.jobs:
                    state["jobs"].pop(job.name, None)
                    # a resuming command would pick up its old outputs, a fresh one would delete them
                    for path in job.outputs:
                        if path.exists() or path.is_symlink():
                            aside = _aside(path, stamp)
                            path.rename(aside)
                            echo(f"redo {stage.name}: moved {path} to {aside}")
                state.get("stage_seconds", {}).pop(stage.name, None)
                state.get("stage_cpu_seconds", {}).pop(stage.name, None)
        names = [s.name for s in self.stages]
        first = min((names.index(name) for name in redo), default=len(names))
        kept = [
            s.name
            for s in self.stages[first + 1 :]
            if s.name not in redo and all(state["jobs"].get(j.name, {}).get("done") for j in s.jobs)
        ]
        if kept:
            echo(
                f"redo: the later stages {', '.join(kept)} are done and kept (built from the old outputs); "
                "add them to redo=[...] to build them again"
            )
        _save_state(self.run_dir, state)
        for number, stage in enumerate(self.stages, 1):
            if only is not None and stage.name not in only:
                continue
            todo = [j for j in stage.jobs if not state["jobs"].get(j.name, {}).get("done")]
            head = f"[{number}/{len(self.stages)}] {stage.name}"
            if not todo:
                echo(f"{head}: done earlier, skipped")
                continue
            echo(f"{head}: {', '.join(j.name for j in todo)}")
            started, cpu_before = time.perf_counter(), _children_cpu()
            try:
                self._run_stage(stage, todo, state, echo)
            finally:  # wall and CPU time of the stage, summed over invocations (an interrupted one included)
                walls = state.setdefault("stage_seconds", {})
                walls[stage.name] = round(walls.get(stage.name, 0.0) + time.perf_counter() - started, 1)
                cpus = state.setdefault("stage_cpu_seconds", {})
                cpus[stage.name] = round(cpus.get(stage.name, 0.0) + _children_cpu() - cpu_before, 1)
                _save_state(self.run_dir, state)
            echo(
                f"{head}: finished in {_minutes(time.perf_counter() - started)} "
                f"({_children_cpu() - cpu_before:.0f} CPU seconds)"
            )
        return state

    def _run_stage(self, stage: Stage, todo: list[StageJob], state: dict[str, Any], echo) -> None:
        width = max(1, min(stage.parallel, len(todo)))
        threads = max(1, self.threads // width)
        queue = list(todo)
        running: dict[str, tuple[subprocess.Popen, StageJob, float, Path]] = {}
        failed: list[tuple[StageJob, int, Path]] = []
        last_beat = time.perf_counter()
        try:
            while queue or running:
                while queue and len(running) < width and not failed:
                    job = queue.pop(0)
                    running[job.name] = self._start_entry(job, threads)
                    state["jobs"][job.name] = {"started": time.time(), "log": str(running[job.name][3])}
                    _save_state(self.run_dir, state)  # (--status says it runs)
                for name, (proc, job, began, log) in list(running.items()):
                    code, cpu = _reap(proc)
                    if code is None:
                        continue
                    del running[name]
                    seconds = time.perf_counter() - began
                    if code == 0:
                        state["jobs"][name] = {
                            "done": True,
                            "seconds": round(seconds, 1),
                            "cpu_seconds": round(cpu, 1),
                            "log": str(log),
                        }
                        _save_state(self.run_dir, state)
                        echo(f"  {name}: done in {_minutes(seconds)} ({cpu:.0f} CPU seconds)")
                    else:
                        state["jobs"].pop(name, None)  # (not running any more: todo again)
                        _save_state(self.run_dir, state)
                        failed.append((job, code, log))
                if failed and not running:
                    break
                now = time.perf_counter()
                if running and now - last_beat >= _HEARTBEAT_S:
                    last_beat = now
                    for name, (_, _, began, log) in running.items():
                        echo(f"  {name} ({_minutes(now - began)}): {_last_progress(log)}")
                time.sleep(0.5)
        except KeyboardInterrupt:
            for name, (proc, _, _, _) in running.items():
                _stop(proc)
                state["jobs"].pop(name, None)  # stopped: todo again (the caller saves the state)
            raise
        if failed:
            job, code, log = failed[0]
            raise RecallmError(f"stage {stage.name}: {job.name} failed (exit {code}); see {log}: {_last_error(log)}")

    def _start_entry(self, job: StageJob, threads: int) -> tuple[subprocess.Popen, StageJob, float, Path]:
        proc, log = self._start(job, threads)
        return proc, job, time.perf_counter(), log

    def _start(self, job: StageJob, threads: int) -> tuple[subprocess.Popen, Path]:
        if job.fresh:
            for path in job.outputs:
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        log = self.run_dir / "logs" / f"{job.name.replace('/', '-')}.log"
        env = dict(os.environ)
        env.update(self.env)
        env.update(
            OMP_NUM_THREADS=str(threads),
            MKL_NUM_THREADS=str(threads),
            RECALLM_NUM_THREADS=str(threads),
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
        )
        with log.open("a") as f:
            f.write(f"\n$ {shlex.join(job.argv)}\n")
            f.flush()
            proc = subprocess.Popen(
                job.argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=os.getcwd()
            )
        return proc, log


def _aside(path: Path, stamp: str) -> Path:
    """``<path>.before-redo-<stamp>``, or with ``-2``, ``-3``, ... when a redo of the same second
    already moved one there."""
    aside = path.with_name(f"{path.name}.before-redo-{stamp}")
    n = 1
    while aside.exists() or aside.is_symlink():
        n += 1
        aside = path.with_name(f"{path.name}.before-redo-{stamp}-{n}")
    return aside


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _last_error(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in _plain_text(log.read_text(errors="replace")).splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    for line in reversed(lines):
        if line.startswith("error:") or "Error" in line:
            return line[:300]
    return lines[-1][:300] if lines else "(empty log)"


def _reap(proc: subprocess.Popen) -> tuple[int | None, float]:
    """``(exit code, CPU seconds)`` of a finished job, ``(None, 0.0)`` while it runs. The CPU seconds
    (user + system, the job's reaped child processes included) come from ``wait4``, which
    ``Popen.poll`` does not report."""
    if proc.returncode is not None:
        return proc.returncode, 0.0
    try:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    except ChildProcessError:  # reaped elsewhere: Popen knows its code
        return proc.poll(), 0.0
    if pid == 0:
        return None, 0.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def _children_cpu() -> float:
    """User + system CPU seconds of the finished (reaped) child processes so far, their own reaped
    children included: the difference over a stage is the CPU its jobs used, which a loaded machine
    changes far less than their wall time."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


# ----------------------------------------------------------------------------- the experiment
@dataclass(frozen=True)
class PipelineRun:
    """The schema of ``configs/pipeline.yaml``'s own keys, ``recallm-pipeline``'s (``recallm.config.typed``;
    registered with Hydra by ``recallm.cli.schemas``)."""

    run_dir: str
    experiment: dict[str, Any]
    """the ``experiment`` group (``recallm.pipeline.experiment_stages`` reads it)"""
    redo: Any = ()
    """stages to run again from scratch: a name or a list"""
    only: Any = None
    """run only these stages: a name or a list (None: all)"""
    threads: int | None = field(default=None, metadata={"min": 1, "max": MAX_WORKERS})
    """CPU threads shared by the jobs of a stage (None: every core)"""


@dataclass(frozen=True)
class ModelSpec:
    """``experiment.model``: the model to train (one of ``path``, ``base``, ``fetch``; none: the tiny
    default built with ``seed``)."""

    path: str | None = None
    """an existing RecaLLM model directory"""
    base: str | None = None
    """a base model directory to turn into a RecaLLM model (``recallm-create-model --base``)"""
    fetch: str | None = None
    """a known base model to fetch (``recallm-create-model --fetch``)"""
    dtype: str = "auto"
    plain_base: bool = False
    """also build the plain base (variant ``base``: the untrained baseline)"""
    seed: int = field(default=0, metadata={"min": 0, "max": MAX_SEED})
    yarn_factor: float | None = field(default=None, metadata={"min": 1.0, "max": 128.0})
    """with ``base`` or ``fetch``: YaRN rope scaling with this factor (``--yarn-factor``; the paper's Qwen2.5-7B: 4)"""
    config: str | None = None
    """the ``model`` option ``recallm-sft`` composes (``configs/model/<config>.yaml``, e.g. ``qwen2.5_7b``);
    None: the SFT config's default"""


@dataclass(frozen=True)
class VariantSpec:
    """``experiment.variants.<name>``: what a variant changes."""

    sft: list[Any] | None = None
    """overrides of its SFT runs"""
    grpo: list[Any] | None = None
    """overrides of its GRPO run"""
    sft_from: str | None = None
    """start GRPO from this variant's SFT model (no SFT of its own)"""
    rl: bool = True
    """false: no GRPO for this variant (its final model is its SFT model), where the experiment has GRPO"""


@dataclass(frozen=True)
class GRPOStageSpec:
    """``experiment.grpo`` (null: no GRPO)."""

    recipe: str
    val_file: str
    overrides: list[Any] | None = None
    export_step: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    """the step exported and evaluated (``recallm-export --step``; the Llama recipe: 60); None: the newest"""


@dataclass(frozen=True)
class EvalRunSpec:
    """``experiment.eval.runs.<name>``: a variant's model and its decoding."""

    variant: str | None = None
    model: str = "final"
    """final (after every stage) or sft (the SFT checkpoint)"""
    recall_constrained: bool = True
    overrides: list[Any] | None = None


@dataclass(frozen=True)
class EvalStageSpec:
    """``experiment.eval``."""

    suite: str
    runs: dict[str, Any] | None = None
    """name -> an ``EvalRunSpec``"""
    batch_size: int = field(default=8, metadata={"min": 1, "max": MAX_BATCH})
    overrides: list[Any] | None = None
    compare: list[Any] | None = None
    """pairs of run names the report compares prompt by prompt, ``[[recall, norecall], ...]``"""


@dataclass(frozen=True)
class ResultMetric:
    """``experiment.result.metrics.<key>``: a cell of an evaluation summary (``run``, ``benchmark``,
    ``length``, ``metric``); with ``versus``, the paired difference ``run - versus`` on the cell's
    prompts (``recallm.eval.compare``; ``stat``: ``diff``, or the 95% interval's ``low`` or
    ``high``); or a GRPO run's logged metric over its ``first`` or ``last`` steps (``grpo``,
    ``metric``)."""

    run: str | None = None
    benchmark: str | None = None
    length: int | None = None
    versus: str | None = None
    stat: str = field(default="diff", metadata={"choices": ("diff", "low", "high")})
    grpo: str | None = None
    first: int | None = None
    last: int | None = None
    metric: str | None = None
    """default: ``correct`` (a summary cell) or ``critic/score/mean`` (a GRPO log)"""


@dataclass(frozen=True)
class PerLength:
    """``experiment.result.per_length``: ``<run>_<length>=<metric>`` for each run and each length of
    its summary of ``benchmark`` (all tasks of the length)."""

    benchmark: str
    runs: list[Any]
    metric: str = "correct"


@dataclass(frozen=True)
class ResultSpec:
    per_length: PerLength | None = None
    """every run's metric at every length, first in the line"""
    metrics: dict[str, Any] | None = None
    """key -> a ``ResultMetric``"""


@dataclass(frozen=True)
class Experiment:
    """The schema of an experiment config (``configs/experiment/*.yaml``; read with
    ``recallm.config.typed``). The defaults live here."""

    name: str
    model: ModelSpec
    data: str
    """the ``data`` option of ``recallm-data``"""
    sft: str
    """the ``sft`` recipe of ``recallm-sft``"""
    variants: dict[str, Any]
    """name -> a ``VariantSpec``"""
    eval: EvalStageSpec
    data_workers: int = field(default=1, metadata={"min": 1, "max": MAX_WORKERS})
    data_overrides: list[Any] | None = None
    sft_overrides: list[Any] | None = None
    parallel: int = field(default=2, metadata={"min": 1, "max": MAX_WORKERS})
    """jobs of one stage side by side"""
    grpo: GRPOStageSpec | None = None
    result: ResultSpec = field(default_factory=ResultSpec)
    sft_data: str | None = None
    """a directory of SFT traces (``train.jsonl``, ``val.jsonl``: ``recallm-annotate``'s ``output_dir``); None:
    the data stage's programmatic traces (``<run_dir>/data/sft``)"""
    sft_processes: int = field(default=1, metadata={"min": 1, "max": MAX_WORKERS})
    """processes of each SFT run, one per GPU: more than 1 runs ``recallm-sft`` under ``torchrun --standalone
    --nproc_per_node N`` (the paper's runs: 4, with ``deepspeed=zero2`` among ``sft_overrides``)"""
    env: dict[str, Any] | None = None
    """environment variables set for every job of the run (over the caller's own): the toy demo pins the
    CPU kernels with them so that every x86-64 CPU computes the same numbers (``configs/experiment/tiny_cpu.yaml``)"""
    inputs: dict[str, Any] | None = None
    """what the user brings (model, data and traces directories), named once: the file's other values
    interpolate them (``${experiment.inputs.<name>}``); a required one is ``???`` until set on the command line"""


def read_experiment(exp: Mapping[str, Any]) -> Experiment:
    """An experiment config checked against its schema (one-line ``RecallmError``s)."""
    for key in ("name", "model", "data", "sft", "variants", "eval"):
        if key not in exp or exp[key] is None:
            raise RecallmError(f"experiment: {key} is required")
    return typed(Experiment, exp, "experiment")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def experiment_env(exp: Mapping[str, Any]) -> dict[str, str]:
    """``experiment.env`` as the strings a process environment holds (one-line errors for a bad name or value)."""
    env = read_experiment(exp).env or {}
    out: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise RecallmError(f"experiment.env: {name!r} is not an environment variable name")
        if value is None or isinstance(value, (dict, list, tuple)):
            raise RecallmError(f"experiment.env.{name}: a string or a number, got {value!r}")
        out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _overrides(value, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise RecallmError(f"{where} must be a list of Hydra overrides (key=value), got {value!r}")
    bad = [v for v in value if not isinstance(v, str) or "=" not in v]
    if bad:
        raise RecallmError(f"{where}: not a key=value override: {bad[0]!r}")
    return list(value)


def experiment_stages(exp: Mapping[str, Any], run_dir: Path) -> list[Stage]:
    """The stages of an experiment config (``configs/experiment/*.yaml``), checked up front."""
    run_dir = Path(run_dir).resolve()
    spec_ = read_experiment(exp)
    if not spec_.variants:
        raise RecallmError("experiment.variants must map variant names to their overrides")
    variants = {
        name: typed(VariantSpec, value, f"experiment.variants.{name}") for name, value in spec_.variants.items()
    }
    model_cfg = spec_.model
    model_dir = run_dir / "model"
    stages: list[Stage] = []
    base_dir: Path | None = None  # the plain base (variant `base`: the untrained baseline)
    sources = [k for k in ("path", "base", "fetch") if getattr(model_cfg, k)]
    if len(sources) > 1:
        raise RecallmError(f"experiment.model: give one of path, base, fetch; got {', '.join(sources)}")
    if model_cfg.yarn_factor is not None and not (model_cfg.base or model_cfg.fetch):
        raise RecallmError("experiment.model.yarn_factor applies to a model created here: give base or fetch too")
    if model_cfg.path:
        model_dir = Path(model_cfg.path).resolve()
        if not (model_dir / "config.json").is_file():
            raise RecallmError(f"experiment.model.path {model_dir} is not a model directory")
    elif model_cfg.base or model_cfg.fetch:
        source = (
            ["--fetch", model_cfg.fetch] if model_cfg.fetch else ["--base", str(Path(str(model_cfg.base)).resolve())]
        )
        dtype = ["--dtype", model_cfg.dtype]
        yarn = [] if model_cfg.yarn_factor is None else ["--yarn-factor", str(model_cfg.yarn_factor)]
        argv = [*_tool("recallm-create-model"), *source, *dtype, *yarn, "--out", str(model_dir)]
        jobs = [StageJob("model", argv, [model_dir], fresh=True)]
        if model_cfg.plain_base:
            base_dir = run_dir / "base"
            argv = [*_tool("recallm-create-model"), *source, *dtype, "--plain", "--out", str(base_dir)]
            jobs.append(StageJob("model/base", argv, [base_dir], fresh=True))
        stages.append(Stage("model", jobs, 1))
    else:
        argv = [
            *_tool("recallm-create-model"),
            "--tiny",
            "--out",
            str(model_dir),
            "--seed",
            str(model_cfg.seed),
        ]
        stages.append(Stage("model", [StageJob("model", argv, [model_dir], fresh=True)]))
    data_dir = run_dir / "data"
    data_argv = [
        *_tool("recallm-data"),
        f"data={spec_.data}",
        f"tokenizer={model_dir}",
        f"out_dir={data_dir}",
        f"workers={spec_.data_workers}",
        *_overrides(spec_.data_overrides, "experiment.data_overrides"),
    ]
    stages.append(Stage("data", [StageJob("data", data_argv, [data_dir])]))
    parallel = spec_.parallel
    traces = Path(spec_.sft_data).resolve() if spec_.sft_data else data_dir / "sft"
    sft_common = [
        f"sft={spec_.sft}",
        *([f"model={model_cfg.config}"] if model_cfg.config else []),
        f"model.path={model_dir}",
        f"train_file={traces / 'train.jsonl'}",
        f"val_file={traces / 'val.jsonl'}",
        *_overrides(spec_.sft_overrides, "experiment.sft_overrides"),
    ]
    shared = _shared_sft(variants)
    for stage in ("embed", "full"):
        jobs = []
        for name, variant in variants.items():
            if name in shared:
                continue
            extra = _overrides(variant.sft, f"experiment.variants.{name}.sft")
            out = f"out_dir={run_dir / 'sft' / name}"
            argv = [*_sft_tool(spec_.sft_processes), *sft_common, f"stage={stage}", out, *extra]
            jobs.append(StageJob(f"sft_{stage}/{name}", argv, [run_dir / "sft" / name / stage]))
        stages.append(Stage(f"sft_{stage}", jobs, parallel))
    final = {name: run_dir / "sft" / shared.get(name, name) / "full" / "final" for name in variants}
    sft_final = dict(final)
    grpo = spec_.grpo
    metrics_logs: dict[str, Path] = {}
    if grpo:
        jobs, exports, plans = [], [], []
        step = ["--step", str(grpo.export_step)] if grpo.export_step is not None else []
        for name, variant in variants.items():
            if not variant.rl:
                if variant.sft_from is not None:
                    raise RecallmError(
                        f"experiment.variants.{name}: sft_from with rl: false would be the same model as {variant.sft_from}"
                    )
                continue
            ckpt = run_dir / "grpo" / name
            argv = [
                *_tool("recallm-grpo"),
                f"grpo={grpo.recipe}",
                f"actor_rollout_ref.model.path={final[name]}",
                f"data.train_files={data_dir / 'train.parquet'}",
                f"data.val_files={data_dir / 'val' / grpo.val_file}",
                f"trainer.default_local_dir={ckpt}",
                f"trainer.experiment_name={spec_.name}-{name}",
                "trainer.logger=[console,file]",  # per-step metrics in <ckpt>/metrics.jsonl (the report's curves)
                *_overrides(grpo.overrides, "experiment.grpo.overrides"),
                *_overrides(variant.grpo, f"experiment.variants.{name}.grpo"),
            ]
            jobs.append(StageJob(f"grpo/{name}", argv, [ckpt]))
            if _paper_scale(grpo.recipe):  # recallm-plan --require-fit before a GPU launch: it stops here if it cannot fit
                plans.append(StageJob(f"plan/{name}", [*_tool("recallm-plan"), "grpo", "--require-fit", *argv[3:]]))
            metrics_logs[name] = ckpt / METRICS_FILE
            out = run_dir / "models" / name
            exports.append(
                StageJob(
                    f"export/{name}",
                    [*_tool("recallm-export"), "--checkpoint", str(ckpt), *step, "--out", str(out)],
                    [out],
                    True,
                )
            )
            final[name] = out
        if plans:
            stages.append(Stage("plan", plans, 1))
        stages.append(Stage("grpo", jobs, 1))  # one Ray cluster at a time
        stages.append(Stage("export", exports, 1))
    ev = spec_.eval
    runs = {name: typed(EvalRunSpec, value, f"experiment.eval.runs.{name}") for name, value in (ev.runs or {}).items()}
    if not runs:
        raise RecallmError("experiment.eval.runs must name at least one evaluation run")
    eval_jobs = []
    evaluated = dict(final, model=model_dir)  # `model`: the created model before any training
    if base_dir is not None:
        evaluated["base"] = base_dir
    for run_name, spec in runs.items():
        variant = spec.variant
        which = spec.model
        if which not in ("final", "sft"):
            raise RecallmError(
                f"experiment.eval.runs.{run_name}.model must be final (after every stage) or sft (the SFT "
                f"checkpoint), got {which!r}"
            )
        chosen = dict(evaluated, **sft_final) if which == "sft" else evaluated
        if variant not in chosen:
            raise RecallmError(
                f"experiment.eval.runs.{run_name}: unknown variant {variant!r}; known: {list(chosen)}"
            )
        argv = [
            *_tool("recallm-eval"),
            f"eval={ev.suite}",
            f"model_path={chosen[variant]}",
            f"out_dir={run_dir / 'eval' / run_name}",
            f"run_name={run_name}",
            f"backend.recall_constrained={str(spec.recall_constrained).lower()}",
            f"backend.batch_size={ev.batch_size}",
            f"eval.benchmarks.in_domain.data_dir={data_dir}",
            "report=false",
            "progress=true",
            *_overrides(ev.overrides, "experiment.eval.overrides"),
            *_overrides(spec.overrides, f"experiment.eval.runs.{run_name}.overrides"),
        ]
        eval_jobs.append(StageJob(f"eval/{run_name}", argv, [run_dir / "eval" / run_name]))
    stages.append(Stage("eval", eval_jobs, parallel))
    report_argv = [
        *_tool("recallm-eval"),
        "mode=report",
        f"runs=[{','.join(str(run_dir / 'eval' / r) for r in runs)}]",
        f"report_dir={run_dir / 'report'}",
    ]
    if ev.compare:
        pairs = []
        for i, pair in enumerate(ev.compare):
            if not (isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2):
                raise RecallmError(f"experiment.eval.compare[{i}] must be a pair of run names, got {pair!r}")
            unknown = [str(name) for name in pair if str(name) not in runs]
            if unknown:
                raise RecallmError(
                    f"experiment.eval.compare[{i}]: no evaluation run {unknown[0]!r}; the runs are {', '.join(runs)}"
                )
            pairs.append(f"[{pair[0]},{pair[1]}]")
        report_argv.append(f"compare=[{','.join(pairs)}]")
    if metrics_logs:  # the GRPO runs' training curves (Figure 10's panels) in the same report
        report_argv.append("curves={" + ",".join(f"{name}:{path}" for name, path in metrics_logs.items()) + "}")
    stages.append(Stage("report", [StageJob("report", report_argv, [run_dir / "report"], True)]))
    return stages


def _shared_sft(variants: Mapping[str, VariantSpec]) -> dict[str, str]:
    """``{variant: the variant whose SFT model it starts from}`` for variants with ``sft_from``
    (they differ in GRPO only: no SFT jobs of their own)."""
    shared = {}
    for name, variant in variants.items():
        source = variant.sft_from
        if source is None:
            continue
        if source not in variants or variants[source].sft_from is not None:
            raise RecallmError(
                f"experiment.variants.{name}.sft_from must name a variant with its own SFT, got {source!r}"
            )
        if variant.sft:
            raise RecallmError(f"experiment.variants.{name}: sft_from and sft overrides exclude each other")
        shared[name] = str(source)
    return shared


def _grpo_metric(ref: ResultMetric, run_dir: Path, key: str) -> float:
    """A GRPO run's logged metric averaged over its first or last ``n`` steps."""
    from recallm.eval.curves import read_metrics, window_mean

    path = Path(run_dir) / "grpo" / str(ref.grpo) / METRICS_FILE
    first, last = ref.first, ref.last
    if (first is None) == (last is None):
        raise RecallmError(f"result {key}: give exactly one of first: <n> or last: <n> steps")
    try:
        return window_mean(read_metrics(path), ref.metric or "critic/score/mean", first=first, last=last)
    except RecallmError as exc:
        raise RecallmError(f"result {key}: {exc}") from None


def _summary_cells(run_dir: Path, run: str, benchmark: str, key: str) -> dict[str, Any]:
    """``by_length`` of a run's summary of ``benchmark``."""
    path = Path(run_dir) / "eval" / run / "summary.json"
    try:
        return dict(json.loads(path.read_text())["benchmarks"][benchmark]["by_length"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise RecallmError(f"{key}: cannot read {benchmark} of {run} from {path} ({type(exc).__name__}: {exc})") from None


def result_line(exp: Mapping[str, Any], run_dir: Path, state: Mapping[str, Any]) -> str:
    """``RESULT k=v ...`` from the evaluation summaries and the GRPO runs' metric logs
    (``experiment.result``), and the total wall-clock minutes of the stages (every invocation
    counted)."""
    spec = read_experiment(exp).result
    parts = []
    if spec.per_length is not None:
        per = spec.per_length
        for run in per.runs:
            by_length = _summary_cells(run_dir, str(run), per.benchmark, "experiment.result.per_length")
            for length in sorted(by_length, key=int):
                parts.append(f"{run}_{length}={float(by_length[length]['all'][per.metric]):.3f}")
    for key, raw in (spec.metrics or {}).items():
        ref = typed(ResultMetric, raw, f"experiment.result.metrics.{key}")
        if ref.grpo is not None:
            parts.append(f"{key}={_grpo_metric(ref, run_dir, key):.3f}")
            continue
        if ref.versus is not None:
            from recallm.eval.compare import paired_cell

            try:
                cell = paired_cell(
                    Path(run_dir) / "eval" / str(ref.run),
                    Path(run_dir) / "eval" / str(ref.versus),
                    benchmark=str(ref.benchmark),
                    length=int(ref.length or 0),
                    metric=ref.metric or "correct",
                )
            except RecallmError as exc:
                raise RecallmError(f"result {key}: {exc}") from None
            value = {"diff": cell.diff.diff, "low": cell.diff.low, "high": cell.diff.high}[ref.stat]
            parts.append(f"{key}={value:+.3f}")
            continue
        summary_path = Path(run_dir) / "eval" / str(ref.run) / "summary.json"
        try:
            summary = json.loads(summary_path.read_text())
            cell = summary["benchmarks"][ref.benchmark]["by_length"][str(ref.length)]["all"]
            value = cell[ref.metric or "correct"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise RecallmError(
                f"result {key}: cannot read it from {summary_path} ({type(exc).__name__}: {exc})"
            ) from None
        parts.append(f"{key}={float(value):.3f}")
    minutes = sum(float(v) for v in state.get("stage_seconds", {}).values()) / 60
    parts.append(f"minutes={minutes:.1f}")
    return "RESULT " + " ".join(parts)
