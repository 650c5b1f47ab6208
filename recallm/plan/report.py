"""The printed plan: one :class:`Line` per checked quantity (what is needed against what there is, why, and
the key to change when it does not fit), grouped in sections, and the verdict; its units, ``GiB`` = 2**30
bytes and ``GB`` = 1e9 bytes (disks and bandwidths are sold in GB)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Line", "Plan", "GiB", "GB", "gib"]

GiB = 2**30
GB = 10**9


def gib(value: int) -> str:
    return f"{value / GiB:.1f} GiB"


@dataclass(frozen=True)
class Line:
    """One checked quantity: ``need`` against ``have`` (None: shown, not checked)."""

    section: str
    what: str
    need: float
    have: float | None
    unit: str  # "GiB" | "GB" | "s" | "x" | ""
    why: str
    fix: str = ""

    @property
    def fits(self) -> bool | None:
        return None if self.have is None else self.need <= self.have

    def render(self) -> str:
        def fmt(value: float) -> str:
            if self.unit == "GiB":
                return f"{value / GiB:,.1f} GiB"
            if self.unit == "GB":
                return f"{value / GB:,.0f} GB"
            if self.unit == "s":
                return f"{value:,.0f} s"
            if self.unit == "x":
                return f"{value:.2f}x"
            if self.unit == "h":
                return f"{value / 3600:,.1f} h"
            if self.unit == "/h":
                return f"{value:,.2f} per hour"
            return f"{value:,.0f}"

        verdict = {True: "fits", False: "DOES NOT FIT", None: "info"}[self.fits]
        if self.unit == "flag":
            amount = "needed, " + ("present" if self.fits else "missing")
        else:
            amount = fmt(self.need) if self.have is None else f"{fmt(self.need)} of {fmt(self.have)}"
        text = f"  {self.what:<34} {amount:<26} {verdict}: {self.why}"
        if self.fits is False and self.fix:
            text += f"\n  {'':<34} {'':<26} fix: {self.fix}"
        return text


@dataclass
class Plan:
    title: str
    lines: list[Line] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *args: Any, **kwargs: Any) -> Line:
        line = Line(*args, **kwargs)
        self.lines.append(line)
        return line

    @property
    def misfits(self) -> list[Line]:
        return [line for line in self.lines if line.fits is False]

    @property
    def fits(self) -> bool:
        return not self.misfits

    def render(self) -> str:
        out = [self.title]
        section = None
        for line in self.lines:
            if line.section != section:
                section = line.section
                out.append(section)
            out.append(line.render())
        out += [f"note: {n}" for n in self.notes]
        verdict = "everything fits" if self.fits else f"{len(self.misfits)} thing(s) do not fit"
        out.append(f"verdict: {verdict}")
        return "\n".join(out)

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "fits": self.fits,
            "lines": [{**asdict(line), "fits": line.fits} for line in self.lines],
            "notes": self.notes,
        }
