"""Generate a mixture: train rows, validation cells (category × length), SFT traces, a summary.

The schedule comes from a mixture config (``configs/data/*.yaml``)::

    train:  {lengths: [lo, hi], entries: [{task, count, lengths?, params?}, ...]}
    val:    {lengths: [4096, 8192, ...], per_cell: 50, categories: null}   # null: every category present
    sft:    {count: 0, val_fraction: 0.1}   # programmatic traces of synthetic tasks

Everything is validated before any work starts (unknown task, bad parameter, negative count,
a length a task cannot reach). Each row's RNG is seeded from ``(seed, split, task, i)``, so the
output does not depend on how rows are spread over worker processes. Work is written in shards
(atomically: temporary file, fsync, rename); a restarted run skips the shards already written for
the same schedule, so an interrupted run resumes without corrupting anything. The shard manifest and
the summaries are written atomically too. One run writes an ``out_dir`` at a time: ``run_schedule``
holds its lock (``recallm.io.lock_dir``), and a second writer — another schedule deleting and
rewriting the shards under the same names — is refused with a one-line error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_gen.base import Row, Task, make_task
from data_gen.fit import DEFAULT_TOLERANCE, DraftTooLong, PromptRenderer, build_row
from data_gen.io import read_records, row_record, write_parquet
from recallm.config import MAX_SEED, MAX_WORKERS
from recallm.errors import RecallmError
from recallm.io import (
    MANIFEST_FILE,
    file_problem,
    lock_dir,
    record_files,
    write_json_atomic,
    write_jsonl,
    write_text_atomic,
)

__all__ = ["DataRun", "RowJob", "RowSchedule", "Mixture", "TrainEntry", "schedule_from_config", "run_schedule", "summarize"]

log = logging.getLogger(__name__)
SHARD_ROWS = 500
_MAX_REDRAWS = 50


@dataclass(frozen=True)
class RowJob:
    """``count`` rows of one task, for one split, lengths drawn uniformly from ``lengths``.

    A train entry's ``val_params`` (merged over its ``params``) make its validation jobs: how a
    dataset-backed task points its validation cells at held-out data (its eval split)."""

    split: str  # "train", "val/<category>_<length>" or "sft"
    task: str
    params: tuple[tuple[str, Any], ...]
    count: int
    lengths: tuple[int, int]

    def key(self) -> str:
        return f"{self.split}|{self.task}|{json.dumps(dict(self.params), sort_keys=True, default=str)}"


@dataclass
class RowSchedule:
    jobs: list[RowJob]
    seed: int
    tolerance: float
    store_prompt_text: bool
    system_prompt: str | None
    sft_val_fraction: float
    skipped: list[str] = field(default_factory=list)

    def fingerprint(self, tokenizer_name: str) -> str:
        blob = json.dumps(
            [tokenizer_name, self.seed, self.tolerance, self.store_prompt_text, self.system_prompt]
            + [(j.split, j.task, list(j.params), j.count, j.lengths) for j in self.jobs],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _lengths(value, where: str) -> tuple[int, int]:
    if isinstance(value, int):
        lo = hi = value
    else:
        try:
            lo, hi = (int(v) for v in value)
        except (TypeError, ValueError):
            raise RecallmError(f"{where}: lengths must be an integer or [min, max], got {value!r}") from None
    if not 1 <= lo <= hi:
        raise RecallmError(f"{where}: lengths must satisfy 1 <= min <= max, got [{lo}, {hi}]")
    return lo, hi


def _params(value) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise RecallmError(f"task params must be a mapping, got {value!r}")
    return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))


def _freeze(v):
    if isinstance(v, Mapping):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


def _thaw(v):
    if isinstance(v, tuple):
        if v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v):
            return {k: _thaw(x) for k, x in v}
        return [_thaw(x) for x in v]
    return v


def _task(job: RowJob) -> Task:
    return make_task(job.task, **{k: _thaw(v) for k, v in job.params})


def _non_negative(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if value < 0:
            raise RecallmError(f"{name} must be a non-negative integer, got {value!r}")


#: rows of one train entry, validation cell or the SFT traces: the paper's whole mixture is ~10^5 rows; more is a
#: typo (``data.val.per_cell=10**9`` started generating 9e9 rows). What the disk holds is checked too (``schedule_bytes``).
MAX_ROWS = 10_000_000
#: the least a row takes on disk per token of its length (prompt text in parquet, compressed): ``schedule_bytes``
BYTES_PER_TOKEN = 2


@dataclass(frozen=True)
class TrainEntry:
    """One of ``train.entries``: ``count`` rows of ``task`` (with ``params``) at ``lengths``."""

    task: str
    count: int = field(default=0, metadata={"max": MAX_ROWS})
    lengths: Any = None
    """an integer or ``[min, max]`` (default: ``train.lengths``)"""
    params: dict[str, Any] | None = None
    val_params: dict[str, Any] | None = None
    """dataset-backed tasks: what the validation rows change (their held-out split)"""

    @classmethod
    def from_mapping(cls, cfg: Mapping, where: str) -> TrainEntry:
        """The entry at ``where`` (``train.entries[i]``), its count in ``[0, MAX_ROWS]``."""
        from recallm.config import typed

        entry = typed(cls, cfg, where)
        if entry.count < 0:
            raise RecallmError(f"{where}: count must be a non-negative integer, got {entry.count!r}")
        return entry


@dataclass(frozen=True)
class TrainSection:
    lengths: Any = None
    """the entries' default lengths: an integer or ``[min, max]``"""
    entries: list[Any] = field(default_factory=list)
    """``TrainEntry`` mappings"""


