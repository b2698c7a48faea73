"""Token layouts: padded `[B, T]` batches and packed (padding-free) `[N]` batches with `cu_seqlens`.

Every backend works on flat token rows. A padded batch is viewed as B sequences of T rows each
(no copy); a packed batch carries its boundaries in `cu_seqlens [B+1]`. `TokenLayout` holds what
the GRPO reductions need from either: per-token sequence index, per-sequence active-token counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLayout:
    """Sequence structure of N flat token rows.

    seq_index:   [N] int64, the sequence each row belongs to.
    seq_starts:  [B+1] int64, row offsets of the sequences (cu_seqlens).
    mask:        [N] in {0, 1} (fp32, fp64 for fp64 inputs), active (completion, non-padding) tokens.
    active_per_seq: [B], Σ mask over each sequence.
    padded_width: T for a padded batch; None for a packed one (see `longest_sequence`).
    """

    seq_index: torch.Tensor
    seq_starts: torch.Tensor
    mask: torch.Tensor
    active_per_seq: torch.Tensor
    padded_width: int | None

    def longest_sequence(self) -> torch.Tensor:
        """The longest sequence's rows as a 0-dim int64 tensor on the layout's device (no host read: traceable)."""
        lengths = self.seq_starts[1:] - self.seq_starts[:-1]
        return lengths.max() if lengths.numel() else lengths.new_zeros(())

    @property
    def num_seqs(self) -> int:
        return self.active_per_seq.numel()

    @property
    def num_tokens(self) -> int:
        return self.mask.numel()

    def seq_sum(self, values: torch.Tensor, seq_index: torch.Tensor | None = None) -> torch.Tensor:
        """[R] per-row values -> [B] per-sequence sums; `seq_index` [R] names the rows' sequences
        (default: all N rows)."""
        seq_index = self.seq_index if seq_index is None else seq_index
        out = torch.zeros(self.num_seqs, dtype=values.dtype, device=values.device)
        return out.index_add_(0, seq_index, values)


def padded_layout(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> TokenLayout:
    """Layout of a padded batch from its `[B, T]` completion mask."""
    batch, length = mask.shape
    device = mask.device
    flat = mask.reshape(-1).to(dtype)
    seq_index = torch.arange(batch, device=device).repeat_interleave(length)
    seq_starts = torch.arange(batch + 1, device=device) * length
    return TokenLayout(seq_index, seq_starts, flat, flat.view(batch, length).sum(-1), length)


def packed_layout(mask: torch.Tensor, cu_seqlens: torch.Tensor, dtype: torch.dtype = torch.float32) -> TokenLayout:
    """Layout of a packed batch from its `[N]` mask and `[B+1]` cumulative sequence lengths."""
    cu = cu_seqlens.to(device=mask.device, dtype=torch.int64)
    lengths = cu[1:] - cu[:-1]
    flat = mask.to(dtype)
    seq_index = torch.arange(lengths.numel(), device=mask.device).repeat_interleave(lengths, output_size=flat.numel())
    active = torch.zeros(lengths.numel(), dtype=dtype, device=mask.device).index_add_(0, seq_index, flat)
    return TokenLayout(seq_index, cu, flat, active, None)
