"""SFT batch layouts and the order of optimizer steps.

Both layouts pass no attention mask, only position_ids, so every row is causal attention over its tokens:
- packed: examples concatenated into rows of at most max_length tokens (best-fit decreasing; no example is
  split), position_ids restarting at 0 for each example. transformers reads the restarts as example
  boundaries (masking_utils.find_packed_sequence_indices) and builds a block-diagonal causal mask, so each
  example sees only its own tokens (grpo_fast.core.packing verifies this for the model at hand).
- padded: one example per row, rows of similar length together: the examples of a mega-batch are sorted
  by length, cut into micro-batches, and the micro-batches shuffled.
Rows are right-padded to the micro-batch's widest row; the padding continues the last example's positions,
so under causal attention it never reaches a real token, and it is never a target.

A micro-batch holds at most `max_tokens` tokens counted with padding (rows x widest row) and at most
`max_rows` rows; an optimizer step is `grad_accum` consecutive micro-batches (an epoch's last step may have
fewer). The order is a pure function of (seed, epoch), so a resumed run continues it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from grpo_fast.core.packing import Row, pack
from grpo_fast.core.policy import TensorFields

if TYPE_CHECKING:  # a type only: importing sft.data here would close the loop sft.data -> trainer -> here
    from grpo_fast.sft.data import SFTExample

MEGA_BATCH = 50  # micro-batches' worth of examples sorted by length together (transformers' group_by_length)

MicroBatch = list[Row]


@dataclass
class TokenBatch(TensorFields):
    """input_ids, position_ids: int64 [B, W]; loss_mask: bool [B, W] (token t is a target, predicted from
    the row's hidden state at t - 1); num_tokens: real (non-padding) tokens."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    num_tokens: int

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())


def collate(examples: list[SFTExample], rows: MicroBatch, pad_id: int) -> TokenBatch:
    """The TokenBatch of `rows` (each a list of indices into `examples`, concatenated in order)."""
    widths = [sum(len(examples[i]) for i in row) for row in rows]
    width = max(widths)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    position_ids = torch.empty((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for r, row in enumerate(rows):
        start = 0
        for i in row:
            example, end = examples[i], start + len(examples[i])
            input_ids[r, start:end] = torch.from_numpy(example.input_ids)
            loss_mask[r, start:end] = torch.from_numpy(example.loss_mask)
            position_ids[r, start:end] = torch.arange(end - start)
            start = end
        last = len(examples[row[-1]])  # the padding continues the last example's positions
        position_ids[r, start:] = torch.arange(last, last + width - start)
    return TokenBatch(input_ids, position_ids, loss_mask, sum(widths))


def cut(widths: list[int], max_tokens: int | None, max_rows: int | None) -> list[slice]:
    """Consecutive runs of rows with len(run) * max(width) <= max_tokens and len(run) <= max_rows
    (None: no bound); a row wider than max_tokens goes alone."""
    runs, start, widest = [], 0, 0
    for j, w in enumerate(widths):
        wider = max(widest, w)
        full = (max_tokens is not None and (j - start + 1) * wider > max_tokens) or (
            max_rows is not None and j - start + 1 > max_rows
        )
        if full and j > start:
            runs.append(slice(start, j))
            start, wider = j, w
        widest = wider
    if start < len(widths):
        runs.append(slice(start, len(widths)))
    return runs


class BatchPlan:
    """The optimizer steps of each epoch (lists of `grad_accum` micro-batches), and the position in them.

    lengths: tokens per example; packing: rows of up to max_length tokens (else one example per row);
    micro_batch_tokens / micro_batch_size: the micro-batch bounds (see the module docstring)."""

    def __init__(
        self,
        lengths: list[int],
        packing: bool,
        max_length: int | None,
        micro_batch_tokens: int | None,
        micro_batch_size: int | None,
        grad_accum: int,
        seed: int,
    ) -> None:
        self.lengths = lengths
        self.max_tokens, self.max_rows = micro_batch_tokens, micro_batch_size
        self.grad_accum, self.seed = grad_accum, seed
        self.rows = pack(lengths, max_length) if packing else None
        self.epoch, self.position = 0, 0
        self._steps = self.epoch_steps(0)

    def epoch_steps(self, epoch: int) -> list[list[MicroBatch]]:
        """Epoch `epoch`'s optimizer steps."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        if self.rows is not None:
            rows = [self.rows[i] for i in torch.randperm(len(self.rows), generator=g).tolist()]
            micro = self._cut(rows)
        else:
            micro = []
            for mega in self._mega_batches(torch.randperm(len(self.lengths), generator=g).tolist()):
                mega.sort(key=lambda i: -self.lengths[i])
                micro += self._cut([[i] for i in mega])
            micro = [micro[i] for i in torch.randperm(len(micro), generator=g).tolist()]
        return [micro[i : i + self.grad_accum] for i in range(0, len(micro), self.grad_accum)]

    def _cut(self, rows: list[Row]) -> list[MicroBatch]:
        widths = [sum(self.lengths[i] for i in row) for row in rows]
        return [rows[s] for s in cut(widths, self.max_tokens, self.max_rows)]

    def _mega_batches(self, order: list[int]) -> list[list[int]]:
        """`order` cut into runs of at most MEGA_BATCH micro-batches' worth of tokens and rows."""
        tokens = None if self.max_tokens is None else MEGA_BATCH * self.max_tokens
        rows = None if self.max_rows is None else MEGA_BATCH * self.max_rows
        runs, start, total = [], 0, 0
        for j, i in enumerate(order):
            total += self.lengths[i]
            if j > start and ((tokens is not None and total > tokens) or (rows is not None and j - start >= rows)):
                runs.append(order[start:j])
                start, total = j, self.lengths[i]
        runs.append(order[start:])
        return runs

    def steps_for_epochs(self, epochs: int) -> int:
        """Optimizer steps in the first `epochs` epochs (the length-grouped layout's count varies by epoch)."""
        return sum(len(self.epoch_steps(e)) for e in range(epochs))

    def next(self) -> list[MicroBatch]:
        """The next optimizer step's micro-batches (a new epoch begins after the last step of one)."""
        if self.position >= len(self._steps):
            self.epoch, self.position = self.epoch + 1, 0
            self._steps = self.epoch_steps(self.epoch)
        step = self._steps[self.position]
        self.position += 1
        return step

    @property
    def epochs_done(self) -> float:
        """Epochs completed by the steps taken so far (fractional)."""
        return self.epoch + self.position / len(self._steps)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "num_examples": len(self.lengths), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["num_examples"] != len(self.lengths):
            raise ValueError(
                f"resumed dataset has {len(self.lengths)} examples, the checkpoint's had {state['num_examples']}"
            )
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._steps = self.epoch_steps(self.epoch)
