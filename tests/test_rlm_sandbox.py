"""The RLM sandbox: model-written code runs in a separate, limited, isolated process.

Where bubblewrap works here, every behaviour is checked with it and without it; the tests that
need isolation (network, filesystem view, other processes' environments) are skipped, with
the reason the detection gives, only where it is unavailable.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from recallm.errors import RecallmError
from recallm.rlm.budget import BudgetExhausted
from recallm.rlm.sandbox import Isolation, Sandbox, SandboxLimits, detect_isolation

ISOLATION = detect_isolation()
MODES = ["none", "bwrap"] if ISOLATION.available else ["none"]
needs_bwrap = pytest.mark.skipif(not ISOLATION.available, reason=f"no isolation here: {ISOLATION.detail}")
FAST = SandboxLimits(cpu_s=5, wall_s=1.0, memory_mb=512, max_output_chars=2000, kill_grace_s=0.5)


def sandbox(mode="none", limits=FAST, **kwargs) -> Sandbox:
    kwargs.setdefault("context", "abc " * 100)
    return Sandbox(limits=limits, isolation=mode, **kwargs)


@pytest.mark.parametrize("mode", MODES)
def test_namespace_persists_and_last_expression_is_echoed(mode):
    with sandbox(mode, query="the question?") as sb:
        first = sb.execute("n = len(context)\nwords = context.split()")
        assert first.error is None and first.stdout == ""
        second = sb.execute("print(n)\nlen(words) * 2")
        assert second.stdout == "400\n200\n"
        assert sb.execute("query").stdout == "'the question?'\n"
        assert sb.get("n") == (True, "400")
        ok, why = sb.get("missing")
        assert not ok and "no variable named 'missing'" in why


@pytest.mark.parametrize("mode", MODES)
def test_syntax_errors_and_exceptions_are_returned_not_raised(mode):
    with sandbox(mode) as sb:
        sb.execute("kept = 7")
        bad = sb.execute("def f(:\n    pass")
        assert bad.error_type == "SyntaxError" and "<cell 2>" in bad.error and "worker.py" not in bad.error
        boom = sb.execute("def g():\n    return 1 / 0\nprint('before')\ng()")
        assert boom.error_type == "ZeroDivisionError" and boom.stdout == "before\n"
        assert 'File "<cell 3>", line 2, in g' in boom.error and "worker.py" not in boom.error
        assert not bad.restarted and not boom.restarted
        assert sb.execute("kept").stdout == "7\n"  # the namespace survived both


@pytest.mark.parametrize("mode", MODES)
def test_a_python_loop_forever_is_interrupted_and_the_namespace_survives(mode):
    with sandbox(mode) as sb:
        sb.execute("kept = 'still here'")
        start = time.monotonic()
        result = sb.execute("while True:\n    pass")
        assert time.monotonic() - start < FAST.wall_s + FAST.kill_grace_s
        assert result.timed_out and not result.restarted and result.error_type == "TimeoutError"
        assert "wall-clock limit of 1s" in result.error
        assert sb.execute("kept").stdout == "'still here'\n"


def test_the_cpu_time_limit_stops_a_busy_cell():
    limits = SandboxLimits(cpu_s=1, wall_s=10, memory_mb=512, kill_grace_s=0.5)
    with sandbox("none", limits) as sb:
        result = sb.execute("x = 0\nwhile True:\n    x += 1")
        assert result.timed_out and "CPU-time limit of 1s" in result.error
        assert result.elapsed < 5
        assert int(sb.execute("x").stdout) > 0


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_inside_c_code_is_killed_and_the_repl_restarted(mode):
    limits = SandboxLimits(cpu_s=5, wall_s=0.5, memory_mb=512, kill_grace_s=0.5)
    with sandbox(mode, limits) as sb:
        sb.execute("kept = 1")
        pid = sb._proc.pid
        start = time.monotonic()
        result = sb.execute("import itertools\nany(itertools.repeat(0))")  # never returns to the interpreter
        assert time.monotonic() - start < limits.wall_s + limits.kill_grace_s + 1.5
        assert result.timed_out and result.restarted and "was killed" in result.error
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the whole process group is gone
        after = sb.execute("print(len(context))\nkept")
        assert after.stdout == "400\n" and after.error_type == "NameError"  # fresh REPL, context reloaded


@pytest.mark.parametrize("mode", MODES)
def test_unbounded_allocation_hits_the_memory_limit_cleanly(mode):
    limits = SandboxLimits(cpu_s=10, wall_s=10, memory_mb=256, kill_grace_s=0.5)
    with sandbox(mode, limits) as sb:
        result = sb.execute("hog = []\nwhile True:\n    hog.append(bytearray(10**7))")
        assert result.error_type == "MemoryError" and not result.restarted
        assert "memory" in result.error
        assert sb.execute("del hog\nprint('recovered')").stdout == "recovered\n"


@pytest.mark.parametrize("mode", MODES)
def test_a_stdout_flood_is_capped_and_counted(mode):
    with sandbox(mode) as sb:
        result = sb.execute("for i in range(200000):\n    print(i)")
        assert result.error is None
        assert len(result.stdout) == FAST.max_output_chars and result.truncated
        assert result.stdout_chars == sum(len(f"{i}\n") for i in range(200000))
        raw = sb.execute("import os\n_ = os.write(1, b'x' * 50000)\n_ = os.write(2, b'E')")  # file descriptors too
        assert raw.stdout.startswith("x" * 100) and len(raw.stdout) <= FAST.max_output_chars
        assert raw.stdout_chars >= 50001
        sub = sb.execute("import subprocess\nsubprocess.run(['echo', 'from a child process'])")
        assert "from a child process" in sub.stdout


@pytest.mark.parametrize("mode", MODES)
def test_host_secrets_are_not_in_the_sandbox_environment(mode, monkeypatch):
    monkeypatch.setenv("RECALLM_TEST_SECRET", "s3cr3t-token-value")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    with sandbox(mode) as sb:
        result = sb.execute("import os\nprint(sorted(os.environ.items()))\nprint(os.getcwd())")
        assert "s3cr3t" not in result.stdout and "sk-should" not in result.stdout
        assert "RECALLM_TEST_SECRET" not in result.stdout and "OPENAI_API_KEY" not in result.stdout
        cwd = result.stdout.splitlines()[-1]
        assert cwd == "/home/rlm" if mode == "bwrap" else cwd.startswith(os.path.realpath(os.sep + "tmp"))


@needs_bwrap
def test_with_bwrap_other_processes_and_their_environments_are_invisible(monkeypatch):
    monkeypatch.setenv("RECALLM_TEST_SECRET", "s3cr3t-token-value")
    with sandbox("bwrap") as sb:
        code = f"import os\nprint(os.path.exists('/proc/{os.getpid()}'), sorted(p for p in os.listdir('/proc') if p.isdigit()))"
        result = sb.execute(code)
        assert result.stdout.startswith("False")
        assert "s3cr3t" not in sb.execute("print(open('/proc/1/environ').read())").stdout


def _listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    threading.Thread(target=lambda: [server.accept() for _ in range(8)], daemon=True).start()
    return server


CONNECT = (
    "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
    "    print('connected')\nexcept OSError as exc:\n    print('blocked', type(exc).__name__)"
)


@needs_bwrap
def test_with_bwrap_the_network_is_unreachable():
    server = _listener()
    try:
        port = server.getsockname()[1]
        with sandbox("bwrap") as sb:
            assert sb.execute(CONNECT.format(port=port)).stdout.startswith("blocked")
            dns = sb.execute("import socket\ntry:\n    socket.getaddrinfo('pypi.org', 443)\n    print('resolved')\n"
                             "except OSError:\n    print('no dns')")  # fmt: skip
            assert dns.stdout == "no dns\n"
        with sandbox("none") as sb:  # the same code reaches the host without isolation: the test can fail
            assert sb.execute(CONNECT.format(port=port)).stdout == "connected\n"
    finally:
        server.close()


@needs_bwrap
def test_with_bwrap_the_filesystem_is_a_small_read_only_view():
    here = os.path.dirname(os.path.abspath(__file__))
    with sandbox("bwrap") as sb:
        code = (
            "import os\n"
            f"print(os.path.exists({here!r}), os.path.exists('/root/.bashrc'), os.path.exists('/etc/passwd'))\n"
            "for path in ('/usr/evil', '/evil', '/tmp/ok', '/home/rlm/ok'):\n"
            "    try:\n        open(path, 'w').write('x'); print(path, 'written')\n"
            "    except OSError as exc:\n        print(path, 'refused', exc.errno)"
        )
        lines = sb.execute(code).stdout.splitlines()
        assert lines[0] == "False False False"
        assert lines[1].startswith("/usr/evil refused") and lines[2].startswith("/evil refused")
        assert lines[3] == "/tmp/ok written" and lines[4] == "/home/rlm/ok written"
        assert os.path.isfile(os.path.join(sb._home, "ok"))  # the private directory, seen from the host
    assert not os.path.exists(sb._base)  # removed on close


def test_isolation_is_reported_and_bwrap_can_be_required(monkeypatch, caplog):
    from recallm.rlm import sandbox as module

    missing = Isolation("none", "bubblewrap (bwrap) is not installed")
    monkeypatch.setattr(module, "detect_isolation", lambda: missing)
    monkeypatch.setattr(module, "_warned_once", False)
    with pytest.raises(RecallmError, match="isolation=bwrap, but bubblewrap .* is not installed"):
        module.resolve_isolation("bwrap")
    with caplog.at_level("WARNING"):
        assert module.resolve_isolation("auto") is missing
    assert "without isolation" in caplog.text and "NONE" in caplog.text
    with pytest.raises(RecallmError, match="must be one of auto, bwrap, none"):
        module.resolve_isolation("docker")
    assert "NONE" in missing.describe() and "no network" in Isolation("bwrap", "/usr/bin/bwrap").describe()


@pytest.mark.parametrize("mode", MODES)
def test_sub_calls_travel_to_the_host_and_threads_in_a_cell_overlap(mode):
    seen = []

    def on_call(kind, args):
        seen.append((kind, dict(args)))
        if args.get("prompt") == "spend":
            raise BudgetExhausted("max_subcalls=0")
        if args.get("prompt") == "fail":
            raise RuntimeError("server said no")
        time.sleep(0.3)
        return f"answer to {args['prompt']}"

    with sandbox(mode, functions=["llm_query"], on_call=on_call) as sb:
        code = (
            "from concurrent.futures import ThreadPoolExecutor\n"
            "with ThreadPoolExecutor(4) as pool:\n"
            "    out = list(pool.map(llm_query, ['a', 'b', 'c', 'd']))\n"
            "print(out)"
        )
        result = sb.execute(code)
        assert result.stdout == "['answer to a', 'answer to b', 'answer to c', 'answer to d']\n"
        assert result.elapsed < 1.1  # four 0.3 s calls at once (1.2 s one after another)
        spent = sb.execute("try:\n    llm_query('spend')\nexcept BudgetExhausted as exc:\n    print('budget:', exc)")
        assert spent.stdout == "budget: budget exhausted: max_subcalls=0\n"
        failed = sb.execute("llm_query('fail')")
        assert failed.error_type == "SubCallError" and "server said no" in failed.error
        off = sb.execute("rlm_query('x', 'y')")
        assert off.error_type == "RuntimeError" and "not available" in off.error
    assert [k for k, _ in seen] == ["llm_query"] * 6


def test_a_dying_worker_is_restarted_and_reported():
    with sandbox("none") as sb:
        result = sb.execute("import os\nos._exit(3)")
        assert result.restarted and "exited with code 3" in result.error
        assert sb.execute("len(context)").stdout == "400\n"
        assert sb.starts == 2


def test_limits_are_checked():
    assert SandboxLimits.from_mapping({"wall_s": 3}).wall_s == 3.0
    with pytest.raises(RecallmError, match="unknown keys \\['wal_s'\\]"):
        SandboxLimits.from_mapping({"wal_s": 3})
    with pytest.raises(RecallmError, match="sandbox.memory_mb must be >= 64"):
        SandboxLimits.from_mapping({"memory_mb": 8})
    with pytest.raises(RecallmError, match="sandbox.cpu_s must be a number"):
        SandboxLimits.from_mapping({"cpu_s": "fast"})
    with pytest.raises(RecallmError, match="context must be a str or JSON data"):
        Sandbox(object(), isolation="none")
