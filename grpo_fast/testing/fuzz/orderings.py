"""Re-orderings of a case that leave its exact results unchanged and redraw the rounding of every sum in it.

Permuting the vocabulary (the rows of weight and bias, the columns of logits, the ids) and the hidden dimension
(the columns of hidden and weight) changes the order in which the GEMMs, the log-sum-exps and the softmax's
backward add their terms, and nothing else. The tolerance rule's peer error is PyTorch's own error in the
case's precision; one evaluation of it is one draw of a rounding error, which for an ill-conditioned quantity
(a cancellation of terms much larger than the result: 1 − p_y with p_y → 1, exp(x) − x − 1 with x ≫ 1 under
the bias-corrected KL, advantages of ±1e4 in one sum) can happen to be far below its typical size. The peer
error is therefore the largest over the plain evaluation and a few re-ordered ones (grpo_fast.testing.fuzz.check).
"""

from __future__ import annotations

import dataclasses

import torch

from .inputs import FuzzInputs


def reordered(inputs: FuzzInputs, seed: int) -> tuple[FuzzInputs, dict[str, tuple]]:
    """(the case with its vocabulary and hidden dimension permuted, {gradient name: index that maps the
    re-ordered gradient back}); `seed` picks the permutations."""
    gen = torch.Generator().manual_seed(seed)
    vocab = inputs.logits.shape[-1] if inputs.logits is not None else inputs.weight.shape[0]
    order = torch.randperm(vocab, generator=gen)
    back = torch.argsort(order)  # new id of each old id
    token = dict(inputs.token)
    ids = token["completion_ids"]
    token["completion_ids"] = torch.where((ids >= 0) & (ids < vocab), back[ids.clamp(0, vocab - 1)], ids)
    changes = dict(token=token, targets=back[inputs.targets])
    if inputs.logits is not None:
        changes["logits"] = inputs.logits[..., order]
        return dataclasses.replace(inputs, **changes), {"grad/logits": (slice(None), back)}
    columns = torch.randperm(inputs.weight.shape[1], generator=gen)
    changes |= dict(hidden=inputs.hidden[..., columns], weight=inputs.weight[order][:, columns])
    if inputs.bias is not None:
        changes["bias"] = inputs.bias[order]
    column_back = torch.argsort(columns)
    maps = {"grad/hidden": (..., column_back), "grad/weight": (back[:, None], column_back), "grad/bias": (back,)}
    return dataclasses.replace(inputs, **changes), maps


def restore(outputs: dict[str, torch.Tensor], maps: dict) -> dict[str, torch.Tensor]:
    """The quantities of a re-ordered case in the original order (gradients re-indexed, the rest as they are)."""
    return {name: value[maps[name]] if name in maps else value for name, value in outputs.items()}
