"""The RLM root as a verl 0.9.1 agent loop: each GRPO rollout is one root trajectory.

verl's multi-turn rollout runs an *agent loop* per sample (``AgentLoopBase.run``, instantiated by
name from ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` - its extension point; no
file of verl is changed). ``RLMAgentLoop`` (registered as ``rlm``; the rows of the data set name
it in ``agent_name``) is:

1. the task (context, query, reference) comes from the row's ``extra_info.rlm``; an
   ``recallm.rlm.runner.RootSession`` opens the REPL (our sandbox) and writes the root's first
   messages, which verl's continuous-token builder renders into the prompt ids;
2. each turn the policy generates through verl's LLM server (``server_manager.generate``: vLLM on
   GPUs, the ``hf_cpu`` rollout on CPUs) at most ``rlm.root_max_new_tokens`` tokens; those tokens are
   the trained ones (``response_mask`` 1, their rollout log-probs kept);
3. the session runs the reply's code in the sandbox - sub-calls go to the sub-model (``policy``:
   the same policy through the same server, its tokens never trained; or any ``recallm.rlm``
   model section, such as an OpenAI-compatible server) - and the observation becomes the next
   user message, appended as context tokens (``response_mask`` 0: tool output is masked out of
   the loss);
4. it ends as ``RLM.run`` does (FINAL, the iteration limit and its last call, the budget), or when
   the rollout's ``response_length`` is spent (then the stored ``answer`` variable is scored);
5. the reward is the task's score (``recallm.rlm.tasks.score_answer``), set on the output so
   verl's reward loop does not recompute it; ``reward_extra_info`` carries the run's turns,
   outcome, sub-calls and masked tokens.

Settings come from the trainer config's ``recallm.rlm`` section (``recallm.rlm.train``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from recallm.cancel import Cancelled
from recallm.errors import RecallmError
from recallm.rlm.models import ChatModel, Reply, make_model
from recallm.rlm.runner import RLM
from recallm.rlm.tasks import score_answer
from recallm.rlm.train import train_settings

__all__ = ["RLMAgentLoop", "PolicyChatModel", "AGENT_NAME"]

log = logging.getLogger(__name__)
AGENT_NAME = "rlm"
_SUB_MODELS: dict[str, ChatModel] = {}
_SUB_LOCK = threading.Lock()
#: sessions block (cells run up to sandbox.wall_s): their own threads, not the event loop's few
_EXECUTOR = ThreadPoolExecutor(max_workers=int(os.environ.get("RECALLM_RLM_THREADS", "256")), thread_name_prefix="rlm")


def _finish_reason(token_ids: list[int], max_tokens: int, eos_ids: set[int]) -> str:
    if token_ids and token_ids[-1] in eos_ids:
        return "stop"
    return "length" if len(token_ids) >= max_tokens else "stop"


class PolicyChatModel(ChatModel):
    """Sub-calls answered by the policy being trained, through verl's LLM server, from the
    sandbox's threads (the agent loop's event loop runs the requests). Its tokens are not part of
    any trajectory, so they are never trained."""

    name = "policy"

    def __init__(self, server_manager, tokenizer, loop: asyncio.AbstractEventLoop, sampling: Mapping[str, Any]):
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.loop = loop
        self.sampling = {k: v for k, v in sampling.items() if v is not None}
        self.eos_ids = {int(t) for t in _eos_ids(tokenizer)}

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def complete(self, messages, *, max_new_tokens: int | None, seed: int = 0, cancel=None) -> Reply:
        if cancel is not None:
            cancel.check()
        text = self.tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=True)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        params = {**self.sampling, "logprobs": False}
        if max_new_tokens is not None:
            params["max_tokens"] = int(max_new_tokens)
        future = asyncio.run_coroutine_threadsafe(
            self.server_manager.generate(request_id=f"rlm-sub-{uuid.uuid4().hex}", prompt_ids=ids, sampling_params=params),
            self.loop,
        )
        remove = cancel.add_callback(future.cancel) if cancel is not None else None
        try:
            output = future.result()
        except asyncio.CancelledError:
            raise Cancelled(cancel.reason if cancel is not None else "cancelled") from None
        finally:
            if remove is not None:
                remove()
        tokens = list(output.token_ids)
        reason = _finish_reason(tokens, params.get("max_tokens", 1 << 30), self.eos_ids)
        body = tokens[:-1] if tokens and tokens[-1] in self.eos_ids else tokens
        return Reply(self.tokenizer.decode(body, skip_special_tokens=False), len(ids), len(tokens), reason)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "sampling": dict(self.sampling)}


def _eos_ids(tokenizer) -> list[int]:
    ids = tokenizer.eos_token_id
    out = [ids] if isinstance(ids, int) else list(ids or [])
    for token in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(token) if token in tokenizer.get_vocab() else None
        if isinstance(tid, int) and tid not in out:
            out.append(tid)
    return out


def _section(config, key: str) -> dict[str, Any]:
    node = OmegaConf.select(config, key, default=None)
    if node is None:
        return {}
    return OmegaConf.to_container(node, resolve=True) if not isinstance(node, dict) else dict(node)


class RLMAgentLoop(AgentLoopBase):
    """One RLM root trajectory per rollout (see module doc)."""

    def __init__(self, *args, tools=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        section = train_settings(_section(self.config, "recallm.rlm"))  # the schema: RLMTrainSettings
        self.settings = section.rlm
        self.subcall_settings = section.subcalls
        self.sandbox_limits = section.sandbox
        self.budget_limits = section.budget
        self.response_length = int(self.rollout_config.response_length)
        self.turn_max_new_tokens = int(self.settings.root_max_new_tokens or self.response_length)
        self.sub_cfg = dict(section.sub)
        self.trajectory_dir = section.trajectory_dir
        self.eos_ids = set(_eos_ids(self.tokenizer))

    def _sub_model(self) -> ChatModel:
        if self.sub_cfg.get("name") == "policy":
            sampling = {k: self.sub_cfg.get(k) for k in ("temperature", "top_p", "top_k")}
            return PolicyChatModel(self.server_manager, self.tokenizer, asyncio.get_running_loop(), sampling)
        key = json.dumps(self.sub_cfg, sort_keys=True)
        with _SUB_LOCK:  # one sub-model per worker process (an HF model or a client is costly to build)
            if key not in _SUB_MODELS:
                _SUB_MODELS[key] = make_model(self.sub_cfg, "recallm.rlm.sub")
            return _SUB_MODELS[key]

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        spec = dict((kwargs.get("extra_info") or {}).get("rlm") or {})
        if not spec:
            raise RecallmError("an rlm rollout needs extra_info.rlm (context_json, query, task, reference_json)")
        context = json.loads(spec["context_json"])
        reference = json.loads(spec["reference_json"])
        task, query = str(spec["task"]), spec.get("query")
        loop = asyncio.get_running_loop()
        sub = self._sub_model()
        policy_root = PolicyChatModel(self.server_manager, self.tokenizer, loop, {})
        rlm = RLM(
            policy_root,
            sub,
            settings=self.settings,
            subcalls=self.subcall_settings,
            sandbox=self.sandbox_limits,
            budget=self.budget_limits,
        )
        trajectory = None
        if self.trajectory_dir:
            trajectory = Path(self.trajectory_dir) / f"{spec.get('task_id', task).replace('/', '-')}-{uuid.uuid4().hex[:8]}.jsonl"
        session = rlm.session(context, query, task_id=spec.get("task_id"), trajectory=trajectory)
        metrics = {"generate_sequences": 0.0, "tool_calls": 0.0}
        try:
            messages = await loop.run_in_executor(_EXECUTOR, session.begin)
            prompt_ids = await self.ct_build_initial_tokens(messages)
            ids, mask, logprobs, turns = await self._turns(session, messages, prompt_ids, sampling_params, metrics)
        finally:
            result = await loop.run_in_executor(_EXECUTOR, session.close)
        score = score_answer(task, result.answer, reference)
        masked = sum(1 for m in mask[: self.response_length] if m == 0)
        extra = {
            "rlm_turns": float(result.turns),
            "rlm_final": float(result.outcome == "final"),
            "rlm_subcalls": float(result.usage.get("subcalls", 0)),
            "rlm_masked_tokens": float(masked),
            "rlm_correct": float(score.correct),
        }
        response = ids[len(prompt_ids) :]
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response[: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            reward_score=float(score.score),
            num_turns=2 * turns + 1,
            metrics=AgentLoopMetrics(**metrics),
            extra_fields={"reward_extra_info": extra, "rlm_outcome": result.outcome},
        )

    async def _turns(self, session, messages, prompt_ids, sampling_params, metrics):
        """The root's turns: (all token ids, response mask, response log-probs, turns)."""
        loop = asyncio.get_running_loop()
        ids, mask, logprobs = list(prompt_ids), [], []
        request_id = uuid.uuid4().hex
        turns = 0
        final_call = False
        while True:
            room = self.response_length - len(mask)
            if room <= 0:
                await loop.run_in_executor(
                    _EXECUTOR, session.stop, f"the rollout's response length ({self.response_length} tokens) is spent"
                )
                return ids, mask, logprobs, turns
            limit = min(self.turn_max_new_tokens, room)
            params = {**sampling_params, "max_tokens": limit}
            started = time.perf_counter()
            output = await self.server_manager.generate(request_id=request_id, prompt_ids=ids, sampling_params=params)
            metrics["generate_sequences"] += time.perf_counter() - started
            tokens = list(output.token_ids)
            merged, mask, new_logprobs = await self.ct_merge_assistant_token(
                ids, tokens, mask, logprobs if (logprobs or output.log_probs) else None,
                assistant_logprobs=output.log_probs if output.log_probs else None,
            )  # fmt: skip
            prompt_len = len(ids)
            ids = merged.token_ids
            logprobs = new_logprobs or []
            turns += 1
            reason = _finish_reason(tokens, limit, self.eos_ids)
            body = tokens[:-1] if tokens and tokens[-1] in self.eos_ids else tokens
            text = self.tokenizer.decode(body, skip_special_tokens=False)
            reply = Reply(text, prompt_len, len(tokens), reason)
            started = time.perf_counter()
            if final_call:
                await loop.run_in_executor(_EXECUTOR, session.finish, reply)
                metrics["tool_calls"] += time.perf_counter() - started
                return ids, mask, logprobs, turns
            step = await loop.run_in_executor(_EXECUTOR, session.step, reply)
            metrics["tool_calls"] += time.perf_counter() - started
            if step.result is not None:
                return ids, mask, logprobs, turns
            final_call = step.final_call
            previous = [*messages, {"role": "assistant", "content": text}]
            messages = [*previous, {"role": "user", "content": step.observation}]
            merged, mask, new_logprobs = await self.ct_merge_context_msg(
                previous, messages, ids, mask, logprobs if logprobs else None
            )
            ids = merged.token_ids
            logprobs = new_logprobs or []
