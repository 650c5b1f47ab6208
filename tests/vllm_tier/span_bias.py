"""A test aid of the vLLM tier: a V1 logits processor that raises ``<|start_recall|>``'s logit by a
constant in every row, so that the untrained tiny model opens recall spans often.

It changes nothing inside a span: there ``RecallLogitsProcessorV1`` leaves the start token at -inf
whether it runs before or after this one (it is never in the allowed set), so the rollout's
processed log-probs inside spans are still those of the masked distribution the actor computes.
Outside spans the rollout samples from the biased distribution (its log-probs differ from the
actor's there: tests only compare inside spans). Loaded by name, as verl loads any processor:
``tests.vllm_tier.span_bias:StartRecallBiasV1`` (the checkout on ``PYTHONPATH``).
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor

BIAS = 4.0


class StartRecallBiasV1(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.start = int(vllm_config.model_config.hf_config.recall_start_token_id)

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        return None

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        return None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        logits[:, self.start] += BIAS
        return logits
