"""Prefill each prompt alone, optionally in a cheaper dtype, and let ``generate`` only decode.

``HFBackend`` with ``backend.prefill_dtype`` set runs every ``generate`` call inside
:class:`RowPrefill` (the ``wrap`` hook of ``recallm.generation.generate``): before decoding, each
row's prompt but its last token goes through the model's decoder *alone* — no padding, plain causal
attention — in ``prefill_dtype``; the keys and values are cast to the model's dtype and laid out
left-padded like the batch (zeros under the padding, which the attention mask hides), and
``generate`` receives them as ``past_key_values``, so it feeds only each row's last prompt token
and decodes from there in the model's own dtype.

Why: on a CPU the prompt dominates an evaluation at a few thousand tokens. In bfloat16 a CPU
with AVX512-BF16 computes the prefill about three times faster than in float32, while decoding
(one token per step, a few rows) is faster in float32; and a prompt processed alone needs neither
the padded columns nor the (rows x heads x length x length) masked attention of a padded batch, so
decoding batches can be large. What changes: the cached keys and values carry bfloat16 rounding
(about three significant digits); greedy outputs can differ from a float32 prefill where two
tokens' scores are that close (``bench/eval_speed.py`` measures both the speed and how many outputs
agree). In the model's own dtype (``prefill_dtype`` equal to it) the outputs are those of HF's
batched prefill up to floating-point summation order.

Not with a ``length_extension`` (it patches the model that decodes, not the copy that prefills).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch

from recallm.errors import RecallmError

__all__ = ["PREFILL_DTYPES", "RowPrefill"]

PREFILL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class RowPrefill:
    """A ``wrap`` hook for ``recallm.generation.generate`` (module doc). ``dtype``: the prefill's
    (a copy of the model in it is kept when it differs from the model's)."""

    def __init__(self, model, dtype: str | torch.dtype) -> None:
        if isinstance(dtype, str):
            if dtype not in PREFILL_DTYPES:
                raise RecallmError(f"backend.prefill_dtype must be one of {sorted(PREFILL_DTYPES)}, got {dtype!r}")
            dtype = PREFILL_DTYPES[dtype]
        self.model = model
        self.dtype = dtype
        self.cache_dtype = next(model.parameters()).dtype
        self.prefill_model = model if dtype == self.cache_dtype else copy.deepcopy(model).to(dtype).eval()
        self.decoder = self.prefill_model.get_decoder()

    def cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """The ``DynamicCache`` of every row's prompt but its last token, left-padded to
        ``input_ids.shape[1] - 1`` columns; None when there is nothing to prefill."""
        from transformers import DynamicCache

        rows, width = input_ids.shape
        if width < 2:
            return None
        lengths = attention_mask.sum(dim=1).tolist()
        layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        with torch.inference_mode():
            for row, n in enumerate(lengths):
                n = int(n)
                if n < 2:  # a one-token prompt: nothing before its last token
                    continue
                ids = input_ids[row : row + 1, width - n : width - 1]
                past = self.decoder(input_ids=ids, use_cache=True).past_key_values
                for index, layer in enumerate(past.layers):
                    keys, values = layer.keys, layer.values
                    if index == len(layers):
                        shape = (rows, keys.shape[1], width - 1, keys.shape[3])
                        layers.append(
                            (
                                torch.zeros(shape, dtype=self.cache_dtype, device=keys.device),
                                torch.zeros(shape, dtype=self.cache_dtype, device=keys.device),
                            )
                        )
                    layers[index][0][row, :, width - n :] = keys[0].to(self.cache_dtype)
                    layers[index][1][row, :, width - n :] = values[0].to(self.cache_dtype)
        if not layers:
            return None
        return DynamicCache(layers, config=self.model.config)

    @contextlib.contextmanager
    def __call__(self, *, input_ids, attention_mask, prompt_lengths=None, max_new_tokens=None) -> Iterator[dict]:
        cache = self.cache(input_ids, attention_mask)
        yield {} if cache is None else {"past_key_values": cache}