@dataclass(frozen=True)
class ValSection:
    lengths: list[Any] = field(default_factory=list)
    per_cell: int = field(default=0, metadata={"max": MAX_ROWS})
    """rows per (category, length) cell; 0: no validation cells"""
    categories: Any = None
    """None: every category present"""

    def __post_init__(self) -> None:
        _non_negative(self, "per_cell")


@dataclass(frozen=True)
class SFTSection:
    count: int = field(default=0, metadata={"max": MAX_ROWS})
    """programmatic traces of the synthetic train tasks"""
    val_fraction: float = field(default=0.1, metadata={"min": 0, "max": 1})
    """the share of the traces held out for validation (below 1)"""

    def __post_init__(self) -> None:
        _non_negative(self, "count")
        if not 0 <= self.val_fraction < 1:
            raise RecallmError(f"val_fraction must be in [0, 1), got {self.val_fraction}")


@dataclass(frozen=True)
class Mixture:
    """The schema of a mixture config (``configs/data/*.yaml``, the ``data`` section of
    ``configs/data.yaml``; read with ``recallm.config.typed``). The defaults live here."""

    name: str | None = None
    seed: int = field(default=0, metadata={"min": 0, "max": MAX_SEED})
    tolerance: float = DEFAULT_TOLERANCE
    """prompts are fitted to length +- this fraction (in (0, 0.5): ``__post_init__``)"""
    store_prompt_text: bool = False
    system_prompt: str | None = None
    train: TrainSection = field(default_factory=TrainSection)
    val: ValSection = field(default_factory=ValSection)
    sft: SFTSection = field(default_factory=SFTSection)
    dataset_root: str | None = None
    """where dataset-backed tasks' local copies live (the entries' paths interpolate it)"""
    dense_model: str | None = None
    """an encoder directory the entries' dense negatives interpolate"""
    wiki_corpus: str | None = None
    """a chunked local Wikipedia the entries interpolate"""

    def __post_init__(self) -> None:
        if not 0 < self.tolerance < 0.5:
            raise RecallmError(f"tolerance must be in (0, 0.5), got {self.tolerance}")


@dataclass(frozen=True)
class DataRun:
    """The schema of ``configs/data.yaml``'s own keys, ``recallm-data``'s (``recallm.config.typed``;
    registered with Hydra by ``recallm.cli.schemas``); the ``data`` group is ``schedule_from_config``'s."""

    out_dir: str
    data: dict[str, Any]
    tokenizer: str = "tiny"
    """a RecaLLM model/tokenizer directory, or ``tiny`` (the embedded tiny default)"""
    workers: int = field(default=2, metadata={"min": 1, "max": MAX_WORKERS})
    progress: bool = True


