"""`recallm-eval backend.name=rlm`: an RLM on the lost-in-thought and RULER benchmarks through the
evaluation runner, next to a RecaLLM model in one report."""

from __future__ import annotations

import json

import pytest

from recallm.errors import RecallmError
from recallm.eval.types import GenerationSettings, TextRequest
from tests.rlm_helpers import isolation

# the scripted root: code that finds a dictionary key's value, or a RULER needle's number
SOLVER = """```repl
import re
answer = 'unknown'
key = re.search(r"Your key: (-?\\d+)", context)
if key:
    found = re.search(r"(?m)^\\W*(?:Key )?" + re.escape(key.group(1)) + r"\\W+(\\w+)", context)
    answer = found.group(1) if found else 'unknown'
else:
    asked = re.search(r"magic numbers? for ([\\w-]+) mentioned", context)
    if asked:
        name = re.escape(asked.group(1))
        answer = ', '.join(re.findall(r"magic numbers for " + name + r" is: (\\d+)", context))
print(answer)
```
FINAL_VAR(answer)"""

SUITE = {
    "name": "rlm-test",
    "seed": 0,
    "tolerance": 0.05,
    "generation": {"max_new_tokens": 8},
    "benchmarks": {
        "lost_in_thought": {
            "lengths": [512],
            "per_cell": 1,
            "key_type": "toy",
            "value_type": "toy",
            "injection_max_new_tokens": 4,
        },  # fmt: skip
        "ruler": {"lengths": [512], "per_cell": 1, "tasks": ["niah_single_1", "niah_multikey_1"]},
    },
}


def _run(backend, tokenizer, out_dir, name):
    from data_gen.fit import PromptRenderer
    from recallm.eval.benchmarks import make_benchmarks
    from recallm.eval.runner import run_eval

    benchmarks = make_benchmarks(SUITE)
    try:
        return run_eval(
            benchmarks,
            backend,
            PromptRenderer(tokenizer),
            out_dir,
            batch_size=2,
            progress=False,
            run_info={"name": name, "backend": backend.name},
        )
    finally:
        backend.close()


def test_rlm_and_a_recallm_model_side_by_side(tiny_dir, tmp_path):
    from recallm.eval.backends import BACKENDS, make_backend
    from recallm.eval.report import build_report
    from recallm.tokens import load_tokenizer

    assert "rlm" in BACKENDS
    tokenizer = load_tokenizer(tiny_dir)
    rlm_cfg = {
        "name": "rlm",
        "rlm": {
            "root": {"name": "scripted", "replies": [SOLVER]},
            "sandbox": {"wall_s": 5, "memory_mb": 512},
            "rlm": {"isolation": isolation()},
            "trajectory_dir": str(tmp_path / "trajectories"),
        },
    }
    backend = make_backend(rlm_cfg, tiny_dir, tokenizer)
    assert backend.describe()["rlm"]["max_depth"] == 1
    summary = _run(backend, tokenizer, tmp_path / "rlm", "rlm")
    records = {
        r["example_id"]: r for r in map(json.loads, (tmp_path / "rlm" / "results.jsonl").read_text().splitlines())
    }
    assert summary["complete"] and len(records) == 4
    assert records["ruler/niah_single_1/512/0"]["score"] == 1.0
    assert records["lost_in_thought/retrieval/512/0"]["correct"]
    reasoning = records["lost_in_thought/reasoning_retrieval/512/0"]
    assert reasoning["answer"] == "unknown" and not reasoning["correct"]  # the script does no math
    for r in records.values():
        assert "</think>" in r["output"] and r["finish_reason"] == "stop" and r["output_tokens"] > 0
    assert len(list((tmp_path / "trajectories").glob("*.jsonl"))) == 4

    hf = make_backend({"name": "hf", "recall_constrained": True, "batch_size": 2, "device": "cpu"}, tiny_dir, tokenizer)
    _run(hf, tokenizer, tmp_path / "hf", "recallm-tiny")
    report = build_report({"recallm-tiny": tmp_path / "hf", "rlm": tmp_path / "rlm"}, tmp_path / "report").read_text()
    assert "| rlm |" in report and "| recallm-tiny |" in report and "## ruler" in report


