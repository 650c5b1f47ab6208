"""The verl 0.9.1 adapters with real DataProto objects, loaded through verl's own loaders."""

from __future__ import annotations

import asyncio
import copy
import os

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402

from rewards import score_response  # noqa: E402
from rewards.verl_adapter import RecallRewardManager  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from recallm.tiny import create_tiny
    from recallm.tokens import load_tokenizer

    return load_tokenizer(create_tiny(tmp_path_factory.mktemp("tiny-reward")))


def _row(tokenizer, response: str, n_left_pad=3, n_right_pad=5):
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "17: bako\n18: kuri\n19: sela\nWhat is the value of 18?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    g = prompt.index("18: kuri")
    gt = {"category": "retrieval", "answers": ["kuri"], "gold": [{"text": "18: kuri", "start": g, "end": g + 8}]}
    p_ids = tokenizer(prompt)["input_ids"]
    r_ids = tokenizer(response)["input_ids"] + [tokenizer.eos_token_id]
    P, R = len(p_ids) + n_left_pad, len(r_ids) + n_right_pad
    prompts = torch.full((P,), tokenizer.pad_token_id)
    prompts[n_left_pad:] = torch.tensor(p_ids)
    responses = torch.full((R,), tokenizer.pad_token_id)
    responses[: len(r_ids)] = torch.tensor(r_ids)
    mask = torch.zeros(P + R, dtype=torch.long)
    mask[n_left_pad:P] = 1
    mask[P : P + len(r_ids)] = 1
    return prompt, gt, prompts, responses, mask, len(r_ids)


def _batch(rows, extra_info):
    return DataProto.from_dict(
        tensors={
            "prompts": torch.stack([r[2] for r in rows]),
            "responses": torch.stack([r[3] for r in rows]),
            "attention_mask": torch.stack([r[4] for r in rows]),
        },
        non_tensors={
            "reward_model": np.array([{"ground_truth": r[1]} for r in rows], dtype=object),
            "data_source": np.array(["kv_retrieval"] * len(rows), dtype=object),
            "extra_info": np.array([extra_info] * len(rows), dtype=object),  # shared, as verl's repeat does
        },
    )


RESPONSES = [
    "the key <|start_recall|>18: kuri<|end_recall|> so</think>\nAnswer: kuri",
    "guess</think>\nAnswer: bako",
    "<|start_recall|>17<|end_recall|><|start_recall|>19: sela",
]


def _trainer_config(**reward_kwargs):
    import verl.trainer.config as verl_config
    from hydra import compose, initialize_config_dir

    overrides = [
        "reward.reward_manager.source=importlib",
        "reward.reward_manager.name=RecallRewardManager",
        "reward.reward_manager.module.path=pkg://rewards.verl_adapter",
    ] + [f"+reward.reward_kwargs.recallm.{k}={v}" for k, v in reward_kwargs.items()]
    with initialize_config_dir(config_dir=os.path.dirname(verl_config.__file__), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_manager_loaded_by_verl_scores_like_the_library(tokenizer):
    from verl.trainer.ppo.reward import load_reward_manager

    manager = load_reward_manager(_trainer_config(), tokenizer)
    assert isinstance(manager, RecallRewardManager)
    for response in RESPONSES:
        prompt, gt, *_, n_tokens = row = _row(tokenizer, response)
        out = manager.loop.run_until_complete(manager.run_single(_batch([row], {"index": 0})))
        expected = score_response(response, gt, prompt_text=prompt, n_tokens=n_tokens)
        assert out["reward_score"] == pytest.approx(expected.score)
        assert out["reward_extra_info"] == pytest.approx(expected.as_dict())
    # the first response is perfect, the second gets the format only
    first = manager.loop.run_until_complete(manager.run_single(_batch([_row(tokenizer, RESPONSES[0])], {})))
    assert first["reward_score"] == pytest.approx(1.0)


def test_reward_settings_from_trainer_config(tokenizer):
    from verl.trainer.ppo.reward import load_reward_manager

    # a generation cap of 104 tokens, the penalty over the last 100: it starts after 4 tokens
    manager = load_reward_manager(
        _trainer_config(**{"overlong.max_response_length": 104, "overlong.buffer": 100}), tokenizer
    )
    row = _row(tokenizer, RESPONSES[0])
    out = manager.loop.run_until_complete(manager.run_single(_batch([row], {})))
    n = row[-1]
    assert out["reward_extra_info"]["overlong_penalty"] == pytest.approx(1 - (n - 4) / 100)


def test_identical_rollouts_score_identically_and_extra_info_is_untouched(tokenizer):
    manager = RecallRewardManager(_trainer_config(), tokenizer)
    shared = {"index": 7, "split": "train", "nested": {"a": [1, 2]}}
    before = copy.deepcopy(shared)
    for response in RESPONSES:
        row = _row(tokenizer, response)
        single = manager.loop.run_until_complete(manager.run_single(_batch([row], shared)))["reward_score"]
        batch = _batch([row] * 16, shared)

        async def all_rows(b=batch):
            return await asyncio.gather(*(manager.run_single(b[i : i + 1]) for i in range(len(b))))

        scores = [o["reward_score"] for o in manager.loop.run_until_complete(all_rows())]
        assert scores == [single] * 16
    assert shared == before


def test_custom_reward_function_path(tokenizer):
    """verl's naive manager with our compute_score: prompt text and length through extra_info."""
    import verl.trainer.config as verl_config
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.reward import load_reward_manager

    with initialize_config_dir(config_dir=os.path.dirname(verl_config.__file__), version_base=None):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[
                "reward.custom_reward_function.path=pkg://rewards.verl_adapter",
                "reward.custom_reward_function.name=compute_score",
            ],
        )
    manager = load_reward_manager(cfg, tokenizer)
    for response in RESPONSES:
        prompt, gt, *_, n_tokens = row = _row(tokenizer, response)
        out = manager.loop.run_until_complete(
            manager.run_single(_batch([row], {"prompt_text": prompt, "response_length": n_tokens}))
        )
        expected = score_response(response, gt, prompt_text=prompt, n_tokens=n_tokens)
        assert out["reward_score"] == pytest.approx(expected.score)
        assert out["reward_extra_info"]["recall_overlap"] == pytest.approx(expected.recall_overlap)


def test_bad_ground_truth_is_a_clear_error(tokenizer):
    from recallm.errors import RecallmError

    manager = RecallRewardManager(_trainer_config(), tokenizer)
    row = list(_row(tokenizer, RESPONSES[0]))
    row[1] = {"category": "retrieval", "answers": ["kuri"]}  # no gold passages
    with pytest.raises(RecallmError, match="has no 'gold'"):
        manager.loop.run_until_complete(manager.run_single(_batch([row], {})))
