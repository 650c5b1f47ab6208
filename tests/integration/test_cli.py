"""Command lines as a user runs them: success paths, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.assets import save_base


def _run(*args, cwd=None, timeout=300):
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )


def _create(*args):
    return _run("-m", "recallm.cli.create_model", *args)


def _assert_one_line_error(proc, pattern):
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert __import__("re").search(pattern, lines[0]), lines[0]


def test_create_tiny_then_check(tmp_path):
    proc = _create("--tiny", "--out", str(tmp_path / "tiny"), "--untied", "--max-recall-tokens", "64")
    assert proc.returncode == 0, proc.stderr
    assert "recall_start_token_id" in proc.stdout
    proc = _create("--check", str(tmp_path / "tiny"))
    assert proc.returncode == 0 and "max_recall_tokens: 64" in proc.stdout


def test_convert_llama_base(tmp_path):
    base = save_base(tmp_path / "llama", "llama", tied=False)
    proc = _create("--base", str(base), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "model_type: recallm_llama" in proc.stdout


@pytest.fixture
def broken_dirs(tmp_path, tiny_dir):
    import shutil

    from transformers import GPT2Config, GPT2LMHeadModel

    from recallm.tiny import build_tiny_tokenizer

    dirs = {"missing": tmp_path / "nope"}
    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=32, n_head=1, vocab_size=64, bos_token_id=0, eos_token_id=0)
    ).save_pretrained(gpt2)
    build_tiny_tokenizer().save_pretrained(gpt2)
    dirs["gpt2"] = gpt2
    out_of_range = shutil.copytree(tiny_dir, tmp_path / "range")
    cfg = json.loads((out_of_range / "config.json").read_text())
    cfg["recall_end_token_id"] = cfg["vocab_size"] + 7
    (out_of_range / "config.json").write_text(json.dumps(cfg))
    dirs["range"] = out_of_range
    no_tokens = shutil.copytree(tiny_dir, tmp_path / "notok")
    build_tiny_tokenizer().save_pretrained(no_tokens)  # a tokenizer without the recall tokens
    dirs["notok"] = no_tokens
    dirs["plain"] = save_base(tmp_path / "plain", "qwen2")
    return dirs


@pytest.mark.parametrize(
    "case, args, pattern",
    [
        ("missing", ["--base", "{missing}", "--out", "{tmp}/o"], r"--base \S*nope does not exist"),
        ("gpt2", ["--base", "{gpt2}", "--out", "{tmp}/o"], r"unsupported architecture model_type='gpt2'"),
        ("range", ["--check", "{range}"], r"recall_end_token_id=\d+ is out of range for a vocabulary of \d+ rows"),
        ("notok", ["--check", "{notok}"], r"tokenizer has no <\|start_recall\|>, <\|end_recall\|>"),
        ("plain", ["--check", "{plain}"], r"plain qwen2 model without recall tokens"),
        ("noout", ["--tiny"], r"--out is required"),
    ],
)
def test_errors_are_one_line(broken_dirs, tmp_path, case, args, pattern):
    args = [a.format(tmp=tmp_path, **broken_dirs) for a in args]
    _assert_one_line_error(_create(*args), pattern)


@pytest.mark.slow
def test_demo_runs(tmp_path):
    proc = _run("-m", "recallm.cli.decoding_demo", f"out_dir={tmp_path}/demo", "prompt.n_pairs=12", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "UNTRAINED" in proc.stdout
    line = next(line for line in proc.stdout.splitlines() if line.startswith("constrained spans verbatim:"))
    ok, total = line.split(":")[1].split(";")[0].strip().split("/")
    assert ok == total and int(total) >= 2
    assert (tmp_path / "demo" / "tiny-recallm" / "config.json").is_file()


def test_demo_bad_override_is_one_line(tmp_path):
    proc = _run("-m", "recallm.cli.decoding_demo", f"out_dir={tmp_path}/demo", "prompt.n_pairs=5000", cwd=tmp_path)
    _assert_one_line_error(proc, r"n_pairs must be in \[1, 600\], got 5000")


def test_the_old_demo_command_prints_one_notice_then_runs_the_decoding_demo(tmp_path):
    """``recallm-demo`` (renamed ``recallm-decoding-demo`` in 0.2.0, MIGRATION.md) still works for one release."""
    from pathlib import Path

    script = Path(sys.executable).parent / "recallm-demo"
    if not script.is_file():
        pytest.skip("recallm-demo is not installed in this environment (pip install -e . installs it)")
    done = subprocess.run([str(script), "prompt.n_pairs=5000"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 2, done.stderr
    assert lines[0].startswith("warning: recallm-demo is deprecated: use recallm-decoding-demo")
    assert lines[1] == "error: n_pairs must be in [1, 600], got 5000"  # the decoding demo's own check
    assert not any(tmp_path.iterdir())


def test_score_cli(tmp_path):
    rows = [
        {"response": "</think>\nAnswer: 12", "ground_truth": {"category": "short_math", "answers": ["12"]}},
        {
            "response": "<|start_recall|>18: kuri<|end_recall|></think>\nAnswer: kuri",
            "prompt_text": "18: kuri\n",
            "ground_truth": {
                "category": "retrieval",
                "answers": ["kuri"],
                "gold": [{"text": "18: kuri", "start": 0, "end": 8}],
            },
        },
        {"response": "</think>\nAnswer: 13", "ground_truth": {"category": "short_math", "answers": ["12"]}},
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    proc = _run("-m", "recallm.cli.score", f"input={src}", "reward.overlong.enable=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in (tmp_path / "in.scored.jsonl").read_text().splitlines()]
    assert [round(o["score"], 6) for o in out] == [1.0, 1.0, round(0.2 + 0.2 + 0.4 * (1.01 * 0.01) ** 0.5 - 0.004, 6)]
    assert "short_math" in proc.stdout and "retrieval" in proc.stdout
    # a bad line: one-line error naming it, and the earlier output is kept
    src.write_text(src.read_text() + '{"response": "x", "ground_truth": {"category": "poetry"}}\n')
    proc = _run("-m", "recallm.cli.score", f"input={src}", cwd=tmp_path)
    _assert_one_line_error(proc, r"in\.jsonl:4: unknown reward category 'poetry'")
    assert len((tmp_path / "in.scored.jsonl").read_text().splitlines()) == 3
    assert not list(tmp_path.glob("*.tmp"))
    _assert_one_line_error(_run("-m", "recallm.cli.score", cwd=tmp_path), r"input=<file.jsonl> is required")
