"""Micro-batches of the loss step: which sequences go through the backbone together, and how.

A step's `SequenceBatch` (B rows: left-padded prompt + right-padded completion) is cut into micro-batches,
each yielding the hidden states that predict its completion tokens plus the loss's per-token arguments in
the matching layout:

- `PaddedMicroBatch`: `micro_batch_size` consecutive rows, padded as they are ([b, T, H] hidden states);
  with prompt sharing, whole groups whose prompt runs through the backbone once
  (grpo_fast.trainer.prefix_sharing).
- `PackedMicroBatch`: whole sequences concatenated padding-free into one row of at most a token budget
  (position ids restarting at 0 for each sequence, no attention mask), its attention kept per sequence by
  one of the paths of grpo_fast.core.packed_attention (grpo_fast.core.packing verifies the model keeps
  them apart on it), the loss in its packed layout ([N, H] hidden states, `cu_seqlens`). A completion the
  loss ignores entirely (every token masked, e.g. a truncated one under mask_truncated_completions) is not
  run through the backbone: it stays in the loss as an empty sequence, where it contributes nothing, as it
  would padded.

`Work` counts what a layout runs (backbone tokens, attention scores, lm_head rows) from the lengths alone, so
the loss step can price both layouts of a batch before it builds one (`padded_work`, `Packing.work`).

Either way, sequence i's completion tokens predicted from its hidden states are the same, so the
accumulated gradient equals one `grpo_loss` on the whole batch (the loss step scales each micro-batch by
its share of the batch's normaliser).

With several ranks (torchrun), every rank must run as many micro-batches as the others (each forward and
backward of an FSDP-sharded model is a collective): a rank with fewer runs `idle_copy`s of one of its own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_fast.core.packed_attention import PackedLayout, bucketed_scores, packed_hidden
from grpo_fast.core.packing import ModelFlops, Row, pack
from grpo_fast.core.policy import SequenceBatch, completion_hidden, segments


@dataclass
class PaddedMicroBatch:
    """Rows `index` (a slice) of a SequenceBatch: hidden [b, T, H] from `forward(model, part)`, per-token
    tensors [b, T]."""

    part: SequenceBatch
    index: slice
    forward: Callable = completion_hidden
    cu_seqlens = None
    idle = False

    @property
    def row_list(self) -> range:
        return range(self.index.start, self.index.start + self.num_rows)

    @property
    def num_rows(self) -> int:
        return self.part.input_ids.shape[0]

    @property
    def input_ids(self) -> torch.Tensor:
        return self.part.input_ids

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.part.completion_ids

    @property
    def completion_mask(self) -> torch.Tensor:
        return self.part.completion_mask

    def hidden(self, model) -> torch.Tensor:
        return self.forward(model, self.part)

    def tokens(self, values: torch.Tensor, device) -> torch.Tensor:
        """This micro-batch's share of a [B, T] (per token) or [B] (per sequence) tensor of the batch."""
        return values[self.index].to(device)

    def scatter(self, out: torch.Tensor, values: torch.Tensor) -> None:
        """Writes this micro-batch's [b, T] per-token values into the batch's [B, T] `out`."""
        out[self.index] = values


@dataclass
class PackedMicroBatch:
    """Sequences `rows` of a SequenceBatch packed into one row of L tokens.

    input_ids, position_ids [1, L]; source [N] (the position in the row of the hidden state that predicts
    each completion token); completion_ids, completion_mask [N]; cu_seqlens [b+1] (int64, on the host)
    over the completion tokens; local_index [N] (device): each completion token's flat index in the
    [b, T] padded layout of these rows, T = width; attention: the path of the row's attention, layout: where
    its sequences lie (grpo_fast.core.packed_attention).
    """

    rows: list[int]
    rows_index: torch.Tensor
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    source: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    cu_seqlens: torch.Tensor
    local_index: torch.Tensor
    width: int
    attention: str
    layout: PackedLayout
    idle = False

    @property
    def row_list(self) -> list[int]:
        return self.rows

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def hidden(self, model) -> torch.Tensor:
        inputs = dict(input_ids=self.input_ids, position_ids=self.position_ids)
        return packed_hidden(model, self.attention, self.layout, **inputs)[0, self.source]

    def tokens(self, values: torch.Tensor, device) -> torch.Tensor:
        """This micro-batch's share of a [B, T] (per token, -> [N]) or [B] (per sequence, -> [b]) tensor."""
        mine = values[self.rows_index]
        return (mine if values.dim() == 1 else mine.reshape(-1)[self.local_index]).to(device)

    def scatter(self, out: torch.Tensor, values: torch.Tensor) -> None:
        """Writes this micro-batch's [N] per-token values into the batch's [B, T] `out` (padding untouched)."""
        mine = out[self.rows_index]
        mine.view(-1)[self.local_index] = values
        out[self.rows_index] = mine


def idle_copy(micro_batch):
    """A copy of `micro_batch` marked idle: run by a rank that has fewer micro-batches than the others, so
    that every rank joins each of FSDP's collectives. The loss step runs its forward and backward with the
    loss multiplied by 0, and writes back or logs nothing of it."""
    idle = copy.copy(micro_batch)
    idle.idle = True
    return idle


