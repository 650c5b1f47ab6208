"""``recallm-eval backend.name=rlm``: an RLM as an evaluation backend, so that the same runner,
benchmarks (lost in thought, RULER, ...) and report put RecaLLM models and RLMs side by side.

For each request the RLM gets the benchmark's prompt (its system and user messages, joined) as
``context`` and no separate query: the root is told the instructions are inside the context.
The ``Generation`` it returns is shaped like a reasoning model's output, which is how every
benchmark reads answers: the root's visible replies (its "reasoning"), ``</think>``, then
``Answer: <the RLM's answer>`` (nothing after ``</think>`` when the RLM ended without one);
``n_tokens`` is the root's completion tokens; ``finish_reason`` is ``stop`` when the RLM ended
with an answer of its own (``final`` or ``plain_text``) and ``length`` otherwise.

A request with a ``prefix`` (lost in thought's injected continuation) cannot be an RLM task: it
is answered by the root model continuing the rendered prompt directly, so ``injected`` measures
the root model, not the RLM.

Settings come from ``backend.rlm`` (add keys with ``+backend.rlm.<key>=...``; see
``configs/rlm.yaml`` for their meaning): ``root`` (default: the evaluated model through HF, with
``backend.recall_constrained``, ``dtype`` and ``device``), ``sub`` (default: the root), ``rlm``,
``subcalls``, ``sandbox``, ``budget``, ``trajectory_dir`` (default
``outputs/rlm/eval_trajectories``) and ``parallel`` (RLM runs at once within a batch).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recallm.config import typed
from recallm.errors import RecallmError
from recallm.eval.backends import Backend, BackendSettings, Progress
from recallm.eval.types import Generation, GenerationSettings, TextRequest
from recallm.rlm.budget import BudgetLimits
from recallm.rlm.models import make_model
from recallm.rlm.runner import RLM, RLMResult, RLMSettings
from recallm.rlm.sandbox import SandboxLimits
from recallm.rlm.subcalls import SubCallSettings
from recallm.tokens import THINK_END

__all__ = ["RLMBackend", "make_rlm_backend", "rlm_output"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RLMBackendSection:
    """The schema of ``backend.rlm`` (``recallm.config.typed``); its sections have their own:
    ``rlm`` ``RLMSettings``, ``subcalls`` ``SubCallSettings``, ``sandbox`` ``SandboxLimits``, ``budget``
    ``BudgetLimits``, ``root``/``sub`` ``recallm.rlm.models.make_model``."""

    root: dict[str, Any] | None = None
    """None or no ``name``: the evaluated model through HF (module doc)"""
    sub: dict[str, Any] | None = None
    rlm: dict[str, Any] | None = None
    subcalls: dict[str, Any] | None = None
    sandbox: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    trajectory_dir: str | None = "outputs/rlm/eval_trajectories"
    """every example's trajectory (None: none written)"""
    parallel: int = field(default=1, metadata={"min": 1})
    """examples run at once"""
    models_dir: str = "outputs/models"


def rlm_output(result: RLMResult) -> tuple[str, int]:
    """(the generation text of an RLM run, the root's completion tokens); see module doc."""
    turns = [e for e in result.events if e.get("event") == "turn" and e.get("rlm") == "0"]
    reasoning = "\n\n".join(str(e.get("visible", "")) for e in turns).strip()
    tokens = sum(int(e.get("completion_tokens") or 0) for e in turns)
    answer = f"\n\nAnswer: {result.answer}" if result.answer is not None else ""
    return f"{reasoning}\n{THINK_END}{answer}", tokens


def _context(request: TextRequest) -> str:
    if request.messages:
        parts = [str(m.get("content", "")) for m in request.messages if m.get("role") in ("system", "user")]
        return "\n\n".join(p for p in parts if p)
    return request.prompt_text


class RLMBackend(Backend):
    """An RLM behind the evaluation ``Backend`` interface (see module doc)."""

    name = "rlm"

    def __init__(self, rlm: RLM, *, trajectory_dir: str | Path | None = None, parallel: int = 1) -> None:
        if parallel < 1:
            raise RecallmError(f"backend.rlm.parallel must be >= 1, got {parallel}")
        self.rlm = rlm
        self.trajectory_dir = Path(trajectory_dir) if trajectory_dir is not None else None
        self.parallel = int(parallel)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, **self.rlm.describe()}

    def close(self) -> None:
        self.rlm.root_model.close()
        if self.rlm.sub_model is not self.rlm.root_model:
            self.rlm.sub_model.close()

    def _one(self, request: TextRequest) -> Generation:
        if request.prefix:
            reply = self.rlm.root_model.continue_text(
                request.prompt_text, request.prefix, max_new_tokens=request.max_new_tokens, seed=request.seed
            )
            return Generation(reply.text, reply.completion_tokens, reply.finish_reason)
        context = _context(request)
        key = hashlib.sha1(request.prompt_text.encode()).hexdigest()[:16]
        path = self.trajectory_dir / f"{key}.jsonl" if self.trajectory_dir is not None else None
        result = self.rlm.run(context, None, task_id=key, trajectory=path)
        if result.outcome == "error":
            log.warning("RLM run %s ended with an error: %s", key, result.reason)
        text, tokens = rlm_output(result)
        reason = "stop" if result.outcome in ("final", "plain_text") else "length"
        return Generation(text, tokens, reason)

    reports_progress = True

    def generate(
        self, requests: Sequence[TextRequest], settings: GenerationSettings, *, progress: Progress | None = None
    ) -> list[Generation]:
        """``progress``: once per request, as its run ends."""

        def one(request: TextRequest) -> Generation:
            generation = self._one(request)
            if progress is not None:
                progress(generation.n_tokens, 1)
            return generation

        if self.parallel == 1 or len(requests) == 1:
            return [one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.parallel, len(requests))) as pool:
            return list(pool.map(one, requests))


def make_rlm_backend(cfg: BackendSettings, model_path: str | Path, tokenizer) -> RLMBackend:
    """The ``rlm`` backend of ``recallm-eval`` from its ``backend`` section (module doc)."""
    section = typed(RLMBackendSection, cfg.rlm, "backend.rlm")
    settings = RLMSettings.from_mapping(section.rlm, "backend.rlm.rlm")
    subcalls = SubCallSettings.from_mapping(section.subcalls, "backend.rlm.subcalls")
    sandbox = SandboxLimits.from_mapping(section.sandbox, "backend.rlm.sandbox")
    budget = BudgetLimits.from_mapping(section.budget, "backend.rlm.budget")
    models_dir = section.models_dir
    root_cfg = dict(section.root or {})
    if not root_cfg.get("name"):
        root_cfg = {
            "name": "hf",
            "recall_constrained": cfg.recall_constrained,
            "dtype": cfg.dtype,
            "device": cfg.device,
            "batch_size": 16,  # concurrent requests (sub-calls) are generated together
            **{k: v for k, v in root_cfg.items() if k != "name"},
        }
    root = make_model(root_cfg, "backend.rlm.root", models_dir=models_dir, tokenizer=tokenizer, model_path=model_path)
    sub_cfg = dict(section.sub or {})
    sub = None
    if sub_cfg.get("name"):
        sub = make_model(sub_cfg, "backend.rlm.sub", models_dir=models_dir, tokenizer=tokenizer, model_path=model_path)
    rlm = RLM(root, sub, settings=settings, subcalls=subcalls, sandbox=sandbox, budget=budget)
    return RLMBackend(rlm, trajectory_dir=section.trajectory_dir, parallel=section.parallel)
