"""vLLM tier: ``recallm-grpo grpo/platform=vllm_cpu`` on a CPU — verl 0.9.1's own vLLM server
(vLLM's CPU build), agent loop and weight transfer from the FSDP actor (shared memory: no CUDA IPC
here), the recall processor in the engine — two GRPO steps of the tiny model, then a resume.

Asserted: spans are verbatim (dumped rollouts and ``recallm/spans_verbatim``); inside spans the
rollout's processed log-probs equal the masked actor's (``recallm/logprob_gap_in_spans`` <= 1e-3:
the engine serves the actor's weights — it starts from dummy weights, ``load_format=dummy`` — and
masks as the actor does); the resumed run continues at step 3. What verl lacks on a CPU is added by
``recallm.grpo.vllm_cpu`` (see its doc). Run with ``scripts/test_vllm.sh``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("verl")

from tests.grpo_runs import MIX, check_spans, grpo_command, run_grpo, step_metrics  # noqa: E402

pytestmark = pytest.mark.slow
RAY_START_TIMEOUT = "The current node timed out during startup"


def _run(cmd, cwd):
    """``run_grpo``, once more if Ray's node did not register within its fixed 30 s
    (``ray/_private/node.py``: a 2-core machine under heavy load); any other failure stands."""
    result = run_grpo(cmd, cwd, timeout=5400)
    if result.returncode != 0 and RAY_START_TIMEOUT in result.stdout:
        result = run_grpo(cmd, cwd, timeout=5400)
    return result


def _report(metrics):
    for step, m in sorted(metrics.items()):
        shown = {k: m[k] for k in sorted(m) if k.startswith("recallm/") and "reward" not in k}
        print(f"step {step}: {shown}")


def test_grpo_with_verls_vllm_rollout_on_cpu(tmp_path):
    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.tiny import create_tiny

    model = create_tiny(tmp_path / "tiny", seed=0, max_recall_tokens=8)
    run_schedule(schedule_from_config(MIX), tmp_path / "data", model, workers=1, progress=False)
    data, ckpt, rollouts = tmp_path / "data" / "train.parquet", tmp_path / "ckpt", tmp_path / "rollouts"

    first = _run(grpo_command(model, data, ckpt, rollouts, rollout="vllm", steps=2), tmp_path)
    assert first.returncode == 0, first.stdout[-8000:]
    assert "recallm.recall.vllm:RecallLogitsProcessorV1" in first.stdout  # the engine's arguments, as verl prints them
    assert '"architectures": ["Qwen2ForCausalLM"]' in first.stdout  # hf_overrides merged into verl's own
    metrics = step_metrics(first.stdout)
    _report(metrics)
    assert sorted(metrics) == [1, 2], first.stdout[-4000:]
    for step, m in metrics.items():
        assert check_spans(rollouts, step) >= 4, step
        assert m["recallm/spans_verbatim"] == 1.0 and m["recallm/spans_per_response"] > 0
        assert m["recallm/logprob_gap_in_spans"] <= 1e-3, (step, m["recallm/logprob_gap_in_spans"])
        assert m["actor/grad_norm"] > 0
    assert (ckpt / "global_step_2" / "actor").is_dir()

    second = _run(grpo_command(model, data, ckpt, rollouts, rollout="vllm", steps=3), tmp_path)
    assert second.returncode == 0, second.stdout[-8000:]
    assert f"Resuming from {ckpt / 'global_step_2'}" in second.stdout
    metrics = step_metrics(second.stdout)
    _report(metrics)
    assert sorted(metrics) == [3], second.stdout[-4000:]
    # the resumed actor's weights reached the engine: log-probs inside spans still agree
    assert metrics[3]["recallm/logprob_gap_in_spans"] <= 1e-3
    assert check_spans(rollouts, 3) >= 4
