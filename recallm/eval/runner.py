"""The evaluation loop: examples -> batched generation -> scores -> JSONL, resumable; the summary.

``run_eval`` plans every example of the benchmarks (ids only), skips the ones already in
``<out_dir>/results.jsonl``, and for each batch of pending examples (one benchmark per batch,
sorted by length, then task): builds the prompts, generates, generates the follow-ups the benchmark asks
for (the lost-in-thought injection), scores, and appends one JSON line per example - flushed and
fsynced once per batch. A crash loses at most the batch in flight; a partial last line (the
process died mid-write) is cut off on the next start, never parsed. A rerun with the same
configuration does only what is left and writes the same ``summary.json``; a rerun with another
configuration (model, backend, generation settings, benchmark settings, tokenizer) in the same
``out_dir`` is refused (``overwrite=True`` starts over).

Progress (``progress=True``): a bar of examples that moves as each example's generation ends
(backends with ``reports_progress``: HF, vLLM, OpenAI-compatible, RLM; another backend's moves once
per batch), with the tokens generated so far and tokens per second, follow-ups included; the same
totals are logged at the end.

Files in ``out_dir``: ``results.jsonl`` (per example: benchmark, task, example id, length,
prompt tokens, prompt id (a hash of the prompt text), output, output tokens, finish reason,
parsed answer, score, correct, metrics, the reference answers (``gold``, where the benchmark gives
them), recall spans (count, verbatim, each span's verdict), follow-up), ``run.json``
(the fingerprint) and ``summary.json`` (``summarize``).

Summary: per benchmark, per length and task (category for in-domain) and for all tasks of a
length: ``n``, ``score`` (mean), ``correct`` (share), every metric the benchmark reports (mean
over the examples that have it), ``recall_usage`` (share of outputs with at least one recall
span), ``spans_per_output``, ``span_verbatim_rate`` (verbatim spans / spans; null without
spans), ``output_tokens`` (mean), ``truncated`` (share cut at max_new_tokens); the same per task
over all lengths and overall; plus the benchmark's own tables (``extra``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError
from recallm.eval.backends import Backend
from recallm.eval.benchmarks.base import Benchmark, example_seed
from recallm.eval.scoring import text_span_stats
from recallm.eval.types import Example, Generation, Spec, TextRequest
from recallm.io import forget_files, record_files, write_json_atomic

__all__ = [
    "RESULTS_FILE",
    "SUMMARY_FILE",
    "RUN_FILE",
    "preflight",
    "run_eval",
    "read_results",
    "check_out_dir_state",
    "summarize",
    "cell_metrics",
]

log = logging.getLogger(__name__)

RESULTS_FILE, SUMMARY_FILE, RUN_FILE = "results.jsonl", "summary.json", "run.json"


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The finished records of a results file. Bytes after its last newline are a line cut short
    by a crash: they are removed from the file (so that appending continues cleanly). Any other
    line that is not JSON is a ``RecallmError`` naming it."""
    path = Path(path)
    if path.is_dir():
        raise RecallmError(f"{path} is a directory, not a results file; move it away")
    if not path.is_file():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        log.warning("%s: dropping a partial last line (%d bytes) left by an interrupted run", path, len(data) - end)
        with path.open("r+b") as f:
            f.truncate(end)
    records = []
    for number, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 JSON"
            raise RecallmError(f"{path}:{number}: not valid JSON ({why}); the results file is damaged") from None
        if not isinstance(record, dict):
            raise RecallmError(f"{path}:{number}: not a result record (a JSON object); the results file is damaged")
        records.append(record)
    return records


def check_out_dir_state(out_dir: str | Path, overwrite: bool = False) -> None:
    """What ``prepare_out_dir`` refuses without reading the configuration: a results file that is a
    directory, results without the ``run.json`` that says which configuration wrote them (checked
    before a run writes anything, its lock file included)."""
    out_dir = Path(out_dir)
    results = out_dir / RESULTS_FILE
    if results.is_dir():
        raise RecallmError(f"{results} is a directory, not a results file; move it away")
    if not overwrite and results.exists() and not (out_dir / RUN_FILE).is_file():
        raise RecallmError(
            f"{out_dir} holds {RESULTS_FILE} without its {RUN_FILE}: which configuration wrote them cannot be "
            "checked; use another out_dir, or overwrite=true to start over"
        )


