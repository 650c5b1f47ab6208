"""The host side of an RLM's REPL: model-written code never runs in the host interpreter.

Each RLM instance gets one ``Sandbox``: a separate Python process (``worker.py`` here)
holding a persistent namespace, talking to the host over two pipes (``protocol.py``).
Model code is hostile until proven otherwise. What protects the host:

* **isolation** (``isolation``), see ``ISOLATION_MODES``:

  - ``bwrap`` (the default): bubblewrap, required. New PID, mount, network, IPC and UTS
    namespaces (no network at all: ``127.0.0.1`` is unreachable), a read-only view of only
    ``/usr``, the Python installation and (optionally) its site-packages; no ``/proc`` of other
    processes, no ``/etc/shadow``, no ``/root``, ``/home`` or project directory.
  - ``namespaces``: the same namespaces and filesystem built by recallm itself
    (``confine.py``), for hosts without bubblewrap where the host is root or unprivileged user
    namespaces work.
  - ``none``: no namespaces: model code shares the host's network and sees every file its
    user may read; only the safeguards below apply. Refused when the host is root and the
    Python installation is not readable by an unprivileged user (the REPL would need root).
  - ``auto``: the first of ``bwrap``, ``namespaces``, ``none`` that works here, with a
    warning, and the result in every trajectory and evaluation report when it is not bwrap.

* **an unprivileged user**: when the host is root, each REPL runs as its own uid
  (``confine.UID_BASE`` + the pid of its first process) with no capabilities and
  ``no_new_privs``; it can neither signal, ptrace nor read the memory or environment of the
  host's processes, nor read root's files. (A non-root host's REPL runs as the host's user with
  no capabilities; under ``none`` the host then makes itself non-dumpable, so that model code
  cannot read its memory or environment.)
* **the whole process tree** is one unit (``proctree.py``): killed together, always - at
  ``close()``, on a timeout, a restart or a protocol violation - by PID namespace, uid, cgroup
  and ancestry; no child, ``setsid`` grandchild or daemon outlives its sandbox. A cell that times
  out in the worker ends every other process of the REPL before it reports (the REPL and its
  variables stay: ``confine.end_other_processes``); a process forked by a cell never speaks the
  protocol (it loses the pipes at the fork and exits where its copy of the cell ends).
* **caps on the whole tree**: ``max_processes`` (processes and threads together:
  ``RLIMIT_NPROC`` on the REPL's own uid, and the cgroup's ``pids.max``), ``memory_mb`` (each
  process's address space, and the resident memory of all of them together: a cgroup where
  the host may create one, else the host samples it every 0.25 s and restarts the REPL when it
  is over), ``home_mb`` (the private directory ``/home/rlm``, a tmpfs; sampled under ``none``),
  ``tmp_mb`` (``/tmp``), ``max_file_mb`` (any single file), CPU time and wall clock per cell, and
  the output a cell returns;
* **a scrubbed environment** (no API keys or other host secrets) and ``python -I -S -B``;
* **a bounded host side**: every message from the REPL is checked; a ``done`` is accepted only
  for the cell in flight (cell ids are random), a reply only for the request in flight, and
  anything else - a forged or late reply, an unknown message, a line longer than
  ``max_message_mb`` - ends the REPL (it is restarted, the cell reports why). Sub-calls run on
  at most ``max_processes`` host threads at once; more in flight, duplicates and kinds the REPL
  was not given are answered with an error at once. Writes to a REPL that stops reading give up
  after ``process._SEND_TIMEOUT_S``.

Sub-calls that model code makes arrive as ``call`` messages; ``on_call(kind, args)`` (the RLM's
sub-call router) answers each on a bounded pool of threads, so that concurrent calls from
threads in a cell, and batched calls, are served at once. Each call gets a ``CancelToken``
(``recallm.cancel.current()`` inside ``on_call``), cancelled when the cell that made it ends
(or is killed) while it is still in flight.

A cell's wall clock counts only its own time: while one of its sub-calls is in flight, the
worker's timer is paused and the host's kill deadline moves by as much. ``execute(max_s=...)``
bounds the whole cell, waits included (the task's remaining wall time): past it, the cell's
sub-calls are cancelled and the cell gets ``kill_grace_s`` to end before it is killed.

This package's public face is what the RLM loop uses: ``Sandbox`` (one REPL), ``SandboxLimits``
(its limits), ``CellResult`` (what a cell did), ``Isolation`` and the functions that choose it,
and ``BudgetSpent`` (what ``on_call`` raises when the task's budget is spent). Its modules:
``repl`` (``Sandbox``), ``process`` (the REPL's processes and channel), ``calls`` (the server of
sub-calls), ``isolation`` (the kinds and what the host builds for them), ``limits``, ``cell``,
and, on the REPL's side, ``worker``, ``protocol``, ``confine`` (standard library only, run as
scripts in the sandbox) with the host's ``proctree``. Nothing outside this package imports them
(the import-linter contracts in pyproject.toml).
"""

from recallm.rlm.sandbox.calls import BudgetSpent, CallHandler
from recallm.rlm.sandbox.cell import CellResult
from recallm.rlm.sandbox.isolation import DEFAULT_ISOLATION, ISOLATION_MODES, Isolation
from recallm.rlm.sandbox.limits import SandboxLimits
from recallm.rlm.sandbox.repl import Sandbox, detect_isolation, probe_isolation, resolve_isolation

__all__ = [
    "Sandbox",
    "SandboxLimits",
    "CellResult",
    "Isolation",
    "ISOLATION_MODES",
    "DEFAULT_ISOLATION",
    "detect_isolation",
    "probe_isolation",
    "resolve_isolation",
    "BudgetSpent",
    "CallHandler",
]
