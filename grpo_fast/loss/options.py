"""Options of the GRPO loss, as one frozen dataclass (the Cut Cross-Entropy habit: non-tensor
options travel together, not as a wall of positional arguments).

Names and semantics follow Hugging Face TRL's `GRPOConfig` / `GRPOTrainer._compute_loss`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .loss_types import LossType, Objective, get_loss_type

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
BACKENDS = ("auto", "torch", "triton", "cuda", "cpu")


@dataclass(frozen=True)
class GRPOLossConfig:
    """Options of `grpo_loss` / `GRPOLoss`.

    loss_type: a name of the loss-type table (grpo_fast.loss.loss_types; TRL's names):
        "grpo"    clipped surrogate; mean over each sequence's tokens, then mean over sequences;
        "bnpo"    clipped surrogate; mean over all active tokens of this (micro-)batch;
        "dr_grpo" clipped surrogate; sum / (num_sequences * max_completion_length);
        "dapo"    clipped surrogate; sum / num_items_in_batch (global active-token count; local if not given);
        "cispo"   REINFORCE with the detached ratio clipped at `epsilon_high`, reduced like "dapo".
    epsilon_low, epsilon_high: clip range [1 - epsilon_low, 1 + epsilon_high] of the ratio; epsilon_high=None
        means epsilon_low (DAPO's clip-higher uses 0.28). For "cispo", epsilon_high is the ratio's upper
        bound itself (ScaleRL recommends 5.0) and must be given.
    delta: two-sided clipping (INTELLECT-2): the unclipped ratio is capped at delta (> 1 + epsilon_high).
    beta: coefficient of the k3 KL estimate exp(ref - logp) - (ref - logp) - 1 to the reference policy.
    temperature: logits are divided by it before the softmax (match the sampling temperature).
    entropy_coef: entropy bonus; the loss gets - entropy_coef * (masked mean entropy).
    importance_sampling_level: "token" ratios, or "sequence" (GSPO: one ratio per sequence from the mean
        masked log-ratio).
    max_completion_length: dr_grpo's constant normaliser; None = the padded length T (packed layout: the
        longest sequence).
    backend: "auto" | "torch" | "triton" | "cuda" | "cpu" (see grpo_fast.backends).
    workspace_bytes: byte budget of one logits tile of the chunked backends (torch / cpu / cuda); None =
        the backend's default (small on CPU, larger on GPU where bigger GEMMs pay off).
    deterministic: Triton backward without float atomics (bitwise reproducible, slightly slower).
    """

    loss_type: str = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    beta: float = 0.0
    temperature: float = 1.0
    entropy_coef: float = 0.0
    importance_sampling_level: str = "token"
    max_completion_length: int | None = None
    backend: str = "auto"
    workspace_bytes: int | None = None
    deterministic: bool = False

    def __post_init__(self) -> None:
        spec = get_loss_type(self.loss_type)
        _check_choice("importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        _check_choice("backend", self.backend, BACKENDS)
        _check_finite("epsilon_low", self.epsilon_low, low=0.0, high=1.0, high_inclusive=False)
        if self.epsilon_high is not None:
            _check_finite("epsilon_high", self.epsilon_high, low=0.0)
        if spec.objective is Objective.CISPO and self.epsilon_high is None:
            raise ValueError(
                f"epsilon_high: loss_type={self.loss_type!r} caps the ratio at epsilon_high; give it (e.g. 5.0)"
            )
        if self.delta is not None:
            _check_finite("delta", self.delta, low=1.0 + self.clip_high, low_inclusive=False)
        _check_finite("beta", self.beta, low=0.0)
        _check_finite("temperature", self.temperature, low=0.0, low_inclusive=False)
        _check_finite("entropy_coef", self.entropy_coef)
        if self.max_completion_length is not None and (
            not isinstance(self.max_completion_length, int) or self.max_completion_length < 1
        ):
            raise ValueError(
                f"max_completion_length: expected a positive int or None, got {self.max_completion_length!r}"
            )
        if self.workspace_bytes is not None and (not isinstance(self.workspace_bytes, int) or self.workspace_bytes < 1):
            raise ValueError(f"workspace_bytes: expected a positive int or None, got {self.workspace_bytes!r}")

    @property
    def loss_spec(self) -> LossType:
        """The row of the loss-type table that `loss_type` names."""
        return get_loss_type(self.loss_type)

    @property
    def clip_high(self) -> float:
        """epsilon_high with TRL's default (epsilon_low when not given)."""
        return self.epsilon_low if self.epsilon_high is None else self.epsilon_high


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")


def _check_finite(
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    if low is not None and (value < low or (value == low and not low_inclusive)):
        raise ValueError(f"{name}: expected a value {'>=' if low_inclusive else '>'} {low}, got {value!r}")
    if high is not None and (value > high or (value == high and not high_inclusive)):
        raise ValueError(f"{name}: expected a value {'<=' if high_inclusive else '<'} {high}, got {value!r}")
