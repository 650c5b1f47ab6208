"""Hostile model code against the RLM sandbox (issue 18, items 1-4): each case is an attack that
worked before and returns what got through (None when it was blocked).

1. escapes: the host's environment and memory through /proc, signals and ptrace to the host,
   root's files, the project, writes outside the sandbox, the network, root privileges;
2. processes that outlive their REPL (children, setsid grandchildren, forking daemons) after a
   clean close, a wall-clock kill, a crash or the host's death (SIGKILL, no close);
3. whole-tree caps: forks and threads, memory of several processes, the private directory,
   /tmp, and files left in shared memory;
4. a REPL that forges protocol messages: replies for other cells and requests, thousands of
   sub-calls, sub-calls it was not given, oversized lines, a channel it stops reading.

Every case runs with each isolation that works here (``probe_isolation``); ``CASES`` can be
run against another version of ``recallm.rlm.sandbox`` (the counts in the closing note).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields

import pytest

from recallm.rlm.sandbox import Isolation, Sandbox, SandboxLimits, probe_isolation
from recallm.rlm.sandbox import isolation as sandbox_isolation
from recallm.rlm.sandbox import process as sandbox_process

PROBES = {kind: probe_isolation(kind) for kind in ("bwrap", "namespaces", "none")}
MODES = [kind for kind, found in PROBES.items() if isinstance(found, Isolation)]
SKIPPED = {kind: why for kind, why in PROBES.items() if isinstance(why, str)}
BASE = {"cpu_s": 20, "wall_s": 20, "memory_mb": 512, "max_output_chars": 20_000, "kill_grace_s": 1.0}
SECRET = "SECRET_TOKEN=hunter2-" + uuid.uuid4().hex


def open_sandbox(mode: str, **overrides) -> Sandbox:
    """A sandbox with the test limits (fields this version of SandboxLimits lacks are dropped)."""
    known = {f.name for f in fields(SandboxLimits)}
    limits = SandboxLimits(**{k: v for k, v in {**BASE, **overrides}.items() if k in known})
    functions = overrides.pop("functions", ())
    on_call = overrides.pop("on_call", None)
    return Sandbox("adversarial context", limits=limits, isolation=mode, functions=functions, on_call=on_call)


def run(sb: Sandbox, code: str) -> str:
    result = sb.execute(code)
    return result.stdout + (result.error or "")


def marker() -> str:
    return f"rlm-adversarial-{uuid.uuid4().hex[:12]}"


def survivors(mark: str) -> list[int]:
    """Host processes whose command line carries ``mark``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if mark.encode() in f.read():
                        with open(f"/proc/{entry}/stat", "rb") as g:
                            if g.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                                found.append(int(entry))
            except OSError:
                pass
    return found


def wait_gone(mark: str, seconds: float = 30.0) -> list[int]:
    """Survivors of ``mark`` once they had ``seconds`` to finish dying (not a timing assertion:
    killed processes may take a moment to leave /proc on a loaded machine)."""
    deadline = time.monotonic() + seconds
    while True:
        left = survivors(mark)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@dataclass
class Host:
    """What the escapes aim at: a root "host" process started with a secret in its environment
    and a key in its memory, a listening port, a directory of the host."""

    pid: int
    key: str
    port: int
    outside: str


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    key = "hostkey-" + uuid.uuid4().hex
    decoy = subprocess.Popen(
        [sys.executable, "-c", f"import time\nkey = {key!r} * 3\ntime.sleep(3600)"],
        env={"PATH": "/usr/bin:/bin", "SECRET_TOKEN": SECRET},
    )
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    threading.Thread(target=lambda: [server.accept() for _ in range(64)], daemon=True).start()
    outside = str(tmp_path_factory.mktemp("outside"))
    try:
        yield Host(decoy.pid, key, server.getsockname()[1], outside)
    finally:
        decoy.kill()
        decoy.wait()
        server.close()


