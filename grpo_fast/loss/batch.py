"""Validates the GRPO front ends' per-token arguments and turns them into flat `[N]` tensors.

Padded layout: completion_ids / completion_mask / old / ref / is_weights / rollout logprobs are [B, T], advantages
and is_weights may be [B] or [B, 1] (one per sequence; vespo then counts a weight once per sequence).
Packed layout (`cu_seqlens` [B+1] given): the same arguments are [N], advantages and is_weights may be [B].

The checks that read values (token ids in range, finite inputs, mask values, offsets) are `check_values`; under
torch.compile they run inside the custom op grpo_fast::checked_targets, whose output the loss consumes.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import checks
from .layout import TokenLayout, packed_layout, padded_layout
from .options import GRPOLossConfig
from .token_math import TokenInputs, entropy_weights, reduction_weights


class PerTokenArguments(NamedTuple):
    """The front ends' per-token arguments as the caller gave them (old, ref, is_weights and the rollout's logprobs
    may be None)."""

    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    is_weights: torch.Tensor | None
    rollout_logprobs: torch.Tensor | None = None


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
    completion_ids, completion_mask, advantages, old_logprobs, ref_logprobs, is_weights, rollout_logprobs = per_token
    check_offsets = validate and not torch.compiler.is_compiling()
    ids, layout = _checked_layout(
        completion_ids, completion_mask, cu_seqlens, source_name, source, dtype, check_offsets
    )
    flatten = _Flattener(ids, layout, packed=cu_seqlens is not None, dtype=dtype)
    advantages_flat = flatten("advantages", advantages, allow_per_seq=True)
    if advantages_flat is None:
        raise ValueError("advantages: required ([B] or per-token)")
    if config.beta != 0.0 and ref_logprobs is None:
        raise ValueError(f"ref_logprobs: required when beta > 0 (beta={config.beta})")
    objective = config.objective_spec
    if objective.needs_rollout_logprobs and rollout_logprobs is None:
        raise ValueError(
            f"rollout_logprobs: the objective {objective.name!r} needs the inference engine's logprobs of the sampled "
            "tokens (shaped like completion_ids); pass them (the trainer passes the engine's sampling logprobs)"
        )
    _check_num_items(num_items_in_batch, validate and not torch.compiler.is_compiling())
    inputs = TokenInputs(
        old_logprobs=flatten("old_logprobs", old_logprobs, allow_per_seq=False),
        ref_logprobs=flatten("ref_logprobs", ref_logprobs, allow_per_seq=False) if config.beta != 0.0 else None,
        advantages=advantages_flat,
        is_weights=flatten("is_weights", is_weights, allow_per_seq=True),
        loss_weights=reduction_weights(layout, config, num_items_in_batch),
        entropy_weights=entropy_weights(layout),
        is_weights_per_sequence="is_weights" in flatten.per_sequence,
        rollout_logprobs=(
            flatten("rollout_logprobs", rollout_logprobs, allow_per_seq=False)
            if objective.needs_rollout_logprobs
            else None
        ),
    )
    flat_ids, mask = ids.reshape(-1), completion_mask.reshape(-1)
    if torch.compiler.is_compiling():  # the value checks as a custom op whose output (the targets) is used
        targets = checked_targets(flat_ids, mask, vocab, *_float_inputs(inputs), validate)
    else:
        targets = check_values(flat_ids, mask, vocab, *_float_inputs(inputs), validate=validate)
    return PreparedBatch(layout, targets, inputs)


FLOAT_INPUTS = ("advantages", "old_logprobs", "ref_logprobs", "is_weights", "rollout_logprobs")


def _float_inputs(inputs: TokenInputs) -> tuple[torch.Tensor | None, ...]:
    """The flat per-token float inputs in FLOAT_INPUTS' order (0 at padding, so only an active NaN/inf remains)."""
    return tuple(getattr(inputs, name) for name in FLOAT_INPUTS)