def schedule_from_config(cfg: Mapping, where: str = "data") -> RowSchedule:
    """Validate a mixture config (``Mixture``; ``where`` names its section in errors) and turn it into
    jobs (raises ``RecallmError`` on any problem)."""
    from recallm.config import typed

    mixture = typed(Mixture, cfg, where)
    jobs: list[RowJob] = []
    skipped: list[str] = []
    val_sources: dict[int, tuple] = {}
    for n, raw in enumerate(mixture.train.entries):
        at = f"train.entries[{n}]"
        if not isinstance(raw, Mapping) or "task" not in raw:
            raise RecallmError(f"{at} must be a mapping with a 'task', got {raw!r}")
        entry = TrainEntry.from_mapping(raw, at)
        count = entry.count
        lengths = _lengths(entry.lengths if entry.lengths is not None else mixture.train.lengths, at)
        job = RowJob("train", entry.task, _params(entry.params), count, lengths)
        task = _task(job)
        task.check_length(lengths[0])
        task.check_length(lengths[1])
        if count:
            jobs.append(job)
            # validation rows of dataset-backed tasks come from held-out data: `val_params` override
            val_params = {**dict(_thaw(job.params) or {}), **(entry.val_params or {})}
            val_sources[len(jobs) - 1] = _params(val_params)
    per_cell = mixture.val.per_cell
    if not jobs and not per_cell:
        raise RecallmError("the mixture has no rows to generate (every train count is 0 and val.per_cell is 0)")
    if per_cell:
        val_lengths = [_lengths(x, "val.lengths")[0] for x in mixture.val.lengths]
        wanted = mixture.val.categories
        by_category: dict[str, list[RowJob]] = defaultdict(list)
        for n, job in enumerate(jobs):
            val_job = RowJob(job.split, job.task, val_sources[n], job.count, job.lengths)
            by_category[_task(val_job).category].append(val_job)
        categories = list(by_category) if wanted is None else list(wanted)
        for category in categories:
            if category not in by_category:
                raise RecallmError(f"val.categories: no train entry has category {category!r}")
            natural = [j for j in by_category[category] if _task(j).natural_length]
            for i, job in enumerate(natural):  # one cell, at the train lengths (upper bounds)
                share = per_cell // len(natural) + (i < per_cell % len(natural))
                if share:
                    jobs.append(RowJob(f"val/{category}", job.task, job.params, share, job.lengths))
            for length in val_lengths:
                reachable = []
                for job in by_category[category]:
                    task = _task(job)
                    if task.natural_length:
                        continue
                    try:
                        task.check_length(length)
                        reachable.append(job)
                    except RecallmError:
                        skipped.append(f"val {category} @ {length}: {task.name} cannot reach it")
                if not reachable:
                    continue
                for i, job in enumerate(reachable):  # split the cell evenly over the category's tasks
                    share = per_cell // len(reachable) + (i < per_cell % len(reachable))
                    if share:
                        jobs.append(RowJob(f"val/{category}_{length}", job.task, job.params, share, (length, length)))
    sft_count = mixture.sft.count
    if sft_count:
        traced = [j for j in jobs if j.split == "train" and type(_task(j)).trace is not Task.trace]
        if not traced:
            raise RecallmError("sft.count > 0 but no train entry has a programmatic trace (synthetic tasks do)")
        total = sum(j.count for j in traced)
        shares = [sft_count * j.count // total for j in traced]
        for i in range(sft_count - sum(shares)):  # the remainder, one each
            shares[i % len(shares)] += 1
        jobs += [RowJob("sft", j.task, j.params, n, j.lengths) for j, n in zip(traced, shares, strict=True) if n]
        fraction = mixture.sft.val_fraction
        if fraction > 0 and not int(round(fraction * sft_count)):  # (the split _assemble makes)
            count_needed = int(0.5 / fraction) + 1
            fraction_needed = next(f / 100 for f in range(1, 100) if round(f / 100 * sft_count) >= 1)
            raise RecallmError(
                f"{where}.sft.count={sft_count} x {where}.sft.val_fraction={fraction} leaves no SFT validation traces "
                f"({fraction * sft_count:.2g} rounds to 0): use {where}.sft.count={count_needed} or "
                f"{where}.sft.val_fraction={fraction_needed} (or {where}.sft.val_fraction=0 for none)"
            )
    return RowSchedule(
        jobs=jobs,
        seed=mixture.seed,
        tolerance=mixture.tolerance,
        store_prompt_text=mixture.store_prompt_text,
        system_prompt=mixture.system_prompt,
        sft_val_fraction=mixture.sft.val_fraction,
        skipped=skipped,
    )


def schedule_bytes(schedule: RowSchedule) -> int:
    """The least disk space the schedule's rows take: rows x their longest length x ``BYTES_PER_TOKEN`` (a floor:
    ``recallm-data`` refuses a schedule the output's disk cannot hold before the first row is generated)."""
    return sum(job.count * max(job.lengths) * BYTES_PER_TOKEN for job in schedule.jobs)


# ----------------------------------------------------------------------------- workers
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_dir: str, system_prompt: str | None) -> None:
    from recallm.tokens import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    _WORKER.update(tokenizer=tokenizer, renderer=PromptRenderer(tokenizer, system_prompt), tasks={})