# --- 1. escapes -------------------------------------------------------------------------------


def _environ(sb: Sandbox, host: Host) -> str | None:
    out = run(sb, f"try:\n    print(open('/proc/{host.pid}/environ', 'rb').read())\nexcept OSError as e:\n    print(e)")
    return "read the host's environment" if SECRET in out else None


def _memory(sb: Sandbox, host: Host) -> str | None:
    code = f"""
import re
found = False
try:
    maps = open('/proc/{host.pid}/maps').read().splitlines()
    with open('/proc/{host.pid}/mem', 'rb') as mem:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))
            if 'rw' not in line.split()[1] or hi - lo > 1 << 28:
                continue
            try:
                mem.seek(lo)
                if {host.key!r}.encode() in mem.read(hi - lo):
                    found = True
                    break
            except OSError:
                pass
except OSError as e:
    print(e)
print('FOUND' if found else 'no')
"""
    return "read a key from the host's memory" if "FOUND" in run(sb, code) else None


def _signal_host(sb: Sandbox, host: Host) -> str | None:
    code = f"""
import os
hits = []
for name, pid in (('parent', os.getppid()), ('host', {os.getpid()}), ('decoy', {host.pid}), ('init', 1)):
    try:
        os.kill(pid, 0)
        hits.append(name)
    except OSError:
        pass
print('MAY SIGNAL', hits)
"""
    out = run(sb, code)
    hits = eval(out.split("MAY SIGNAL", 1)[1].strip()) if "MAY SIGNAL" in out else []
    hits = [h for h in hits if h in ("host", "decoy")]  # (in a PID namespace, parent and 1 are the sandbox's own)
    return f"may signal the host's processes {hits}" if hits else None


