"""The reward in verl 0.9.1, through its two extension points.

* ``RecallRewardManager`` (recommended) — ``reward.reward_manager.source=importlib``,
  ``reward.reward_manager.name=RecallRewardManager``,
  ``reward.reward_manager.module.path=pkg://rewards.verl_adapter``. It decodes the prompt and
  the response itself (keeping the recall tokens whether or not they are special), counts the
  generated tokens for the density and overlong terms, never mutates the ``extra_info`` that
  the n rollouts of a prompt share, and returns the whole breakdown as ``reward_extra_info``.
  Settings: ``reward.reward_kwargs.recallm`` — a path to a file shaped like
  ``configs/reward/paper.yaml``, or a mapping merged onto the paper's table (so
  ``+reward.reward_kwargs.recallm.categories.icl.tau=0.9`` changes one value); the paper's table
  when absent.
* ``compute_score`` — for ``reward.custom_reward_function`` (``path=pkg://rewards.verl_adapter``,
  ``name=compute_score``). verl's own manager gives it only the decoded response, so the prompt
  text (needed by categories that score recall against gold passages) must come in
  ``extra_info["prompt_text"]`` and the token count in ``extra_info["response_length"]``
  (estimated from the text otherwise). ``reward_kwargs`` may carry ``reward_config`` and
  ``reward_overrides``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from rewards.config import RewardConfig, load_reward_config
from rewards.score import score_response

__all__ = ["RecallRewardManager", "compute_score", "reward_config_from_trainer"]


def compute_score(
    data_source,
    solution_str: str,
    ground_truth,
    extra_info: Mapping | None = None,
    *,
    reward_config=None,
    reward_overrides=(),
    prompt_text: str | None = None,
    **_unused,
) -> dict[str, float]:
    """verl ``custom_reward_function``: the score and its breakdown as one dict."""
    info = extra_info if isinstance(extra_info, Mapping) else {}
    config = load_reward_config(reward_config, tuple(reward_overrides or ()))
    length = info.get("response_length")
    breakdown = score_response(
        solution_str,
        ground_truth,
        prompt_text=prompt_text if prompt_text is not None else info.get("prompt_text"),
        n_tokens=length,  # checked there: a NaN or a string is one RecallmError, not a raw ValueError
        data_source=data_source,
        config=config,
    )
    return breakdown.as_dict()


def reward_config_from_trainer(config) -> RewardConfig:
    """``reward.reward_kwargs.recallm`` of verl's trainer config, or the paper's defaults."""
    reward = config.get("reward") if hasattr(config, "get") else None
    kwargs = (reward.get("reward_kwargs") if reward is not None else None) or {}
    return load_reward_config(kwargs.get("recallm"))


class RecallRewardManager(RewardManagerBase):
    """verl reward manager for RecaLLM (see module doc)."""

    def __init__(self, config, tokenizer, compute_score=None, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        self.reward_config = reward_config_from_trainer(config)
        self._strip_ids = {int(i) for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None}

    def _texts(self, item) -> tuple[str, str, int]:
        prompts = item.batch["prompts"]
        responses = item.batch["responses"]
        mask = item.batch["attention_mask"]
        p_len = prompts.shape[-1]
        prompt_ids = prompts[mask[:p_len].bool()].tolist()
        n_valid = int(mask[p_len:].sum())
        response_ids = responses[:n_valid].tolist()
        while response_ids and response_ids[-1] in self._strip_ids:  # the end-of-sequence/padding tail
            response_ids.pop()
        decode = self.tokenizer.decode
        return decode(prompt_ids, skip_special_tokens=False), decode(response_ids, skip_special_tokens=False), n_valid

    def score_item(self, item) -> dict:
        prompt_text, response_text, n_tokens = self._texts(item)
        non_tensor = item.non_tensor_batch
        ground_truth = non_tensor["reward_model"]["ground_truth"]
        data_source = non_tensor.get("data_source")
        breakdown = score_response(
            response_text,
            ground_truth,
            prompt_text=prompt_text,
            n_tokens=n_tokens,
            data_source=None if data_source is None else str(data_source),
            config=self.reward_config,
        )
        return {"reward_score": breakdown.score, "reward_extra_info": breakdown.as_dict()}

    async def run_single(self, data: DataProto) -> dict:
        item = data[-1:][0]  # multi-sequence outputs: the reward is for the last sequence
        # the loop running us (the one stored at construction may not be the one awaiting)
        return await asyncio.get_running_loop().run_in_executor(None, self.score_item, item)
