"""A test-only fault (``tests/integration/test_grpo_algorithms.py``): the ``hf_cpu`` rollout ignores every weight
update, as a LoRA adapter that never reaches the rollout engine does (verl#7495). Imported in every verl process of
a run through ``VERL_USE_EXTERNAL_MODULES=tests.frozen_rollout`` (with the checkout on PYTHONPATH); it patches the
rollout's generator (``recallm.grpo.cpu.hf_generate``, which imports nothing of verl, so it loads whole here)."""

from __future__ import annotations

from recallm.grpo.cpu.hf_generate import HFGenerator


def load_weights(self, named_tensors) -> int:
    if not getattr(self, "_frozen_said", False):
        print("[recallm] test fault: the hf_cpu rollout ignores weight updates", flush=True)
        self._frozen_said = True
    return sum(1 for _ in named_tensors)  # received, not loaded


def finish_weight_update(self) -> None:
    return None


HFGenerator.load_weights = load_weights
HFGenerator.finish_weight_update = finish_weight_update
