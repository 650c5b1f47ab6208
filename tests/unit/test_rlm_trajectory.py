"""RLM trajectories: the HTML page, the SFT data written from them (`recallm-rlm to-sft`, the paper's filtering)
and the `recallm-rlm` CLI."""

from __future__ import annotations

import json

import pytest

from recallm.errors import RecallmError
from recallm.rlm.models import ScriptedModel
from recallm.rlm.runner import RLM, RLMSettings
from recallm.rlm.sandbox import SandboxLimits
from recallm.rlm.sft_data import write_sft_data
from recallm.rlm.show import render_html, write_html
from recallm.rlm.subcalls import SubCallSettings
from recallm.rlm.trajectory import append_event, load_trajectory
from tests.rlm_helpers import isolation, isolation_override

# no cell here is meant to time out: a generous wall clock, so a loaded machine cannot cut one
LIMITS = SandboxLimits(cpu_s=5, wall_s=30, memory_mb=512)


def run(tmp_path, name, replies, *, sub=None, score=None, **settings):
    settings.setdefault("max_iterations", 4)
    settings.setdefault("isolation", isolation())
    rlm = RLM(
        ScriptedModel(replies),
        sub,
        settings=RLMSettings(**settings),
        subcalls=SubCallSettings(retries=0),
        sandbox=LIMITS,
    )
    path = tmp_path / f"{name}.jsonl"
    result = rlm.run("the context " * 20, "the question?", task_id=name, trajectory=path)
    if score is not None:
        append_event(path, {"event": "score", "rlm": "0", "task": "s_niah", "score": score, "correct": score == 1,
                            "metrics": {}, "reference": {"value": "42"}})  # fmt: skip
    return path, result


def test_the_page_shows_turns_cells_subcalls_and_children_escaped(tmp_path):
    def sub(messages):
        if messages[0]["role"] == "system":
            return "```repl\nleaf = llm_query('inner <b>question</b>')\n```\nFINAL_VAR(leaf)"
        return "leaf answer"

    replies = [
        "<think>plan it</think>Exploring.\n```repl\nprint('<script>alert(1)</script>')\n1/0\n```",
        "```repl\nr = rlm_query(context[:50], 'what is inside?')\n```\nFINAL_VAR(r)",
    ]
    path, result = run(tmp_path, "page", replies, sub=ScriptedModel(sub), score=1.0, max_depth=2)
    assert result.answer == "leaf answer"
    page = render_html(load_trajectory(path))
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "ZeroDivisionError" in page and "<summary>reasoning</summary>" in page and "plan it" in page
    assert "RLM 0.1 (depth 1)" in page and "rlm_query" in page and "inner &lt;b&gt;question&lt;/b&gt;" in page
    assert "ended by FINAL_VAR(r)" in page and "<th>score</th><td>1.0 (correct: True)" in page
    assert ("no network" in page) or ("NONE (" in page)  # the isolation, whichever it was
    out = write_html(path)
    assert out == path.with_suffix(".html") and out.read_text() == render_html(
        load_trajectory(path), title=f"RLM trajectory: {path.name}"
    )
    with pytest.raises(RecallmError, match="does not exist"):
        write_html(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"event": "turn"}\n')
    with pytest.raises(RecallmError, match="not an RLM trajectory"):
        load_trajectory(tmp_path / "bad.jsonl")