def prepare_out_dir(out_dir: str | Path, fingerprint: Mapping[str, Any], overwrite: bool = False) -> None:
    """Refuse an ``out_dir`` holding results of another configuration (``overwrite`` deletes them);
    record ``fingerprint`` in ``run.json``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_file = out_dir / RUN_FILE
    results = out_dir / RESULTS_FILE
    fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True, default=str))
    check_out_dir_state(out_dir, overwrite)
    if overwrite:
        for name in (RESULTS_FILE, SUMMARY_FILE, RUN_FILE):
            if (out_dir / name).is_dir():
                raise RecallmError(f"{out_dir / name} is a directory, not a file; move it away")
            (out_dir / name).unlink(missing_ok=True)
    if not overwrite and run_file.is_file() and results.exists():
        try:
            previous = json.loads(run_file.read_bytes().decode("utf-8")).get("fingerprint")
        except (UnicodeDecodeError, ValueError, AttributeError, RecursionError, OSError):
            previous = None
        if previous != fingerprint:
            keys = sorted(_diff(previous or {}, fingerprint)) or ["(unreadable run.json)"]
            raise RecallmError(
                f"{out_dir} holds results of another configuration (differs in {', '.join(keys[:6])}); "
                "use another out_dir, or overwrite=true to start over"
            )
    write_json_atomic(run_file, {"fingerprint": fingerprint})


def _diff(a: Any, b: Any, prefix: str = "") -> set[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out: set[str] = set()
        for key in set(a) | set(b):
            out |= _diff(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return set() if a == b else {prefix.rstrip(".") or "(all)"}


def _batches(specs: Sequence[Spec], size: int) -> Iterable[list[Spec]]:
    batch: list[Spec] = []
    for spec in specs:
        if batch and (len(batch) >= size or spec.benchmark != batch[0].benchmark):
            yield batch
            batch = []
        batch.append(spec)
    if batch:
        yield batch


def _seed(base: int, example_id: str, stage: int = 0) -> int:
    return example_seed(base, example_id, stage) % (2**31 - 1)


def content_id(messages: Sequence[Mapping[str, Any]]) -> str:
    """The id of a prompt's content — its chat messages before any chat template renders them. Two runs
    whose models render the same messages differently (a base model's own template, a reasoning model's
    ``<think>`` prefix) have other ``prompt_id``s and the same ``content_id``: the same question
    (``recallm.eval.compare`` pairs them by it)."""
    text = json.dumps([dict(m) for m in messages], sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _record(
    example: Example, generation: Generation, score, followup, followup_generation: Generation | None
) -> dict[str, Any]:
    spans = generation.spans or text_span_stats(generation.text, example.prompt_text)
    spec = example.spec
    return {
        "benchmark": spec.benchmark,
        "task": spec.task,
        "example_id": spec.example_id,
        "length": spec.length,
        "index": spec.index,
        "prompt_tokens": example.prompt_tokens,
        "prompt_id": hashlib.sha1(example.prompt_text.encode()).hexdigest()[:16],
        "content_id": content_id(example.messages),
        "output": generation.text,
        "output_tokens": generation.n_tokens,
        "finish_reason": generation.finish_reason,
        "answer": score.answer,
        "score": float(score.score),
        "correct": bool(score.correct),
        "metrics": {k: float(v) for k, v in score.metrics.items()},
        **({"gold": [str(g) for g in score.gold]} if score.gold is not None else {}),
        "spans": spans.as_dict(),
        "followup": None
        if followup is None
        else {
            "prefix": followup.prefix,
            "output": followup_generation.text,
            "output_tokens": followup_generation.n_tokens,
        },
    }


class _Progress:
    """The bar of ``run_eval`` (module doc): examples as they finish, tokens and tokens/s."""

    _REFRESH_S = 0.5

    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="eval", unit="ex", disable=not enabled)
        self.lock = threading.Lock()
        self.started = time.perf_counter()
        self.tokens = 0
        self.counted = 0  # examples of the batch in flight counted as finished so far
        self.shown = 0.0

    def batch(self, size: int, *, examples: bool = True):
        """The callback for one backend call: ``examples`` counts its finished requests as examples
        (at most ``size``); a follow-up call adds only its tokens."""

        def report(tokens: int, finished: int) -> None:
            with self.lock:
                self.tokens += tokens
                n = min(finished, size - self.counted) if examples else 0
                self.counted += n
                now = time.perf_counter()
                if n or now - self.shown >= self._REFRESH_S:
                    self.shown = now
                    self.bar.set_postfix_str(self._rate(now), refresh=False)
                    if n:
                        self.bar.update(n)
                    else:
                        self.bar.refresh()

        return report

    def _rate(self, now: float) -> str:
        seconds = max(now - self.started, 1e-9)
        return f"{self.tokens} tokens, {self.tokens / seconds:.1f} tokens/s"

    def end_batch(self, size: int) -> None:
        """The batch's examples are written: count those its backend did not report."""
        with self.lock:
            self.bar.set_postfix_str(self._rate(time.perf_counter()), refresh=False)
            self.bar.update(size - self.counted)
            self.counted = 0

    def close(self) -> None:
        self.bar.close()
        seconds = time.perf_counter() - self.started
        if self.tokens:
            log.info("generated %d tokens in %.0f s (%.1f tokens/s)", self.tokens, seconds, self.tokens / seconds)