def _kill_decoy(sb: Sandbox, host: Host) -> str | None:
    run(sb, f"import os, signal\ntry:\n    os.kill({host.pid}, signal.SIGKILL)\nexcept OSError as e:\n    print(e)")
    time.sleep(0.1)
    try:
        with open(f"/proc/{host.pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return "killed a host process"
    return "killed a host process" if state in (b"Z", b"X") else None


def _ptrace(sb: Sandbox, host: Host) -> str | None:
    code = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
if libc.ptrace(16, {host.pid}, None, None) == 0:
    print('ATTACHED')
    libc.ptrace(17, {host.pid}, None, None)
else:
    print('refused', ctypes.get_errno())
"""
    return "ptrace-attached to a host process" if "ATTACHED" in run(sb, code) else None


def _shadow(sb: Sandbox, host: Host) -> str | None:
    out = run(sb, "try:\n    print('READ', len(open('/etc/shadow').read()))\nexcept OSError as e:\n    print(e)")
    return "read /etc/shadow" if "READ" in out else None


def _project(sb: Sandbox, host: Host) -> str | None:
    here = os.path.abspath(__file__)
    out = run(sb, f"try:\n    print('READ', len(open({here!r}).read()))\nexcept OSError as e:\n    print(e)")
    return "read the project's files" if "READ" in out else None


def _host_root(sb: Sandbox, host: Host) -> str | None:
    code = "import os\ntry:\n    print(os.listdir('/proc/1/root/root'))\nexcept OSError as e:\n    print([])"
    seen = set(eval(run(sb, code).splitlines()[-1]))
    try:
        private = set(os.listdir("/root")) - {".pyenv", ".local"}  # what only the host's /root holds
    except OSError:  # (a host that is not root)
        private = set()
    return "listed the host's /root through /proc/1/root" if seen & private else None


def _write_outside(sb: Sandbox, host: Host) -> str | None:
    mark = marker()
    targets = [os.path.join(host.outside, mark), f"/tmp/{mark}", f"/var/tmp/{mark}", f"/dev/shm/{mark}"]
    run(
        sb, f"for path in {targets!r}:\n    try:\n        open(path, 'w').write('x')\n    except OSError:\n        pass"
    )
    sb.close()
    written = [t for t in targets if os.path.exists(t)]
    for path in written:
        os.unlink(path)
    return f"left files outside its directory: {written}" if written else None


def _network(sb: Sandbox, host: Host) -> str | None:
    code = (
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {host.port}), timeout=3).close()\n"
        "    print('CONNECTED')\nexcept OSError as e:\n    print(e)"
    )
    return "opened TCP to the host's 127.0.0.1" if "CONNECTED" in run(sb, code) else None


def _root(sb: Sandbox, host: Host) -> str | None:
    out = run(
        sb,
        "import os, subprocess\nprint('uids', os.getuid(), subprocess.run(['id', '-u'], capture_output=True, text=True).stdout)",
    )
    return "runs (and runs subprocesses) as root" if out.split()[1:3] == ["0", "0"] else None


def _capabilities(sb: Sandbox, host: Host) -> str | None:
    out = run(sb, "print([l for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', 'NoNewPrivs'))])")
    held = [line for line in eval(out) if line.startswith(("CapEff", "CapPrm")) and int(line.split()[1], 16)]
    return f"holds capabilities {held}" if held else None


ESCAPES: dict[str, Callable[[Sandbox, Host], str | None]] = {
    "environ": _environ,
    "memory": _memory,
    "signal_host": _signal_host,
    "kill_decoy": _kill_decoy,
    "ptrace": _ptrace,
    "shadow": _shadow,
    "project": _project,
    "host_root": _host_root,
    "network": _network,
    "root": _root,
    "capabilities": _capabilities,
    "write_outside": _write_outside,  # last: it closes the sandbox
}


def escapes(mode: str, host: Host) -> dict[str, str]:
    """Every escape case in one sandbox; ``{case: what got through}``."""
    found = {}
    sb = open_sandbox(mode)
    try:
        for name, case in ESCAPES.items():
            what = case(sb, host)
            if what:
                found[name] = what
    finally:
        sb.close()
    return found


# --- 2. process trees -------------------------------------------------------------------------

SPAWN = """
import os, subprocess, time
def sleeper(mark, new_session=False):
    return subprocess.Popen([mark, '600'], executable='/bin/sleep', start_new_session=new_session)
kept = sleeper({mark!r})
if os.fork() == 0:  # a setsid grandchild whose parent exits: an orphan in its own session
    os.setsid()
    sleeper({mark!r}, True)
    os._exit(0)
daemon = subprocess.Popen(['/bin/sh', '-c', 'trap "" TERM HUP INT; while :; do sleep 1; done', {mark!r}])
hydra = subprocess.Popen([{python!r}, '-I', '-S', '-c',  # a daemon that forks away every 10 ms
    'import os, time\\nos.write(1, b"up\\\\n")\\nwhile True:\\n    if os.fork():\\n        os._exit(0)\\n    time.sleep(0.01)',
    {mark!r}], stdout=subprocess.PIPE)
assert hydra.stdout.readline() == b'up\\n'
time.sleep(0.1)
"""


def _tree_after(mode: str, how: str) -> str | None:
    mark = marker()
    sb = open_sandbox(mode)
    try:
        run(sb, SPAWN.format(mark=mark, python=os.path.realpath(sys.executable)))
        assert len(survivors(mark)) >= 3, "the attack did not run"
        if how == "crash":
            run(sb, "import os\nos._exit(7)")
        elif how == "timeout":
            sb.execute("import itertools\nany(itertools.repeat(0))", wall_s=1)  # stuck in C code: killed, restarted
        elif how == "close":
            sb.close()
        left = wait_gone(mark)
    finally:
        sb.close()
    left = left or wait_gone(mark, 0)
    if left:
        subprocess.run(["kill", "-9", *map(str, left)], capture_output=True)
    return f"{len(left)} processes survived {how}" if left else None


HOST = """
import os, signal, sys, threading, time
from recallm.rlm.sandbox import Sandbox, SandboxLimits
limits = SandboxLimits(cpu_s=60, wall_s=60, memory_mb=512, kill_grace_s=1.0)
sb = Sandbox("adversarial context", limits=limits, isolation={mode!r}, functions=["llm_query"],
             on_call=lambda kind, args: time.sleep(600))
result = sb.execute({spawn!r})
print("SPAWNED" if result.error is None else result.error, sb._process.uid, flush=True)
cell = "while True:\\n    try:\\n        llm_query('never answered')\\n    except BaseException:\\n        pass"
threading.Thread(target=sb.execute, args=(cell,), daemon=True).start()  # waits on the host, then never ends
time.sleep(1.0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _uid_survivors(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    line = next(x for x in f if x.startswith("Uid:"))
                if int(line.split()[1]) == uid:
                    found.append(int(entry))
            except (OSError, StopIteration):
                pass
    return found


def _tree_after_host_killed(mode: str) -> str | None:
    """The host is killed (SIGKILL: no ``close``) while a cell waits on a sub-call (its wall clock
    paused), a cell that then ignores every error: the REPL's whole tree dies with the host."""
    mark = marker()
    spawn = SPAWN.format(mark=mark, python=os.path.realpath(sys.executable))
    done = subprocess.run(
        [sys.executable, "-c", HOST.format(mode=mode, spawn=spawn)], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.startswith("SPAWNED"), f"the attack did not run: {done.stdout} {done.stderr[-2000:]}"
    uid = done.stdout.split()[1]
    left = wait_gone(mark)
    deadline = time.monotonic() + 30.0  # a hang guard: returns as soon as none is left
    stray = _uid_survivors(int(uid)) if uid != "None" else []
    while stray and time.monotonic() < deadline:
        time.sleep(0.05)
        stray = _uid_survivors(int(uid))
    if left or stray:
        subprocess.run(["kill", "-9", *map(str, left + stray)], capture_output=True)
    return f"{len(left) + len(stray)} processes survived their host's death" if left or stray else None


TREES = {f"tree_{how}": (lambda mode, how=how: _tree_after(mode, how)) for how in ("close", "crash", "timeout")}
TREES["tree_host_killed"] = _tree_after_host_killed


# --- 3. caps on the whole tree ----------------------------------------------------------------


def _forks(mode: str) -> str | None:
    code = """
import os, time
kids = []
try:
    for i in range(50):
        pid = os.fork()
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    print(e)
print('FORKED', len(kids))
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""
    with open_sandbox(mode, max_processes=16) as sb:
        out = run(sb, code)
    forked = int(out.split("FORKED")[1].split()[0]) if "FORKED" in out else 0
    assert forked >= 1, f"the attack did not run: {out}"
    return f"{forked} forks under max_processes=16" if forked >= 16 else None


def _threads(mode: str) -> str | None:
    code = """
import threading
stop = threading.Event()
started = 0
try:
    for i in range(100):
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
except RuntimeError as e:
    print(e)
stop.set()
print('STARTED', started)
"""
    with open_sandbox(mode, max_processes=16, memory_mb=4096) as sb:  # (not limited by the address space)
        out = run(sb, code)
    started = int(out.split("STARTED")[1].split()[0]) if "STARTED" in out else 0
    assert started >= 1, f"the attack did not run: {out}"
    return f"{started} threads under max_processes=16" if started >= 16 else None


MEMORY = """
import os, select, time
r, w = os.pipe()
kids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        try:
            block = b'\\x01' * (150 << 20)
            os.write(w, b'x')
            time.sleep(30)
        finally:
            os._exit(0)
    kids.append(pid)
os.close(w)
reported, exited = 0, set()
while reported + len(exited) < 3:  # each child has either allocated its block or died
    if select.select([r], [], [], 0.1)[0]:
        reported += len(os.read(r, 16))
    exited |= {pid for pid in kids if pid not in exited and os.waitpid(pid, os.WNOHANG)[0]}
settle = time.monotonic() + 1
while time.monotonic() < settle:  # a child killed for another one's allocation has finished dying by now
    exited |= {pid for pid in kids if pid not in exited and os.waitpid(pid, os.WNOHANG)[0]}
    time.sleep(0.05)
print('HOLDING', 3 - len(exited))
for pid in kids:
    if pid not in exited:
        os.kill(pid, 9)
"""


def _memory_tree(mode: str) -> str | None:
    with open_sandbox(mode, memory_mb=256) as sb:
        result = sb.execute(MEMORY)
    out = result.stdout
    assert "HOLDING" in out or result.error_type == "MemoryError", f"the attack did not run: {result}"
    holding = int(out.split("HOLDING")[1].split()[0]) if "HOLDING" in out else 0
    return f"{holding} x 150 MB held at once under memory_mb=256" if holding >= 2 else None


def _home_size(mode: str) -> str | None:
    code = """
import os
written = 0
for i in range(30):
    try:
        with open(f'f{i}', 'wb') as f:
            f.write(b'x' * (1 << 20))
        written += 1
    except OSError:
        break
print('WRITTEN', written)
"""
    with open_sandbox(mode, max_file_mb=1, home_mb=8) as sb:
        result = sb.execute(code)
    written = int(result.stdout.split("WRITTEN")[1].split()[0]) if "WRITTEN" in result.stdout else 0
    assert written >= 1 or "home_mb" in (result.error or ""), f"the attack did not run: {result}"
    return f"{written} x 1 MB files in the private directory under home_mb=8" if written > 8 else None


def _tmp_size(mode: str) -> str | None:
    code = "import tempfile\nwritten = 0\ntry:\n    with open(tempfile.gettempdir() + '/big', 'wb') as f:\n        for i in range(12):\n            f.write(b'x' * (1 << 20))\n            f.flush()\n            written += 1\nexcept OSError:\n    pass\nprint('WRITTEN', written)"  # noqa: E501
    with open_sandbox(mode, tmp_mb=4, home_mb=4) as sb:  # (under none the temporary directory is in the private one)
        result = sb.execute(code)
    out = result.stdout
    written = int(out.split("WRITTEN")[1].split()[0]) if "WRITTEN" in out else 0
    assert written >= 1 or "home_mb" in (result.error or ""), f"the attack did not run: {result}"
    return f"{written} MB in /tmp under tmp_mb=4" if written > 4 else None


CAPS = {
    "forks": _forks,
    "threads": _threads,
    "memory_tree": _memory_tree,
    "home_size": _home_size,
    "tmp_size": _tmp_size,
}


# --- 4. a forging REPL ------------------------------------------------------------------------

CHANNEL = "import json, os, sys\nfd = json.loads(sys.argv[-1])['fd_out']\n"


def _send_lines(lines: list[dict]) -> str:
    return CHANNEL + f"for m in {lines!r}:\n    os.write(fd, (json.dumps(m) + '\\n').encode())\n"


def _forged_future_done(mode: str) -> str | None:
    forged = [{"op": "done", "id": i, "stdout": "FORGED\n", "stdout_chars": 7, "error": None, "error_type": None,
               "final": "FORGED", "timed_out": False, "elapsed": 0.0} for i in range(1, 8)]  # fmt: skip
    with open_sandbox(mode) as sb:
        sb.execute(_send_lines(forged) + "import time\ntime.sleep(0.2)")
        later = sb.execute("print('real')")
    assert later.stdout in ("real\n", "FORGED\n") or "protocol" in (later.error or ""), (
        f"the attack did not run: {later}"
    )
    return "a later cell's result was forged by an earlier cell" if later.final == "FORGED" else None


def _forged_value(mode: str) -> str | None:
    forged = [{"op": "value", "id": i, "ok": True, "value": "FORGED", "error": None} for i in range(1, 8)]
    slow = (  # the real value takes a moment; meanwhile a thread of the cell forges the answer to the read
        "import threading, time\n"
        "class Slow:\n    def __str__(self):\n        time.sleep(1)\n        return 'real'\n"
        "answer = Slow()\n"
        "def forge():\n    time.sleep(0.3)\n"
        + "\n".join("    " + line for line in _send_lines(forged).splitlines())
        + "\n"
        "threading.Thread(target=forge, daemon=True).start()\n"
    )
    with open_sandbox(mode) as sb:
        first = sb.execute(slow)
        ok, value = sb.get("answer")
    assert first.error is None and (value in ("real", "FORGED") or "protocol" in value), (
        f"the attack did not run: {value}"
    )
    return "FINAL_VAR's value was forged" if ok and value == "FORGED" else None


def _call_flood(mode: str) -> str | None:
    release = threading.Event()
    inside = []
    peak = [0]

    def on_call(kind, args):
        inside.append(1)
        peak[0] = max(peak[0], threading.active_count())
        release.wait(20)
        return "late"

    calls = [{"op": "call", "id": 10_000 + i, "kind": "llm_query", "args": {"prompt": "x"}} for i in range(3000)]
    before = threading.active_count()
    sb = open_sandbox(mode, functions=["llm_query"], on_call=on_call, max_processes=16)
    try:
        sb.execute(_send_lines(calls) + "import time\ntime.sleep(1)")
        threads = peak[0] - before
    finally:
        release.set()
        sb.close()
    assert inside, "the attack did not run"
    return f"{len(inside)} host handlers, {threads} host threads for 3000 forged calls" if threads > 32 else None


def _call_kind(mode: str) -> str | None:
    seen = []
    calls = [{"op": "call", "id": 77, "kind": "rlm_query", "args": {"context": "c", "query": "q"}}]
    with open_sandbox(mode, functions=["llm_query"], on_call=lambda kind, args: seen.append(kind) or "ok") as sb:
        done = sb.execute(_send_lines(calls) + "import time\ntime.sleep(0.5)")
    assert done.error is None, f"the attack did not run: {done}"
    return f"the host ran a sub-call the REPL was not given: {seen}" if "rlm_query" in seen else None


def _long_line(mode: str) -> str | None:
    with open_sandbox(mode, max_message_mb=1) as sb:
        result = sb.execute(CHANNEL + "os.write(fd, b'x' * (3 << 20))\nimport time\ntime.sleep(0.5)")
    if result.restarted and "longer than" in (result.error or ""):
        return None
    return "the host buffered a 3 MiB line although max_message_mb=1"


def _stalled_channel(mode: str) -> str | None:
    code = CHANNEL + (
        "fd_in = json.loads(sys.argv[-1])['fd_in']\n"
        "keep = os.dup(fd_in)\nos.dup2(os.pipe()[0], fd_in)\n"  # nobody reads the host's answers any more
        "for i in range(3000):\n"
        "    os.write(fd, (json.dumps({'op': 'call', 'id': i, 'kind': 'nope', 'args': {}}) + '\\n').encode())\n"
    )
    before = threading.active_count()
    sb = open_sandbox(mode, wall_s=5)
    grown = []

    def attack() -> None:
        sb.execute(code)
        grown.append(threading.active_count() - before)
        sb.close()

    worker = threading.Thread(target=attack, daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():
        sb._process.kill()
        return "the host hung writing to a REPL that stopped reading"
    return f"{grown[0]} host threads stuck writing to a REPL that stopped reading" if grown[0] > 32 else None


def _late_reply(mode: str) -> str | None:
    """A sub-call of a REPL that died is answered after its restart: the answer must not reach
    the new REPL's sub-call that happens to have the same id."""
    old_asked, old_free = threading.Event(), threading.Event()

    def on_call(kind, args):
        if args["prompt"] == "old":
            old_asked.set()
            old_free.wait(20)
            return "OLD"
        old_free.set()  # the old call answers now, while this one is in flight
        time.sleep(0.5)
        return "NEW"

    with open_sandbox(mode, functions=["llm_query"], on_call=on_call) as sb:
        sb.execute("import os, threading\nthreading.Thread(target=llm_query, args=('old',)).start()")
        assert old_asked.wait(20), "the attack did not run"
        sb.execute("import os\nos._exit(1)")
        answer = sb.execute("print(llm_query('new'))").stdout
    return "a sub-call of the new REPL got the old REPL's answer" if answer == "OLD\n" else None


FORGERY = {
    "forged_future_done": _forged_future_done,
    "forged_value": _forged_value,
    "call_flood": _call_flood,
    "call_kind": _call_kind,
    "long_line": _long_line,
    "stalled_channel": _stalled_channel,
    "late_reply": _late_reply,
}


# --- 5. a cell's own processes (issue 31) -------------------------------------------------------
# Bounded on purpose: a dozen children at most, under max_processes (cgroup pids.max and RLIMIT_NPROC
# on the REPL's own uid), never an unbounded fork loop.


def _timed_out_tree(mode: str) -> str | None:
    """A cell forks 12 children (they sleep, named by a marker) and then outlives its wall
    clock: its timeout ends every one of them, the REPL keeps its variables, and the next cell
    can fork again."""
    mark = marker()
    code = (
        "import os, time\n"
        "for i in range(12):\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', [{mark!r}, '600'])\n"
        "time.sleep(60)\n"
    )
    problems = []
    sb = open_sandbox(mode, max_processes=32, wall_s=3)
    try:
        sb.execute("x = 41")
        result = sb.execute(code)
        assert result.timed_out, f"the attack did not run: {result}"
        left = survivors(mark)  # at once: the timed-out cell's result comes after its processes ended
        if left:
            problems.append(f"{len(left)} processes of the timed-out cell kept running")
        if result.restarted:
            problems.append("the REPL was restarted instead (variables lost)")
        elif "12 killed" not in (result.error or ""):
            problems.append(f"the cell's error does not say its processes were killed: {result.error!r}")
        later = sb.execute("import subprocess\nprint(x + 1, subprocess.run(['/bin/true']).returncode)")
        if later.stdout != "42 0\n":
            problems.append(f"the next cell: {later.stdout!r} {later.error!r}")
    finally:
        sb.close()
        stray = wait_gone(mark, 10)
        if stray:
            subprocess.run(["kill", "-9", *map(str, stray)], capture_output=True)
    return "; ".join(problems) or None


def _forked_child_speaks(mode: str) -> str | None:
    """A child forked by a cell runs a copy of the REPL: one that raises and one that returns
    must not answer for the cell (their result taken for the cell's, the protocol broken, the
    REPL restarted and its variables lost)."""
    code = (
        "import os, sys\n"
        "codes = []\n"
        "for how in ('raise', 'return', 'exit'):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        print('child', how)\n"
        "        if how == 'raise':\n"
        "            raise ValueError('the child failed')\n"
        "        if how == 'exit':\n"
        "            sys.exit(3)\n"
        "        break\n"
        "    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "print('parent', codes)\n"
    )
    problems = []
    with open_sandbox(mode, functions=["llm_query"], on_call=lambda kind, args: "answer") as sb:
        sb.execute("x = 41")
        result = sb.execute(code)
        if result.error is not None or result.restarted or not result.stdout.startswith("parent [1, 0, 3]\n"):
            problems.append(f"the cell's result is not its own: {result.stdout!r} {result.error!r}")
        elif not all(x in result.stdout for x in ("ValueError: the child failed", "child return", "child exit")):
            problems.append(f"what the children printed is missing: {result.stdout!r}")
        sub = sb.execute("import os\npid = os.fork()\nif pid == 0:\n    llm_query('q')\nos.waitpid(pid, 0)")
        if sub.error is not None or "only in the REPL's own process" not in sub.stdout:
            problems.append(f"a child's sub-call: {sub.stdout!r} {sub.error!r}")
        later = sb.execute("print(x + 1)")
        if later.stdout != "42\n" or later.restarted:
            problems.append(f"the REPL lost its variables: {later.stdout!r} {later.error!r}")
    return "; ".join(problems) or None


OWN = {"timed_out_tree": _timed_out_tree, "forked_child_speaks": _forked_child_speaks}

CASES: dict[str, Callable[[str], str | None]] = {**TREES, **CAPS, **FORGERY, **OWN}


# --- the tests --------------------------------------------------------------------------------

needs_modes = pytest.mark.skipif(not MODES, reason=f"no isolation works here: {SKIPPED}")


@needs_modes
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_no_escape(mode, host):
    assert escapes(mode, host) == {}


@needs_modes
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_code_is_contained(case, mode, monkeypatch):
    monkeypatch.setattr(sandbox_process, "_SEND_TIMEOUT_S", 2.0)  # the stalled channel gives up sooner
    assert CASES[case](mode) is None


def test_none_mode_is_refused_where_it_would_need_root():
    """A root host whose Python only root can read cannot run an unprivileged REPL without
    namespaces: ``none`` says so instead of running model code as root."""
    obstacle = sandbox_isolation.none_obstacle()
    if os.geteuid() != 0 or obstacle is None:
        pytest.skip("the host is not root, or its Python is readable by everyone")
    assert isinstance(PROBES["none"], str) and "root" in PROBES["none"]


NO_NAMESPACE_TREE = """
import os, sys, time
from recallm.rlm.sandbox import confine
mark = sys.argv[1]
confine._prctl(confine.PR_SET_CHILD_SUBREAPER, 1)  # the supervisor of ``none`` (confine._enter_supervised)
worker = os.fork()
if worker == 0:
    for i in range(8):  # children, and orphans in their own sessions (they come back to the supervisor)
        if os.fork() == 0:
            if i % 2 and os.fork():
                os._exit(0)
            if i % 2:
                os.setsid()
            os.execv('/bin/sleep', [mark, '600'])
    time.sleep(0.5)
    print('killed', confine.end_other_processes(os.getppid()), flush=True)
    os._exit(0)
print('worker exit', confine._wait_for(worker), flush=True)
"""


def test_a_timeout_ends_the_tree_without_a_pid_namespace():
    """``none`` (no PID namespace; not runnable as root where the interpreter is private): the
    worker's ``end_other_processes`` finds and kills its children and the orphans that went to
    the supervisor, on the host's own ``/proc``, and nothing else."""
    mark = marker()
    done = subprocess.run([sys.executable, "-c", NO_NAMESPACE_TREE, mark], capture_output=True, text=True, timeout=120)
    left = wait_gone(mark, 10)
    if left:
        subprocess.run(["kill", "-9", *map(str, left)], capture_output=True)
    assert "killed 8" in done.stdout and "worker exit 0" in done.stdout, done.stdout + done.stderr[-2000:]
    assert left == []


@needs_modes
@pytest.mark.slow
def test_without_cgroups_the_host_samples_the_memory_of_the_whole_tree(monkeypatch):
    """Where the host may not create cgroups, the tree's memory is sampled and the process count
    is still capped by RLIMIT_NPROC on the REPL's own uid."""
    from recallm.rlm.sandbox import proctree

    monkeypatch.setattr(proctree, "detect_cgroups", lambda: proctree.CgroupSupport((), "not in this test"))
    with open_sandbox(MODES[0], memory_mb=256) as sb:
        result = sb.execute(MEMORY)
        assert sb._process.cgroups is None
    assert result.restarted and result.error_type == "MemoryError" and "memory_mb=256" in result.error
    if os.geteuid() == 0:  # (a non-root host's REPL shares the host user's process count)
        assert _forks(MODES[0]) is None
