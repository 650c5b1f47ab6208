"""Benchmark: the vLLM batch core (``RecallBatchState``) on a whole engine batch, vs a naive rescan.

Run: ``.venv/bin/python bench/vllm_mask_batch.py`` (``--quick`` for a short smoke run).

No vLLM engine: a recorded stream drives the core the way the V1 adapter does
(``update(batch_update)`` then ``apply(logits)`` each engine step):

* 256 requests, 16K-token prompts drawn from a Zipf distribution over a 152K vocabulary (as in
  ``bench/recall_mask.py``); one prefill step adds them all (a ``BatchUpdate`` with 256
  ``added``), a few decode steps generate ordinary tokens (no row in a span), then every
  request opens a recall span copying a random 64-token stretch of its prompt, and the
  64 decode steps that follow all have every row inside a span (the first of them sees the
  start token: the matcher builds its token->positions index). Every 16 steps the batch
  update swaps two rows (both methods follow it).
* Logits: float32 ``[256, 152064]`` CPU tensors, copied from two recorded random matrices
  before each step (the copy is not timed).
* Naive: per request and step, rescan the whole searchable context for every occurrence of
  the span so far (a vectorised sliding-window compare, O(context x span)), then write the
  mask exactly as the core does (gather the allowed logits, fill the rows, scatter back). The
  two methods differ only in how the allowed sets are found. Both run on the same steps from
  the same logits; their masked logits are checked equal on every step the naive one runs.

Per-step time = ``update`` + ``apply`` for the whole batch. The breakdown (a second pass with a
fresh core) splits it into feeding the new tokens, building the allowed-id index, and writing
the mask, and shows the memory floor: filling 256 x 152K float32 rows (156 MB) with ``-inf``.

Last line: ``RESULT batch_step_ms=<median ms per engine step> speedup_vs_naive=<x>`` where x is
the naive total time over the core's total time on the same steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recallm.recall.vllm import RecallBatchState  # noqa: E402

VOCAB = 152_064
START, END = VOCAB - 2, VOCAB - 1
MAX_RECALL = 128
NEG = float("-inf")


@dataclass(frozen=True)
class Update:  # the fields of vllm.v1.sample.logits_processor.BatchUpdate
    batch_size: int
    removed: list
    added: list
    moved: list


def zipf_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` ids from Zipf(1.1) over the vocabulary minus the recall tokens."""
    out = np.empty(0, dtype=np.int64)
    while out.size < n:
        draw = rng.zipf(1.1, size=2 * n)
        out = np.concatenate((out, draw[draw < START] - 1))
    return out[:n]


def record_stream(rng, n_req: int, n_prompt: int, n_free: int, n_span: int):
    """Prompts, and per step (update, {request: token appended after the step})."""
    prompts = [zipf_tokens(rng, n_prompt) for _ in range(n_req)]
    spans = []
    for p in prompts:
        src = int(rng.integers(0, n_prompt - n_span))
        spans.append(p[src : src + n_span])
    free = [zipf_tokens(rng, n_free) for _ in range(n_req)]
    # tokens each request samples after step t (t = 0 is the prefill)
    tokens = []
    for t in range(n_free + 1 + n_span):
        if t < n_free:
            tokens.append([int(f[t]) for f in free])
        elif t == n_free:
            tokens.append([START] * n_req)
        else:
            tokens.append([int(s[t - n_free - 1]) for s in spans])
    return prompts, tokens


