"""Validates the GRPO front ends' per-token arguments and turns them into flat `[N]` tensors.

Padded layout: completion_ids / completion_mask / old / ref / is_weights are [B, T], advantages and
is_weights may be [B] or [B, 1] (one per sequence; vespo then counts a weight once per sequence).
Packed layout (`cu_seqlens` [B+1] given): the same arguments are [N], advantages and is_weights may be [B].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import checks
from .layout import TokenLayout, packed_layout, padded_layout
from .options import GRPOLossConfig
from .token_math import TokenInputs, entropy_weights, reduction_weights


class PerTokenArguments(NamedTuple):
    """The front ends' per-token arguments as the caller gave them (old, ref and is_weights may be None)."""

    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    is_weights: torch.Tensor | None


@dataclass(frozen=True)
class PreparedBatch:
    layout: TokenLayout
    targets: torch.Tensor  # [N] int64, padding positions clamped into the vocabulary
    inputs: TokenInputs


def prepare_batch(
    per_token: PerTokenArguments,
    *,
    num_items_in_batch,
    cu_seqlens,
    config: GRPOLossConfig,
    vocab: int,
    source_name: str,
    source: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    validate: bool = True,
) -> PreparedBatch:
    """Check the per-token arguments against `source` (hidden [.., H] or logits [.., V], named
    `source_name`) and flatten them to [N] tensors of `dtype` (the accumulation dtype). validate=False
    skips the checks that read values (host synchronisations on a GPU)."""
    if not isinstance(config, GRPOLossConfig):
        raise TypeError(f"config: expected a GRPOLossConfig, got {type(config).__name__}")
    completion_ids, completion_mask, advantages, old_logprobs, ref_logprobs, is_weights = per_token
    ids, layout = _checked_layout(completion_ids, completion_mask, cu_seqlens, source_name, source, dtype, validate)
    active = layout.mask.bool()
    flat_ids = ids.reshape(-1)
    if validate:
        checks.require_token_ids("completion_ids", flat_ids, vocab, active)
    targets = torch.where(active, flat_ids, torch.zeros_like(flat_ids)).to(torch.int64)

    flatten = _Flattener(ids, layout, packed=cu_seqlens is not None, dtype=dtype, validate=validate)
    advantages_flat = flatten("advantages", advantages, allow_per_seq=True)
    if advantages_flat is None:
        raise ValueError("advantages: required ([B] or per-token)")
    if config.beta != 0.0 and ref_logprobs is None:
        raise ValueError(f"ref_logprobs: required when beta > 0 (beta={config.beta})")
    _check_num_items(num_items_in_batch, validate)
    inputs = TokenInputs(
        old_logprobs=flatten("old_logprobs", old_logprobs, allow_per_seq=False),
        ref_logprobs=flatten("ref_logprobs", ref_logprobs, allow_per_seq=False) if config.beta != 0.0 else None,
        advantages=advantages_flat,
        is_weights=flatten("is_weights", is_weights, allow_per_seq=True),
        loss_weights=reduction_weights(layout, config, num_items_in_batch),
        entropy_weights=entropy_weights(layout),
        is_weights_per_sequence="is_weights" in flatten.per_sequence,
    )
    return PreparedBatch(layout, targets, inputs)


