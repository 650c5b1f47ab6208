"""The evaluation recipe behind ``recallm-eval`` (``recallm.cli.eval`` is its command line).

``run(cfg)`` takes the composed ``configs/eval.yaml``: ``mode=run`` evaluates a model on the
benchmark suites and writes per-example JSONL, ``summary.json`` and (``report=true``) a report;
``mode=report`` compares finished runs. Everything is checked before the first token is generated:
the suite and benchmark settings (unknown benchmark, bad length), the validation parquet files, the
model directory (and its recall tokens when decoding is constrained), that every task reaches its
shortest and longest length, the out_dir (a different configuration's results are never mixed in)
and, for a server or a judge, that it answers. A rerun resumes.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recallm.config import MAX_COUNT, typed
from recallm.errors import RecallmError
from recallm.io import check_out_dir, check_unlocked, lock_dir
from recallm.tiny import resolve_model

__all__ = ["check", "run", "run_report"]

log = logging.getLogger(__name__)

#: backend keys that change what a model writes (the rest - batch size, device, timeouts - do not)
_FINGERPRINT_BACKEND_KEYS = (
    "name",
    "recall_constrained",
    "dtype",
    "length_extension",
    "length_extension_kwargs",
    "force_recall_every",
    "force_recall_length",
    "served_model",
    "api",
    "extra_body",
    "engine_kwargs",
    "rlm",  # backend=rlm: the RLM's models, depth, limits and budget
    "prefill_dtype",  # hf: a prefill in another dtype (recallm.eval.prefill)
)
#: keys recorded only when set (runs without them keep the fingerprint they had before the key existed)
_FINGERPRINT_WHEN_SET = ("rlm", "prefill_dtype")


def _print_summary(summary: dict[str, Any]) -> None:
    for name, bench in summary["benchmarks"].items():
        cells = bench["by_length"]
        row = "  ".join(f"{n}: {100 * cells[n]['all']['score']:.1f} ({cells[n]['all']['n']})" for n in cells)
        usage, n = bench["overall"]["recall_usage"], bench["overall"]["n"]
        print(f"{name:16} score (%) by length (examples)  {row}   | recall usage {100 * usage:.0f}% of {n}")
    if not summary.get("complete", True):
        print(f"incomplete: {summary['n_examples']} of {summary['planned']} examples done; rerun to continue")


def _settings(cfg: DictConfig | Any) -> EvalRun:
    """The command's settings (``EvalRun``), their ``${...}`` resolved."""
    return typed(EvalRun, OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg, "")


def run_report(cfg: DictConfig) -> Path:
    from recallm.eval.report import build_report

    settings = _settings(cfg)
    runs = settings.runs if settings.runs not in (None, ()) else []
    report = build_report(runs, Path(settings.report_dir), curves=settings.curves or None, compare=settings.compare)
    print(f"wrote {report}")
    return report


@dataclass(frozen=True)
class EvalRun:
    """The schema of ``configs/eval.yaml``'s own keys (``recallm.config.typed``; registered with Hydra
    by ``recallm.cli.schemas``); the ``eval`` suite, ``backend`` and ``reward`` sections are read by
    ``recallm.eval`` (benchmarks, backends) and ``rewards.config``."""

    out_dir: str
    eval: dict[str, Any]
    backend: dict[str, Any]
    reward: dict[str, Any]
    mode: str = field(default="run", metadata={"choices": ("run", "report")})
    model_path: str = "tiny"
    """a (RecaLLM) model directory, or ``tiny`` (built under ``models_dir``)"""
    tokenizer_path: str | None = None
    """tokenizer for fitting prompts (None: model_path's)"""
    models_dir: str = "outputs/models"
    run_name: str | None = None
    paper_model: str | None = None
    benchmarks: Any = None
    """None: the suite's enabled benchmarks; or a name or list of names"""
    limit: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    overwrite: bool = False
    progress: bool = True
    report: bool = True
    runs: Any = ()
    """mode=report: run out_dirs (a list) or {name: dir}"""
    report_dir: str = "outputs/eval/report"
    curves: dict[str, Any] | None = None
    compare: list[Any] | None = None
    """mode=report: pairs of run names compared prompt by prompt, ``[[recall, norecall], ...]``
    (``recallm.eval.compare``)"""


def check(cfg: DictConfig) -> None:
    """The command's settings, before anything is written (``recallm.cli.common``)."""
    settings = typed(EvalRun, cfg, "")
    if settings.mode == "report":
        check_out_dir(settings.report_dir, "report_dir")
        return
    check_out_dir(settings.out_dir, "out_dir")
    check_unlocked(settings.out_dir)
    from recallm.eval.runner import check_out_dir_state

    check_out_dir_state(settings.out_dir, settings.overwrite)
    check_out_dir(settings.models_dir, "models_dir")
    from recallm.eval.backends import BackendSettings

    BackendSettings.from_mapping(settings.backend)  # the backend section's schema (recallm.eval.backends)
    if settings.tokenizer_path is not None and not Path(settings.tokenizer_path).is_dir():
        raise RecallmError(f"tokenizer_path {settings.tokenizer_path} is not a directory")