def test_prefixed_requests_continue_with_the_root_model(tiny_dir):
    from recallm.eval.backends import make_backend
    from recallm.tokens import load_tokenizer

    root = {"name": "scripted", "replies": ["FINAL(x)"], "continuation": "kusose"}
    cfg = {"name": "rlm", "rlm": {"root": root, "rlm": {"isolation": isolation()}}}
    backend = make_backend(cfg, tiny_dir, load_tokenizer(tiny_dir))
    request = TextRequest("rendered prompt", None, 4, prefix="Looking up key 534: ")
    [generation] = backend.generate([request], GenerationSettings(max_new_tokens=4))
    assert generation.text == "kusose" and generation.n_tokens == 2  # the root model continued the prefix
    with pytest.raises(RecallmError, match="backend.rlm has unknown keys \\['depth'\\]"):
        make_backend({"name": "rlm", "rlm": {"depth": 2}}, tiny_dir, None)
    with pytest.raises(RecallmError, match="backend.rlm.rlm.max_depth must be in"):
        make_backend({"name": "rlm", "rlm": {"rlm": {"max_depth": 9}}}, tiny_dir, None)


def test_the_eval_cli_runs_an_rlm(tiny_dir, tmp_path):
    from hydra import compose, initialize_config_dir

    from recallm.cli.eval import run
    from recallm.paths import config_dir

    overrides = [
        f"model_path={tiny_dir}",
        f"out_dir={tmp_path / 'out'}",
        "progress=false",
        "report=false",
        "benchmarks=[ruler]",
        "eval.benchmarks.ruler.lengths=[512]",
        "eval.benchmarks.ruler.tasks=[niah_single_1]",
        "backend.name=rlm",
        "+backend.rlm.root.name=scripted",
        "+backend.rlm.root.replies=['FINAL(1234)']",
        f"+backend.rlm.trajectory_dir={tmp_path / 'traj'}",
        f"+backend.rlm.rlm.isolation={isolation()}",
    ]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="eval", overrides=overrides)
    summary = run(cfg)
    assert summary["run"]["backend"] == "rlm" and summary["n_examples"] == 1
    [record] = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert record["output"].endswith("</think>\n\nAnswer: 1234") and record["answer"].endswith("1234")
    assert len(list((tmp_path / "traj").glob("*.jsonl"))) == 1


def test_a_recallm_model_answers_sub_calls_with_constrained_recall(tiny_dir):
    from recallm.rlm.models import ScriptedModel, make_model
    from recallm.rlm.runner import RLM, RLMSettings
    from recallm.rlm.sandbox import SandboxLimits

    sub = make_model(
        {"name": "hf", "model_path": str(tiny_dir), "recall_constrained": True, "device": "cpu", "max_new_tokens": 6},
        "sub",
    )
    assert sub.backend.recall_constrained and sub.backend.recall is not None
    root = ScriptedModel(["```repl\nr = llm_query_batched(['Key: 5. Value?', 'Key: 7. Value?'], max_tokens=6)\n```\n"
                          "FINAL_VAR(r)"])  # fmt: skip
    result = RLM(
        root, sub, settings=RLMSettings(max_iterations=2, isolation=isolation()), sandbox=SandboxLimits(wall_s=60)
    ).run("ctx")
    assert result.outcome == "final" and result.answer.startswith("[")
    calls = [e for e in result.events if e["event"] == "subcall"]
    assert len(calls) == 2 and all(1 <= e["completion_tokens"] <= 6 and e["prompt_tokens"] > 5 for e in calls)
    assert all(e["error"] is None for e in calls)
    sub.close()