class NaiveBatch:
    """The naive method with the same interface: per-index state, rescan at every step."""

    def __init__(self, start_id: int, end_id: int, max_recall_tokens: int) -> None:
        self.start_id, self.end_id, self.max_recall = start_id, end_id, max_recall_tokens
        self.reqs: dict[int, list] = {}  # slot -> [prompt array, output list, context | None, span start]

    def update(self, u) -> None:
        if u is None:
            return
        for i in u.removed:
            self.reqs.pop(i, None)
        for i, _params, prompt, output in u.added:
            self.reqs[i] = [np.asarray(prompt, dtype=np.int64), output, None, -1]
        for i, j, direction in u.moved:
            a, b = self.reqs.pop(i, None), self.reqs.pop(j, None)
            if a is not None:
                self.reqs[j] = a
            if direction == "SWAP" and b is not None:
                self.reqs[i] = b

    def _allowed(self, req) -> np.ndarray | None:
        prompt, output = req[0], req[1]
        # span state from the output: the last start token not followed by an end token
        starts = [i for i, t in enumerate(output) if t == self.start_id]
        if not starts or self.end_id in output[starts[-1] :]:
            return None
        s = starts[-1]
        if req[3] != s:  # the context as an array, once per span
            req[2], req[3] = np.concatenate((prompt, np.asarray(output[:s], dtype=np.int64))), s
        context, prefix = req[2], np.asarray(output[s + 1 :], dtype=np.int64)
        k = prefix.size
        if k >= self.max_recall or self.start_id in prefix:
            return np.array([self.end_id])
        if k == 0:
            ids = np.unique(context)
        else:
            windows = np.lib.stride_tricks.sliding_window_view(context, k)[: context.size - k]
            hits = np.flatnonzero((windows == prefix).all(axis=1))
            ids = np.unique(context[hits + k])
        ids = ids[ids != self.start_id]
        return np.append(ids, self.end_id)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rows, cols = [], []
        for i, req in self.reqs.items():
            ids = self._allowed(req)
            if ids is not None and i < logits.shape[0]:
                rows.append(i)
                cols.append(ids)
        if not rows:
            return logits
        a = logits.numpy()
        row_of = np.repeat(np.asarray(rows), [c.size for c in cols])
        flat = np.concatenate(cols)
        keep = a[row_of, flat]
        if len(rows) == a.shape[0]:
            a.fill(NEG)
        else:
            a[np.asarray(rows)] = NEG
        a[row_of, flat] = keep
        return logits