def sequence_lengths(batch: SequenceBatch) -> tuple[list[int], list[int]]:
    """(prompt lengths, completion lengths) of the batch's rows, in tokens; a completion whose every token
    is masked counts 0 (nothing of it needs computing)."""
    p = batch.prompt_width
    prompt = batch.attention_mask[:, :p].sum(1)
    completion = batch.attention_mask[:, p:].sum(1) * batch.completion_mask.any(1)
    return prompt.tolist(), completion.tolist()


def padded_micro_batches(
    batch: SequenceBatch, rows_per_micro_batch: int, device, forward: Callable = completion_hidden
) -> list[PaddedMicroBatch]:
    n, step = batch.input_ids.shape[0], rows_per_micro_batch
    return [
        PaddedMicroBatch(batch.rows(slice(s, s + step)).to(device), slice(s, s + step), forward)
        for s in range(0, n, step)
    ]


@dataclass(frozen=True)
class Work:
    """What a layout of a batch runs: tokens through the backbone, attention scores (query-key pairs per head and
    layer, counted whole even where a causal kernel skips half), completion positions through the lm_head."""

    tokens: int
    scores: int
    head_rows: int

    def cost(self, flops: ModelFlops) -> float:
        """FLOPs of this work for a model of `flops`."""
        return flops.cost(self.tokens, self.scores, self.head_rows)


def padded_work(batch: SequenceBatch) -> Work:
    """The padded layout's work: every row at the batch's width W = P + T, attention W² per row (its mask is not
    causal-only), the loss's lm_head over all T completion positions of every row."""
    rows, width = batch.input_ids.shape
    return Work(rows * width, rows * width * width, rows * batch.completion_ids.shape[1])


@dataclass(frozen=True)
class Packing:
    """Which sequences share each packed micro-batch (`rows`, best-fit decreasing under a token budget; within one,
    the batch's order) and the sequences' prompt and completion lengths (`sequence_lengths`)."""

    rows: list[Row]
    prompt_lens: list[int]
    completion_lens: list[int]

    @classmethod
    def of(cls, batch: SequenceBatch, max_tokens: int) -> Packing:
        """The packing of `batch` into micro-batches of at most `max_tokens` tokens (raised to the longest
        sequence when that is longer)."""
        prompt_lens, completion_lens = sequence_lengths(batch)
        lengths = [p + c if c else 0 for p, c in zip(prompt_lens, completion_lens, strict=True)]
        bins = pack(lengths, max(max_tokens, *lengths, 1))
        return cls(sorted(sorted(b) for b in bins), prompt_lens, completion_lens)

    def lengths(self, rows: Row) -> list[int]:
        """Tokens of each sequence of `rows` that runs through the backbone (a fully masked completion: none)."""
        return [self.prompt_lens[i] + self.completion_lens[i] for i in rows if self.completion_lens[i]]

    def work(self, attention: str) -> Work:
        """This packing's work with its rows' attention on path `attention` (grpo_fast.core.packed_attention)."""
        tokens = scores = 0
        for rows in self.rows:
            lengths = self.lengths(rows)
            tokens += sum(lengths)
            if attention == "varlen":
                scores += sum(n * n for n in lengths)
            elif attention == "per_sequence":
                scores += bucketed_scores(lengths)
            else:  # block_mask: the whole row
                scores += sum(lengths) ** 2
        return Work(tokens, scores, sum(self.completion_lens))


def packed_micro_batches(batch: SequenceBatch, packing: Packing, device, attention: str) -> list[PackedMicroBatch]:
    """The micro-batches of `packing` on `device`, their attention on path `attention`; a micro-batch with no
    completion token to train on is left out."""
    plan = [_pack(batch, rows, packing, device, attention) for rows in packing.rows]
    return [mb for mb in plan if mb.completion_ids.numel()]


def _pack(batch: SequenceBatch, rows: Row, packing: Packing, device, attention: str) -> PackedMicroBatch:
    """One packed micro-batch of sequences `rows`, its index tensors computed per token in a few vector ops."""
    p, width, full = batch.prompt_width, batch.completion_ids.shape[1], batch.input_ids.shape[1]
    index = torch.tensor(rows, dtype=torch.long)
    lp = torch.tensor([packing.prompt_lens[i] for i in rows], dtype=torch.long)
    lc = torch.tensor([packing.completion_lens[i] for i in rows], dtype=torch.long)
    lp = torch.where(lc > 0, lp, 0)  # a sequence without completion tokens to train on stays out of the row
    owner, positions, starts = segments(lp + lc)
    flat = index[owner] * full + p - lp[owner] + positions
    # Completion token t of sequence k is predicted by the hidden state at row position starts[k] + lp[k] - 1 + t.
    token_owner, t, _ = segments(lc)
    local = token_owner * width + t
    return PackedMicroBatch(
        rows=rows,
        rows_index=index.to(device),
        input_ids=batch.input_ids.reshape(-1)[flat][None].to(device),
        position_ids=positions[None].to(device),
        source=(starts[token_owner] + lp[token_owner] - 1 + t).to(device),
        completion_ids=batch.completion_ids[index].reshape(-1)[local].to(device),
        completion_mask=batch.completion_mask[index].reshape(-1)[local].to(device),
        cu_seqlens=torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lc, 0)]),
        local_index=local.to(device),
        width=width,
        attention=attention,
        layout=PackedLayout.from_lengths(packing.lengths(rows), device),
    )
