"""Benchmark: generating 8K-token rows vs one plain tokenisation pass over them.

Run: ``.venv/bin/python bench/data_gen.py`` (``--rows N`` per task; default 1,000).

Generates ``N`` math-retrieval and ``N`` KV-retrieval rows at 8K tokens with the tiny tokenizer,
through the same code ``recallm-data`` runs (``data_gen.generate``):

* throughput with two worker processes (rows/s, wall clock, the 2-core target);
* the fitting overhead in one process: generation time / the time of one plain tokenisation
  pass over the finished prompts (what fitting to a length costs compared with measuring it).

Last line: ``RESULT rows_per_s_8k=<x> fit_overhead=<ratio>``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_gen import generate  # noqa: E402
from data_gen.generate import RowJob  # noqa: E402

TARGET = 8192


def jobs(n: int) -> list[RowJob]:
    return [
        RowJob("train", "math_retrieval", (), n, (TARGET, TARGET)),
        RowJob("train", "kv_retrieval", (), n, (TARGET, TARGET)),
    ]


def chunks(n: int, size: int = 50):
    for job in jobs(n):
        for start in range(0, job.count, size):
            yield job, start, min(job.count, start + size)


def generate_parallel(tokenizer_dir: str, n: int, workers: int) -> tuple[float, list[dict]]:
    t = time.perf_counter()
    records: list[dict] = []
    with ProcessPoolExecutor(workers, initializer=generate._init_worker, initargs=(tokenizer_dir, None)) as pool:
        futures = [pool.submit(generate._make_rows, job, a, b, 0, 0.02, True) for job, a, b in chunks(n)]
        for f in futures:
            records.extend(f.result())
    return time.perf_counter() - t, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000, help="rows per task")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from recallm.tiny import create_tiny

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = str(create_tiny(Path(tmp) / "tiny"))
        wall, records = generate_parallel(tokenizer_dir, args.rows, args.workers)
        n_rows = len(records)
        # one process: generation vs one tokenisation pass over the same prompts
        generate._init_worker(tokenizer_dir, None)
        renderer = generate._WORKER["renderer"]
        sample = max(1, args.rows // 5)
        t = time.perf_counter()
        single = []
        for job, a, b in chunks(sample):
            single.extend(generate._make_rows(job, a, b, 0, 0.02, True))
        gen_time = time.perf_counter() - t
        t = time.perf_counter()
        lengths = [renderer.length(r["extra_info"]["prompt_text"]) for r in single]
        tok_time = time.perf_counter() - t
    mean_len = sum(r["extra_info"]["prompt_tokens"] for r in records) / n_rows
    off = max(abs(r["extra_info"]["prompt_tokens"] / TARGET - 1) for r in records)
    assert lengths == [r["extra_info"]["prompt_tokens"] for r in single]
    print(
        f"{n_rows} rows at {TARGET} tokens (mean {mean_len:.0f}, max deviation {100 * off:.1f}%) "
        f"in {wall:.1f} s with {args.workers} workers"
    )
    print(f"one process, {len(single)} rows: generation {gen_time:.2f} s, one tokenisation pass {tok_time:.2f} s")
    print(f"RESULT rows_per_s_8k={n_rows / wall:.0f} fit_overhead={gen_time / tok_time:.2f}")


if __name__ == "__main__":
    main()