def run(args) -> None:
    rng = np.random.default_rng(0)
    n_req, n_prompt, n_free, n_span = args.requests, args.prompt, args.free_steps, args.steps
    t0 = time.perf_counter()
    prompts, tokens = record_stream(rng, n_req, n_prompt, n_free, n_span)
    gen = torch.Generator().manual_seed(0)
    recorded = [torch.randn(n_req, VOCAB, generator=gen) for _ in range(2)]
    ours_buf = torch.empty(n_req, VOCAB)
    naive_buf = torch.empty(n_req, VOCAB)
    print(
        f"{n_req} requests x {n_prompt}-token prompts (Zipf over {VOCAB}), {n_free} decode steps outside spans, "
        f"then {n_span} decode steps with every row inside a span; logits [{n_req}, {VOCAB}] float32 on the CPU "
        f"({n_req * VOCAB * 4 / 1e6:.0f} MB); setup {time.perf_counter() - t0:.1f} s"
    )

    n_steps = len(tokens)  # step t applies, then every request appends tokens[t]
    naive_steps = set(range(n_steps)) if args.naive_every == 1 else set(range(0, n_steps, args.naive_every))
    naive_steps |= {n_free + 1}  # always include the first in-span step

    def updates(outputs):
        """The batch update of each step (prefill adds all; every 16 steps a swap)."""
        for t in range(n_steps):
            if t == 0:
                yield Update(n_req, [], [(i, None, prompts[i].tolist(), outputs[i]) for i in range(n_req)], [])
            elif t % 16 == 0:
                i, j = (t * 7) % n_req, (t * 13 + 1) % n_req
                yield Update(n_req, [], [], [(i, j, "SWAP")]) if i != j else None
            else:
                yield None

    # ------------------------------------------------ main pass: ours vs naive
    ours = RecallBatchState(START, END, max_recall_tokens=MAX_RECALL, vocab_size=VOCAB)
    naive = NaiveBatch(START, END, MAX_RECALL)
    outputs = [[] for _ in range(n_req)]
    slot_of = list(range(n_req))  # request -> persistent index (follows the swaps)
    ours_t, naive_t, checked = {}, {}, 0
    for t, update in enumerate(updates(outputs)):
        if update is not None:
            for i, j, _ in update.moved:
                ri, rj = slot_of.index(i), slot_of.index(j)
                slot_of[ri], slot_of[rj] = j, i
        src = recorded[t % 2]
        ours_buf.copy_(src)
        a = time.perf_counter()
        ours.update(update)
        out = ours.apply(ours_buf)
        ours_t[t] = time.perf_counter() - a
        if t in naive_steps:
            naive_buf.copy_(src)
            a = time.perf_counter()
            naive.update(update)
            ref = naive.apply(naive_buf)
            naive_t[t] = time.perf_counter() - a
            assert torch.equal(out, ref), f"step {t}: the core and the naive rescan disagree"
            checked += 1
        else:
            naive.update(update)
        # the recorded continuation is always allowed (spans copy the prompt verbatim)
        nxt = tokens[t]
        rows = torch.tensor(slot_of)
        assert bool(torch.isfinite(out[rows, torch.tensor(nxt)]).all()), f"step {t}: a recorded token is masked"
        for r in range(n_req):
            outputs[r].append(nxt[r])

    span_steps = list(range(n_free + 1, n_steps))
    free_steps = list(range(1, n_free + 1))
    ours_span = [ours_t[t] * 1e3 for t in span_steps]
    first_span = n_free + 1
    common = sorted(naive_t)
    speedup = sum(naive_t[t] for t in common) / sum(ours_t[t] for t in common)
    common_rest = [t for t in common if t in span_steps and t != first_span]
    speedup_rest = sum(naive_t[t] for t in common_rest) / sum(ours_t[t] for t in common_rest)

    # ------------------------------------------------ breakdown pass (fresh core)
    core = RecallBatchState(START, END, max_recall_tokens=MAX_RECALL, vocab_size=VOCAB)
    outputs = [[] for _ in range(n_req)]
    phase = {"feed": [], "index": [], "write": [], "fill": []}
    for t, update in enumerate(updates(outputs)):
        ours_buf.copy_(recorded[t % 2])
        core.update(update)
        a = time.perf_counter()
        in_span = core.sync()
        b = time.perf_counter()
        index = core.allowed_index(in_span, n_req) if in_span else None
        c = time.perf_counter()
        core.write_mask(ours_buf, index)
        d = time.perf_counter()
        ours_buf.numpy().fill(NEG)  # the memory floor: one -inf write over every row
        e = time.perf_counter()
        if t in span_steps and t != first_span:
            for key, val in zip(phase, (b - a, c - b, d - c, e - d), strict=True):
                val_ms = val * 1e3
                phase[key].append(val_ms)
        for r in range(n_req):
            outputs[r].append(tokens[t][r])
    n_allowed = sum(core.matcher(s).allowed_tokens().size for s in core.slots())

    med = statistics.median
    print(
        f"core, steps with every row in a span ({len(span_steps)}): median {med(ours_span):.2f} ms, "
        f"mean {statistics.fmean(ours_span):.2f}, max {max(ours_span):.1f} "
        f"(the first, where every span opens: allowed = every distinct token of each {n_prompt + n_free}-token "
        f"context (token->positions indexes are built at prefill): "
        f"{ours_t[first_span] * 1e3:.1f} ms)"
    )
    print(
        f"core, steps with no row in a span ({len(free_steps)}): median "
        f"{med([ours_t[t] * 1e3 for t in free_steps]):.3f} ms (feeding one token to each of {n_req} matchers)"
    )
    print(
        f"breakdown (median ms over in-span steps after the first): feed {med(phase['feed']):.2f}, "
        f"allowed-id index {med(phase['index']):.2f}, mask write {med(phase['write']):.2f}; "
        f"memory floor (numpy fill of all {n_req} rows alone) {med(phase['fill']):.2f} ms; "
        f"last step: {n_allowed} allowed ids over {n_req} rows"
    )
    print(
        f"naive rescan on {len(common)} of {n_steps} steps"
        f"{'' if len(common) == n_steps else f' (every {args.naive_every}th step, plus the first in-span step)'}: "
        f"median {med([naive_t[t] * 1e3 for t in common if t in span_steps]):.1f} ms per in-span step; "
        f"total {sum(naive_t[t] for t in common):.2f} s vs the core's {sum(ours_t[t] for t in common):.2f} s "
        f"on the same steps (x{speedup:.1f}; x{speedup_rest:.1f} without the span-opening step); "
        f"masked logits equal on all {checked} checked steps"
    )
    naive_rest = med([naive_t[t] * 1e3 for t in common_rest])
    own = med(phase["feed"]) + med(phase["index"])
    print(
        f"allowed sets alone (median per in-span step after the first, the mask write taken out of both): "
        f"core {own:.2f} ms (feed + index) vs naive {naive_rest - med(phase['write']):.1f} ms (rescan): "
        f"x{(naive_rest - med(phase['write'])) / own:.0f}"
    )
    print(f"RESULT batch_step_ms={med(ours_span):.2f} speedup_vs_naive={speedup:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=64, help="decode steps inside spans")
    parser.add_argument("--free-steps", type=int, default=8, help="decode steps before the spans open")
    parser.add_argument("--naive-every", type=int, default=1, help="run the naive rescan on every n-th step")
    parser.add_argument("--quick", action="store_true", help="32 requests, 4K prompts, 16 steps")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.prompt, args.steps, args.free_steps = 32, 4096, 16, 4
    torch.set_num_threads(1)
    run(args)


if __name__ == "__main__":
    main()