def _checked_layout(completion_ids, completion_mask, cu_seqlens, source_name, source, dtype, validate):
    """(completion_ids, TokenLayout) of the padded [B, T] or packed [N] + cu_seqlens [B+1] layout, every shape,
    device and (with `validate`) value checked against `source`."""
    device, leading = source.device, tuple(source.shape[:-1])
    if len(leading) != (1 if cu_seqlens is not None else 2):
        layout_name = "[N, ...] (packed, cu_seqlens given)" if cu_seqlens is not None else "[B, T, ...] (padded)"
        raise ValueError(f"{source_name}: expected shape {layout_name}, got {list(source.shape)}")
    ids = checks.require_tensor("completion_ids", completion_ids)
    checks.require_integer("completion_ids", ids)
    checks.require_shape("completion_ids", ids, leading, f"the leading dimensions of {source_name}")
    checks.require_device("completion_ids", ids, device)
    mask = checks.require_tensor("completion_mask", completion_mask)
    checks.require_device("completion_mask", mask, device)
    if cu_seqlens is None:
        if ids.dim() != 2:
            raise ValueError(f"completion_ids: expected shape [B, T] (padded layout), got {list(ids.shape)}")
        checks.require_shape("completion_mask", mask, ids.shape, "[B, T] like completion_ids")
        if validate and mask.is_floating_point() and bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError("completion_mask: expected values in {0, 1}")
        return ids, padded_layout(mask != 0, dtype)
    cu = checks.require_tensor("cu_seqlens", cu_seqlens)
    checks.require_integer("cu_seqlens", cu)
    if ids.dim() != 1:
        raise ValueError(f"completion_ids: expected shape [N] (packed layout with cu_seqlens), got {list(ids.shape)}")
    checks.require_shape("completion_mask", mask, ids.shape, "[N] like completion_ids")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"cu_seqlens: expected [B+1] offsets, got shape {list(cu.shape)}")
    if validate and (int(cu[0]) != 0 or int(cu[-1]) != ids.numel()):
        raise ValueError(f"cu_seqlens: expected [B+1] offsets from 0 to N={ids.numel()}, got {cu.tolist()}")
    if validate and bool((cu[1:] < cu[:-1]).any()):
        raise ValueError("cu_seqlens: expected non-decreasing offsets")
    return ids, packed_layout(mask != 0, cu, dtype)


class _Flattener:
    """Flattens one optional per-token argument to [N] (`dtype`, 0 at inactive positions), accepting one value
    per sequence ([B], or TRL's [B, 1]) where allowed; records which arguments came per sequence."""

    def __init__(self, ids: torch.Tensor, layout: TokenLayout, packed: bool, dtype: torch.dtype, validate: bool):
        self.ids, self.layout, self.packed, self.dtype, self.validate = ids, layout, packed, dtype, validate
        self.active = layout.mask.bool()
        self.per_sequence: set[str] = set()

    def __call__(self, name: str, value, allow_per_seq: bool) -> torch.Tensor | None:
        if value is None:
            return None
        layout, ids = self.layout, self.ids
        value = checks.require_tensor(name, value)
        checks.require_floating(name, value)
        checks.require_device(name, value, ids.device)
        if allow_per_seq and value.dim() == 2 and tuple(value.shape) == (layout.num_seqs, 1) and ids.dim() == 2:
            value = value.reshape(-1)  # [B, 1] (TRL's per-sequence shape) as [B]; at T = 1 both mean the same
        one_per_sequence = value.dim() == 1 and value.numel() == layout.num_seqs
        if allow_per_seq and one_per_sequence and not (self.packed and value.numel() == layout.num_tokens):
            flat = value.to(self.dtype)[layout.seq_index]
            self.per_sequence.add(name)
        elif value.numel() == layout.num_tokens and tuple(value.shape) == tuple(ids.shape):
            flat = value.reshape(-1).to(self.dtype)
        else:
            per_seq = f"[B]={layout.num_seqs} or " if allow_per_seq else ""
            raise ValueError(
                f"{name}: expected shape {per_seq}{list(ids.shape)} like completion_ids, got {list(value.shape)}"
            )
        if self.validate:
            checks.require_finite(name, flat, self.active)
        return torch.where(self.active, flat, torch.zeros_like(flat))


def _check_num_items(num_items_in_batch, validate: bool) -> None:
    """ValueError unless num_items_in_batch is None or a positive finite count (a tensor is read only when
    validating: a host synchronisation on a GPU)."""
    if isinstance(num_items_in_batch, (int, float)):  # a host number: checked without touching a device
        valid = math.isfinite(num_items_in_batch) and num_items_in_batch > 0
    elif num_items_in_batch is not None and validate:
        count = torch.as_tensor(num_items_in_batch)
        valid = count.numel() == 1 and bool(torch.isfinite(count.float()).all()) and float(count) > 0
    else:
        valid = True
    if not valid:
        raise ValueError(f"num_items_in_batch: expected a positive count, got {num_items_in_batch!r}")
