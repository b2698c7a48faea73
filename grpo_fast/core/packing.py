"""Packing sequences padding-free into rows: which sequences share a row (`pack`), whether the model keeps
packed sequences apart on an attention path (`packing_error`: a probe, not a list of attention implementations —
two short sequences through the backbone packed into one row, position_ids restarting at 0 and no attention mask,
and each alone; packing is exact when the hidden states agree), and what a layout costs (`ModelFlops`)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from grpo_fast.core.packed_attention import PackedLayout, implementation, packed_hidden
from grpo_fast.core.policy import last_hidden

PROBE_LENGTHS = (7, 5)
Row = list[int]
"""Indices of the sequences packed into one row."""


def pack(lengths: list[int], capacity: int) -> list[Row]:
    """Best-fit decreasing bin packing: examples (longest first, ties by index) each go into the fullest row
    that still has room, or a new row. Returns rows of example indices, each summing to <= capacity."""
    rows: list[Row] = []
    free: list[tuple[int, int]] = []  # (room left, row index), sorted
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"example {i} has {n} tokens, more than the row capacity {capacity}")
        k = bisect.bisect_left(free, (n, -1))  # the smallest room that fits
        if k == len(free):
            rows.append([i])
            room, r = capacity - n, len(rows) - 1
        else:
            room, r = free.pop(k)
            rows[r].append(i)
            room -= n
        if room:
            bisect.insort(free, (room, r))
    return rows


@torch.no_grad()
def packing_error(model: torch.nn.Module, path: str = "block_mask") -> str | None:
    """None when packed rows whose attention runs through `path` (grpo_fast.core.packed_attention) give each
    example the hidden states it has alone (relative max difference within 1e-4 for fp32 weights, 2e-2 for half
    precision), else the reason. Runs in eval mode (no dropout; the mode is restored) and draws no random
    numbers."""
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = [torch.arange(3 + 11 * k, 3 + 11 * k + n, device=device) % vocab for k, n in enumerate(PROBE_LENGTHS)]
    was_training = model.training
    model.eval()
    try:
        alone = [
            last_hidden(model, input_ids=x[None], position_ids=torch.arange(len(x), device=device)[None]) for x in ids
        ]
        positions = torch.cat([torch.arange(len(x), device=device) for x in ids])[None]
        layout = PackedLayout.from_lengths(list(PROBE_LENGTHS), device)
        packed = packed_hidden(model, path, layout, input_ids=torch.cat(ids)[None], position_ids=positions)
    except Exception as exc:  # noqa: BLE001 - any failure of the packed forward means: do not pack
        return f"the packed forward fails ({type(exc).__name__}: {exc})"
    finally:
        model.train(was_training)
    reference = torch.cat(alone, dim=1).float()
    diff = float((packed.float() - reference).abs().max() / reference.abs().max().clamp(min=1e-12))
    tolerance = 1e-4 if next(model.parameters()).dtype == torch.float32 else 2e-2
    if diff > tolerance:
        return (
            f"packed examples see each other under attn_implementation={implementation(model)!r}, {path} attention "
            f"(relative hidden-state difference {diff:.2e} > {tolerance:.0e})"
        )
    return None


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs of one forward + backward of a causal LM, per unit of work: per token through the decoder layers'
    linear maps (6 x their weights), per attention score over all layers (query-key pair: QKᵀ and the weighted
    sum of V, forward and backward: 12 x heads x head_dim x layers), per completion position through the
    lm_head (6 x H x V)."""

    per_token: float
    per_score: float
    per_head_row: float

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelFlops:
        config = model.config
        head = model.get_output_embeddings().weight
        embeddings = model.get_input_embeddings().weight
        linear = sum(p.numel() for p in model.parameters() if p.dim() == 2) - head.numel()
        if embeddings is not head:
            linear -= embeddings.numel()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(6.0 * linear, 12.0 * heads * head_dim * config.num_hidden_layers, 6.0 * head.numel())

    def cost(self, tokens: int, scores: int, head_rows: int) -> float:
        """FLOPs of `tokens` backbone tokens, `scores` attention scores and `head_rows` lm_head rows."""
        return self.per_token * tokens + self.per_score * scores + self.per_head_row * head_rows