def preflight(benchmarks: Sequence[Benchmark], specs: Sequence[Spec], renderer) -> int:
    """Build, for every benchmark and task, the first example at its shortest and its longest
    length: a length a task cannot reach (too short for its fixed part, or beyond its material)
    or a data file that does not fit the tokenizer fails here, before anything is generated.
    Returns the number of examples built."""
    by_name = {b.name: b for b in benchmarks}
    firsts: dict[tuple[str, str, int], Spec] = {}
    for spec in specs:
        firsts.setdefault((spec.benchmark, spec.task, spec.length), spec)
    chosen = []
    for bench, task in sorted({(b, t) for b, t, _ in firsts}):
        lengths = sorted(n for b, t, n in firsts if (b, t) == (bench, task))
        chosen += [firsts[(bench, task, n)] for n in sorted({lengths[0], lengths[-1]})]
    for spec in chosen:
        by_name[spec.benchmark].build(spec, renderer)
    return len(chosen)


def run_eval(
    benchmarks: Sequence[Benchmark],
    backend: Backend,
    renderer,
    out_dir: str | Path,
    *,
    batch_size: int = 8,
    fingerprint: Mapping[str, Any] | None = None,
    run_info: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    limit: int | None = None,
    specs: Sequence[Spec] | None = None,
) -> dict[str, Any]:
    """Run (or finish) an evaluation into ``out_dir``; returns the summary (see module doc).

    ``limit`` stops after that many new examples (smoke runs; the rest is done by a rerun).
    ``specs``: the plan when the caller already made it (``benchmark.specs()`` of each).
    """
    if batch_size < 1:
        raise RecallmError(f"batch_size must be >= 1, got {batch_size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_name = {b.name: b for b in benchmarks}
    # by length, then benchmark and task: a batch holds prompts of one length and, where it can, one task
    # (similar prompt and output lengths: less padding, and fewer rows that wait for a long one to finish)
    plan = sorted(
        specs if specs is not None else [s for b in benchmarks for s in b.specs()],
        key=lambda s: (s.length, s.benchmark, s.task, s.index),
    )
    ids = [s.example_id for s in plan]
    if len(set(ids)) != len(ids):
        raise RecallmError("two examples share an id; a benchmark is listed twice")
    prepare_out_dir(out_dir, fingerprint or {}, overwrite)
    results = out_dir / RESULTS_FILE
    done = {r.get("example_id") for r in read_results(results)}
    forget_files(out_dir, [RESULTS_FILE, SUMMARY_FILE])  # appended to now: checksummed again at the end
    pending = [s for s in plan if s.example_id not in done]
    if limit is not None:
        pending = pending[: max(0, int(limit))]
    log.info("%d examples planned, %d done, %d to run now", len(plan), len(done & set(ids)), len(pending))
    bar = _Progress(len(pending), progress and bool(pending))
    reports = bool(getattr(backend, "reports_progress", False))

    def call(requests: list[TextRequest], settings, examples: bool) -> list[Generation]:
        if not reports:
            return backend.generate(requests, settings)
        return backend.generate(requests, settings, progress=bar.batch(len(requests), examples=examples))

    try:
        with results.open("a") as f:
            for batch in _batches(pending, batch_size):
                bench = by_name[batch[0].benchmark]
                settings = bench.generation
                examples = [bench.build(spec, renderer) for spec in batch]
                requests = [
                    TextRequest(
                        e.prompt_text, tuple(e.messages), settings.max_new_tokens, _seed(settings.seed, e.example_id)
                    )
                    for e in examples
                ]
                generations = call(requests, settings, True)
                followups = bench.followup_batch(examples, generations)
                asked = [i for i, fu in enumerate(followups) if fu is not None]
                second: dict[int, Generation] = {}
                if asked:
                    extra = [
                        TextRequest(
                            examples[i].prompt_text,
                            None,
                            followups[i].max_new_tokens,
                            _seed(settings.seed, examples[i].example_id, 1),
                            prefix=followups[i].prefix,
                        )
                        for i in asked
                    ]
                    second = dict(zip(asked, call(extra, settings, False), strict=True))
                continued = [second.get(i) for i in range(len(examples))]
                scores = bench.score_batch(examples, generations, continued)
                lines = [
                    json.dumps(_record(example, generation, score, followup, extra)) + "\n"
                    for example, generation, score, followup, extra in zip(
                        examples, generations, scores, followups, continued, strict=True
                    )
                ]
                f.write("".join(lines))
                f.flush()
                os.fsync(f.fileno())
                bar.end_batch(len(batch))
    finally:
        bar.close()
    planned, seen = set(ids), set()
    records = []
    for r in read_results(results):  # the planned examples, each once
        if r.get("example_id") in planned and r["example_id"] not in seen:
            seen.add(r["example_id"])
            records.append(r)
    summary = summarize(records, benchmarks, run_info)
    summary["complete"] = len(records) == len(plan)
    summary["planned"] = len(plan)
    write_json_atomic(out_dir / SUMMARY_FILE, summary)
    record_files(out_dir, [RESULTS_FILE, SUMMARY_FILE])  # verified where the report reads them
    return summary


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def cell_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The generic metrics of a group of records (see module doc)."""
    spans = sum(int(r["spans"]["count"]) for r in records)
    verbatim = sum(int(r["spans"]["verbatim"]) for r in records)
    out: dict[str, Any] = {
        "n": len(records),
        "score": _mean([float(r["score"]) for r in records]),
        "correct": _mean([float(bool(r["correct"])) for r in records]),
        "recall_usage": _mean([float(int(r["spans"]["count"]) > 0) for r in records]),
        "spans_per_output": _mean([float(r["spans"]["count"]) for r in records]),
        "span_verbatim_rate": verbatim / spans if spans else None,
        "output_tokens": _mean([float(r["output_tokens"]) for r in records]),
        "truncated": _mean([float(r.get("finish_reason") == "length") for r in records]),
    }
    names = sorted({k for r in records for k in (r.get("metrics") or {})})
    for name in names:
        if name not in out:
            out[name] = _mean([float(r["metrics"][name]) for r in records if name in (r.get("metrics") or {})])
    return out


def summarize(
    records: Sequence[Mapping[str, Any]],
    benchmarks: Sequence[Benchmark] = (),
    run_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``summary.json`` of a set of records (a pure function of them and the run's info)."""
    by_name = {b.name: b for b in benchmarks}
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(r["benchmark"], []).append(r)
    out: dict[str, Any] = {}
    for name in sorted(groups):
        recs = groups[name]
        by_length: dict[str, Any] = {}
        for length in sorted({int(r["length"]) for r in recs}):
            at = [r for r in recs if int(r["length"]) == length]
            cell = {"all": cell_metrics(at)}
            for task in sorted({r["task"] for r in at}):
                cell[task] = cell_metrics([r for r in at if r["task"] == task])
            by_length[str(length)] = cell
        by_task = {
            task: cell_metrics([r for r in recs if r["task"] == task]) for task in sorted({r["task"] for r in recs})
        }
        entry = {"overall": cell_metrics(recs), "by_length": by_length, "by_task": by_task}
        if name in by_name:
            entry["extra"] = by_name[name].summarize(recs)
        out[name] = entry
    return {"run": dict(run_info or {}), "n_examples": len(records), "benchmarks": out}
