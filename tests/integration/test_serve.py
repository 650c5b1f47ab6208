"""recallm-serve's command and checks (the server itself runs in the vLLM tier:
tests/vllm_tier/test_serve.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from recallm.errors import RecallmError
from recallm.serve import PROCESSOR, ServeSettings, serve_command


def _option(command, name):
    i = command.index(name)
    return command[i + 1]


def test_command_serves_the_base_architecture_with_the_processor(tiny_dir):
    command = serve_command(ServeSettings(tiny_dir, port=8123), ["--max-model-len", "1024", "--dtype=float32"])
    assert command[:5] == [sys.executable, "-m", "recallm.serve", "serve", str(tiny_dir)]
    assert _option(command, "--port") == "8123" and _option(command, "--host") == "127.0.0.1"
    assert _option(command, "--served-model-name") == tiny_dir.name
    assert json.loads(_option(command, "--hf-overrides")) == {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
    }
    assert _option(command, "--logits-processors") == PROCESSOR
    assert command[-3:] == ["--max-model-len", "1024", "--dtype=float32"]  # vLLM's own options pass through


def test_user_overrides_and_processors_are_merged(tiny_dir):
    command = serve_command(
        ServeSettings(tiny_dir, served_model_name="recallm-tiny"),
        ["--hf-overrides", '{"max_position_embeddings": 4096}', "--logits-processors", "my.mod:Other", "--seed", "3"],
    )
    assert json.loads(_option(command, "--hf-overrides")) == {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "max_position_embeddings": 4096,
    }
    i = command.index("--logits-processors")
    assert command[i + 1 : i + 3] == ["my.mod:Other", PROCESSOR]
    assert command.count("--hf-overrides") == 1 and command[-2:] == ["--seed", "3"]
    assert _option(command, "--served-model-name") == "recallm-tiny"
    plain = serve_command(ServeSettings(tiny_dir, recall_constrained=False))
    assert "--logits-processors" not in plain and "--hf-overrides" in plain  # vLLM still needs the base architecture


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--hf-overrides", '{"model_type": "llama"}'], "--hf-overrides sets model_type='llama'"),
        (["--hf-overrides={oops"], "--hf-overrides is not valid JSON"),
        (["--hf-overrides", "[1]"], "--hf-overrides must be a mapping"),
        (["--port", "9"], "--port is an option of recallm-serve itself"),
    ],
)
def test_bad_arguments(tiny_dir, extra, message):
    with pytest.raises(RecallmError, match=message):
        serve_command(ServeSettings(tiny_dir), extra)


def test_cli_errors_are_one_line(tiny_base_dir, tiny_dir, tmp_path, capsys, monkeypatch):
    from recallm.cli.serve import main

    for argv, message in [
        ([str(tiny_base_dir)], "without recall tokens"),
        ([str(tmp_path / "nope")], "is not a Hugging Face model directory"),
        ([str(tiny_dir), "--port", "70000"], "--port must be in 1..65535"),
    ]:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and message in err[0], err
    assert main([str(tiny_dir), "--print-command", "--max-model-len", "512"]) == 0
    out = capsys.readouterr().out
    assert "-m recallm.serve serve" in out and out.strip().endswith("--max-model-len 512")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(SystemExit):
        main([str(tiny_dir)])
    assert "recallm-serve needs vLLM" in capsys.readouterr().err


def test_cli_refuses_an_untested_vllm_in_one_line(tiny_dir, capsys, monkeypatch):
    """recallm-serve checks the installed vLLM before it starts it (``recallm.engines``); the override lets it by."""
    import importlib.util

    import recallm.engines as engines
    from recallm.cli.serve import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setattr(engines, "installed_versions", lambda: ("0.9.1", "0.34.0"))
    monkeypatch.delenv(engines.OVERRIDE_ENV, raising=False)
    with pytest.raises(SystemExit) as exc:
        main([str(tiny_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("error: vLLM 0.34.0 is not a tested engine pair for vLLM serving (tested: 0.24.0, 0.32.0;")
    executed = []
    monkeypatch.setattr("os.execv", lambda exe, argv: executed.append(argv))
    monkeypatch.setenv(engines.OVERRIDE_ENV, "1")
    assert main([str(tiny_dir)]) == 0 and executed and executed[0][2:4] == ["recallm.serve", "serve"]


def _values(command: list[str], flag: str) -> list[str]:
    """The values of ``flag`` in a command line: what follows it up to the next flag (``--middleware`` follows)."""
    i = command.index(flag)
    end = next((k for k in range(i + 1, len(command)) if command[k].startswith("--")), len(command))
    return command[i + 1 : end]


def test_user_names_of_the_processor_are_not_doubled(tiny_dir):
    from recallm.serve import RECALL_PROCESSORS

    for name in RECALL_PROCESSORS:
        command = serve_command(ServeSettings(tiny_dir), ["--logits-processors", name])
        assert _values(command, "--logits-processors") == [name] and command.count(name) == 1, command
        plain = serve_command(ServeSettings(tiny_dir, recall_constrained=False), ["--logits-processors", name, "x:Y"])
        assert _values(plain, "--logits-processors") == ["x:Y"] and name not in plain, plain


def test_the_served_process_knows_the_recallm_configs_before_vllm_reads_them(tmp_path, tiny_dir):
    """The command runs vLLM's CLI in a process where ``AutoConfig`` knows ``recallm_<base>``: a
    stand-in ``vllm`` package records what its CLI's ``main`` sees (vLLM reads the checkpoint's
    config with AutoConfig before ``--hf-overrides`` apply; a plain ``vllm serve`` refused it)."""
    cli = tmp_path / "fake" / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for d in (cli, cli.parent, cli.parent.parent):
        (d / "__init__.py").write_text("")
    (cli / "main.py").write_text(
        "import sys\n"
        "from transformers import AutoConfig\n"
        "def main():\n"
        "    config = AutoConfig.from_pretrained(sys.argv[2])\n"
        "    print('MODEL_TYPE', config.model_type, sys.argv[1])\n"
        "    return 0\n"
    )
    command = serve_command(ServeSettings(tiny_dir, port=8123))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MODEL_TYPE recallm_qwen2 serve" in done.stdout


def _asgi(guard, body: bytes, path: str = "/v1/chat/completions", chunks: int = 1):
    """One POST through ``guard`` (an ASGI middleware) to an app that echoes the body it received; returns
    (status, response body, whether the app was reached)."""
    import asyncio

    reached = {}

    async def app(scope, receive, send):
        got, more = b"", True
        while more:
            message = await receive()
            got += message.get("body", b"")
            more = message.get("more_body", False)
        reached["body"] = got
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": got})

    step = max(1, -(-len(body) // chunks))
    parts = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(guard(app)(scope={"type": "http", "method": "POST", "path": path}, receive=receive, send=send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"), "body" in reached


def test_the_request_guard_answers_bodies_vllm_fails_on_with_a_400(monkeypatch):
    """recallm-serve puts RequestGuard in front of vLLM's routes (--middleware): a JSON array or string body (vLLM's
    server answered a 500), a body that is not JSON, n or best_of above --max-n (n=10000 queued ten thousand
    generations) get a 400 in OpenAI's error format; a good request reaches vLLM whole, in one piece or several."""
    import functools

    from recallm.serve import MAX_N_ENV, RequestGuard

    guard = functools.partial(RequestGuard, max_n=16)
    good = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}).encode()
    assert _asgi(guard, good) == (200, good, True)
    assert _asgi(guard, good, chunks=5) == (200, good, True)
    for body, said in [
        (b"[1, 2]", "must be a JSON object of the OpenAI API, got a JSON list"),
        (b'"text"', "got a JSON str"),
        (b"{not json", "the request body is not JSON"),
        (json.dumps({"n": 10000}).encode(), "n=10000: this server answers 1 to 16 completions per request"),
        (json.dumps({"best_of": 0}).encode(), "best_of=0: this server answers 1 to 16"),
        (json.dumps({"n": "many"}).encode(), "n='many'"),
    ]:
        status, answer, reached = _asgi(guard, body)
        error = json.loads(answer)["error"]
        assert (status, reached, error["code"], error["type"]) == (400, False, 400, "BadRequestError")
        assert said in error["message"], error
    assert _asgi(guard, b"[1]", path="/v1/models")[0] == 200  # other routes pass untouched
    monkeypatch.setenv(MAX_N_ENV, "4")  # how recallm-serve hands --max-n to the guard in vLLM's process
    assert _asgi(RequestGuard, json.dumps({"n": 5}).encode())[0] == 400
    assert _asgi(RequestGuard, json.dumps({"n": 4}).encode())[0] == 200


def test_serve_puts_the_guard_in_front_and_hands_it_max_n(tiny_dir, capsys):
    from recallm.cli.serve import main
    from recallm.serve import GUARD, MAX_N_ENV, ServeSettings, serve_command, serve_env

    command = serve_command(ServeSettings(tiny_dir, max_n=4))
    assert command[command.index("--middleware") + 1] == GUARD == "recallm.serve.RequestGuard"
    assert serve_env(ServeSettings(tiny_dir, max_n=4)) == {MAX_N_ENV: "4"}
    assert main([str(tiny_dir), "--print-command", "--max-n", "4"]) == 0
    assert capsys.readouterr().out.startswith(f"{MAX_N_ENV}=4 ")
