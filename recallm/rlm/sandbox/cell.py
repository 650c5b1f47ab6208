"""What one cell did (``CellResult``), and the checks of the REPL's replies before they become one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CellResult"]


@dataclass
class CellResult:
    """What one cell did."""

    stdout: str
    stdout_chars: int
    error: str | None
    error_type: str | None
    final: str | None
    timed_out: bool
    elapsed: float
    restarted: bool = False

    @property
    def truncated(self) -> bool:
        return self.stdout_chars > len(self.stdout)

    def as_dict(self) -> dict[str, Any]:
        return {
            "stdout": self.stdout,
            "stdout_chars": self.stdout_chars,
            "error": self.error,
            "error_type": self.error_type,
            "final": self.final,
            "timed_out": self.timed_out,
            "elapsed": round(self.elapsed, 4),
            "restarted": self.restarted,
        }


OPTIONAL_STR = (str, type(None))
DONE_FIELDS = {
    "stdout": (str,),
    "stdout_chars": (int,),
    "error": OPTIONAL_STR,
    "error_type": OPTIONAL_STR,
    "final": OPTIONAL_STR,
    "timed_out": (bool,),
    "elapsed": (int, float),
}
VALUE_FIELDS = {"ok": (bool,), "value": OPTIONAL_STR, "error": OPTIONAL_STR}


def malformed(message: Mapping[str, Any], fields: Mapping[str, tuple[type, ...]]) -> str | None:
    for name, types in fields.items():
        value = message.get(name)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"a {message.get('op')!r} message with {name}={str(value)[:40]!r}"
    return None
