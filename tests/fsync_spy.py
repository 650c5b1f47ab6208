"""A spy on ``os.fsync`` and ``os.replace``: did every atomic rename of the project's code put a file
(or directory) in place that was fsync'd first, and was the directory holding it fsync'd after?"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

OURS = ("recallm", "data_gen", "rewards")


@dataclass
class RenameSpy:
    events: list[tuple] = field(default_factory=list)

    def install(self, monkeypatch) -> RenameSpy:
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd):
            st = os.fstat(fd)
            self.events.append(("fsync", (st.st_dev, st.st_ino)))
            return real_fsync(fd)

        def replace(src, dst, *args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            st = os.stat(src)
            parent = os.stat(Path(dst).resolve().parent)
            self.events.append(("replace", (st.st_dev, st.st_ino), Path(dst), (parent.st_dev, parent.st_ino), caller))
            return real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        return self

    def renamed(self) -> list[Path]:
        """Destinations of our code's renames, in order."""
        return [e[2] for e in self.events if e[0] == "replace" and e[4].startswith(OURS)]

    def problems(self) -> list[str]:
        """Our renames whose source was not fsync'd before, or whose directory was not fsync'd after."""
        out = []
        for i, event in enumerate(self.events):
            if event[0] != "replace" or not event[4].startswith(OURS):
                continue
            _, src, dst, parent, caller = event
            before = {e[1] for e in self.events[:i] if e[0] == "fsync"}
            after = {e[1] for e in self.events[i + 1 :] if e[0] == "fsync"}
            if src not in before:
                out.append(f"{dst} ({caller}): not fsync'd before the rename")
            if parent not in after:
                out.append(f"{dst} ({caller}): its directory not fsync'd after the rename")
        return out
