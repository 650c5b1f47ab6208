"""Mixture plans, sharded generation, resume, outputs and the recallm-data CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from data_gen.generate import run_schedule, schedule_from_config
from data_gen.io import read_jsonl, read_records, read_rows
from recallm.errors import RecallmError

MIX = {
    "seed": 3,
    "tolerance": 0.05,
    "train": {
        "lengths": [384, 512],
        "entries": [
            {"task": "kv_retrieval", "count": 12, "params": {"key_type": "toy", "value_type": "toy"}},
            {"task": "math_retrieval", "count": 9, "params": {"key_type": "toy", "value_type": "toy"}},
            {"task": "majority_vote", "count": 6},
        ],
    },
    "val": {"lengths": [512, 1024], "per_cell": 4},
    "sft": {"count": 10, "val_fraction": 0.2},
}


def _records(out):
    return {p.name: read_records(p) for p in sorted(out.rglob("*.parquet")) if "shards" not in p.parts}


def test_plan_validation():
    schedule = schedule_from_config(MIX)
    splits = {j.split for j in schedule.jobs}
    assert {"train", "sft", "val/retrieval_512", "val/reasoning_retrieval_1024", "val/aggregation_512"} <= splits
    assert sum(j.count for j in schedule.jobs if j.split == "sft") == 10
    assert sum(j.count for j in schedule.jobs if j.split == "val/retrieval_512") == 4
    bad = [
        ({"train": {"entries": [{"task": "kv_retrieval", "count": -2}]}}, "count must be a non-negative integer"),
        ({"train": {"entries": [{"task": "kv_retrieval", "count": 2, "lengths": [500, 100]}]}}, "min <= max"),
        ({"train": {"entries": [{"task": "nope", "count": 2, "lengths": 100}]}}, "unknown task 'nope'"),
        ({"train": {"entries": [{"task": "kv_retrieval", "count": 2, "lengths": 5}]}}, "cannot reach a prompt of 5"),
        ({"train": {"entries": [{"count": 2}]}}, "must be a mapping with a 'task'"),
        ({"train": {"entries": [{"task": "kv_retrieval", "count": 0, "lengths": 300}]}}, "no rows to generate"),
        ({**MIX, "tolerance": 2}, "tolerance must be in"),
        ({**MIX, "val": {"lengths": [512], "per_cell": 2, "categories": ["poetry"]}}, "no train entry has category"),
    ]
    for cfg, message in bad:
        with pytest.raises(RecallmError, match=message):
            schedule_from_config(cfg)


def test_run_is_deterministic_across_workers_and_resumes(tmp_path, tiny_dir):
    schedule = schedule_from_config(MIX)
    one = run_schedule(schedule, tmp_path / "one", tiny_dir, workers=1, progress=False)
    two = run_schedule(schedule_from_config(MIX), tmp_path / "two", tiny_dir, workers=2, progress=False)
    assert set(one["files"]) == set(two["files"])
    assert _records(tmp_path / "one") == _records(tmp_path / "two")
    assert read_jsonl(tmp_path / "one" / "sft" / "train.jsonl") == read_jsonl(tmp_path / "two" / "sft" / "train.jsonl")
    # outputs: verl columns, JSON ground truth, categories, lengths; rows read back
    train = read_records(tmp_path / "one" / "train.parquet")
    assert len(train) == 27 and set(train[0]) == {"data_source", "ability", "prompt", "reward_model", "extra_info"}
    assert {r["ability"] for r in train} == {"retrieval", "reasoning_retrieval", "aggregation"}
    assert len(read_jsonl(tmp_path / "one" / "sft" / "val.jsonl")) == 2
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["splits"]["train"]["tasks"]["kv_retrieval"]["count"] == 12
    assert "question_position" in summary["splits"]["train"]["tasks"]["kv_retrieval"]["augmentations"]
    # resume: delete one shard, rerun: only it is written again, outputs identical
    shards = sorted((tmp_path / "one" / "shards").glob("*.parquet"))
    stamps = {p: p.stat().st_mtime_ns for p in shards}
    shards[0].unlink()
    run_schedule(schedule_from_config(MIX), tmp_path / "one", tiny_dir, workers=1, progress=False)
    assert shards[0].is_file()
    assert all(p.stat().st_mtime_ns == stamps[p] for p in shards[1:])
    assert _records(tmp_path / "one") == _records(tmp_path / "two")
    # a changed schedule regenerates everything
    changed = {**MIX, "seed": 4}
    run_schedule(schedule_from_config(changed), tmp_path / "one", tiny_dir, workers=1, progress=False)
    assert _records(tmp_path / "one") != _records(tmp_path / "two")
    assert not list((tmp_path / "one").rglob(".*.tmp-*"))


def test_read_rows_needs_the_tokenizer_without_prompt_text(tmp_path, tiny_dir):
    from recallm.tokens import load_tokenizer

    run_schedule(schedule_from_config({**MIX, "val": {}, "sft": {}}), tmp_path, tiny_dir, workers=1, progress=False)
    assert "prompt_text" not in read_records(tmp_path / "train.parquet")[0]["extra_info"]
    with pytest.raises(RecallmError, match="has no prompt_text: pass the tokenizer"):
        read_rows(tmp_path / "train.parquet")
    rows = read_rows(tmp_path / "train.parquet", load_tokenizer(tiny_dir))
    for row in rows:
        for gold in row.gold:
            assert row.prompt_text[gold["start"] : gold["end"]] == gold["text"]


def test_cli(tmp_path, tiny_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "recallm.cli.data",
        "data=tiny",
        f"out_dir={tmp_path}/out",
        f"tokenizer={tiny_dir}",
        "data.train.entries.0.count=5",
        "data.train.entries.1.count=5",
        "data.train.entries.2.count=2",
        "data.train.entries.3.count=2",
        "data.val.per_cell=2",
        "data.sft.count=4",
        "data.sft.val_fraction=0.25",  # one validation trace (0.1 x 4 rounds to none: refused)
        "workers=1",
        "progress=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "train.parquet").is_file() and (tmp_path / "out" / "sft" / "train.jsonl").is_file()
    assert "# Data summary" in proc.stdout
    bad = subprocess.run(
        cmd + ["data.train.entries.0.count=-1"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert bad.returncode == 2
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert lines == ["error: train.entries[0]: count must be a non-negative integer, got -1"]
    # the default is the paper mixture, which needs the datasets' location
    paper = subprocess.run(
        [sys.executable, "-m", "recallm.cli.data", f"out_dir={tmp_path}/p"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert paper.returncode == 2
    assert paper.stderr.strip() == (
        "error: config value data.dataset_root is required: set it on the command line (data.dataset_root=...)"
    )


def test_stored_prompt_text(tmp_path, tiny_dir):
    run_schedule(
        schedule_from_config({**MIX, "val": {}, "sft": {}, "store_prompt_text": True}),
        tmp_path,
        tiny_dir,
        workers=1,
        progress=False,
    )
    rows = read_rows(tmp_path / "train.parquet")
    assert rows and all(r.prompt_text.endswith("<think>\n") for r in rows)


def test_val_params_point_validation_at_held_out_data():
    cfg = {
        "train": {
            "lengths": [400, 500],
            "entries": [
                {
                    "task": "kv_retrieval",
                    "count": 3,
                    "params": {"formats": ["csv"]},
                    "val_params": {"formats": ["json"]},
                }
            ],
        },
        "val": {"lengths": [512], "per_cell": 2},
    }
    schedule = schedule_from_config(cfg)
    train = [j for j in schedule.jobs if j.split == "train"]
    val = [j for j in schedule.jobs if j.split.startswith("val/")]
    assert dict(train[0].params)["formats"] == ("csv",)
    assert dict(val[0].params)["formats"] == ("json",)


@pytest.fixture(scope="module")
def dataset_root(tmp_path_factory):
    """Fixture copies of every public data set, laid out as the paper mixture expects."""
    from tests.data_fixtures import link_dataset_root, write_all

    base = tmp_path_factory.mktemp("datasets")
    return link_dataset_root(write_all(base / "fixtures"), base / "root")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, tiny_dir):
    """A tiny local encoder: the paper mixture draws dense negatives (data.dense_model)."""
    from recallm.tokens import load_tokenizer
    from tests.data_fixtures import save_tiny_encoder

    return save_tiny_encoder(tmp_path_factory.mktemp("encoder"), load_tokenizer(tiny_dir))


def _paper(dataset_root, dense_model=None, **changes):
    from omegaconf import OmegaConf

    from recallm.paths import config_dir

    cfg = OmegaConf.load(config_dir() / "data" / "paper.yaml")
    cfg.dataset_root = str(dataset_root)
    cfg.dense_model = dense_model
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_container(OmegaConf.create({"data": cfg}), resolve=True)["data"]


def test_paper_mixture_plan(dataset_root, encoder):
    schedule = schedule_from_config(_paper(dataset_root, encoder))
    train = [j for j in schedule.jobs if j.split == "train"]
    assert sum(j.count for j in train) == 20000
    per_category = {}
    for job in train:
        from data_gen.base import make_task

        category = make_task(job.task, **dict((k, v) for k, v in job.params)).category
        per_category[category] = per_category.get(category, 0) + job.count
    assert per_category == {
        "multi_hop_qa": 3000,
        "single_hop_qa": 2000,
        "retrieval": 2000,
        "reasoning_retrieval": 2000,
        "short_math": 1000,
        "icl": 3000,
        "long_doc_qa": 1000,
        "aggregation": 2000,
        "reranking": 2000,
        "entity_citation": 2000,
    }  # Table 1
    cells = {j.split for j in schedule.jobs if j.split.startswith("val/")}
    assert "val/multi_hop_qa_131072" in cells and "val/short_math" in cells and "val/long_doc_qa" in cells
    assert "val/entity_citation_98304" in cells  # the 96K cell


def test_paper_mixture_generates_every_task(tmp_path, dataset_root, tiny_dir, encoder):
    """One row of every paper task through the whole generator (short prompts: the fixtures are small;
    entity citation's 5-20 gold passages need about 4K tokens)."""
    cfg = _paper(dataset_root, encoder)
    for entry in cfg["train"]["entries"]:
        entry["count"] = 1
        if entry["task"] not in ("dapo_math", "mcqa_math", "quality"):
            entry["lengths"] = 4096 if entry["task"] == "qampari" else 1536
    cfg["val"]["per_cell"] = 0
    result = run_schedule(schedule_from_config(cfg), tmp_path, tiny_dir, workers=1, progress=False)
    records = read_records(result["files"]["train"])
    assert len(records) == 17 and len({r["ability"] for r in records}) == 10
    from rewards import check_rows

    assert check_rows(records) == 17
