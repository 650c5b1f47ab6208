"""The RecaLLM composite reward (paper §4.3, App. C.5, Table 5).

* ``parsing``  - think block, recall spans, final answer of any response string;
* ``metrics``  - answer metrics (exact match, subEM, net recall, multiple choice, NDCG@10, citation);
* ``recall``   - interval-F1 recall reward, density and correctness penalties;
* ``config``   - the per-category table (``configs/reward/paper.yaml``) and ground-truth checks;
* ``score``    - ``score_response``: the composite score and its breakdown;
* ``verl_adapter`` - ``compute_score`` for verl's ``custom_reward_function`` and
  ``RecallRewardManager`` for ``reward.reward_manager`` (imports verl).
"""

from rewards.config import CategoryReward, RewardConfig, check_ground_truth, check_rows, load_reward_config
from rewards.parsing import ParsedResponse, parse_response
from rewards.score import RewardBreakdown, score_response

__all__ = [
    "CategoryReward",
    "RewardConfig",
    "check_ground_truth",
    "check_rows",
    "load_reward_config",
    "ParsedResponse",
    "parse_response",
    "RewardBreakdown",
    "score_response",
]
