"""The paper's RL recipe holds what it promises (issue 17, item 12): 20 root turns of 4,096 tokens and
their observations fit the response length, and prompt + response fit the model length and one
training micro-batch. Before, 28,672 response tokens could not hold even 7 such turns."""

from __future__ import annotations

import pytest

from recallm.errors import RecallmError


def _compose(tmp_path, tiny_dir):
    from recallm.grpo.app import compose

    return compose(
        [
            f"recallm.rlm.out_dir={tmp_path / 'out'}",
            f"actor_rollout_ref.model.path={tiny_dir}",
            "rlm_train=mrcr_qwen3_4b",
        ],
        config_name="rlm_train",
    )


def test_the_mrcr_recipe_holds_its_longest_trajectory(tmp_path, tiny_dir):
    from recallm.rlm import prompts
    from recallm.rlm.tasks import make_task
    from recallm.rlm.train import OBSERVATION_OVERHEAD_TOKENS, trajectory_tokens

    cfg = _compose(tmp_path, tiny_dir)
    rlm, data, arr = cfg.recallm.rlm.rlm, cfg.data, cfg.actor_rollout_ref
    assert (rlm.max_iterations, rlm.root_max_new_tokens) == (20, 4096)  # the paper's
    needed = trajectory_tokens(rlm)
    # 21 turns (20 + the last call for the answer) x 4,096, 20 observations of ceil(5,000 / 3) + 256
    assert needed == 21 * 4096 + 20 * (1667 + 256) == 124_476
    assert needed <= data.max_response_length
    assert data.max_prompt_length + data.max_response_length <= arr.rollout.max_model_len
    assert arr.actor.ppo_max_token_len_per_gpu >= data.max_prompt_length + data.max_response_length
    assert arr.rollout.max_model_len <= 262_144  # Qwen3-4B-Instruct-2507's native window
    # the overhead budget holds the longest text an observation carries besides block output
    task = make_task("mrcr", 32 * 1024, 0, seed=0, needles=2)
    extra = (
        prompts.turn_reminder(task.query)
        + "\n\n"
        + max((prompts.NO_CODE_NUDGE, prompts.CUT_OFF_NUDGE, prompts.FINAL_CUT_OFF), key=len)
    )
    assert len(extra) / 3 < OBSERVATION_OVERHEAD_TOKENS - 32  # 32: chat-template turn markers and block headers


def test_the_old_numbers_do_not_fit(tmp_path, tiny_dir):
    """The arithmetic is not vacuous: the recipe as it was (paper's observation cap, 28,672 tokens)."""
    from recallm.rlm.train import trajectory_tokens

    old = {"max_iterations": 20, "root_max_new_tokens": 4096, "max_observation_chars": 20_000}
    assert trajectory_tokens(old) > 28_672
    with pytest.raises(RecallmError, match="root_max_new_tokens"):
        trajectory_tokens({"root_max_new_tokens": None})
