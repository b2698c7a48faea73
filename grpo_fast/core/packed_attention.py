"""How a packed row's attention keeps its sequences apart.

A packed micro-batch is one row of several sequences (position ids restarting at 0 for each). Its attention
can run three ways, its "attention path":

- "varlen": the model's own attention is variable-length: transformers' flash_attention_* implementations read
  the restarting position ids as sequence boundaries and run flash-attn's varlen kernel. Work: Σ L_i² scores.
- "per_sequence": grpo_fast's attention function (registered with transformers as PER_SEQUENCE): the row's
  sequences split into length buckets (`length_buckets`: lengths in (2^(k-1), 2^k] share bucket k), each
  bucket's queries, keys and values gathered into a [n_b, W_b] batch (each sequence right-padded to the
  bucket's longest, W_b), one causal `scaled_dot_product_attention` per bucket, the outputs gathered back into
  the row. Right padding under a causal mask never reaches a real query, so no mask is built. Work: Σ_b n_b ·
  W_b² scores, under 4 Σ L_i² (W_b < 2 L_i within a bucket) and never more than the padded micro-batch of the
  same sequences: one long completion among short ones no longer pads every short one to its length. Exact for
  causal attention without sliding windows or logit soft-capping (it refuses those).
- "block_mask": the model's own attention (sdpa, eager) over the whole row with transformers' block-diagonal
  mask. Work: L_row² scores: with 64 sequences of ~160 tokens in a row, ~64x the per-sequence work, and a
  [L_row, L_row] mask built for every forward.

`attention_path` names the path a model gets (`run.packed_attention`); `packed_hidden` runs a packed row
through it.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpo_fast.core.policy import last_hidden, segments

PER_SEQUENCE = "grpo_fast_per_sequence"
"""The name grpo_fast's per-sequence attention function is registered under in transformers' AttentionInterface."""
PATHS = ("varlen", "per_sequence", "block_mask")
_SPLITTABLE = ("sdpa", "eager")  # implementations whose math the per-sequence path reproduces exactly


def length_buckets(lengths: list[int]) -> list[list[int]]:
    """The indices of `lengths` (each > 0) grouped by ceil(log2(length)), shortest bucket first, each in order:
    within a bucket the longest is under twice the shortest."""
    buckets: dict[int, list[int]] = {}
    for i, length in enumerate(lengths):
        buckets.setdefault((length - 1).bit_length(), []).append(i)
    return [buckets[k] for k in sorted(buckets)]


def bucketed_scores(lengths: list[int]) -> int:
    """Attention scores of the per-sequence path over sequences of `lengths`: Σ_b n_b · W_b²."""
    return sum(len(b) * max(lengths[i] for i in b) ** 2 for b in length_buckets(lengths))


@dataclass(frozen=True)
class LengthBucket:
    """One bucket of a packed row's sequences: gather [n * width], the row position of each slot of its
    [n, width] batch (padding slots point at position 0)."""

    gather: torch.Tensor
    n: int
    width: int


@dataclass(frozen=True)
class PackedLayout:
    """Where a packed row's sequences lie, for the per-sequence path: `buckets` (see `length_buckets`), and
    scatter [L], the slot of each row position in the buckets' outputs laid end to end."""

    buckets: tuple[LengthBucket, ...]
    scatter: torch.Tensor

    @classmethod
    def from_lengths(cls, lengths: list[int], device=None) -> PackedLayout:
        """The layout of sequences of `lengths` tokens (each > 0), in row order."""
        sizes = torch.tensor(lengths, dtype=torch.long)
        owner, within, starts = segments(sizes)
        slot_of = torch.zeros(len(lengths), dtype=torch.long)  # each sequence's first slot in the buckets' outputs
        buckets, offset = [], 0
        for members in length_buckets(lengths):
            index = torch.tensor(members, dtype=torch.long)
            width = int(sizes[index].max())
            slot = torch.arange(width)
            gather = torch.where(slot[None] < sizes[index, None], starts[index, None] + slot[None], 0)
            buckets.append(LengthBucket(gather.reshape(-1).to(device), len(members), width))
            slot_of[index] = offset + torch.arange(len(members)) * width
            offset += len(members) * width
        return cls(tuple(buckets), (slot_of[owner] + within).to(device))


