"""Benchmark: LoRA vs full finetune for SFT stage ``full`` on SmolLM2-135M on the CPU — seconds per
step, peak memory, and held-out accuracy after the same budget.

Run: ``.venv/bin/python bench/sft_lora.py`` (needs the converted SmolLM2, ``make smollm2``, or ``--model DIR``).

One run, same data, same steps, same batch, same seed:

1. data: the synthetic retrieval tasks of ``configs/data/smollm2.yaml`` (key-value retrieval and math
   retrieval, integer keys, random-string values) at 256-384 tokens with SmolLM2's tokenizer, recall spans
   in the traces; ``--train`` traces for training and ``--heldout`` fresh prompts (another seed);
2. the embedding stage once (``configs/sft/smollm2_cpu.yaml``'s: 8 steps at 2e-2, the four token rows), or
   ``--init DIR``, an embedding stage's output;
3. from its output, stage ``full`` for ``--steps`` steps per variant, each a ``recallm-sft`` process of
   its own (its peak resident memory: its VmHWM at exit; seconds per step from the Trainer's
   ``train_runtime``, model loading excluded):
   * ``full``: every weight, AdamW at the recipe's 1e-4;
   * ``lora``: ``sft.lora.rank=16`` on every linear layer, AdamW at 1e-3 (LoRA's usual 10x), token rows
     frozen as the embedding stage left them;
   * ``lora_rows``: the same with ``sft.lora.token_rows=true`` (the four rows train next to the adapter);
4. held-out accuracy: greedy constrained generation on the held-out prompts, scored with the reward's
   answer metric (``recallm.sft.train.recall_metrics``), with the verbatim fraction of the spans.

Sequential processes on a shared machine: the seconds per step are as noisy as the machine is busy
(the load average is printed); the memory and accuracy are not.

Last line: ``RESULT lora_step_speedup=<full s/step / lora s/step> lora_peak_memory_ratio=<lora / full>
full_acc=<..> lora_acc=<..> lora_rows_acc=<..>``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMOLLM2_DEFAULT = Path.home() / ".cache" / "recallm" / "models" / "smollm2-135m-instruct-recallm"
VARIANTS = {
    "full": ["sft.full.lr=1e-4"],
    "lora": ["sft.full.lr=1e-3", "sft.lora.rank=16", "sft.lora.alpha=32"],
    "lora_rows": ["sft.full.lr=1e-3", "sft.lora.rank=16", "sft.lora.alpha=32", "sft.lora.token_rows=true"],
}


def _mixture(count: int, seed: int) -> dict:
    return {
        "seed": seed,
        "tolerance": 0.05,
        "store_prompt_text": True,
        "train": {
            "lengths": [256, 384],
            "entries": [
                {
                    "task": "kv_retrieval",
                    "count": count,
                    "params": {"key_type": "int", "value_type": "alnum", "key_digits": 6},
                },
                {
                    "task": "math_retrieval",
                    "count": count,
                    "params": {
                        "key_type": "int",
                        "value_type": "alnum",
                        "problem_types": ["linear", "arithmetic"],
                        "near_keys": 2,
                    },
                },
            ],
        },
        "sft": {"count": count, "val_fraction": 0.0},
    }


def _data(model: Path, out: Path, count: int, seed: int) -> Path:
    from data_gen.generate import run_schedule, schedule_from_config

    run_schedule(schedule_from_config(_mixture(count, seed)), out, model, workers=1, progress=False)
    return _traces(out)


def _traces(data_dir: Path) -> Path:
    """The SFT traces a data directory of ``_data`` holds."""
    return data_dir / "sft" / "train.jsonl"


#: runs recallm-sft as ``python -m`` would, then writes the process's VmHWM (its own address space's peak
#: resident memory) to $RECALLM_BENCH_HWM at exit. Not os.wait4's ru_maxrss: Linux keeps that across execve, so
#: a child reports at least the forking bench's resident memory (which grows once a model is loaded to score).
_SFT_WITH_PEAK = """
import atexit, os, runpy

def _write_peak():
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    with open(os.environ["RECALLM_BENCH_HWM"], "w") as f:
        f.write(str(peak))

