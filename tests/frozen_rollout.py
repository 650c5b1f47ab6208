"""A test-only fault (``tests/integration/test_grpo_algorithms.py``): the ``hf_cpu`` rollout server ignores every
weight update, as a LoRA adapter that never reaches the rollout engine does (verl#7495). Imported in every verl
process of a run through ``VERL_USE_EXTERNAL_MODULES=tests.frozen_rollout`` (with the checkout on PYTHONPATH)."""

from __future__ import annotations

from recallm.grpo.cpu.patches import after_import


def _freeze(module) -> None:
    cls = module.HFCPUServer

    async def load_weights(self, named_tensors):
        return 0

    async def finish_weight_update(self, global_steps=None):
        if not getattr(self, "_frozen_said", False):
            print("[recallm] test fault: the hf_cpu rollout ignores weight updates", flush=True)
            self._frozen_said = True
        if global_steps is not None:
            self._set_step(global_steps)

    cls.load_weights = load_weights
    cls.finish_weight_update = finish_weight_update


after_import("recallm.grpo.cpu.rollout", _freeze)
