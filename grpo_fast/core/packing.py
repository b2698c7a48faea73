"""Packing sequences padding-free into rows: which sequences share a row (`pack`), and whether the model keeps
packed sequences apart (`packing_error`: a probe, not a list of attention implementations — two short sequences
through the backbone packed into one row, position_ids restarting at 0 and no attention mask, and each alone;
packing is exact when the hidden states agree)."""

from __future__ import annotations

import bisect

import torch

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
def packing_error(model: torch.nn.Module) -> str | None:
    """None when packed rows give each example the hidden states it has alone (relative max difference
    within 1e-4 for fp32 weights, 2e-2 for half precision), else the reason. Runs in eval mode (no dropout;
    the mode is restored) and draws no random numbers."""
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
        packed = last_hidden(model, input_ids=torch.cat(ids)[None], position_ids=positions)
    except Exception as exc:  # noqa: BLE001 - any failure of the packed forward means: do not pack
        return f"the packed forward fails ({type(exc).__name__}: {exc})"
    finally:
        model.train(was_training)
    reference = torch.cat(alone, dim=1).float()
    diff = float((packed.float() - reference).abs().max() / reference.abs().max().clamp(min=1e-12))
    tolerance = 1e-4 if next(model.parameters()).dtype == torch.float32 else 2e-2
    if diff > tolerance:
        implementation = getattr(model.config, "_attn_implementation", None)
        return (
            f"packed examples see each other under attn_implementation={implementation!r} (relative hidden-state "
            f"difference {diff:.2e} > {tolerance:.0e})"
        )
    return None