def test_export_keeps_correct_multi_turn_runs_and_drops_the_rest(tmp_path, tiny_dir):
    from recallm.sft.data import load_sft_file
    from recallm.tokens import THINK_END, load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    two_turns = ["```repl\nx = 42\n```", "<think>\ndone</think>FINAL_VAR(x)"]
    run(tmp_path, "good", two_turns, score=1.0)
    run(tmp_path, "partial", two_turns, score=0.25)
    run(tmp_path, "zero", two_turns, score=0.0)
    run(tmp_path, "single", ["FINAL(42)"], score=1.0)
    run(tmp_path, "unscored", two_turns)
    long_turn = ["```repl\nprint('y' * 3000)\n```", "FINAL(42)"]
    run(tmp_path, "long", long_turn, score=1.0, max_observation_chars=5000)
    out = tmp_path / "sft" / "train.jsonl"
    counts = write_sft_data([tmp_path], tokenizer, out, min_turns=2, max_turn_chars=5000)
    assert counts == {
        "trajectories": 6,
        "kept": 2,
        "records": 3,  # good: 2, long: 1 (its second turn read 3000+ characters more)
        "turns_too_long": 1,
        "dropped_not_correct": 2,  # partial credit is not correct, and score 0 neither
        "dropped_too_few_turns": 1,
        "dropped_unscored": 1,
    }
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["trajectory"].rsplit("/", 1)[1], r["turn"]) for r in rows] == [
        ("good.jsonl", 1),
        ("good.jsonl", 2),
        ("long.jsonl", 1),
    ]
    first, second = rows[0], rows[1]
    assert first["messages"][0]["role"] == "system" and len(first["messages"]) == 2
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][2]["content"] == "```repl\nx = 42\n```"  # history holds the visible reply
    assert first["prompt_text"].endswith("<think>\n")  # the tiny template opens the think block, so:
    assert second["completion"] == "done</think>FINAL_VAR(x)" + tokenizer.eos_token  # the reply continues it
    assert first["completion"].startswith(THINK_END + "\n```repl")  # no reasoning: the block is closed first
    assert first["completion_ids"][-1] == tokenizer.eos_token_id
    assert first["data_source"] == "rlm/s_niah" and json.loads(first["ground_truth"]) == {"value": "42"}
    from transformers import AutoConfig

    dataset, stats = load_sft_file(
        out, tokenizer, max_length=100_000, vocab_size=AutoConfig.from_pretrained(tiny_dir).vocab_size
    )
    assert stats["examples"] == 3 and len(dataset) == 3
    with pytest.raises(RecallmError, match="train.jsonl:1: not a trajectory event"):
        write_sft_data([tmp_path / "sft"], tokenizer, tmp_path / "x.jsonl")  # SFT rows are no trajectory
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecallmError, match="no trajectory files"):
        write_sft_data([tmp_path / "empty"], tokenizer, tmp_path / "x.jsonl")


# --- the CLI -----------------------------------------------------------------------------------


