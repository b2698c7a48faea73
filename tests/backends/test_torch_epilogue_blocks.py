"""The torch backend's epilogue (grpo_fast/backends/chunked.py `TorchEpilogue`) on an accelerator: the number of
ops it issues for one chunk must not grow with the chunk's rows / 3. On an H200 every op is a kernel launch of
~15 µs of host time; with CPU-sized 4 MiB row blocks a Qwen2.5-7B chunk (863 rows of V = 152064) went in blocks
of 3 rows, ~5.5k launches per chunk, and the backend ran at 23.7x the three GEMMs (benchmarks/NOTES.md,
"First GPU run"). Counted here on `meta` tensors (no memory, no values: only the dispatched ops), and on CPU
the blocks stay cache-sized."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpo_fast.backends.chunked import TORCH_BACKEND, TorchEpilogue

QWEN_VOCAB = 152064
ROWS_PER_CHUNK_H200 = 863  # the torch backend's 512 MiB workspace at N=16384: 19 balanced chunks of 863 rows


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _epilogue_ops(epilogue: TorchEpilogue, device: str, rows: int, vocab: int, softcap: float = 0.0) -> int:
    """Aten ops dispatched by stats + grad_ (with the entropy gradient) on one [rows, vocab] fp32 tile."""
    z = torch.empty(rows, vocab, device=device)
    targets = torch.zeros(rows, dtype=torch.int64, device=device)
    grads = [torch.zeros(rows, device=device) for _ in range(2)]
    cap = (softcap,) if softcap else ()
    with OpCounter() as counter:
        logp, entropy, lse = epilogue.stats(z, targets, *cap)
        epilogue.grad_(z, targets, lse, entropy, *grads, *cap)
    return counter.ops


def test_chunk_ops_do_not_scale_with_rows_on_an_accelerator():
    rows = TORCH_BACKEND.rows_per_chunk(QWEN_VOCAB, torch.device("cuda"), None)
    assert rows >= ROWS_PER_CHUNK_H200  # the chunk this test stands for (balanced chunks are at most this long)
    epilogue = TORCH_BACKEND.epilogue
    for softcap in (0.0, 30.0):
        ops = _epilogue_ops(epilogue, "meta", ROWS_PER_CHUNK_H200, QWEN_VOCAB, softcap)
        # 204 (no cap) and 370 (cap) ops in 4 and 6 row blocks; the 4 MiB blocks issued 14404 and 26356
        assert ops <= 500, f"softcap {softcap}: {ops} ops for one chunk"


def test_cpu_blocks_stay_within_their_budget():
    """On CPU the chunk goes in blocks whose one temporary fits `temp_bytes` (16 MiB): more ops, on purpose."""
    epilogue = TorchEpilogue()
    blocks = epilogue._blocks(torch.empty(512, 32768), 0.0)
    assert all((b.stop - b.start) * 32768 * 4 <= epilogue.temp_bytes for b in blocks)
    assert len(blocks) == 4
