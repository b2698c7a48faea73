"""The contract of a layer-1 backend, as code.

Every backend is a `Backend`: a name, declared `Capabilities`, `availability(device)` (None, or why it does
not run there), `forward` / `backward` over the logits z = c tanh((h Wᵀ + b) / c) · inv_temperature (softcap
c > 0) or (h Wᵀ + b) · inv_temperature (softcap 0), and `deterministic_variant()`. A backend that declares
`fused_gradients` is also a `ChunkedHooks`: the loss then forms dz from each logits tile during the forward
pass (3 GEMMs instead of 4, see grpo_fast.backends.chunked). A backend with a layer-2 kernel names it in
`token_loss_kernel`; that kernel takes plain numbers (grpo_fast.kernels.grpo_token_loss.TokenLossOptions),
never the loss's own types: which loss options map to which kernel options is layer 2's business
(grpo_fast.loss.token_loss).

`check_backend` is the contract of the BACKENDS registry (grpo_fast.backends): enforced when a backend is registered
or first loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

TokenGrads = Callable[[slice, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]
"""token_grads(rows, logp [R], entropy [R]) -> (gℓ [R], gH [R] | None): layer 2's upstream gradients of a chunk."""


@dataclass(frozen=True)
class LogprobStats:
    """Per-token results of layer 1, all [N] fp32: log p(y), entropy H, log-sum-exp of z."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    lse: torch.Tensor


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond `forward` / `backward`, declared rather than probed.

    fused_gradients: it implements `ChunkedHooks` (row chunks whose gradient is formed in the forward pass).
    token_loss_kernel: a fused layer-2 kernel with grpo_fast.kernels.grpo_token_loss.grpo_token_loss_triton's
        signature, or None (layer 2 then runs in PyTorch).
    """

    fused_gradients: bool = False
    token_loss_kernel: Callable | None = None


@runtime_checkable
class Backend(Protocol):
    """Layer 1: per-token logprobs and entropies from hidden states and the lm_head weight, and their gradients."""

    name: str
    capabilities: Capabilities

    def availability(self, device: torch.device) -> str | None:
        """None when the backend runs on `device`, else the reason it does not (shown to the user)."""

    def forward(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        inv_temperature: float,
        workspace_bytes: int | None = None,
        softcap: float = 0.0,
    ) -> LogprobStats:
        """hidden [N, H], weight [V, H], bias [V] | None, targets [N] int64 -> LogprobStats ([N] fp32 each)."""

    def backward(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        inv_temperature: float,
        stats: LogprobStats,
        grad_logp: torch.Tensor,
        grad_entropy: torch.Tensor | None,
        workspace_bytes: int | None = None,
        softcap: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """-> (dh [N, H] in hidden's dtype, dW [V, H] fp32, db [V] fp32 | None) for gℓ, gH [N] (gH None = 0)."""

    def deterministic_variant(self) -> Backend:
        """The same backend with a bitwise-reproducible backward (itself when it already is)."""


@runtime_checkable
class ChunkedHooks(Protocol):
    """The orchestration hooks of a backend with `Capabilities.fused_gradients`."""

    def rows_per_chunk(self, vocab: int, device: torch.device, workspace_bytes: int | None) -> int:
        """The most rows R whose fp32 [R, V] logits tile fits the workspace (at least 1)."""

    def row_chunks(self, num_rows: int, vocab: int, device: torch.device, workspace_bytes: int | None) -> list[slice]:
        """[0, num_rows) as consecutive chunks of at most `rows_per_chunk` rows."""

    def forward_backward(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        inv_temperature: float,
        token_grads: TokenGrads | None,
        chunks: Iterable[slice],
        need_grads: bool = True,
        softcap: float = 0.0,
    ) -> tuple[LogprobStats, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None]:
        """One pass over `chunks`, calling token_grads once per chunk in order; -> (stats, (dh, dW, db) or None)."""


def check_backend(name: str, backend: object) -> Backend:
    """`backend` if it fulfils the contract (and `ChunkedHooks` when it declares fused_gradients); TypeError naming
    what is missing otherwise."""
    capabilities = getattr(backend, "capabilities", None)
    if not isinstance(capabilities, Capabilities):
        raise TypeError(f"backend {name!r}: expected a `capabilities` attribute of type Capabilities")
    required = ["availability", "forward", "backward", "deterministic_variant"]
    if capabilities.fused_gradients:
        required += ["rows_per_chunk", "row_chunks", "forward_backward"]
    missing = [member for member in required if not callable(getattr(backend, member, None))]
    if missing:
        raise TypeError(f"backend {name!r}: missing {missing} (grpo_fast.backends.base.Backend / ChunkedHooks)")
    if ":" not in name and getattr(backend, "name", None) != name:  # "package.module:attribute" names no `name`
        raise TypeError(f"backend {name!r}: its `name` attribute is {getattr(backend, 'name', None)!r}")
    if capabilities.token_loss_kernel is not None and not callable(capabilities.token_loss_kernel):
        raise TypeError(f"backend {name!r}: token_loss_kernel must be callable")
    return backend