def per_sequence_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    packed_layout: PackedLayout | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface for a packed row: query [1, heads, L, d], key / value [1, kv_heads, L, d]
    -> ([1, L, heads, d], None), each sequence attending causally to itself only (see the module doc)."""
    if packed_layout is None:
        raise RuntimeError(f"{PER_SEQUENCE} attention needs packed_layout= in the forward (a packed row's layout)")
    if query.shape[0] != 1 or attention_mask is not None:
        raise RuntimeError(f"{PER_SEQUENCE} attention takes one packed row without an attention mask")
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise RuntimeError(f"{PER_SEQUENCE} attention does not reproduce sliding windows or logit soft-capping")
    kwargs["is_causal"] = True
    outs = []
    for bucket in packed_layout.buckets:
        out, _ = sdpa_attention_forward(
            module, _split(query, bucket), _split(key, bucket), _split(value, bucket), None, **kwargs
        )
        outs.append(out.reshape(-1, out.shape[2], out.shape[3]))  # out [n, W, heads, d]
    return torch.cat(outs).index_select(0, packed_layout.scatter)[None], None


def _split(x: torch.Tensor, bucket: LengthBucket) -> torch.Tensor:
    """A packed row's [1, heads, L, d] -> the bucket's [n, heads, W, d] (each sequence right-padded)."""
    heads, dim = x.shape[1], x.shape[3]
    return x[0].index_select(1, bucket.gather).view(heads, bucket.n, bucket.width, dim).transpose(0, 1)


AttentionInterface.register(PER_SEQUENCE, per_sequence_attention)


def implementation(model: torch.nn.Module) -> str | None:
    """The model's attention implementation as transformers names it (sdpa, eager, flash_attention_2, ...)."""
    return getattr(model.config, "_attn_implementation", None)


def attention_path(model: torch.nn.Module, requested: str = "auto") -> str:
    """The attention path of the model's packed rows (see the module doc) for `requested` ("auto": the model's
    own when it is variable-length, else per_sequence where the model's attention is sdpa or eager, else
    block_mask; "model": the model's own, variable-length or not; "per_sequence"). A model under gradient
    checkpointing never gets per_sequence (its recomputation in the backward would run the model's own)."""
    if requested not in ("auto", "model", "per_sequence"):
        raise ValueError(f"run.packed_attention: expected auto, model or per_sequence, got {requested!r}")
    name = implementation(model) or ""
    # Gradient checkpointing recomputes a layer's forward in the backward, after packed_hidden has given the model
    # its own attention back: the per-sequence path would be recomputed as another (and fail torch's check).
    checkpointed = getattr(model, "is_gradient_checkpointing", False)
    if requested == "per_sequence" and checkpointed:
        raise ValueError("run.packed_attention: per_sequence does not run under model.gradient_checkpointing")
    if requested == "per_sequence":
        return "per_sequence"
    if "flash" in name:
        return "varlen"
    return "per_sequence" if requested == "auto" and name in _SPLITTABLE and not checkpointed else "block_mask"


@contextmanager
def _implementation(model: torch.nn.Module, name: str):
    """The model's attention implementation set to `name` inside the block (restored after)."""
    before = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = before


def packed_hidden(model: torch.nn.Module, path: str, layout: PackedLayout | None, **inputs) -> torch.Tensor:
    """The backbone's last hidden states [1, L, H] of a packed row (input_ids and position_ids [1, L]) with its
    attention through `path`; the per-sequence path needs the row's `layout`."""
    if path != "per_sequence":
        return last_hidden(model, **inputs)
    with _implementation(model, PER_SEQUENCE):
        return last_hidden(model, **inputs, packed_layout=layout)