def run(cfg: DictConfig) -> dict[str, Any] | Path:
    """Evaluate (``mode=run``) or compare runs (``mode=report``); the settings are checked first."""
    check(cfg)
    settings = _settings(cfg)
    if settings.mode == "report":
        return run_report(cfg)
    from data_gen.fit import PromptRenderer
    from recallm.eval.backends import BackendSettings, check_model_dir
    from recallm.eval.benchmarks import SuiteSettings, make_benchmarks
    from recallm.eval.runner import preflight
    from recallm.tokens import load_tokenizer

    suite = settings.eval  # make_benchmarks reads it with its schema, SuiteSettings, as suite_settings is
    suite_settings = typed(SuiteSettings, suite, "eval")
    backend_settings = BackendSettings.from_mapping(settings.backend)
    reward_cfg = settings.reward
    only = settings.benchmarks
    if only is not None:
        only = [str(name) for name in only] if isinstance(only, (list, tuple)) else [str(only)]
    from recallm.eval.judge import make_judge

    judge = make_judge(suite_settings.judge)
    benchmarks = make_benchmarks(suite, only=only, reward_config=reward_cfg, judge=judge)
    specs = [s for b in benchmarks for s in b.specs()]
    model_path = resolve_model(settings.model_path, Path(settings.models_dir))
    constrained = backend_settings.recall_constrained
    if backend_settings.name in ("hf", "vllm"):
        info = check_model_dir(model_path, constrained=constrained)
        positions = info["max_position_embeddings"]
        longest = max(s.length for s in specs)
        if positions and longest > positions and not backend_settings.length_extension:
            raise RecallmError(
                f"bad length {longest}: the model has {positions} positions (use shorter lengths or a "
                "backend.length_extension)"
            )
        for b in benchmarks:  # tokens a generation may take: within the model's positions (it ran until killed)
            wanted = b.generation.max_new_tokens
            if positions and wanted > positions and not backend_settings.length_extension:
                raise RecallmError(
                    f"eval.benchmarks.{b.name}: max_new_tokens={wanted} is more than the model's {positions} positions "
                    f"(max_position_embeddings of {model_path}): use at most {positions} (eval.generation.max_new_tokens)"
                )
    tokenizer = load_tokenizer(Path(settings.tokenizer_path) if settings.tokenizer_path else model_path)
    renderer = PromptRenderer(tokenizer, suite_settings.system_prompt)
    if judge is not None:
        judge.ping()
    log.info("checking that every task reaches its lengths")
    preflight(benchmarks, specs, renderer)
    out_dir = Path(settings.out_dir)
    fingerprint = {
        "model_path": str(model_path.resolve()) if model_path.exists() else str(model_path),
        "tokenizer": str(Path(settings.tokenizer_path).resolve()) if settings.tokenizer_path else None,
        "backend": {
            k: getattr(backend_settings, k)
            for k in _FINGERPRINT_BACKEND_KEYS
            if k not in _FINGERPRINT_WHEN_SET or getattr(backend_settings, k)
        },
        "suite": {k: getattr(suite_settings, k) for k in ("seed", "tolerance", "answer_region", "system_prompt")},
        "benchmarks": {b.name: {"settings": b.describe(), "generation": asdict(b.generation)} for b in benchmarks},
        "reward": reward_cfg if any(b.name == "in_domain" for b in benchmarks) else None,
    }
    with lock_dir(out_dir, "recallm-eval"):  # one run per out_dir: a second is refused, not run twice
        return _run_locked(settings, out_dir, fingerprint, model_path, tokenizer, renderer, benchmarks, specs, judge)


def _run_locked(settings, out_dir, fingerprint, model_path, tokenizer, renderer, benchmarks, specs, judge):
    from recallm.eval.backends import BackendSettings, make_backend
    from recallm.eval.benchmarks import SuiteSettings
    from recallm.eval.report import build_report
    from recallm.eval.runner import prepare_out_dir, run_eval

    suite_settings = typed(SuiteSettings, settings.eval, "eval")
    backend_settings = BackendSettings.from_mapping(settings.backend)
    constrained = backend_settings.recall_constrained
    prepare_out_dir(out_dir, fingerprint, overwrite=settings.overwrite)
    run_info = {
        "name": settings.run_name or out_dir.name,
        "model_path": settings.model_path,
        "backend": backend_settings.name,
        "recall_constrained": constrained,
        "suite": suite_settings.name,
        "paper_model": settings.paper_model,
        "judge": judge.model if judge is not None else None,
    }
    print(
        f"evaluating {model_path} ({backend_settings.name}) on {', '.join(b.name for b in benchmarks)}: "
        f"{len(specs)} examples into {out_dir}"
    )
    backend = make_backend(backend_settings, model_path, tokenizer)
    if backend_settings.name == "rlm":  # where model code ran: the report flags it unless it was bubblewrap
        run_info["rlm_isolation"] = backend.rlm.isolation.as_dict()
    try:
        summary = run_eval(
            benchmarks,
            backend,
            renderer,
            out_dir,
            batch_size=backend_settings.batch_size,
            fingerprint=fingerprint,
            run_info=run_info,
            progress=settings.progress,
            limit=settings.limit,
            specs=specs,
        )
    finally:
        backend.close()
        if judge is not None:
            judge.close()
    _print_summary(summary)
    if settings.report:
        report = build_report({run_info["name"]: out_dir}, out_dir)
        print(f"wrote {out_dir / 'summary.json'} and {report}")
    return summary
