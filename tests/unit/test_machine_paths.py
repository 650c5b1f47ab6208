"""No tracked file holds an absolute path of a particular machine: a bench report, a config comment or a
fixture reads the same wherever the checkout is.

What counts as a machine's path: the places a machine keeps its own files - home directories (``/home/<user>``,
``/root/...``, ``/Users/<user>``), the development machines' work trees (``/work/...``), temporary directories
of a run (``/tmp/pytest-of-<user>``, ``/tmp/tmpXXXXXXXX``, macOS's ``/var/folders``) - and, found at test time,
this checkout's own location, its virtual environment and the user's home. Not counted: the placeholders
the documentation's example lines use (``/models/...``, ``/data/raw``, ``/scratch/$USER/...``: no machine's
files), system paths code reads (``/proc``, ``/dev/null``, ``/usr/bin``, shebangs) and URLs; a scan of every
absolute path would need an allow-list of all of those. The allow-list below is what legitimately names such a
root, each with its reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO_ROOT

#: the roots where a machine keeps its own files (left unanchored at the start: a path inside a word, a URL's
#: path or a relative path is no absolute path)
MACHINE_ROOTS = (
    r"/home/[^/\s'\"`]+",
    r"/root/",
    r"/Users/[^/\s'\"`]+",
    r"/work/",
    r"/tmp/pytest-of-",
    r"/tmp/tmp[a-z0-9_]{6,}",
    r"/var/folders/",
)
_BEFORE = r"(?<![\w.~$}/:-])"  # not inside a word, a URL (http://host/...), ~/... or ${VAR}/...

#: (file pattern, path pattern, why it is legitimate)
ALLOWED = (
    (r".*", r"/home/rlm\b", "the RLM sandbox's private home inside its own mount namespace (rlm/sandbox/confine.py)"),
    (r"tests/integration/(test_rlm_sandbox|adversarial/test_sandbox)\.py", r"/root/\.bashrc|/proc/1/root/root",
     "the sandbox tests probe that the host's files are hidden from the code it runs"),
)
SELF = Path(__file__).resolve().relative_to(REPO_ROOT.resolve()).as_posix()  # its patterns name the roots


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True)
    return [name for name in done.stdout.decode().split("\0") if name]


def _machine_pattern() -> re.Pattern[str]:
    here = [re.escape(p) + r"(?![\w.-])" for p in (str(REPO_ROOT.resolve()), sys.prefix) if p != "/"]
    home = str(Path.home())
    dynamic = here + ([re.escape(home) + "/"] if home != "/" else [])  # a file under it (not the bare /root, /home)
    return re.compile(_BEFORE + "(" + "|".join([*MACHINE_ROOTS, *dynamic]) + ")")


def _allowed(name: str, line: str, match: re.Match[str]) -> bool:
    rest = line[match.start() :]
    return any(re.fullmatch(files, name) and re.match(path, rest) for files, path, _ in ALLOWED)


def machine_paths(names: list[str]) -> list[str]:
    """``file:line: text`` of every machine path in the named files (binary files skipped)."""
    pattern = _machine_pattern()
    found = []
    for name in names:
        path = REPO_ROOT / name
        if name == SELF or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # an image, a parquet file
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            for match in pattern.finditer(line):
                if not _allowed(name, line, match):
                    found.append(f"{name}:{number}: {line.strip()[:160]}")
    return found


def test_no_tracked_file_holds_a_machine_path():
    found = machine_paths(_tracked())
    assert not found, "absolute paths of a machine (write them relative to the checkout, or as ~/...):\n" + "\n".join(found)


def test_the_scan_finds_what_it_should(tmp_path, monkeypatch):
    """The scan itself: a development machine's report line is found, the allowed and placeholder ones are not."""
    import tests.unit.test_machine_paths as scan

    monkeypatch.setattr(scan, "REPO_ROOT", tmp_path)
    lines = {
        "report.md": "| before | /work/main/outputs/pipeline/toy_rl/eval/before | hf |\n",
        "notes.md": "cached in /home/alice/.cache and /Users/bob/x, a run in /tmp/pytest-of-root/p0\n",
        "ok.md": "recallm-data tokenizer=/models/recallm-qwen data.dataset_root=/data/raw ~/work/x $HOME/x\n"
        "see https://example.org/work/x, /proc/self/status, /dev/null, /usr/bin/env, cwd is /home/rlm\n",
        "tests/integration/test_rlm_sandbox.py": "os.path.exists('/root/.bashrc')\n",
        "other.py": "open('/root/.bashrc')\n",
    }
    for name, text in lines.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = machine_paths(sorted(lines))
    assert [f.split(":")[0] for f in found] == ["notes.md", "notes.md", "notes.md", "other.py", "report.md"], found
