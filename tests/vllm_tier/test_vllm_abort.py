"""vLLM tier (issue 17, item 3): a request cancelled while vLLM's in-process engine generates it is
aborted in the engine, not run to its end.

``recallm.eval.backends.VLLMBackend`` on the tiny model (the CPU build of vLLM 0.24.0), with
end-of-sequence ignored so that every request runs to its token limit unless stopped. Checked
without wall-clock thresholds: the cancelled request comes back ``cancelled`` with at most as many
tokens as engine steps had run when it was cancelled (far fewer than its limit), no engine step is
made for it afterwards, the engine has no unfinished request, and the engine core's own scheduler
(its statistics) no longer holds it. The same through ``recallm.rlm.models.BackendModel`` with a
``CancelToken``, as an RLM sub-call is cancelled. Run with ``scripts/test_vllm.sh``.
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("vllm")

pytestmark = pytest.mark.slow
LONG = 256


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from recallm.eval.backends import VLLMBackend
    from recallm.tiny import create_tiny
    from recallm.tokens import load_tokenizer

    path = create_tiny(tmp_path_factory.mktemp("tiny-vllm-abort"), seed=0, max_recall_tokens=8)
    backend = VLLMBackend(
        path,
        load_tokenizer(path),
        recall_constrained=True,
        dtype="float32",
        max_model_len=1024,
        engine_kwargs={"enforce_eager": True, "max_num_seqs": 4, "disable_log_stats": False},
    )
    inputs = backend._engine_inputs

    def no_eos(requests, settings):  # every request runs to its limit unless it is aborted
        prompts, params = inputs(requests, settings)
        for p in params:
            p.ignore_eos = True
        return prompts, params

    backend._engine_inputs = no_eos
    # every engine step, and what the engine core's scheduler holds at it (num_running_reqs)
    core = backend.llm.llm_engine.engine_core
    get_output = core.get_output
    state = {"steps": 0, "running": [], "on_step": lambda n: None}

    def counted():
        outputs = get_output()
        state["steps"] += 1
        if outputs.scheduler_stats is not None:
            state["running"].append(outputs.scheduler_stats.num_running_reqs)
        state["on_step"](state["steps"])
        return outputs

    core.get_output = counted
    yield backend, state
    backend.close()
    backend.llm.llm_engine.engine_core.shutdown()  # its engine-core process ends here, not at interpreter exit


def _reset(state, on_step=lambda n: None):
    state.update(steps=0, running=[], on_step=on_step)


def _request(backend, text, limit):
    from recallm.eval.types import TextRequest

    prompt = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return TextRequest(prompt, None, limit)


def test_a_cancelled_request_is_aborted_in_the_engine(backend):
    from recallm.eval.types import GenerationSettings

    backend, state = backend
    engine = backend.llm.llm_engine
    settings = GenerationSettings(max_new_tokens=LONG)
    kept, dropped = _request(backend, "count to ten", 24), _request(backend, "count to a thousand", LONG)
    flag, cancelled_at = threading.Event(), {}

    def on_step(n):
        if n == 4:
            cancelled_at["step"] = n
            flag.set()

    _reset(state, on_step)
    out_kept, out_dropped = backend.generate([kept, dropped], settings, cancelled=[lambda: False, flag.is_set])
    assert (out_kept.n_tokens, out_kept.finish_reason) == (24, "length")  # its sibling ran on to its end
    assert out_dropped.finish_reason == "cancelled"
    assert 1 <= out_dropped.n_tokens <= cancelled_at["step"] < LONG, out_dropped
    assert state["steps"] <= 24 + 2  # the sibling's 24 tokens (and a step of slack), not 256
    assert not engine.has_unfinished_requests() and engine.get_num_unfinished_requests() == 0
    # the engine core dropped it too: while the next request runs, the scheduler holds only that one
    _reset(state)
    (after,) = backend.generate([_request(backend, "again", 8)], settings)
    assert after.n_tokens == 8 and state["running"] and max(state["running"]) == 1, state["running"]


def test_a_cancelled_rlm_sub_call_on_vllm_is_aborted_and_charged(backend):
    from recallm.cancel import Cancelled, CancelToken
    from recallm.eval.types import GenerationSettings
    from recallm.rlm.budget import Budget, BudgetLimits
    from recallm.rlm.models import BackendModel
    from recallm.rlm.subcalls import CallPool

    backend, state = backend
    model = BackendModel(backend, backend.tokenizer, GenerationSettings(max_new_tokens=LONG), label="sub:vllm")
    token = CancelToken()
    _reset(state, lambda n: token.cancel("the cell ended") if n == 3 else None)
    budget = Budget(BudgetLimits())
    pool = CallPool(2, budget)
    messages = [{"role": "user", "content": "count to a thousand"}]
    with pytest.raises(Cancelled):
        pool.call(model, messages, max_new_tokens=LONG, cancel=token)
    assert pool.drain(600) == 0
    assert state["steps"] == 3  # no engine step after the cancellation
    assert not backend.llm.llm_engine.has_unfinished_requests()
    prompt_tokens = model.count_tokens(model.render(messages))
    assert prompt_tokens + 1 <= budget.tokens <= prompt_tokens + 3  # the prompt and the tokens generated
