"""Random GRPO loss batches, shared by the tests and the benchmarks (same setup, same shapes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..loss.logprobs import fused_logprobs


@dataclass
class LossBatch:
    """hidden [B, T, H], weight [V, H], completion_ids / completion_mask / old / ref / is_weights / rollout (the
    inference engine's logprobs) [B, T], advantages [B]; all on one device, hidden and weight in `dtype`, the rest
    fp32 (fp64 for fp64)."""

    hidden: torch.Tensor
    weight: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    is_weights: torch.Tensor
    rollout_logprobs: torch.Tensor

    def token_arguments(self, rows: slice = slice(None)) -> dict[str, torch.Tensor]:
        """The per-sequence / per-token keyword arguments of `grpo_loss` for the sequences `rows`."""
        names = ("completion_ids", "completion_mask", "advantages", "old_logprobs", "ref_logprobs", "is_weights")
        return {name: getattr(self, name)[rows] for name in (*names, "rollout_logprobs")}


def make_loss_batch(
    batch: int,
    length: int,
    hidden_size: int,
    vocab: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    logit_scale: float = 1.0,
    active_fraction: float = 0.8,
    drift: float = 0.3,
) -> LossBatch:
    """A batch whose hidden/weight give logits of standard deviation ~logit_scale, a completion mask
    with ragged right padding (about `active_fraction` active), and old/ref logprobs that differ from
    the current ones by noise of scale `drift` (so clipping and KL are exercised); the engine's logprobs differ from
    the old ones by noise of scale `drift` too, kept below 0 (so the trust-region masks are exercised).

    Everything is drawn and computed on `device` (a real-shape batch never touches the CPU); the same seed
    gives the same batch on the same device type."""
    gen = torch.Generator(device=device).manual_seed(seed)
    aux = torch.float64 if dtype == torch.float64 else torch.float32

    def randn(*shape, **kwargs):
        return torch.randn(*shape, generator=gen, device=device, **kwargs)

    hidden = randn(batch, length, hidden_size) * (logit_scale / hidden_size**0.5) ** 0.5
    weight = randn(vocab, hidden_size) * (logit_scale / hidden_size**0.5) ** 0.5
    ids = torch.randint(0, vocab, (batch, length), generator=gen, device=device)
    spread = torch.rand(batch, generator=gen, device=device)
    lengths = (length * (1 - (1 - active_fraction) * 2 * spread)).long().clamp(1, length)
    mask = torch.arange(length, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    with torch.no_grad():
        current = fused_logprobs(hidden.to(aux), weight.to(aux), ids, backend="torch")
    old = current + drift * randn(batch, length, dtype=aux)
    ref = current + drift * randn(batch, length, dtype=aux)
    is_weights = (1 + 0.2 * randn(batch, length)).clamp(0.5, 2.0)
    advantages = randn(batch)
    rollout = (old + drift * randn(batch, length, dtype=aux)).clamp(max=-1e-6)
    return LossBatch(
        hidden=hidden.to(dtype),
        weight=weight.to(dtype),
        completion_ids=ids,
        completion_mask=mask,
        advantages=advantages.to(aux),
        old_logprobs=old,
        ref_logprobs=ref,
        is_weights=is_weights.to(aux),
        rollout_logprobs=rollout,
    )
