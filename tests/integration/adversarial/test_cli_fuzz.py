"""The CLI fuzz test (issue 31): every command x a matrix of hostile arguments and damaged inputs —
missing, empty, truncated, binary files, directories for files, wrong JSON types, NaN / huge /
negative numbers, unicode paths. Each case is one ``error:`` line on stderr (no traceback; a launch whose
checks find several problems: one line each, then ``error: N problems; nothing was started``), exit
code 2, and nothing written: the working directory holds the same files, of the same sizes and
times, afterwards (no output directory, no Hydra log directory, no lock file, no tiny model).

Issue 38 adds four classes: **special files** (a FIFO, private character devices made with ``mknod`` in the
test's directory, never the machine's ``/dev``, a socket) as inputs and outputs; **LoRA adapters** damaged in
every way ``recallm.modeling.adapter_problem`` names, given to every command that takes a model; **ranges**
(LoRA ranks, rows, tokens, seeds, verl's keys, ``recallm-plan``'s flags and keys, and the metrics log it reads); and the generic cases every command
gets by default (from ``pyproject.toml``'s scripts: a command without a case fails
``test_every_command_is_fuzzed``; every Hydra command gets a run directory under a file and under
``/proc``; every numeric key of a command's own schema a value far out of range). Concurrency (two writers
of one output) is ``test_concurrency.py``'s.

The commands run in this process (their entry points, as the console scripts call them), so the
whole matrix (a few hundred cases) takes several minutes on 2 cores; ``test_runs.py`` runs one command through a
real process."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import socket
import stat
import sys
from pathlib import Path

import pytest

NUMBERS = ["nan", "-1", "1e400", "99999999999999999999999"]  # (1e400 is inf to YAML and float())


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root``: a file's size and time, a directory's presence."""
    return {
        str(p.relative_to(root)): (0, 0) if p.is_dir() else (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def place(tmp_path_factory, tiny_dir) -> Path:
    """Damaged inputs of every kind, side by side (module doc)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("fuzz")
    (root / "adir").mkdir()
    (root / "empty.jsonl").write_bytes(b"")
    (root / "binary.jsonl").write_bytes(bytes(range(256)) * 8)
    (root / "notutf8.jsonl").write_bytes(b'{"a": "\xff\xfe"}\n')
    (root / "truncated.jsonl").write_bytes(b'{"response": "Answer: x", "ground_truth": {"categ')
    (root / "list.jsonl").write_text("[1, 2, 3]\n")
    (root / "types.jsonl").write_text(json.dumps({"response": 5, "ground_truth": [1], "prompt_text": 3}) + "\n")
    (root / "deep.jsonl").write_text("[" * 100000 + "]" * 100000 + "\n")
    (root / "afile").write_text("a file\n")
    pq.write_table(pa.Table.from_pylist([{"x": 1, "y": "z"}]), root / "wrongcols.parquet")
    (root / "trunc.parquet").write_bytes(b"PAR1" + b"\x00" * 100)
    unicode = root / "données ü 中"
    unicode.mkdir()
    (unicode / "rows.jsonl").write_text('{"a": 1}\n')
    # models: truncated, empty and NaN weights, no manifest to catch them first
    for name in ("m_trunc", "m_empty", "m_nan", "m_noconfig"):
        shutil.copytree(tiny_dir, root / name)
        (root / name / "recallm_files.json").unlink()
    weights = root / "m_trunc" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (root / "m_empty" / "model.safetensors").write_bytes(b"")
    tensors = load_file(str(root / "m_nan" / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].float().fill_(float("nan")).to(tensors[name].dtype)
    save_file(tensors, str(root / "m_nan" / "model.safetensors"), metadata={"format": "pt"})
    (root / "m_noconfig" / "config.json").unlink()
    # RLM trajectories: not UTF-8, wrong JSON types after a valid start
    (root / "traj_bin.jsonl").write_bytes(b'{"event": "start"}\n\xff\xfe\n')
    start = {"event": "start", "rlm": "0", "task": "t", "prompt": "p", "messages": 5}
    turn = {"event": "turn", "rlm": "0", "messages": 5, "reply": ["x"], "cells": "abc", "notes": 3}
    bad = [start, turn, turn,
           {"event": "score", "correct": True, "score": "x", "task": 5, "reference": 7},
           {"event": "end", "rlm": "0", "answer": {"a": 1}}]  # fmt: skip
    (root / "traj_types.jsonl").write_text("".join(json.dumps(e) + "\n" for e in bad))
    (root / "trajs").mkdir()
    shutil.copy(root / "traj_types.jsonl", root / "trajs" / "t.jsonl")
    # eval run directories with damaged summaries and results; a pipeline run dir with a damaged state
    for name, summary in {"ev_list": b"[]", "ev_bin": b"\xff\xfe", "ev_types": b'{"benchmarks": {"ruler": 3}}',
                          "ev_deep": b"[" * 100000}.items():  # fmt: skip
        (root / name).mkdir()
        (root / name / "summary.json").write_bytes(summary)
    (root / "ev_resdir").mkdir()
    (root / "ev_resdir" / "results.jsonl").mkdir()
    for name, state in {"pl_bin": b"\xff", "pl_list": b"[]", "pl_types": b'{"jobs": {"data": 3}}'}.items():
        (root / name).mkdir()
        (root / name / "pipeline.json").write_bytes(state)
    (root / "lockdir").mkdir()
    (root / "lockdir" / ".recallm.lock").mkdir()
    # special files (issue 38): a FIFO nobody writes, private character devices (null, zero), a socket
    os.mkfifo(root / "fifo.jsonl")
    for name, minor in (("null.jsonl", 3), ("zero.jsonl", 5)):
        try:
            os.mknod(root / name, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        except PermissionError:  # (not root: those cases are skipped)
            pass
    _SOCKETS.append(socket.socket(socket.AF_UNIX))
    _SOCKETS[-1].bind(str(root / "sock.jsonl"))
    # a score input holding a 5,000-digit integer; a metrics log whose step has 5,000 digits
    big = "9" * 5000
    (root / "bigint.jsonl").write_text(f'{{"response": "Answer: x", "ground_truth": {{"category": "icl"}}, "n_tokens": {big}}}\n')
    (root / "bigstep.jsonl").write_text(f'{{"step": {big}, "data": {{}}}}\n{{"step": 2, "data": {{}}}}\n')
    # LoRA adapters of the ok model, damaged every way the checks name (tests.assets.damaged_adapters)
    from tests.assets import damaged_adapters, save_adapter

    damaged_adapters(save_adapter(tiny_dir, root / "adapters" / "sound"), root)
    # GRPO checkpoints for recallm-export: damaged shards without a manifest, a binary tracker, a config not UTF-8
    for name in ("ck_shards", "ck_config"):
        actor = root / name / "global_step_1" / "actor"
        (actor / "huggingface").mkdir(parents=True)
        for file in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(tiny_dir / file, actor / "huggingface" / file)
        (actor / "fsdp_config.json").write_text('{"world_size": 1}')
        (actor / "model_world_size_1_rank_0.pt").write_bytes(b"PK\x03\x04" + b"\x00" * 200)
        (root / name / "latest_checkpointed_iteration.txt").write_text("1")
    (root / "ck_config" / "global_step_1" / "actor" / "huggingface" / "config.json").write_bytes(b'{"dtype": "\xff"}')
    (root / "ck_tracker").mkdir()
    (root / "ck_tracker" / "latest_checkpointed_iteration.txt").write_bytes(b"\x00\xff\xfe")
    (root / "ck_trackerdir" / "latest_checkpointed_iteration.txt").mkdir(parents=True)
    (root / "adir_full").mkdir()
    (root / "adir_full" / "theirs.txt").write_text("another run's\n")
    return root


_SOCKETS: list[socket.socket] = []  # (bound by the fixture; a socket file needs its socket while it is probed)


def _run(monkeypatch, capsys, module: str, args: list[str]) -> tuple[object, list[str]]:
    mod = importlib.import_module(module)
    monkeypatch.setattr(sys, "argv", [module, *args])
    code: object = 0
    try:
        code = mod.main()
    except SystemExit as exc:
        code = exc.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


SCORE = "recallm.cli.score"
DATA = "recallm.cli.data"
SFT = "recallm.cli.sft"
EVAL = "recallm.cli.eval"
RLM = "recallm.cli.rlm"
PIPE = "recallm.cli.pipeline"
CREATE = "recallm.cli.create_model"
EXPORT = "recallm.cli.export"
ANNOTATE = "recallm.cli.annotate"
GRPO = "recallm.cli.grpo"
SERVE = "recallm.cli.serve"
DEMO = "recallm.cli.decoding_demo"

PLAN = "recallm.cli.plan"
DOCTOR = "recallm.cli.doctor"

SPECIAL = ["fifo.jsonl", "null.jsonl", "zero.jsonl", "sock.jsonl"]  # (special files: issue 38)
FILES = ["missing.jsonl", "empty.jsonl", "binary.jsonl", "notutf8.jsonl", "truncated.jsonl", "list.jsonl",
         "types.jsonl", "deep.jsonl", "adir", "wrongcols.parquet", "données ü 中/missing.jsonl", *SPECIAL]  # fmt: skip
SFT_FILES = {"missing.jsonl", "empty.jsonl", "binary.jsonl", "truncated.jsonl", "types.jsonl", "adir", "fifo.jsonl"}
#: damaged LoRA adapters (tests.assets.DAMAGED_ADAPTERS), given wherever a model is taken
ADAPTERS = ["a_nan", "a_trunc", "a_empty", "a_noweights", "a_shape", "a_rank", "a_basenum", "a_list", "a_notargets",
            "a_alpha0", "a_binconfig", "a_deepconfig", "f_flip/adapter"]  # fmt: skip
#: what a case's last error line must say, where the case is about one message (its id -> a regular expression)
SAYS: dict[str, str] = {}
MODELS = ["m_trunc", "m_empty", "m_nan", "m_noconfig", "missing_model", "afile", "données ü 中"]

CASES: list[tuple[str, str, list[str]]] = []
for f in FILES:
    CASES.append((f"score-input-{f}", SCORE, [f"input={f}", "output=out/s.jsonl"]))
    if f in SFT_FILES:  # (each loads the model before reading the data: the kinds that differ for SFT)
        CASES.append((f"sft-train-{f}", SFT, [f"train_file={f}", "val_file=null", "out_dir=out", "model.path=m_ok"]))
    CASES.append((f"rlm-show-{f}", RLM, ["show", f]))
for m in MODELS:
    CASES.append((f"create-check-{m}", CREATE, ["--check", m]))
    CASES.append((f"create-base-{m}", CREATE, ["--base", m, "--out", "out/m"]))
    CASES.append((f"sft-model-{m}", SFT, ["train_file=ok.jsonl", "val_file=null", "out_dir=out", f"model.path={m}"]))
    CASES.append((f"eval-model-{m}", EVAL, [f"model_path={m}", "out_dir=out", "eval=toy", "limit=1"]))
    CASES.append((f"serve-{m}", SERVE, [m, "--print-command"]))
for a in ADAPTERS:  # a damaged LoRA adapter wherever a model is taken (issue 38)
    CASES.append((f"create-check-{a}", CREATE, ["--check", a]))
    CASES.append((f"serve-{a}", SERVE, [a, "--print-command"]))
    CASES.append((f"eval-model-{a}", EVAL, [f"model_path={a}", "out_dir=out", "eval=toy", "limit=1",
                                            "eval.benchmarks.in_domain.enabled=false"]))
    CASES.append((f"export-{a}", EXPORT, ["--checkpoint", a, "--out", "out/m"]))
    for command in ("create-check", "serve", "eval-model", "export"):
        SAYS[f"{command}-{a}"] = "LoRA adapter|adapter_config.json"
for n in NUMBERS:
    CASES.append((f"create-yarn-{n}", CREATE, ["--tiny", "--out", "out/m", f"--yarn-factor={n}"]))
    CASES.append((f"create-maxrecall-{n}", CREATE, ["--tiny", "--out", "out/m", f"--max-recall-tokens={n}"]))
    CASES.append((f"data-workers-{n}", DATA, ["data=tiny", "out_dir=out", f"workers={n}"]))
    CASES.append((f"sft-steps-{n}", SFT, ["train_file=ok.jsonl", "out_dir=out", f"max_steps={n}"]))
    CASES.append((f"sft-lr-{n}", SFT, ["train_file=ok.jsonl", "out_dir=out", f"sft.full.lr={n}"]))
    CASES.append((f"eval-limit-{n}", EVAL, ["out_dir=out", f"limit={n}"]))
    CASES.append((f"pipeline-threads-{n}", PIPE, [f"threads={n}", "run_dir=out"]))
    CASES.append((f"rlm-parallel-{n}", RLM, [f"parallel={n}", "out_dir=out"]))
    CASES.append((f"score-tau-{n}", SCORE, ["input=ok_rollouts.jsonl", "output=out/s.jsonl", f"reward.categories.icl.tau={n}"]))
CASES += [
    ("score-output-is-input", SCORE, ["input=ok_rollouts.jsonl", "output=ok_rollouts.jsonl"]),
    ("score-output-dir", SCORE, ["input=ok_rollouts.jsonl", "output=adir"]),
    ("score-output-under-file", SCORE, ["input=ok_rollouts.jsonl", "output=afile/x.jsonl"]),
    ("data-out-lockdir", DATA, ["data=tiny", "out_dir=lockdir"]),
    ("data-entries-type", DATA, ["data=tiny", "out_dir=out", "data.train.entries=5"]),
    ("data-task-unknown", DATA, ["data=tiny", "out_dir=out", "data.train.entries=[{task: nope, count: 1}]"]),
    ("data-out-unicode-file", DATA, ["data=tiny", "out_dir=données ü 中/rows.jsonl"]),
    ("rlm-show-traj-bin", RLM, ["show", "traj_bin.jsonl", "out_file=out/x.html"]),
    ("rlm-show-traj-types", RLM, ["show", "traj_types.jsonl"]),
    ("rlm-to-sft-traj-types", RLM, ["to-sft", "sft_data.trajectories=trajs", "sft_data.tokenizer_path=m_ok", "sft_data.out_file=out/x.jsonl"]),
    ("rlm-to-sft-traj-bin", RLM, ["to-sft", "sft_data.trajectories=traj_bin.jsonl", "sft_data.tokenizer_path=m_ok", "sft_data.out_file=out/x.jsonl"]),
    ("eval-report-list", EVAL, ["mode=report", "runs=[ev_list]", "report_dir=out"]),
    ("eval-report-bin", EVAL, ["mode=report", "runs=[ev_bin]", "report_dir=out"]),
    ("eval-report-types", EVAL, ["mode=report", "runs=[ev_types]", "report_dir=out"]),
    ("eval-report-deep", EVAL, ["mode=report", "runs=[ev_deep]", "report_dir=out"]),
    ("eval-report-missing", EVAL, ["mode=report", "runs=[nope]", "report_dir=out"]),
    ("eval-out-lockdir", EVAL, ["out_dir=lockdir", "model_path=m_ok", "eval=toy"]),
    ("eval-results-dir", EVAL, ["out_dir=ev_resdir", "model_path=m_ok", "eval=toy", "limit=1"]),
    ("pipeline-state-bin", PIPE, ["experiment=tiny_cpu", "run_dir=pl_bin"]),
    ("pipeline-state-list", PIPE, ["experiment=tiny_cpu", "run_dir=pl_list"]),
    ("pipeline-state-types", PIPE, ["experiment=tiny_cpu", "run_dir=pl_types"]),
    ("pipeline-status-bin", PIPE, ["experiment=tiny_cpu", "run_dir=pl_bin", "--status"]),
    ("annotate-wrong-columns", ANNOTATE, ["input=wrongcols.parquet", "tokenizer=m_ok", "output_dir=out", "teacher.traces=ok.jsonl", "annotator.model=x"]),
    ("annotate-trunc-parquet", ANNOTATE, ["input=trunc.parquet", "tokenizer=m_ok", "output_dir=out", "teacher.traces=ok.jsonl", "annotator.model=x"]),
    ("export-checkpoint-missing", EXPORT, ["--checkpoint", "nope", "--out", "out/m"]),
    ("export-checkpoint-file", EXPORT, ["--checkpoint", "afile", "--out", "out/m"]),
    ("export-checkpoint-unicode", EXPORT, ["--checkpoint", "données ü 中", "--out", "out/m"]),
    ("grpo-plot-missing", GRPO, ["plot", "nope.jsonl", "--out", "out"]),
    ("grpo-plot-binary", GRPO, ["plot", "binary.jsonl", "--out", "out"]),
    ("grpo-model-trunc", GRPO, ["actor_rollout_ref.model.path=m_trunc", "--print-config"]),
    ("grpo-model-nan", GRPO, ["actor_rollout_ref.model.path=m_nan", "--print-config"]),
    ("demo-out-file", DEMO, ["out_dir=afile"]),
    # special outputs (issue 38): never renamed over, nothing beside them (/dev/null itself is a sink that is
    # written: test_the_null_device_is_written_in_place below)
    ("score-output-chardev", SCORE, ["input=ok_rollouts.jsonl", "output=zero.jsonl"]),
    ("score-output-fifo-no-reader", SCORE, ["input=ok_rollouts.jsonl", "output=fifo.jsonl"]),
    ("score-output-socket", SCORE, ["input=ok_rollouts.jsonl", "output=sock.jsonl"]),
    ("data-out-fifo", DATA, ["data=tiny", "out_dir=fifo.jsonl"]),
    ("grpo-data-fifo", GRPO, ["data.train_files=fifo.jsonl", "actor_rollout_ref.model.path=m_ok", "--print-config"]),
    # numbers whose cost is memory or time, bounded by the schema, the model and the machine (issue 38)
    ("sft-lora-rank-huge", SFT, ["train_file=ok.jsonl", "val_file=null", "out_dir=out", "model.path=m_ok", "stage=full",
                                 "init_from=m_ok", "sft.lora.rank=100000000"]),
    ("sft-lora-rank-width", SFT, ["train_file=ok.jsonl", "val_file=null", "out_dir=out", "model.path=m_ok", "stage=full",
                                  "init_from=m_ok", "sft.lora.rank=129"]),
    ("sft-lora-alpha-0", SFT, ["train_file=ok.jsonl", "val_file=null", "out_dir=out", "model.path=m_ok", "stage=full",
                               "init_from=m_ok", "sft.lora.rank=4", "sft.lora.alpha=0"]),
    ("data-val-per-cell-huge", DATA, ["data=tiny", "out_dir=out", "data.val.per_cell=1000000000"]),
    ("data-rows-beyond-disk", DATA, ["data=tiny", "out_dir=out", "data.val.per_cell=9000000",
                                     "data.val.lengths=[131072,131072,131072,131072,131072,131072,131072,131072]"]),
    ("eval-max-new-tokens-huge", EVAL, ["model_path=m_ok", "out_dir=out", "eval=toy", "limit=1",
                                        "eval.generation.max_new_tokens=1000000000000"]),
    ("eval-max-new-tokens-positions", EVAL, ["model_path=m_ok", "out_dir=out", "eval=toy", "limit=1",
                                             "eval.generation.max_new_tokens=40000",
                                             "eval.benchmarks.in_domain.enabled=false"]),
    ("create-seed-huge", CREATE, ["--tiny", "--out", "out/m", "--seed", "9" * 40]),
    ("create-seed-negative", CREATE, ["--tiny", "--out", "out/m", "--seed=-1"]),
    ("serve-max-n-0", SERVE, ["m_ok", "--print-command", "--max-n", "0"]),
    ("serve-max-n-huge", SERVE, ["m_ok", "--print-command", "--max-n", "10000"]),
    # verl's keys a GRPO launch ranges (recallm.grpo.ranges), trainer.resume_mode, the run directory
    ("grpo-lora-rank-negative", GRPO, ["actor_rollout_ref.model.path=m_ok", "actor_rollout_ref.model.lora_rank=-1",
                                       "--print-config"]),
    ("grpo-lora-rank-width", GRPO, ["actor_rollout_ref.model.path=m_ok", "actor_rollout_ref.model.lora_rank=100000000",
                                    "--print-config"]),
    ("grpo-save-freq", GRPO, ["actor_rollout_ref.model.path=m_ok", "trainer.save_freq=-5", "--print-config"]),
    ("grpo-total-steps", GRPO, ["actor_rollout_ref.model.path=m_ok", "trainer.total_training_steps=-1", "--print-config"]),
    ("grpo-resume-mode", GRPO, ["actor_rollout_ref.model.path=m_ok", "trainer.resume_mode=bogus", "--print-config"]),
    ("grpo-rollout-n-0", GRPO, ["actor_rollout_ref.model.path=m_ok", "actor_rollout_ref.rollout.n=0", "--print-config"]),
    ("grpo-nnodes-0", GRPO, ["actor_rollout_ref.model.path=m_ok", "trainer.nnodes=0", "--print-config"]),
    ("grpo-gpu-mem-util", GRPO, ["actor_rollout_ref.model.path=m_ok",
                                 "actor_rollout_ref.rollout.gpu_memory_utilization=5", "--print-config"]),
    ("grpo-tracker-dir", GRPO, ["actor_rollout_ref.model.path=m_ok", "trainer.default_local_dir=ck_trackerdir",
                                "--print-config"]),
    # damaged inputs that were tracebacks (issue 38)
    ("score-input-5000-digits", SCORE, ["input=bigint.jsonl", "output=out/s.jsonl"]),
    ("grpo-plot-5000-digits", GRPO, ["plot", "bigstep.jsonl", "--out", "out"]),
    ("grpo-plot-out-file", GRPO, ["plot", "ok.jsonl", "--out", "afile"]),
    ("export-damaged-shards", EXPORT, ["--checkpoint", "ck_shards", "--out", "out/m"]),
    ("export-config-not-utf8", EXPORT, ["--checkpoint", "ck_config", "--out", "out/m"]),
    ("export-binary-tracker", EXPORT, ["--checkpoint", "ck_tracker", "--out", "out/m"]),
    ("export-out-not-empty", EXPORT, ["--checkpoint", "ck_shards", "--out", "adir_full"]),
    # the newcomer's own-model LoRA line (issue 38): sft.lora.* without +, out_dir= taken
    ("sft-own-lora-out-dir", SFT, ["sft=own_cpu", "model.path=m_ok", "stage=full", "out_dir=out", "sft.lora.rank=8",
                                   "train_file=missing.jsonl", "val_file=null"]),
]
SAYS.update({
    "score-output-chardev": "output zero.jsonl is a character device, not a regular file: nothing is written to it",
    "score-output-fifo-no-reader": "output fifo.jsonl is a FIFO that no process reads",
    "score-output-socket": "output sock.jsonl is a socket, not a regular file",
    "score-input-fifo.jsonl": r"input fifo.jsonl is a FIFO \(named pipe\), not a regular file: reading it could block",
    "score-input-zero.jsonl": r"input zero.jsonl is a character device, not a regular file",
    "data-out-fifo": r"out_dir fifo.jsonl is a FIFO \(named pipe\), not a directory",
    "sft-lora-rank-huge": r"sft.lora.rank must be <= 65536, got 100000000",
    "sft-lora-rank-width": r"sft.lora.rank=129 is above the model's width \(hidden_size 128\).*use 1 to 128",
    "sft-lora-alpha-0": r"sft.lora.alpha must be > 0",
    "data-val-per-cell-huge": r"data.val.per_cell must be <= 10000000, got 1000000000",
    "data-rows-beyond-disk": r"the mixture makes [\d,]+ rows, at least [\d,.]+ GiB, and .* GiB free",
    "eval-max-new-tokens-huge": r"max_new_tokens must be <= 4194304, got 1000000000000",
    "eval-max-new-tokens-positions": r"max_new_tokens=40000 is more than the model's 32768 positions",
    "create-seed-huge": r"--seed must be in \[0, 9223372036854775807\]",
    "create-seed-negative": r"--seed must be in \[0, 9223372036854775807\]",
    "serve-max-n-0": r"--max-n must be in 1..1024, got 0",
    "serve-max-n-huge": r"--max-n must be in 1..1024, got 10000",
    "grpo-lora-rank-negative": r"actor_rollout_ref.model.lora_rank=-1 is out of range: use >= 0",
    "grpo-lora-rank-width": r"lora_rank=100000000 is above the model's width",
    "grpo-save-freq": r"trainer.save_freq=-5 is out of range: use >= 1 or -1 \(never\)",
    "grpo-total-steps": r"trainer.total_training_steps=-1 is out of range: use >= 1 or null",
    "grpo-resume-mode": r"trainer.resume_mode=bogus is not one of auto, disable, resume_path",
    "grpo-rollout-n-0": r"actor_rollout_ref.rollout.n=0 is out of range",
    "grpo-nnodes-0": r"trainer.nnodes=0 is out of range",
    "grpo-gpu-mem-util": r"gpu_memory_utilization=5 is out of range: use \(0, 1\]",
    "grpo-tracker-dir": r"latest_checkpointed_iteration.txt is not a file",
    "score-input-5000-digits": r"bigint.jsonl:1: not readable JSON \(Exceeds the limit \(4300 digits\)",
    "grpo-plot-5000-digits": r"bigstep.jsonl:1: not a readable JSON metrics record",
    "grpo-plot-out-file": r"--out afile is a file, not a directory",
    "export-damaged-shards": r"cannot read the checkpoint shards in .*ck_shards/global_step_1/actor",
    "export-config-not-utf8": r"cannot read .*ck_config/global_step_1/actor/huggingface/config.json",
    "export-binary-tracker": r"latest_checkpointed_iteration.txt does not name a step",
    "export-out-not-empty": r"--out adir_full is not empty",
    "sft-own-lora-out-dir": r"train_file missing.jsonl does not exist",
})

# Every command, by default (issue 38): the console scripts of pyproject.toml. A Hydra command gets, from a line its
# own checks pass, a run directory under a file and one under /proc (Hydra's mkdir was a traceback), and a value
# far out of range for each numeric key of its own schema (the keys of configs/<command>.yaml, read by the
# command's check: a new key is probed without a line here); an argparse command an unknown flag.
HYDRA_VALID = {
    SCORE: ["input=ok_rollouts.jsonl", "output=out/s.jsonl"],
    DATA: ["data=tiny", "out_dir=out"],
    SFT: ["train_file=ok.jsonl", "val_file=null", "out_dir=out", "model.path=m_ok"],
    EVAL: ["model_path=m_ok", "out_dir=out", "eval=toy", "limit=1", "eval.benchmarks.in_domain.enabled=false"],
    PIPE: ["experiment=tiny_cpu", "run_dir=out"],
    RLM: ["out_dir=out"],
    DEMO: ["out_dir=out"],
    ANNOTATE: ["input=wrongcols.parquet", "tokenizer=m_ok", "output_dir=out", "teacher.traces=ok.jsonl",
               "annotator.model=x"],
}  # fmt: skip
ARGPARSE = [CREATE, EXPORT, SERVE, DOCTOR, PLAN]
for module, valid in HYDRA_VALID.items():
    name = module.rsplit(".", 1)[1]
    CASES.append((f"{name}-hydra-dir-under-file", module, [*valid, "hydra.run.dir=afile/run"]))
    CASES.append((f"{name}-hydra-dir-in-proc", module, [*valid, "hydra.run.dir=/proc/recallm-fuzz/run"]))
    SAYS[f"{name}-hydra-dir-under-file"] = r"hydra.run.dir afile/run: afile is a file|is a file, not a directory"
    SAYS[f"{name}-hydra-dir-in-proc"] = r"hydra.run.dir=/proc/recallm-fuzz/run cannot be created"
for module in ARGPARSE:
    CASES.append((f"{module.rsplit('.', 1)[1]}-unknown-flag", module, ["--no-such-flag-x"]))

#: a command's own keys (its configs/<name>.yaml schema: SFTRun, EvalRun, DataRun, PipelineRun, RLMRun), probed far
#: out of range: +9e18 for an integer key, 1e300 for a float (one that takes it declares so in its metadata)
OWN_SCHEMAS = {SFT: "recallm.sft.settings:SFTRun", EVAL: "recallm.eval.app:EvalRun", DATA: "data_gen.generate:DataRun",
               PIPE: "recallm.pipeline:PipelineRun", RLM: "recallm.rlm.settings:RLMRun"}  # fmt: skip


def _own_numeric_keys(spec: str) -> list[tuple[str, type]]:
    import dataclasses
    import typing

    module, name = spec.split(":")
    cls = getattr(importlib.import_module(module), name)
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        kind = {int: int, float: float, int | None: int, float | None: float}.get(hints[f.name])
        probe = 9 * 10**18 if kind is int else 1e300
        if kind is not None and f.metadata.get("max", 0) < probe and not f.name.startswith("_"):
            keys.append((f.name, kind))
    return keys


for module, spec in OWN_SCHEMAS.items():
    for key, kind in _own_numeric_keys(spec):
        value = str(9 * 10**18) if kind is int else "1e300"
        CASES.append((f"{module.rsplit('.', 1)[1]}-own-{key}-huge", module, [*HYDRA_VALID[module], f"{key}={value}"]))

# recallm-plan (and recallm-sft --plan, recallm-grpo --plan): its flags' ranges (recallm.cli.plan.PlanFlags), verl's
# keys' (recallm.grpo.ranges), SFT's settings' (recallm.sft.settings), the metrics log it reads (issue 38)
_FITS = ["grpo", "grpo=qwen2.5_7b", "--gpus", "4", "--gpu-mem-gib", "80", "--host-ram-gib", "2048", "--disk-free-gb",
         "100000", "--write-gbps", "5", "--no-measure"]  # (a cluster the paper's GRPO recipe fits)
PLAN_CASES = [
    ("plan-gpu-mem-inf", PLAN, [*_FITS, "--gpu-mem-gib", "inf"]),
    ("plan-host-ram-inf", PLAN, [*_FITS, "--host-ram-gib", "inf"]),
    ("plan-mean-tokens-0", PLAN, [*_FITS, "--mean-tokens", "0"]),
    ("plan-metrics-binary", PLAN, [*_FITS, "--metrics", "m_ok/model.safetensors"]),
    ("plan-fit-negative-batch", PLAN, [*_FITS, "--require-fit", "data.train_batch_size=-4"]),
    ("plan-fit-negative-prompt", PLAN, [*_FITS, "--require-fit", "data.max_prompt_length=-20"]),
    ("plan-fit-negative-time", PLAN, [*_FITS, "--require-fit", "--time-limit-hours", "-1"]),
    ("plan-fit-negative-mean-tokens", PLAN, [*_FITS, "--require-fit", "--mean-tokens", "-5"]),
    ("plan-rollout-n-0", PLAN, [*_FITS, "actor_rollout_ref.rollout.n=0"]),
    ("plan-nnodes-0", PLAN, [*_FITS, "trainer.nnodes=0"]),
    ("plan-gpu-mem-util-5", PLAN, [*_FITS, "actor_rollout_ref.rollout.gpu_memory_utilization=5"]),
    ("plan-negative-rank", PLAN, [*_FITS, "actor_rollout_ref.model.lora_rank=-8"]),
    ("plan-sft-negative-rank", PLAN, ["sft", "sft=qwen2.5_7b", "model=qwen2.5_7b", *_FITS[2:], "sft.lora.rank=-8"]),
    ("plan-gpu-mem-nan", PLAN, [*_FITS, "--gpu-mem-gib", "nan"]),
    ("plan-step-seconds-nan", PLAN, [*_FITS, "--step-seconds", "nan"]),
    ("plan-nodes-0", PLAN, [*_FITS, "--nodes", "0"]),
    ("plan-negative-length", PLAN, [*_FITS, "data.max_prompt_length=-20", "data.max_response_length=0"]),
    ("plan-metrics-fifo", PLAN, [*_FITS, "--metrics", "fifo.jsonl"]),
    ("plan-metrics-chardev", PLAN, [*_FITS, "--metrics", "zero.jsonl"]),
    ("plan-metrics-not-utf8", PLAN, [*_FITS, "--metrics", "notutf8.jsonl"]),
    ("plan-metrics-5000-digits", PLAN, [*_FITS, "--metrics", "bigint.jsonl"]),
    ("plan-sft-max-length-0", PLAN, ["sft", "sft=qwen2.5_7b", "model=qwen2.5_7b", *_FITS[2:], "sft.max_length=0"]),
    ("plan-sft-own-no-data", PLAN, ["sft", "--no-measure", "sft=own_cpu", "model.path=m_ok", "stage=full",
                                    "train_file=missing.jsonl", "val_file=null"]),
    ("plan-grpo-own-no-lengths", PLAN, ["grpo", "--no-measure", "grpo=own_cpu", "actor_rollout_ref.model.path=m_ok"]),
    ("sft-plan-host-ram-inf", SFT, ["--plan", "sft=qwen2.5_7b", "model=qwen2.5_7b", *_FITS[2:], "--host-ram-gib", "inf"]),
    ("grpo-plan-rollout-n-0", GRPO, ["--plan", *_FITS[1:], "actor_rollout_ref.rollout.n=0"]),
]  # fmt: skip
SAYS.update({
    "plan-gpu-mem-inf": r"--gpu-mem-gib must be a finite number, got inf",
    "plan-gpu-mem-nan": r"--gpu-mem-gib must be a finite number, got nan",
    "plan-host-ram-inf": r"--host-ram-gib must be a finite number, got inf",
    "plan-mean-tokens-0": r"--mean-tokens must be positive, got 0",
    "plan-metrics-binary": r"--metrics m_ok/model.safetensors is a binary file, not JSONL",
    "plan-fit-negative-batch": r"data.train_batch_size=-4 is out of range: use >= 1",
    "plan-fit-negative-prompt": r"data.max_prompt_length=-20 is out of range: use >= 1",
    "plan-fit-negative-time": r"--time-limit-hours must be positive, got -1",
    "plan-fit-negative-mean-tokens": r"--mean-tokens must be positive, got -5",
    "plan-rollout-n-0": r"actor_rollout_ref.rollout.n=0 is out of range: use \[1, 1024\]",
    "plan-nnodes-0": r"trainer.nnodes=0 is out of range: use >= 1",
    "plan-gpu-mem-util-5": r"gpu_memory_utilization=5 is out of range: use \(0, 1\]",
    "plan-negative-rank": r"actor_rollout_ref.model.lora_rank=-8 is out of range: use >= 0",
    "plan-sft-negative-rank": r"sft.lora.rank must be >= 0, got -8",
    "plan-step-seconds-nan": r"--step-seconds must be a finite number, got nan",
    "plan-nodes-0": r"--nodes must be positive, got 0",
    "plan-metrics-fifo": r"--metrics fifo.jsonl is a FIFO \(named pipe\), not a regular file",
    "plan-metrics-chardev": r"--metrics zero.jsonl is a character device, not a regular file",
    "plan-metrics-not-utf8": r"--metrics notutf8.jsonl is not UTF-8 text",
    "plan-metrics-5000-digits": r"--metrics bigint.jsonl: line 1 is not JSON",
    "plan-sft-max-length-0": r"sft.max_length must be >= 1, got 0",
    "plan-sft-own-no-data": r"sft.max_length is null \(the longest trace of the data\) and train_file missing.jsonl does "
                            r"not exist: create the data first, or plan with sft.max_length=<tokens>",
    "plan-grpo-own-no-lengths": r"data.max_prompt_length is null and .*summary.json does not give the longest training prompt",
    "sft-plan-host-ram-inf": r"--host-ram-gib must be a finite number, got inf",
    "grpo-plan-rollout-n-0": r"actor_rollout_ref.rollout.n=0 is out of range",
})  # fmt: skip


@pytest.fixture
def cwd(place, tiny_dir, monkeypatch) -> Path:
    monkeypatch.chdir(place)
    if not (place / "m_ok").exists():
        shutil.copytree(tiny_dir, place / "m_ok")
        (place / "ok.jsonl").write_text('{"a": 1}\n')
        gt = {"category": "icl", "answers": ["x"], "gold": []}
        (place / "ok_rollouts.jsonl").write_text(json.dumps({"response": "Answer: x", "ground_truth": gt}) + "\n")
    return place


class _TooLong(BaseException):
    pass


def _alarm(signum, frame):
    raise _TooLong("a hostile case ran for more than 60 s: it was not refused")




def _plan_flag_cases() -> list[tuple[str, str, list[str]]]:
    """Every number recallm-plan's flags give (``recallm.cli.plan.PlanFlags``: a new flag is probed without a line
    here) at nan, -1 and far above its bound (an integer flag at 0 instead of nan)."""
    import dataclasses

    from recallm.cli.plan import PlanFlags

    cases = []
    for f in dataclasses.fields(PlanFlags):
        integer = f.type.startswith("int")
        for value in ("0" if integer else "nan", "-1", str(10 ** 30) if integer else "1e300"):
            flag = "--" + f.name.replace("_", "-")
            cases.append((f"plan-flag-{f.name}-{value[:5]}", PLAN, [*_FITS, flag, value]))
            SAYS[cases[-1][0]] = f"{flag} (must be|is out of range)|argument {flag}"
    return cases


PLAN_CASES += _plan_flag_cases()
_PARAMS = [pytest.param(case, module, args, id=case) for case, module, args in CASES + PLAN_CASES]


@pytest.mark.parametrize("case,module,args", _PARAMS)
def test_hostile_input_is_one_line_exit_2_nothing_written(cwd, monkeypatch, capsys, case, module, args):
    import signal
    import subprocess

    for node in ("null.jsonl", "zero.jsonl"):
        if any(node in a for a in args) and not stat.S_ISCHR(os.stat(cwd / node).st_mode if (cwd / node).exists() else 0):
            pytest.skip("a private character device needs mknod (root)")

    def no_process(*a, **k):
        raise _TooLong(f"a hostile case started a process: {a[0] if a else k}")

    # verl (and Ray under it) imported before Popen is refused: Ray starts processes while it imports, and an
    # import stopped half-way leaves a partial `ray` in sys.modules that breaks every later test importing it
    importlib.import_module("verl")
    monkeypatch.setattr(subprocess, "Popen", no_process)  # (the pipeline's jobs, a served model)
    before = _tree(cwd)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)
    try:
        code, err = _run(monkeypatch, capsys, module, args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        after = _tree(cwd)
        for new in sorted(set(after) - set(before), key=len):  # keep the next case's place clean
            path = cwd / new
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    text = "\n".join(err)
    assert "Traceback" not in text, text[-3000:]
    assert code == 2, (code, err[-5:])
    errors = [line for line in err if "error:" in line]
    if len(errors) > 1:  # a launch's checks found several problems: one line each, then how many (recallm.errors)
        assert errors[-1] == f"error: {len(errors) - 1} problems; nothing was started" and err[-1] == errors[-1], err
    assert errors and err[-1] == errors[-1], err[-5:]
    if module == GRPO and any(a.startswith("actor_rollout_ref.model.path=") for a in args):  # the damaged model itself
        model = next(a.split("=", 1)[1] for a in args if a.startswith("actor_rollout_ref.model.path="))
        assert model not in MODELS or any(f"{model}: " in line for line in errors), errors
    if case in SAYS:
        assert any(re.search(SAYS[case], line) for line in errors), (SAYS[case], errors)
    assert after == before, sorted(set(after) ^ set(before))[:10]


def test_every_command_is_fuzzed():
    """Each console script of pyproject.toml has cases in the matrix (a new command needs them: the generic ones of
    HYDRA_VALID or ARGPARSE at least)."""
    import tomllib

    scripts = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())["project"]["scripts"]
    fuzzed = {module for _, module, _ in CASES}

    def runs(entry: str) -> str:  # the module whose main the script runs (an old name's alias runs the new command's)
        module, name = entry.split(":")
        new = getattr(getattr(importlib.import_module(module), name), "renames", None)
        return scripts[new].split(":")[0] if new else module

    missing = sorted(name for name, entry in scripts.items() if runs(entry) not in fuzzed)
    assert not missing, f"commands without hostile cases: {missing} (add them to HYDRA_VALID or ARGPARSE)"


def test_the_null_device_is_written_in_place(cwd, monkeypatch, capsys):
    """output=/dev/null (a private null device here): scored, the means printed, the device still a device and
    nothing written beside it (no lock file, no manifest)."""
    if not stat.S_ISCHR(os.stat(cwd / "null.jsonl").st_mode if (cwd / "null.jsonl").exists() else 0):
        pytest.skip("a private character device needs mknod (root)")
    row = {"response": "</think>\nAnswer: 12", "ground_truth": {"category": "short_math", "answers": ["12"]}}
    (cwd / "out").mkdir()
    (cwd / "out" / "math.jsonl").write_text(json.dumps(row) + "\n")
    before = _tree(cwd)
    code, err = _run(monkeypatch, capsys, SCORE, ["input=out/math.jsonl", "output=null.jsonl", "hydra.run.dir=out/run"])
    after = _tree(cwd)
    shutil.rmtree(cwd / "out", ignore_errors=True)
    assert code in (0, None), err
    assert stat.S_ISCHR(os.stat(cwd / "null.jsonl").st_mode)
    assert {k: v for k, v in after.items() if not k.startswith("out")} == {
        k: v for k, v in before.items() if not k.startswith("out")
    }


@pytest.mark.parametrize(
    "args",
    [
        ["sft", "--no-measure", "sft=own_cpu", "model.path=m_ok", "stage=full", "train_file={traces}", "val_file=null"],
        ["grpo", "--no-measure", "grpo=own_cpu", "actor_rollout_ref.model.path=m_ok", "data.max_prompt_length=256",
         "data.max_response_length=128"],
    ],
    ids=["sft", "grpo"],
)  # fmt: skip
def test_the_plan_of_an_own_model_recipe_is_the_run_it_plans(cwd, tmp_path, monkeypatch, capsys, args):
    """The newcomer's own-model recipes (issue 38): recallm-plan plans what the command runs, the CPU platform on
    this machine's RAM (it stopped with a TypeError traceback, then planned four assumed 79 GiB GPUs and said a
    135M model's host RAM "DOES NOT FIT"). SFT's sft.max_length null is the longest trace of its data, as
    recallm-sft sets it: the data is there (two traces, the longest 300 tokens)."""
    traces = tmp_path / "traces.jsonl"
    traces.write_text("".join(json.dumps({"prompt_ids": [1] * p, "completion_ids": [2] * c}) + "\n"
                              for p, c in ((100, 200), (50, 60))))  # fmt: skip
    args = [a.format(traces=traces) for a in args]
    monkeypatch.setattr(sys, "argv", [PLAN, *args])
    code: object = 0
    try:
        code = importlib.import_module(PLAN).main()
    except SystemExit as exc:
        code = exc.code
    said = capsys.readouterr()
    out, err = said.out, said.err.splitlines()
    assert code in (0, None) and "Traceback" not in said.err, err[-5:]
    assert "assumed" not in out and "DOES NOT FIT" not in out and "cpu" in out.lower(), out
    if args[0] == "sft":
        assert f"{4 * 300:,} tokens per step" in out, out  # 4 per device x the longest trace, 300
