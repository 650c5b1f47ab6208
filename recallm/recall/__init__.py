"""Constrained decoding for recall spans: one matcher, every consumer calls it.

* ``matcher``  - ``RecallMatcher``: the allowed set inside a span (the one implementation).
* ``hf``       - ``RecallLogitsProcessor`` for ``model.generate`` (and ``ForceRecallSpans``).
* ``mask``     - training-time masks for teacher-forced, padded or packed batches.
* ``spans``    - the spans of a sequence and whether each is verbatim.
"""

from recallm.recall.hf import ForceRecallSpans, RecallLogitsProcessor
from recallm.recall.mask import MASK_VALUE, AllowedPositions, allowed_positions, apply_recall_mask
from recallm.recall.matcher import RecallMatcher, iter_allowed_sets
from recallm.recall.spans import RecallSpan, find_spans

__all__ = [
    "RecallMatcher",
    "iter_allowed_sets",
    "RecallLogitsProcessor",
    "ForceRecallSpans",
    "MASK_VALUE",
    "AllowedPositions",
    "allowed_positions",
    "apply_recall_mask",
    "RecallSpan",
    "find_spans",
]
