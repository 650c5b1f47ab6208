"""Stage 1 of the SFT cold start: only the new tokens' embedding rows train (App. C.1).

Every parameter is frozen except the input embedding matrix and, for untied models, the
``lm_head`` matrix; a gradient hook on those keeps only the rows of the RecaLLM tokens. With
weight decay 0, AdamW leaves a row whose gradient is always zero exactly as it was, so every
other weight — other rows included — stays bit-identical. The hooks act on the gradient before
any optimizer or DeepSpeed reduction sees it.
"""

from __future__ import annotations

import torch

__all__ = ["freeze_all_but_token_rows", "frozen_snapshot", "changed_outside_rows"]


def _tied(model) -> bool:
    out = model.get_output_embeddings()
    return out is None or out.weight is model.get_input_embeddings().weight


def freeze_all_but_token_rows(model, token_ids: list[int]) -> list[torch.nn.Parameter]:
    """Freeze ``model`` except the rows ``token_ids`` of its (input and output) embeddings."""
    for param in model.parameters():
        param.requires_grad_(False)
    matrices = [model.get_input_embeddings().weight]
    if not _tied(model):
        matrices.append(model.get_output_embeddings().weight)
    for weight in matrices:
        rows = torch.zeros(weight.shape[0], 1, dtype=weight.dtype, device=weight.device)
        rows[torch.as_tensor(sorted(set(token_ids)), dtype=torch.long)] = 1
        weight.requires_grad_(True)
        weight.register_hook(lambda grad, rows=rows: grad * rows.to(device=grad.device, dtype=grad.dtype))
    return matrices


def frozen_snapshot(model) -> dict[str, torch.Tensor]:
    """A copy of every parameter (to check the freeze after training)."""
    return {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()}


def changed_outside_rows(before: dict[str, torch.Tensor], model, token_ids: list[int]) -> list[str]:
    """Names of parameters that changed anywhere but the token rows of the embedding matrices."""
    embedding_names = {
        name
        for name, p in model.named_parameters()
        if p is model.get_input_embeddings().weight
        or (model.get_output_embeddings() is not None and p is model.get_output_embeddings().weight)
    }
    changed = []
    for name, p in model.named_parameters():
        now = p.detach().to("cpu")
        old = before[name]
        if name in embedding_names:
            other = torch.ones(now.shape[0], dtype=torch.bool)
            other[torch.as_tensor(token_ids)] = False
            if not torch.equal(now[other], old[other]):
                changed.append(name)
        elif not torch.equal(now, old):
            changed.append(name)
    return changed