def compose(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from recallm.paths import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return hydra_compose(config_name="rlm", overrides=list(overrides))


def cli(*args, replies=None):
    """The CLI on ``args``; ``replies`` (code with newlines, awkward on a command line) are set on
    the composed config as a scripted root's."""
    from omegaconf import OmegaConf

    from recallm.cli.rlm import rewrite_argv, run

    cfg = compose("progress=false", *rewrite_argv(list(args)), isolation_override())
    if replies is not None:
        OmegaConf.update(cfg, "root.name", "scripted")
        OmegaConf.update(cfg, "root.replies", replies, force_add=True)
    return run(cfg)


def fail(capsys, *args) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli(*args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


SOLVE = (
    "```repl\nimport re\nkey = re.search(r'number for (\\S+) mentioned', query).group(1)\n"
    "answer = re.search(re.escape(key) + r' is (\\d+)', context).group(1)\n```"
)


def test_cli_runs_resumes_shows_and_exports(tmp_path, tiny_dir, capsys):
    out = tmp_path / "run"
    common = (f"out_dir={out}", "tasks.names=[s_niah]", "tasks.lengths=[1K,2K]", "sandbox.wall_s=5")
    replies = [SOLVE, "FINAL_VAR(answer)"]
    summary = cli(*common, replies=replies)
    assert summary["complete"] and summary["tasks"]["s_niah"]["overall"]["score"] == 1.0
    assert summary["tasks"]["s_niah"]["overall"]["outcomes"] == {"final": 2}
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in results] == ["s_niah/1024/0", "s_niah/2048/0"]
    assert all((out / r["trajectory"]).is_file() for r in results)
    assert cli(*common, replies=replies)["complete"]  # a rerun does nothing new
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    other = fail(capsys, *common, "root.name=scripted", "+root.replies=['FINAL(x)']")
    assert "holds results of another configuration (differs in root.replies)" in other

    page = cli("show", str(out / "trajectories" / "s_niah-1024-0.jsonl"))
    assert page.suffix == ".html" and "FINAL_VAR(answer)" in page.read_text()
    counts = cli("to-sft", f"out_dir={out}", f"sft_data.tokenizer_path={tiny_dir}")
    assert counts["records"] == 4 and (out / "sft.jsonl").is_file()

    tasks = cli("generate", f"out_dir={tmp_path / 'gen'}", "tasks.lengths=[1K]")
    rows = [json.loads(line) for line in tasks.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["s_niah/1024/0", "oolong/1024/0", "oolong_pairs/1024/0"]


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert "mode must be one of run, generate, show, to-sft" in fail(capsys, "mode=train")
    assert "show needs a trajectory" in fail(capsys, "show")
    assert "unknown RLM task 'needle'" in fail(capsys, f"out_dir={tmp_path}", "tasks.names=[needle]")
    assert "rlm.max_depth must be in [0, 3], got 5" in fail(capsys, f"out_dir={tmp_path}", "rlm.max_depth=5")
    assert "root.replies must be a non-empty list" in fail(capsys, f"out_dir={tmp_path}", "root.name=scripted")
    assert "trajectory file" in fail(capsys, "show", str(tmp_path / "nope.jsonl"))


def test_rewrite_argv():
    from recallm.cli.rlm import rewrite_argv

    assert rewrite_argv(["show", "a/b.jsonl", "html=x.html"]) == ["mode=show", "trajectory=a/b.jsonl", "html=x.html"]
    assert rewrite_argv(["show", "my run/a b.jsonl"]) == ["mode=show", "trajectory='my run/a b.jsonl'"]
    assert rewrite_argv(["to-sft", "out_dir=o"]) == ["mode=to-sft", "out_dir=o"]
    assert rewrite_argv(["tasks.per_cell=2"]) == ["tasks.per_cell=2"]


def test_the_old_export_names_still_write_sft_data(tmp_path, tiny_dir, capsys, monkeypatch):
    """Before 0.2.0 `to-sft` was `recallm-rlm export export.<key>=...`: the old line still writes the same
    SFT data, after one notice line on stderr (MIGRATION.md)."""
    from recallm.cli.rlm import main, old_names

    assert old_names(["export", "export.tokenizer_path=t", "+export.min_turns=3", "out_dir=o"]) == [
        "to-sft", "sft_data.tokenizer_path=t", "+sft_data.min_turns=3", "out_dir=o"]  # fmt: skip
    assert old_names(["mode=export", "export={out_file: x}"]) == ["mode=to-sft", "sft_data={out_file: x}"]
    unchanged = [["train", "export.x=1"], ["to-sft", "tasks.exported=1", "exports.x=1"], ["run"]]
    capsys.readouterr()
    assert [old_names(line) for line in unchanged] == unchanged and capsys.readouterr().err == ""
    runs = tmp_path / "runs"
    run(runs / "trajectories", "right", ["```repl\nx = 42\n```", "FINAL_VAR(x)"], score=1.0)
    monkeypatch.chdir(tmp_path)  # (Hydra's run directory: outputs/rlm/hydra/...)
    new = cli("to-sft", f"out_dir={runs}", f"sft_data.tokenizer_path={tiny_dir}", f"sft_data.out_file={tmp_path}/new.jsonl")
    capsys.readouterr()
    main(["export", f"out_dir={runs}", f"export.tokenizer_path={tiny_dir}", f"export.out_file={tmp_path}/old.jsonl",
          "progress=false", isolation_override()])  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["warning: recallm-rlm export is deprecated: use recallm-rlm to-sft, and sft_data.<key> for "
                   "export.<key> (renamed in 0.2.0; the old name works until 0.3.0, see MIGRATION.md)"], err  # fmt: skip
    assert new["records"] == 2 and (tmp_path / "old.jsonl").read_text() == (tmp_path / "new.jsonl").read_text()


# --- issue 17, item 8: the paper's filters -----------------------------------------------------------


def test_export_keeps_only_correct_multi_turn_runs_and_fixes_final_templates(tmp_path, tiny_dir):
    """Before: any run with score > 0 was kept (a wrong OOLONG count scores 0.75 ** error), and a
    FINAL called inside code was exported as written."""
    from recallm.tokens import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    run(tmp_path, "right", ["```repl\nx = 42\n```", "FINAL_VAR(x)"], score=1.0)
    run(tmp_path, "close", ["```repl\nx = 41\n```", "FINAL_VAR(x)"], score=0.75)
    run(tmp_path, "in_code", ["```repl\nx = 42\n```", "Done.\n```repl\ny = x\nFINAL_VAR('y')\n```"], score=1.0)
    out = tmp_path / "sft.jsonl"
    counts = write_sft_data([tmp_path], tokenizer, out)
    assert counts["kept"] == 2 and counts["dropped_not_correct"] == 1 and counts["final_fixed"] == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    fixed = [r for r in rows if r["trajectory"].endswith("in_code.jsonl") and r["turn"] == 2][0]
    assert "FINAL_VAR" not in fixed["completion"].split("```repl")[1].split("```")[0]  # out of the code block ...
    assert fixed["completion"].removesuffix(tokenizer.eos_token).rstrip().endswith("FINAL_VAR(y)")  # ... written after
    refused = ["```repl\nx = 42\n```", "```repl\n1 / 0\n```\nFINAL(41)", "FINAL_VAR(x)"]
    run(tmp_path / "more", "refused", refused, score=1.0)
    counts = write_sft_data([tmp_path / "more"], tokenizer, tmp_path / "more.jsonl")
    assert counts["turns_final_refused"] == 1 and counts["records"] == 2  # the refused FINAL is not a target
