"""Second test tier: a real vLLM engine with the recall processor, loaded by its one name
(``recallm.recall.vllm:RecallLogitsProcessor``), on both tiers of ``scripts/test_vllm.sh``: vLLM 0.24.0
(verl 0.9.1's) and 0.32.0 (the newest CPU build; its V1 model runner, the one it runs here: Model
Runner V2 needs a Triton CPU backend, ``tests/vllm_tier/test_mrv2.py``). Skipped where vLLM is not
importable, i.e. in the normal test run.

The tiny RecaLLM model is served as its base architecture (``vllm_hf_overrides``) with the
processor loaded by name, as verl does. Sampled spans must be verbatim; greedy outputs must
equal HF ``generate`` (which adds ``RecallLogitsProcessor``), constrained and opted out.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("vllm")

from recallm.recall.vllm import PROCESSOR_FQCN  # noqa: E402
from tests.reference import contains, reference_spans  # noqa: E402

pytestmark = pytest.mark.slow
MAX_RECALL = 8


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    import recallm.modeling  # noqa: F401  (registers the RecaLLM config and model classes)
    from recallm.modeling import vllm_hf_overrides
    from recallm.tiny import create_tiny
    from recallm.tokens import RecallTokenIds, load_tokenizer

    path = create_tiny(tmp_path_factory.mktemp("tiny-vllm"), seed=0, max_recall_tokens=MAX_RECALL)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(path)
    ids = RecallTokenIds.from_pretrained(model.config, tokenizer)
    llm = LLM(
        model=str(path),
        hf_overrides=vllm_hf_overrides(model.config),
        logits_processors=[PROCESSOR_FQCN],
        dtype="float32",
        max_model_len=1024,
        max_num_seqs=4,  # fewer slots than requests: requests join as others finish
        enforce_eager=True,
        seed=0,
    )
    words = [i for i in range(ids.start) if i not in tokenizer.all_special_ids]
    yield llm, model, ids, words
    llm.llm_engine.engine_core.shutdown()  # its engine-core process ends here, not at interpreter exit


def _prompts(ids, words, n, seed, end_in_span):
    """Random toy-word prompts, some holding a verbatim span, optionally ending with the start token."""
    rng = np.random.default_rng(seed)
    prompts = []
    for i in range(n):
        p = rng.choice(words, size=int(rng.integers(20, 120))).tolist()
        if i % 2:
            src = int(rng.integers(0, len(p) - 6))
            p += [ids.start, *p[src : src + 4], ids.end] + rng.choice(words, size=5).tolist()
        if end_in_span:
            p.append(ids.start)
        prompts.append(p)
    return prompts


def _generate(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_sampled_spans_are_verbatim(served):
    from vllm import SamplingParams

    llm, _, ids, words = served
    prompts = _prompts(ids, words, 12, seed=1, end_in_span=False)
    prompts += _prompts(ids, words, 4, seed=2, end_in_span=True)
    params = [
        SamplingParams(
            temperature=1.0,
            max_tokens=24 + 8 * (i % 5),  # different lengths: removals, condensing moves, reused slots
            seed=i,
            logit_bias={ids.start: 4.0, ids.end: 1.0},  # open spans often (the mask keeps them verbatim)
        )
        for i in range(len(prompts))
    ]
    outputs = _generate(llm, prompts, params)
    n_spans = 0
    for prompt, out in zip(prompts, outputs, strict=True):
        hist = prompt + out
        for start, content in reference_spans(hist, ids.start, ids.end):
            if start < len(prompt) - 1:
                continue  # written in the prompt
            assert len(content) <= MAX_RECALL
            assert contains(hist[:start], content), f"span {content} at {start} is not verbatim"
            n_spans += bool(content)
    assert n_spans >= 10, f"only {n_spans} non-empty spans were generated"


def test_greedy_equals_hf_generate(served):
    import torch
    from vllm import SamplingParams

    llm, model, ids, words = served
    prompts = _prompts(ids, words, 6, seed=3, end_in_span=True)
    for constrained in (True, False):
        extra = None if constrained else {"recall_constrained": False}
        got = _generate(llm, prompts, SamplingParams(temperature=0.0, max_tokens=24, extra_args=extra))
        differs = 0
        for prompt, out in zip(prompts, got, strict=True):
            x = torch.tensor([prompt])
            with torch.no_grad():
                hf = model.generate(
                    input_ids=x,
                    attention_mask=torch.ones_like(x),
                    do_sample=False,
                    max_new_tokens=24,
                    recall_constrained=constrained,
                )[0, len(prompt) :].tolist()
            assert out == hf, f"constrained={constrained}: vLLM {out} != HF {hf}"
            with torch.no_grad():
                other = model.generate(
                    input_ids=x,
                    attention_mask=torch.ones_like(x),
                    do_sample=False,
                    max_new_tokens=24,
                    recall_constrained=not constrained,
                )[0, len(prompt) :].tolist()
            differs += other != out
        assert differs, "the mask changed no greedy output: the test would not notice a missing processor"