atexit.register(_write_peak)
runpy.run_module("recallm.cli.sft", run_name="__main__", alter_sys=True)
"""


def _sft(args: list[str], log: Path) -> int:
    """One ``recallm-sft`` process; its peak resident memory in bytes (VmHWM, see ``_SFT_WITH_PEAK``)."""
    peak_file = log.with_suffix(".peak")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "RECALLM_BENCH_HWM": str(peak_file)}
    with log.open("w") as f:
        done = subprocess.run(
            [sys.executable, "-c", _SFT_WITH_PEAK, *args], stdout=f, stderr=subprocess.STDOUT, env=env
        )
    if done.returncode:
        raise SystemExit(f"recallm-sft {' '.join(args)} failed; see {log}:\n{log.read_text()[-3000:]}")
    return int(peak_file.read_text())


def _seconds_per_step(stage_dir: Path) -> float:
    checkpoints = sorted(stage_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    history = json.loads((checkpoints[-1] / "trainer_state.json").read_text())["log_history"]
    done = [h for h in history if "train_runtime" in h]
    if done:
        return done[-1]["train_runtime"] / max(h.get("step", 1) for h in history)
    raise SystemExit(f"no train_runtime in {checkpoints[-1]}")


def _accuracy(final: Path, heldout: Path, n: int, max_new_tokens: int) -> dict[str, float]:
    """The reward's answer metric and the span figures over the first ``n`` held-out prompts, and the answer
    accuracy of each task category among them (``acc/<category>``)."""
    import itertools

    from recallm.io import iter_jsonl
    from recallm.modeling import load_recallm_model
    from recallm.sft.train import recall_metrics
    from recallm.tokens import load_tokenizer

    records = [record for _, record in itertools.islice(iter_jsonl(heldout), n)]
    model, tokenizer = load_recallm_model(final), load_tokenizer(final)
    by_category: dict[str, list[dict]] = {}
    for record in records:
        by_category.setdefault(str(record.get("category", "?")), []).append(record)
    scored = {
        name: recall_metrics(model, tokenizer, group, max_new_tokens=max_new_tokens, batch_size=4)
        for name, group in sorted(by_category.items())
    }
    checked = sum(m["recall_spans_checked"] for m in scored.values())
    total = {
        key: sum(m[key] * len(by_category[name]) for name, m in scored.items()) / len(records)
        for key in ("answer_accuracy", "recall_spans")
    }
    if checked:  # the verbatim fraction of all spans (absent when there were none, as recall_metrics does)
        total["recall_verbatim"] = (
            sum(m.get("recall_verbatim", 0.0) * m["recall_spans_checked"] for m in scored.values()) / checked
        )
    return {**total, **{f"acc/{name}": m["answer_accuracy"] for name, m in scored.items()}}


def _scores(row: dict[str, float]) -> str:
    per_task = " ".join(f"{key[4:]} {value:.3f}" for key, value in sorted(row.items()) if key.startswith("acc/"))
    return (
        f"held-out accuracy {row['answer_accuracy']:.3f} ({per_task})  spans/answer {row['recall_spans']:.2f} "
        f"verbatim {row.get('recall_verbatim', float('nan')):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=SMOLLM2_DEFAULT, help="converted SmolLM2 (make smollm2)")
    parser.add_argument("--steps", type=int, default=24, help="stage-full steps per variant")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--heldout", type=int, default=24, help="held-out prompts scored per variant")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--init", type=Path, default=None, help="an embedding stage's final model to start from")
    parser.add_argument(
        "--rescore",
        type=Path,
        default=None,
        help="score the variants' final models of an earlier --out directory again (no training; no RESULT line)",
    )
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if "full" not in variants or "lora" not in variants or any(v not in VARIANTS for v in variants):
        parser.error(f"--variants must include full and lora, of {', '.join(VARIANTS)}")
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"no converted SmolLM2 at {args.model}: run `make smollm2` or pass --model DIR")
    from transformers import logging as hf_logging

    hf_logging.set_verbosity_error()
    if args.rescore is not None:
        for name in variants:
            final = args.rescore / name / "full" / "final"
            if not (final / "config.json").is_file():
                raise SystemExit(f"no final model of variant {name} at {final}")
            print(
                f"{name:9s} {_scores(_accuracy(final, _traces(args.rescore / 'heldout'), args.heldout, args.max_new_tokens))}",
                flush=True,
            )
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.out or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        train = _data(args.model, work / "data", args.steps * args.batch, seed=0)
        heldout = _data(args.model, work / "heldout", args.heldout, seed=1)
        common = [
            "sft=smollm2_cpu",
            f"model.path={args.model}",
            f"train_file={train}",
            "val_file=null",
            f"sft.per_device_batch_size={args.batch}",
            f"sft.global_batch_size={args.batch}",
            "sft.logging_steps=4",
            f"sft.save_steps={args.steps}",
        ]
        init = args.init
        if init is None:  # the embedding stage, once, shared by every variant
            embed_out = work / "embed"
            _sft([*common, "stage=embed", f"out_dir={embed_out}"], work / "embed.log")
            init = embed_out / "embed" / "final"
        rows = {}
        for name in variants:
            out = work / name
            peak = _sft(
                [
                    *common,
                    "stage=full",
                    f"init_from={init}",
                    f"out_dir={out}",
                    f"sft.full.steps={args.steps}",
                    "sft.full.warmup_steps=2",
                    *VARIANTS[name],
                ],
                work / f"{name}.log",
            )
            rows[name] = {"s_per_step": _seconds_per_step(out / "full"), "peak_rss": peak}
            rows[name].update(_accuracy(out / "full" / "final", heldout, args.heldout, args.max_new_tokens))
            print(
                f"{name:9s} {rows[name]['s_per_step']:6.2f} s/step  peak RSS {peak / 2**30:5.2f} GiB  {_scores(rows[name])}",
                flush=True,
            )
    print(
        f"SmolLM2-135M, {args.steps} steps x {args.batch} sequences of 256-384 tokens per variant, "
        f"{args.heldout} held-out prompts; {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.1f}"
    )
    full, lora = rows["full"], rows["lora"]
    result = (
        f"RESULT lora_step_speedup={full['s_per_step'] / lora['s_per_step']:.2f} "
        f"lora_peak_memory_ratio={lora['peak_rss'] / full['peak_rss']:.2f}"
    )
    result += "".join(f" {name}_acc={rows[name]['answer_accuracy']:.3f}" for name in variants)
    print(result)


if __name__ == "__main__":
    main()
