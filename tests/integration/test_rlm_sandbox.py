"""The RLM sandbox: model-written code runs in a separate, limited, isolated process.

Every behaviour is checked with each isolation that works here (bubblewrap, recallm's own
namespaces, none); those that need isolation (network, filesystem view, other processes) run
with the isolating kinds only. Kinds that do not work here are skipped with the probe's reason.
The hostile cases (escapes, process trees, whole-tree caps, a forging REPL) are in
``tests/integration/adversarial/test_sandbox.py``.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

from recallm.errors import RecallmError
from recallm.rlm.budget import BudgetExhausted
from recallm.rlm.sandbox import Isolation, Sandbox, SandboxLimits, probe_isolation

PROBES = {kind: probe_isolation(kind) for kind in ("bwrap", "namespaces", "none")}
MODES = [kind for kind, found in PROBES.items() if isinstance(found, Isolation)] or ["none"]
ISOLATED = [kind for kind in MODES if kind != "none"]
ANY = MODES[0]
# limits for the tests of timeouts, and for the others (roomy: no test depends on how loaded the machine is)
FAST = SandboxLimits(cpu_s=5, wall_s=1.0, memory_mb=512, max_output_chars=2000, kill_grace_s=0.5)
ROOMY = SandboxLimits(cpu_s=60, wall_s=60, memory_mb=512, max_output_chars=2000, kill_grace_s=0.5)


def isolated(test):
    """Run ``test`` with every isolating kind that works here (skipped, with why, if none)."""
    if not ISOLATED:
        reason = "; ".join(f"{k}: {v}" for k, v in PROBES.items() if isinstance(v, str))
        return pytest.mark.skip(reason=f"no isolation here: {reason}")(test)
    return pytest.mark.parametrize("mode", ISOLATED)(test)


def sandbox(mode=ANY, limits=ROOMY, **kwargs) -> Sandbox:
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
    with sandbox(mode, FAST) as sb:
        sb.execute("kept = 'still here'")
        result = sb.execute("while True:\n    pass")
        assert result.timed_out and not result.restarted and result.error_type == "TimeoutError"
        assert "wall-clock limit of 1s" in result.error
        assert sb.execute("kept").stdout == "'still here'\n"


def test_the_cpu_time_limit_stops_a_busy_cell():
    limits = SandboxLimits(cpu_s=1, wall_s=120, memory_mb=512, kill_grace_s=0.5)
    with sandbox(ANY, limits) as sb:
        result = sb.execute("x = 0\nwhile True:\n    x += 1")
        assert result.timed_out and "CPU-time limit of 1s" in result.error  # (not the wall clock)
        assert int(sb.execute("x").stdout) > 0


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_inside_c_code_is_killed_and_the_repl_restarted(mode):
    limits = SandboxLimits(cpu_s=5, wall_s=0.5, memory_mb=512, kill_grace_s=0.5)
    with sandbox(mode, limits) as sb:
        sb.execute("kept = 1")
        pid = sb._process.proc.pid
        result = sb.execute("import itertools\nany(itertools.repeat(0))")  # never returns to the interpreter
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
        assert cwd == "/home/rlm" if mode != "none" else cwd.startswith(os.path.realpath(os.sep + "tmp"))


@isolated
def test_with_isolation_other_processes_and_their_environments_are_invisible(mode, monkeypatch):
    monkeypatch.setenv("RECALLM_TEST_SECRET", "s3cr3t-token-value")
    with sandbox(mode) as sb:
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


@isolated
def test_with_isolation_the_network_is_unreachable(mode):
    server = _listener()
    try:
        port = server.getsockname()[1]
        with sandbox(mode) as sb:
            assert sb.execute(CONNECT.format(port=port)).stdout.startswith("blocked")
            dns = sb.execute("import socket\ntry:\n    socket.getaddrinfo('pypi.org', 443)\n    print('resolved')\n"
                             "except OSError:\n    print('no dns')")  # fmt: skip
            assert dns.stdout == "no dns\n"
        if "none" in MODES:  # the same code reaches the host without isolation: the test can fail
            with sandbox("none") as sb:
                assert sb.execute(CONNECT.format(port=port)).stdout == "connected\n"
    finally:
        server.close()


@isolated
def test_with_isolation_the_filesystem_is_a_small_read_only_view(mode):
    here = os.path.dirname(os.path.abspath(__file__))
    with sandbox(mode) as sb:
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
        assert sb.execute("print(open('/home/rlm/ok').read())").stdout == "x\n"
        assert not os.path.exists(os.path.join(sb._process.home, "ok"))  # a tmpfs of the sandbox's own, not a host directory
    assert not os.path.exists(sb._process.base)  # removed on close


def test_isolation_is_reported_and_bwrap_is_required_unless_the_user_opts_out(monkeypatch, caplog):
    from recallm.rlm.sandbox import repl as module

    found = {
        "bwrap": "bubblewrap (bwrap) is not installed",
        "namespaces": Isolation("namespaces", "namespaces"),
        "none": Isolation("none", "isolation=none"),
    }
    uncached = module.detect_isolation.__wrapped__
    monkeypatch.setattr(module, "probe_isolation", found.get)
    monkeypatch.setattr(module, "detect_isolation", uncached)
    monkeypatch.setattr(module, "_warned", set())
    assert module.DEFAULT_ISOLATION == "bwrap"
    with pytest.raises(
        RecallmError, match="isolation=bwrap, but bubblewrap .* is not installed; install it, or opt out"
    ):
        module.resolve_isolation("bwrap")
    with caplog.at_level("WARNING"):
        auto = module.resolve_isolation("auto")
    assert auto.kind == "namespaces" and "bubblewrap (bwrap) is not installed" in auto.detail
    assert "WITHOUT bubblewrap" in caplog.text and auto.as_dict()["bubblewrap"] is False
    found["namespaces"] = "namespaces cannot start a sandbox here (unshare: Operation not permitted)"
    with caplog.at_level("WARNING"):
        assert module.resolve_isolation("auto").kind == "none"
    assert "UNISOLATED" in caplog.text and "shares the host's network" in caplog.text
    found["none"] = "the host is root and /root is not searchable by other users"
    with pytest.raises(RecallmError, match="no way to run model code safely here: .*not installed.*unshare.*/root"):
        module.resolve_isolation("auto")
    with pytest.raises(RecallmError, match="must be one of bwrap, auto, namespaces, none"):
        module.resolve_isolation("docker")
    assert "no network" in Isolation("bwrap", "/usr/bin/bwrap").describe()
    assert Isolation("bwrap", "/usr/bin/bwrap").as_dict()["isolated"] is True


@pytest.mark.parametrize("mode", MODES)
def test_sub_calls_travel_to_the_host_and_threads_in_a_cell_overlap(mode):
    seen = []
    together = threading.Barrier(4, timeout=30)  # passes only when the four calls are in flight at once

    def on_call(kind, args):
        seen.append((kind, dict(args)))
        if args.get("prompt") == "spend":
            raise BudgetExhausted("max_subcalls=0")
        if args.get("prompt") == "fail":
            raise RuntimeError("server said no")
        together.wait()
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
        spent = sb.execute("try:\n    llm_query('spend')\nexcept BudgetExhausted as exc:\n    print('budget:', exc)")
        assert spent.stdout == "budget: budget exhausted: max_subcalls=0\n"
        failed = sb.execute("llm_query('fail')")
        assert failed.error_type == "SubCallError" and "server said no" in failed.error
        off = sb.execute("rlm_query('x', 'y')")
        assert off.error_type == "RuntimeError" and "not available" in off.error
    assert [k for k, _ in seen] == ["llm_query"] * 6


def test_a_dying_worker_is_restarted_and_reported():
    with sandbox() as sb:
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
        Sandbox(object(), isolation=ANY)


@pytest.mark.skipif("namespaces" not in MODES, reason=f"namespaces: {PROBES['namespaces']}")
def test_code_run_without_bubblewrap_is_said_in_the_trajectory_and_the_eval_report(tmp_path):
    import json

    from recallm.eval.report import build_report
    from recallm.rlm.models import ScriptedModel
    from recallm.rlm.runner import RLM, RLMSettings

    rlm = RLM(
        ScriptedModel(["FINAL(x)"]), settings=RLMSettings(isolation="namespaces", max_iterations=1), sandbox=ROOMY
    )
    result = rlm.run("ctx", "q?", trajectory=tmp_path / "t.jsonl")
    assert result.events[0]["isolation"].startswith("WITHOUT bubblewrap")
    runs = {}
    for name, isolation in (
        ("plain", None),
        ("rlm-ns", rlm.isolation),
        ("rlm-bwrap", Isolation("bwrap", "/usr/bin/bwrap")),
    ):
        run_dir = tmp_path / name
        run_dir.mkdir()
        info = {"name": name, "backend": "rlm"} | ({"rlm_isolation": isolation.as_dict()} if isolation else {})
        (run_dir / "summary.json").write_text(json.dumps({"run": info, "n_examples": 0, "benchmarks": {}}))
        runs[name] = run_dir
    report = build_report(runs, tmp_path / "report").read_text()
    warnings = [line for line in report.splitlines() if "without bubblewrap" in line]
    assert len(warnings) == 1 and "`rlm-ns`" in warnings[0] and "recallm's own Linux namespaces" in warnings[0]