def _row_seed(seed: int, job: RowJob, i: int) -> int:
    digest = hashlib.sha256(f"{seed}|{job.key()}|{i}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)  # fits parquet int64


def _make_rows(job: RowJob, start: int, stop: int, seed: int, tolerance: float, store_prompt_text: bool) -> list:
    from data_gen.traces import programmatic_trace, sft_example

    tasks = _WORKER["tasks"]
    if job.key() not in tasks:
        tasks[job.key()] = _task(job)
    task = tasks[job.key()]
    out = []
    for i in range(start, stop):
        row_seed = _row_seed(seed, job, i)
        rng = random.Random(row_seed)
        target = rng.randint(*job.lengths)
        row = draft_row(task, _WORKER["renderer"], target, rng, seed=row_seed, tolerance=tolerance)
        if job.split == "sft":
            segments = programmatic_trace(task, row, random.Random(row_seed + 1))
            example = sft_example(_WORKER["tokenizer"], row, segments, task.answer_text(row))
            out.append(example.to_record())
        else:
            out.append(row_record(row, i, job.split, store_prompt_text=store_prompt_text))
    return out


def draft_row(task: Task, renderer: PromptRenderer, target: int, rng: random.Random, **kwargs) -> Row:
    """``build_row`` of a fresh draft; a natural-length draft longer than ``target`` is drawn again."""
    for _ in range(_MAX_REDRAWS):
        try:
            return build_row(task, task.draft(rng), renderer, target, rng, **kwargs)
        except DraftTooLong:
            continue
    raise RecallmError(f"task {task.name}: {_MAX_REDRAWS} drafts in a row were longer than {target} tokens")


def _shards(schedule: RowSchedule) -> Iterator[tuple[str, RowJob, int, int]]:
    for j, job in enumerate(schedule.jobs):
        for start in range(0, job.count, SHARD_ROWS):
            name = f"{job.split.replace('/', '__')}-{j:03d}-{job.task}-{start // SHARD_ROWS:05d}"
            yield name, job, start, min(job.count, start + SHARD_ROWS)


def preflight(schedule: RowSchedule, tokenizer_dir: Path) -> None:
    """Build one row of every job at both ends of its length range in this process, so that a
    missing dataset or an unreachable length stops the run before the workers start."""
    _init_worker(str(tokenizer_dir), schedule.system_prompt)
    seen = set()
    for job in schedule.jobs:
        for length in sorted(set(job.lengths)):
            if (job.task, job.params, length) in seen:
                continue
            seen.add((job.task, job.params, length))
            probe = RowJob(job.split, job.task, job.params, 1, (length, length))
            try:
                _make_rows(probe, 0, 1, schedule.seed, schedule.tolerance, schedule.store_prompt_text)
            except RecallmError as exc:
                raise RecallmError(f"{job.split} {job.task} at {length} tokens: {exc}") from exc


def run_schedule(schedule: RowSchedule, out_dir: Path, tokenizer_dir: Path, *, workers: int = 1, progress: bool = True) -> dict:
    """Generate every shard not already on disk, then assemble the outputs and the summary, holding
    ``out_dir``'s write lock throughout (a second writer is a ``RecallmError``)."""
    with lock_dir(out_dir, "recallm-data"):
        return _run_schedule(schedule, Path(out_dir), tokenizer_dir, workers=workers, progress=progress)


def _run_schedule(schedule: RowSchedule, out_dir: Path, tokenizer_dir: Path, *, workers: int, progress: bool) -> dict:
    from tqdm import tqdm

    shard_dir = out_dir / "shards"
    fingerprint = schedule.fingerprint(str(Path(tokenizer_dir).resolve()))
    manifest = shard_dir / "manifest.json"
    if manifest.is_file() and _fingerprint_of(manifest) != fingerprint:
        log.warning("the schedule changed since the shards in %s were written: regenerating them", shard_dir)
        for old in shard_dir.glob("*.parquet"):
            old.unlink()
        (shard_dir / MANIFEST_FILE).unlink(missing_ok=True)
    shard_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(manifest, {"fingerprint": fingerprint})  # the shards below belong to this schedule
    todo = [(name, job, a, b) for name, job, a, b in _shards(schedule) if not _shard_intact(shard_dir / f"{name}.parquet")]
    total = sum(b - a for _, _, a, b in todo)
    if todo:
        workers = worker_count(workers, len(todo))
        preflight(schedule, tokenizer_dir)
        bar = tqdm(total=total, desc="generating", unit="row", disable=not progress)
        if workers > 1:
            with ProcessPoolExecutor(
                workers, initializer=_init_worker, initargs=(str(tokenizer_dir), schedule.system_prompt)
            ) as pool:
                futures = {
                    pool.submit(_make_rows, job, a, b, schedule.seed, schedule.tolerance, schedule.store_prompt_text): (name, b - a)
                    for name, job, a, b in todo
                }
                from concurrent.futures import as_completed

                for future in as_completed(futures):
                    name, n = futures[future]
                    _write_shard(future.result(), shard_dir, name)
                    bar.update(n)
        else:
            _init_worker(str(tokenizer_dir), schedule.system_prompt)
            for name, job, a, b in todo:
                records = _make_rows(job, a, b, schedule.seed, schedule.tolerance, schedule.store_prompt_text)
                _write_shard(records, shard_dir, name)
                bar.update(b - a)
        bar.close()
    return _assemble(schedule, out_dir, shard_dir)


def worker_count(asked: int, shards: int) -> int:
    """The worker processes of a run: as asked, but never more than the shards to write nor than
    the CPUs this process may use (``workers=100000`` forked hundreds of processes that did
    nothing but load the tokenizer)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    used = max(1, min(int(asked), shards, cpus))
    if used < asked:
        log.warning("workers=%d: using %d (%d shards to write, %d CPUs)", asked, used, shards, cpus)
    return used


def _write_shard(records: list, shard_dir: Path, name: str) -> None:
    write_parquet(records, shard_dir / f"{name}.parquet")
    record_files(shard_dir, [f"{name}.parquet"])  # its checksum: a changed shard is found before reuse


def _shard_intact(path: Path) -> bool:
    """A shard on disk that may be reused: there, with the checksum recorded when it was written. A
    damaged one (a flipped byte, truncated) or one without a recorded checksum is deleted with a
    warning and generated again."""
    if not path.exists():
        return False
    problem = file_problem(path, required=True)
    if problem is None:
        return True
    log.warning("shard %s: %s; generating it again", path.name, problem.removeprefix(f"{path} "))
    path.unlink()
    return False


def _fingerprint_of(manifest: Path) -> str | None:
    try:
        return json.loads(manifest.read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):  # damaged: the shards are of no known schedule
        return None


def _assemble(schedule: RowSchedule, out_dir: Path, shard_dir: Path) -> dict:
    by_split: dict[str, list[dict]] = defaultdict(list)
    for name, job, _, _ in _shards(schedule):
        path = shard_dir / f"{name}.parquet"
        problem = file_problem(path, required=True)
        if problem:
            raise RecallmError(f"{problem}; run recallm-data again to regenerate it")
        by_split[job.split].extend(read_records(path))
    written = {}
    for split, records in sorted(by_split.items()):
        if split == "sft":
            rng = random.Random(schedule.seed)
            order = list(range(len(records)))
            rng.shuffle(order)
            n_val = int(round(schedule.sft_val_fraction * len(records)))
            val = [records[i] for i in order[:n_val]]
            train = [records[i] for i in order[n_val:]]
            written["sft/train"] = str(write_jsonl(train, out_dir / "sft" / "train.jsonl"))
            if val:
                written["sft/val"] = str(write_jsonl(val, out_dir / "sft" / "val.jsonl"))
        else:
            if split == "train":
                random.Random(schedule.seed).shuffle(records)
            written[split] = str(write_parquet(records, out_dir / f"{split}.parquet"))
    for path in map(Path, written.values()):  # their checksums, verified where they are read
        record_files(path.parent, [path.name])
    summary = summarize(by_split, schedule)
    write_json_atomic(out_dir / "summary.json", summary)
    write_text_atomic(out_dir / "summary.md", summary_markdown(summary))
    return {"files": written, "summary": summary}


def summarize(by_split: Mapping[str, list[dict]], schedule: RowSchedule | None = None) -> dict:
    """Counts, prompt lengths and augmentation balance per split and task."""
    out: dict[str, Any] = {"splits": {}, "skipped": list(schedule.skipped) if schedule else []}
    for split, records in sorted(by_split.items()):
        if split == "sft":
            spans = [len(r["spans"]) for r in records]
            out["splits"][split] = {
                "count": len(records),
                "spans_mean": statistics.fmean(spans) if spans else 0.0,
                "completion_tokens_mean": statistics.fmean(len(r["completion_ids"]) for r in records)
                if records
                else 0.0,
                "completion_tokens_median": statistics.median(len(r["completion_ids"]) for r in records)
                if records
                else 0,
                "completion_tokens_max": max((len(r["completion_ids"]) for r in records), default=0),
                "tokens_max": max((len(r["prompt_ids"]) + len(r["completion_ids"]) for r in records), default=0),
            }
            continue
        tasks: dict[str, dict] = {}
        grouped: dict[str, list[dict]] = defaultdict(list)
        for r in records:
            grouped[r["extra_info"]["task"]].append(r)
        for task, rows in sorted(grouped.items()):
            lengths = [r["extra_info"]["prompt_tokens"] for r in rows]
            errors = [r["extra_info"]["prompt_tokens"] / r["extra_info"]["target_tokens"] - 1 for r in rows]
            balance: dict[str, Counter] = defaultdict(Counter)
            for r in rows:
                for k, v in json.loads(r["extra_info"]["augmentations"]).items():
                    balance[k][str(v)] += 1
            tasks[task] = {
                "category": rows[0]["ability"],
                "count": len(rows),
                "tokens_min": min(lengths),
                "tokens_mean": statistics.fmean(lengths),
                "tokens_max": max(lengths),
                "length_error_max": max(abs(e) for e in errors),
                "augmentations": {k: dict(sorted(c.items())) for k, c in sorted(balance.items())},
            }
        out["splits"][split] = {"count": len(records), "tasks": tasks}
    return out


def data_lengths(out_dir: str | Path) -> dict[str, int]:
    """The lengths a data directory ``recallm-data`` wrote holds, in tokens of its tokenizer, read from
    its ``summary.json``: ``prompt_max`` (the longest training prompt), ``completion_max`` (the longest
    SFT completion: the trace a policy is taught to write; ``completion_median``) and ``trace_max`` (the longest SFT prompt +
    completion); a length the directory has no rows for, or a missing or unreadable summary, is left
    out. The GRPO launch derives and checks its token caps from them (``recallm.grpo.app``)."""
    try:
        splits = json.loads((Path(out_dir) / "summary.json").read_text())["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    out: dict[str, int] = {}
    tasks = (splits.get("train") or {}).get("tasks") or {}
    if tasks:
        out["prompt_max"] = max(int(t["tokens_max"]) for t in tasks.values())
    sft = splits.get("sft") or {}
    if sft.get("count") and "completion_tokens_max" in sft:
        out["completion_max"] = int(sft["completion_tokens_max"])
        out["completion_median"] = int(sft.get("completion_tokens_median") or sft["completion_tokens_max"])
        out["trace_max"] = int(sft["tokens_max"])
    return out


def summary_markdown(summary: Mapping) -> str:
    lines = ["# Data summary", ""]
    for split, info in summary["splits"].items():
        lines.append(f"## {split} ({info['count']} rows)")
        if "tasks" not in info:
            lines += [f"- {k}: {v:.3g}" if isinstance(v, float) else f"- {k}: {v}" for k, v in info.items()]
            lines.append("")
            continue
        lines += [
            "",
            "| task | category | rows | tokens min / mean / max | max length error |",
            "|---|---|---|---|---|",
        ]
        for task, t in info["tasks"].items():
            lines.append(
                f"| {task} | {t['category']} | {t['count']} | {t['tokens_min']} / {t['tokens_mean']:.0f} / "
                f"{t['tokens_max']} | {100 * t['length_error_max']:.1f}% |"
            )
        lines.append("")
        lines.append("Augmentation balance:")
        for task, t in info["tasks"].items():
            parts = "; ".join(
                f"{k}: " + ", ".join(f"{v}={n}" for v, n in c.items()) for k, c in t["augmentations"].items()
            )
            lines.append(f"- {task}: {parts}")
        lines.append("")
    if summary.get("skipped"):
        lines += ["## Skipped validation cells", ""] + [f"- {s}" for s in summary["skipped"]]
    return "\n".join(lines) + "\n"


def generate_rows(task: Task, renderer: PromptRenderer, target: int, n: int, seed: int = 0) -> list[Row]:
    """Convenience for tests and notebooks: ``n`` rows of one task at one length."""
    rows = []
    for i in range(n):
        rng = random.Random(f"{seed}|{task.name}|{i}")
        rows.append(draft_row(task, renderer, target, rng, seed=i))
    return rows