def check_values(ids, mask, vocab, *float_inputs, validate: bool = True) -> torch.Tensor:
    """The checks that read values — mask values in {0, 1}, token ids in [0, vocab) and finite per-token inputs
    where the mask is set — when `validate`; -> the layer-1 targets [N] int64 (the ids, 0 at padding). ids, mask
    [N]; float_inputs: flat [N] or None, named by FLOAT_INPUTS. (cu_seqlens' values: `_checked_layout`.)"""
    active = mask != 0
    if validate:
        if mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):  # TRL would count a 2 twice
            raise ValueError("completion_mask: expected values in {0, 1}")
        checks.require_token_ids("completion_ids", ids, vocab, active)
        for name, values in zip(FLOAT_INPUTS, float_inputs, strict=True):
            if values is not None:
                checks.require_finite(name, values, active)
    return torch.where(active, ids, torch.zeros_like(ids)).to(torch.int64)


@torch.library.custom_op("grpo_fast::checked_targets", mutates_args=())
def checked_targets(
    ids: torch.Tensor,
    mask: torch.Tensor,
    vocab: int,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    is_weights: torch.Tensor | None,
    rollout_logprobs: torch.Tensor | None,
    validate: bool,
) -> torch.Tensor:
    """`check_values` as an op: under torch.compile the value checks run when the graph runs (a ValueError naming
    the argument, as in eager mode), and their output, the targets [N] int64, feeds layer 1."""
    floats = (advantages, old_logprobs, ref_logprobs, is_weights, rollout_logprobs)
    return check_values(ids, mask, vocab, *floats, validate=validate)


@checked_targets.register_fake
def _(ids, mask, vocab, *rest):
    return torch.empty_like(ids, dtype=torch.int64)


def _checked_layout(completion_ids, completion_mask, cu_seqlens, source_name, source, dtype, check_offsets):
    """(completion_ids, TokenLayout) of the padded [B, T] or packed [N] + cu_seqlens [B+1] layout, every shape and
    device checked against `source`, and with `check_offsets` cu_seqlens' values (the others: `check_values`)."""
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
        return ids, padded_layout(mask != 0, dtype)
    cu = checks.require_tensor("cu_seqlens", cu_seqlens)
    checks.require_integer("cu_seqlens", cu)
    if ids.dim() != 1:
        raise ValueError(f"completion_ids: expected shape [N] (packed layout with cu_seqlens), got {list(ids.shape)}")
    checks.require_shape("completion_mask", mask, ids.shape, "[N] like completion_ids")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"cu_seqlens: expected [B+1] offsets, got shape {list(cu.shape)}")
    if check_offsets and (int(cu[0]) != 0 or int(cu[-1]) != ids.numel()):
        raise ValueError(f"cu_seqlens: expected [B+1] offsets from 0 to N={ids.numel()}, got {cu.tolist()}")
    if check_offsets and bool((cu[1:] < cu[:-1]).any()):
        raise ValueError("cu_seqlens: expected non-decreasing offsets")
    return ids, packed_layout(mask != 0, cu, dtype)


class _Flattener:
    """Flattens one optional per-token argument to [N] (`dtype`, 0 at inactive positions), accepting one value
    per sequence ([B], or TRL's [B, 1]) where allowed; records which arguments came per sequence."""

    def __init__(self, ids: torch.Tensor, layout: TokenLayout, packed: bool, dtype: torch.dtype):
        self.ids, self.layout, self.packed, self.dtype = ids, layout, packed, dtype
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
        return torch.where(self.active, flat, torch.zeros_like(flat))


def _check_num_items(num_items_in_batch, validate: bool) -> None:
    """ValueError unless num_items_in_batch is None or a positive finite count (a tensor is read only when
    validating: a host synchronisation on a GPU)."""
    if isinstance(num_items_in_batch, (int, float)):  # a host number: checked without touching a device
        valid = math.isfinite(num_items_in_batch) and num_items_in_batch > 0
    elif num_items_in_batch is not None and not isinstance(num_items_in_batch, (torch.Tensor, numbers.Real)):
        valid = False  # a string, a list: not a count
    elif num_items_in_batch is not None and validate:
        count = torch.as_tensor(num_items_in_batch)
        valid = count.numel() == 1 and bool(torch.isfinite(count.float()).all()) and float(count) > 0
    else:
        valid = True
    if not valid:
        raise ValueError(f"num_items_in_batch: expected a positive count, got {num_items_in_batch!r}")
