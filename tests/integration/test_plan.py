"""`recallm-plan` on the shipped recipes, and the plan's memory formula against the measured peak of a
tiny model's training step on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from recallm.cli.plan import main

PAPER_NODE = ["--gpus", "4", "--gpu-mem-gib", "79.2", "--host-ram-gib", "1000", "--disk-free-gb", "1000"]


@pytest.mark.parametrize("recipe", ["qwen2.5_7b", "llama3.1_8b"])
def test_plan_of_the_paper_recipes_on_the_paper_node(recipe, capsys):
    pytest.importorskip("verl")
    assert main(["grpo", f"grpo={recipe}", *PAPER_NODE, "--write-gbps", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    lines = {line["what"]: line for line in plan["lines"]}
    assert lines["checkpoints"]["fits"] and lines["deadline save"]["fits"] and lines["host RAM"]["fits"]
    assert lines["vLLM KV cache"]["fits"] and lines["actor update (FSDP2)"]["fits"]
    assert plan["fits"]


@pytest.mark.parametrize(
    ("recipe", "model", "gpu_gib"),
    [("qwen2.5_7b_lora_1gpu", "qwen2.5_7b", "80"), ("qwen2.5_1.5b_lora_24gb", "qwen2.5_1.5b", "24")],
)
def test_plan_of_the_one_gpu_lora_recipes_on_their_gpu(recipe, model, gpu_gib, tmp_path, capsys):
    """What the manual's "One GPU" page (docs/guide/one-gpu.md) says: each LoRA recipe fits the one GPU it is written for."""
    pytest.importorskip("verl")
    node = ["--gpus", "1", "--gpu-mem-gib", gpu_gib, "--host-ram-gib", "128", "--disk-free-gb", "500"]
    argv = ["grpo", f"grpo={recipe}", f"trainer.default_local_dir={tmp_path}", "--model", model, *node]
    assert main([*argv, "--write-gbps", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert "LoRA rank" in plan["title"] and plan["fits"], plan


def test_require_fit_exits_2_with_one_line(capsys):
    pytest.importorskip("verl")
    argv = ["grpo", "grpo=qwen2.5_7b", *PAPER_NODE[:-1], "100", "--write-gbps", "1", "--require-fit"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: the plan does not fit: disk: checkpoints (recallm.keep_checkpoints=N (fewer kept), a larger "
        "trainer.save_freq, or a larger disk)"
    ]


def test_sft_plan_and_bad_input(capsys):
    assert (
        main(
            [
                "sft",
                "sft=qwen2.5_7b",
                "model=qwen2.5_7b",
                "deepspeed=zero2",
                "stage=full",
                *PAPER_NODE,
                "--write-gbps",
                "1",
                "--step-seconds",
                "60",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "plan: SFT stage full Qwen2.5-7B-Instruct" in out and "training step (ZeRO-2)" in out
    assert "60.00 per hour" in out
    for argv, message in [
        (["sft", "--gpus", "0"], "error: --gpus must be positive, got 0"),
        (["sft", "--bogus"], "error: unknown flag --bogus (recallm-plan --help lists them)"),
        (
            ["sft", "model=qwen2.5_7b", "--metrics", "/nonexistent/m.jsonl"],
            "error: --metrics /nonexistent/m.jsonl: no such metrics log",
        ),
    ]:
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--no-measure"])
        assert exc.value.code == 2
        assert capsys.readouterr().err.strip() == message


# The measured step: a plain fp32 model in one process, AdamW, a causal LM loss over one sequence of T tokens
# (the logits, the recall-masked copy, the log-softmax and their gradients: 5 fp32 copies of T x V).
MEASURE = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import recallm.modeling  # noqa: F401
    from transformers import AutoModelForCausalLM

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def hwm():  # this address space's peak: ru_maxrss would carry the forking parent's over execve
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    path, sizes, ckpt = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3] == "1"
    torch.set_num_threads(1)
    base = rss()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    peaks = {}
    for tokens in sizes:  # ascending: each size's peak is the process's peak so far
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
        for _ in range(2):
            logp = torch.log_softmax(model(input_ids=ids).logits, -1)
            loss = -logp[0, :-1].gather(-1, ids[0, 1:, None]).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del logp, loss
        peaks[tokens] = hwm() - base
    print(json.dumps({"peaks": peaks}))
    """
)
#: the stated tolerance of the memory formula at this size: the measured peak is at most 15% above the plan
#: (the plan must not promise room that is not there) and at least 70% of it (without checkpointing the
#: formula over-counts what autograd frees early: ~0.76 measured; with checkpointing 0.82-0.89).
ABOVE, BELOW = 1.15, 0.70


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [True, False])
def test_memory_formula_matches_the_measured_peak_on_the_cpu(tiny_dir, tmp_path, checkpointing):
    """The plan's step memory against the measured peak (VmHWM), less the process's fixed costs measured in the same
    process (what a step of 128 tokens takes beyond its plan: the libraries and kernels a first step loads, ~25 MB
    here), which are not the formula's. CI once failed this with ru_maxrss as the peak: Linux keeps it across
    execve, so the child reported the forking pytest's RSS (648 MB measured vs 578 MB run alone)."""
    from recallm.plan import actor_update_bytes, model_shape

    script = tmp_path / "measure.py"
    script.write_text(MEASURE)
    shape = model_shape(str(tiny_dir))

    def predicted(tokens: int) -> int:
        parts = actor_update_bytes(
            shape, 1, tokens, checkpointing=checkpointing, compute_bytes=4, sharded=False, logits_copies=5
        )
        return sum(parts.values())

    small, tokens = 128, 8192
    out = subprocess.run(
        [sys.executable, str(script), str(tiny_dir), f"{small},{tokens}", "1" if checkpointing else "0"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    peaks = {int(t): b for t, b in json.loads(out.stdout.strip().splitlines()[-1])["peaks"].items()}
    fixed = peaks[small] - predicted(small)  # in the same process as the measured step
    measured = peaks[tokens] - fixed
    assert BELOW * predicted(tokens) <= measured <= ABOVE * predicted(tokens), (measured, fixed, predicted(tokens))


def test_plan_flag_of_the_commands_uses_this_node(tmp_path, capsys):
    from recallm.cli.sft import main as sft_main

    assert sft_main(["--plan", "sft=qwen2.5_7b", "model=qwen2.5_7b", "deepspeed=zero2", f"out_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "plan: SFT stage embed Qwen2.5-7B-Instruct" in out
    assert f"disk free free space at {tmp_path}" in out and "measured at" in out  # this node's disk
    assert not (tmp_path / "embed").exists()  # nothing trained, nothing left behind
    assert not list(tmp_path.iterdir())
    pytest.importorskip("verl")
    from recallm.cli.grpo import main as grpo_main

    assert grpo_main(["--plan", "grpo=llama3.1_8b", f"trainer.default_local_dir={tmp_path}/ckpt"]) == 0
    out = capsys.readouterr().out
    assert "plan: GRPO Llama-3.1-8B-Instruct" in out and "recallm.eval_step" in out
