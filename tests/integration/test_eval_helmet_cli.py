"""The paper's evaluation suite through recallm-eval's command line with a judge: HELMET's tasks
on tiny local copies, the evaluated model and the judge both behind the stub OpenAI server."""

from __future__ import annotations

import json
import re

import pytest

from tests.eval_fixtures import judge_reply, write_eval_data
from tests.integration.test_eval_run import fail_cli, run_cli
from tests.openai_stub import OpenAIStub


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_eval_data(tmp_path_factory.mktemp("helmet-data"))


def model_and_judge(path: str, body: dict) -> str:
    """The stub serves both: the evaluated model (right answers) and the judge (``judge_reply``)."""
    if body.get("model") == "judge-m":
        return judge_reply(path, body)
    prompt = body["messages"][-1]["content"]
    hero = re.search(r"who is the hero (\d+)\?", prompt)
    if hero:
        return f"Thinking.</think>\nAnswer: the hero{hero.group(1)}"
    asked = re.search(r"what is nq question (\d+)\?$", prompt)
    return f"</think>\nAnswer: nqanswer{asked.group(1) if asked else 'x'}"


def test_the_paper_suite_through_the_cli_with_a_judge(data, tiny_dir, tmp_path, capsys):
    stub = OpenAIStub(model_and_judge)
    try:
        common = (
            "eval=paper",
            "benchmarks=[helmet]",
            "eval.benchmarks.helmet.lengths=[2048]",
            "eval.benchmarks.helmet.per_cell=2",
            "eval.benchmarks.helmet.tasks=[nq,narrativeqa]",
            f"eval.benchmarks.helmet.helmet_dir={data['helmet_dir']}",
            f"eval.benchmarks.helmet.dataset_root={data['dataset_root']}",
            "+eval.benchmarks.helmet.task_params.narrativeqa.min_document_tokens=100",
            f"eval.judge.base_url={stub.url}",
            f"model_path={tiny_dir}",
            "backend.name=openai",
            f"backend.base_url={stub.url}",
            "backend.served_model=stub",
            "paper_model=RecaLLM-Qwen2.5-7B",
            f"out_dir={tmp_path / 'run'}",
        )
        summary = run_cli(*common, "eval.judge.model=judge-m")
        helmet = summary["benchmarks"]["helmet"]
        assert helmet["by_task"]["nq"]["score"] == 1.0 and helmet["by_task"]["narrativeqa"]["score"] == 1.0
        assert helmet["by_task"]["narrativeqa"]["judged"] == 1.0 and helmet["extra"]["judge"] == "judge-m"
        assert summary["run"]["judge"] == "judge-m" and summary["run"]["paper_model"] == "RecaLLM-Qwen2.5-7B"
        judged = [body for _, body in stub.requests if body["model"] == "judge-m"]
        assert len(judged) == 2 and all(b["temperature"] == 0.0 for b in judged)  # one LongQA verdict each
        evaluated = [body for _, body in stub.requests if body["model"] == "stub"]
        assert all(b["temperature"] == 0.6 and b["top_p"] == 0.95 for b in evaluated)  # the paper's decoding
        report = (tmp_path / "run" / "report.md").read_text()
        assert "LongQA and Summ judged by judge-m" in report
        fingerprint = json.loads((tmp_path / "run" / "run.json").read_text())["fingerprint"]
        assert fingerprint["benchmarks"]["helmet"]["settings"]["judge"]["model"] == "judge-m"
        err = fail_cli(capsys, *common, "eval.judge.model=other-judge")  # another judge: other scores
        assert "holds results of another configuration" in err and "judge" in err
    finally:
        stub.close()
