"""vLLM tier: ``recallm-serve`` starts vLLM's OpenAI-compatible server with the recall processor; a
chat request whose spans come back verbatim, through the client ``recallm-eval backend.name=openai``
and the RLM use (``recallm.clients.ChatClient``).

Run with ``scripts/test_vllm.sh`` (skipped where vLLM is not importable).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("vllm")

from tests.reference import contains, reference_spans  # noqa: E402

pytestmark = pytest.mark.slow
MAX_RECALL = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(path, name: str, log, *extra: str):
    """``recallm-serve path`` (a model or a LoRA adapter directory) on a free port, as ``name``; yields its
    ``/v1`` address once ``/models`` answers, and stops its process group at the end."""
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "recallm.cli.serve", str(path), "--port", str(port), "--served-model-name", name]
    cmd += ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "4", *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=os.environ)
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"recallm-serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base}/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not come up in 600 s:\n{log.read_text()[-4000:]}")
            time.sleep(2)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):  # (a server that exited has no group left to stop)
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from recallm.tiny import create_tiny

    path = create_tiny(tmp_path_factory.mktemp("tiny-serve"), seed=0, max_recall_tokens=MAX_RECALL)
    with serving(path, "recallm-tiny", tmp_path_factory.mktemp("serve-log") / "server.log") as base:
        yield base, path


def test_chat_spans_are_verbatim(server):
    import httpx

    from recallm.tiny import TOY_KEYS, TOY_VALUES
    from recallm.tokens import RecallTokenIds, load_tokenizer

    base, path = server
    tokenizer = load_tokenizer(path)
    from transformers import AutoConfig

    import recallm.modeling  # noqa: F401

    ids = RecallTokenIds.from_pretrained(AutoConfig.from_pretrained(path), tokenizer)
    models = httpx.get(f"{base}/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["recallm-tiny"]
    content = "\n".join(f"{k}: {v}" for k, v in zip(TOY_KEYS[:40], TOY_VALUES[:40], strict=True))
    messages = [{"role": "user", "content": content + "\nWhat is the value of 17?"}]
    prompt_ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if hasattr(prompt_ids, "keys"):  # transformers 5 returns a BatchEncoding (a mapping, no dict)
        prompt_ids = prompt_ids["input_ids"]
    n_spans = 0
    for seed in range(6):
        resp = httpx.post(
            f"{base}/chat/completions",
            json={
                "model": "recallm-tiny",
                "messages": messages,
                "max_tokens": 64,
                "temperature": 1.0,
                "seed": seed,
                "logit_bias": {str(ids.start): 6.0, str(ids.end): 1.0},  # open spans often (an untrained model)
                "logprobs": True,
                "return_tokens_as_token_ids": True,  # vLLM: each token as "token_id:<id>"
            },
            timeout=120,
        )
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        out = [int(t["token"].split(":", 1)[1]) for t in choice["logprobs"]["content"]]
        hist = list(prompt_ids) + out
        for start, span in reference_spans(hist, ids.start, ids.end):
            if start < len(prompt_ids):
                continue
            assert len(span) <= MAX_RECALL
            assert contains(hist[:start], span), f"span {span} at {start} is not verbatim"
            n_spans += bool(span)
        # the text carries the recall tokens (added as non-special tokens, not skipped)
        if ids.start in out:
            assert "<|start_recall|>" in choice["message"]["content"]
    assert n_spans >= 3, f"only {n_spans} non-empty spans came back"


def test_the_eval_and_rlm_client_talks_to_it(server):
    from recallm.clients import ChatClient, EndpointConfig

    base, _ = server
    endpoint = EndpointConfig.from_mapping(
        {"base_url": base, "model": "recallm-tiny", "max_tokens": 16, "temperature": 0.0}, "backend"
    )
    with ChatClient(endpoint, "backend") as client:
        client.ping()
        completion = client.chat([{"role": "user", "content": "1: ka\n2: bo\nWhat is 2?"}])
    assert isinstance(completion.text, str) and completion.completion_tokens and completion.completion_tokens <= 16


def test_the_guard_answers_what_vllm_would_fail_on_with_a_400(server):
    """recallm-serve's RequestGuard (vLLM's --middleware): a JSON array or string body (vLLM's server answered a
    500), n above --max-n (default 16) get a 400 in OpenAI's error format; a good request is answered by vLLM."""
    import httpx

    base, _ = server
    messages = [{"role": "user", "content": "1: ka\n2: bo\nWhat is 2?"}]
    for body, said in [
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        (json.dumps({"model": "recallm-tiny", "messages": messages, "n": 10000}), "n=10000: this server answers 1 to 16"),
    ]:
        resp = httpx.post(f"{base}/chat/completions", content=body, headers={"content-type": "application/json"},
                          timeout=60)  # fmt: skip
        assert resp.status_code == 400, (resp.status_code, resp.text)
        assert said in resp.json()["error"]["message"]
    good = httpx.post(f"{base}/chat/completions", json={"model": "recallm-tiny", "messages": messages, "max_tokens": 4,
                                                        "n": 2}, timeout=120)  # fmt: skip
    assert good.status_code == 200 and len(good.json()["choices"]) == 2, good.text
