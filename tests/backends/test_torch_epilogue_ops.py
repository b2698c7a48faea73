"""The torch backend's cost on a loaded CPU is its number of ops over logits tiles (each an OpenMP parallel region
whose threads wait for each other; benchmarks/NOTES.md, "The torch backend under load"): per row chunk, the three
GEMMs and a few epilogue ops over the whole tile, not tens of ops over small row blocks. Counted with a dispatch
mode, on the default backend."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.backends.chunked import TORCH_BACKEND
from grpo_fast.testing.synthetic import make_loss_batch

NOT_PASSES = {"slice", "t", "view", "detach", "empty", "zeros", "gather", "scatter_add_"}
"""Views, allocations, and ops that touch one element per row: no pass over the tile."""


class TileOps(TorchDispatchMode):
    """Counts the ops that pass over a tensor of at least `elements` elements."""

    def __init__(self, elements: int):
        super().__init__()
        self.elements, self.count = elements, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in (*args, *(kwargs or {}).values(), out) if isinstance(t, torch.Tensor)]
        if func.overloadpacket.__name__ not in NOT_PASSES and any(t.numel() >= self.elements for t in tensors):
            self.count += 1
        return out


def test_few_ops_per_chunk_on_cpu():
    vocab, rows = 8192, 256  # four chunks of 256 rows, each tile 8 MiB
    batch = make_loss_batch(4, 256, 64, vocab, seed=0)
    config = GRPOLossConfig(backend="torch", workspace_bytes=rows * vocab * 4, entropy_coef=0.01)
    hidden = batch.hidden.clone().requires_grad_()
    weight = batch.weight.clone().requires_grad_()
    chunks = TORCH_BACKEND.row_chunks(1024, vocab, hidden.device, config.workspace_bytes)
    assert len(chunks) == 4
    with TileOps(elements=64 * vocab) as ops:  # a 64-row block of the tile counts
        loss, _ = grpo_loss(hidden, weight, **batch.token_arguments(), config=config)
        loss.backward()
    assert ops.count <= 12 * len(chunks), ops.count  # 3 GEMMs and 9 epilogue passes per chunk, with entropy
