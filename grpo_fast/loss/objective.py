"""An objective: the per-token surrogate of the GRPO family, written once, and everything the loss needs to know
about it. The objectives themselves live in grpo_fast.loss.objectives (TRL's four, then one module per
trust-region method), each shaped like a plug-in.

An objective's `definition` is its math in PyTorch ops, on the inputs of `SurrogateInputs`. Everything else follows
from it:
  * layer 2's gradients (gℓ, gH) are autograd over the O(N) per-token terms (grpo_fast.loss.token_math), so there
    is no second, hand-derived gradient to keep in step;
  * the fp64 reference (grpo_fast.testing.reference) evaluates the same definition on materialised logits;
  * a Triton layer-2 kernel is optional: `kernel` names the code of the kernel's own implementation
    (grpo_fast.kernels.grpo_token_loss.KernelObjective); without one the PyTorch math runs on every backend.

A definition reads the tensors of `SurrogateInputs`, shaped [R] (flat rows of whole sequences, the loss) or [B, T]
(padded, the reference; ratio and weights may be [B, 1]), so it must use elementwise ops and `x.sequences` for
anything summed over a sequence — then one definition serves both layouts.

An objective registers in OBJECTIVES (`OBJECTIVES.register(name, obj)`, or named as "package.module:attribute");
its contract (`check_objective`) is checked there. Its hyper-parameters that TRL does not have are its own
`options` class (a frozen dataclass of `option` fields, set under `loss.objective_options`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..config_fields import build, check_fields
from ..registry import Registry, missing_members, refuse_missing


class Sequences:
    """Sums over each token's sequence, broadcast back to its tokens, in the layout of the definition's tensors.

    sum(x): Σ_{j∈b} x_j for each token of sequence b (mask x yourself); length: L_b = Σ_{j∈b} m_j, at least 1.
    mean(x): Σ_{j∈b} m_j x_j / L_b."""

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def length(self) -> torch.Tensor:
        raise NotImplementedError

    def mean(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.sum(values * mask) / self.length


class PaddedSequences(Sequences):
    """Sequences of a padded [B, T] batch: sums over the last dimension, shaped [B, 1]."""

    def __init__(self, mask: torch.Tensor):
        self._length = mask.sum(-1, keepdim=True).clamp(min=1.0)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values.sum(-1, keepdim=True)

    @property
    def length(self) -> torch.Tensor:
        return self._length


class RowSequences(Sequences):
    """Sequences of flat rows [R]: `seq` [R] the rows' sequence index among `num_seqs`, `lengths` [B] each sequence's
    active tokens. whole: whether the rows hold whole sequences (a chunk of a token-level loss may cut one; reading a
    sequence then is an error: the objective must declare `whole_sequences`)."""

    def __init__(self, seq: torch.Tensor, num_seqs: int, lengths: torch.Tensor, whole: bool, objective: str):
        self.seq, self.num_seqs, self.lengths, self.whole, self.objective = seq, num_seqs, lengths, whole, objective

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        self._require_whole()
        out = torch.zeros(self.num_seqs, dtype=values.dtype, device=values.device)
        return out.index_add(0, self.seq, values)[self.seq]

    @property
    def length(self) -> torch.Tensor:
        self._require_whole()
        return self.lengths.clamp(min=1.0)[self.seq]

    def _require_whole(self) -> None:
        if not self.whole:
            raise RuntimeError(
                f"objective {self.objective!r} reads whole sequences: declare whole_sequences=True in its Objective"
            )


@dataclass(frozen=True)
class SurrogateInputs:
    """What an objective's definition reads ([R] flat or [B, T] padded; see the module docstring).

    ratio: ρ = exp(s) with s the token log-ratio ℓ − o, or at importance_sampling_level="sequence" the sequence's
        mean log-ratio (GSPO), differentiable. log_ratio: the token log-ratios ℓ − o, differentiable.
    advantages: A. logprobs: ℓ, differentiable. old_logprobs: o, detached (ℓ detached when the call is on-policy).
    rollout_logprobs: μ, the inference engine's logprobs of the sampled tokens (None unless the objective declares
        `needs_rollout_logprobs`). mask: m (0 at padding). is_weights: w, the importance weights against the engine,
        or None; is_weights_per_sequence: whether they came one per sequence (broadcast over its tokens).
    sequences: sums over a token's sequence. config: the GRPOLossConfig. options: the objective's options (an instance
        of its `options` class), or None."""

    ratio: torch.Tensor
    log_ratio: torch.Tensor
    advantages: torch.Tensor
    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    rollout_logprobs: torch.Tensor | None
    mask: torch.Tensor
    is_weights: torch.Tensor | None
    is_weights_per_sequence: bool
    sequences: Sequences
    config: Any
    options: Any


class Surrogate(NamedTuple):
    """A definition's result, shaped like its inputs: the per-token surrogate p (before importance weights, TRL's
    masks and the reduction), the low- and high-clip flags (bool; TRL's clip_ratio metrics), and the tokens its trust
    region dropped (bool, or None for an objective that drops none; the trust_region/masked_mean metric)."""

    per_token: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    masked: torch.Tensor | None = None


Definition = Callable[[SurrogateInputs], Surrogate]


@dataclass(frozen=True)
class ObjectiveOptions:
    """Base of an objective's own options: a frozen dataclass of `option` fields, checked when made (from YAML they
    arrive as loss.objective_options). `validate` holds rules between its fields."""

    def __post_init__(self) -> None:
        check_fields(self, "objective_options")
        self.validate()

    def validate(self) -> None:
        """Rules between the fields (ValueError naming the key); none by default."""


@dataclass(frozen=True)
class Objective:
    """A per-token objective: its `definition` (the math, once) and what the loss needs to know about it.

    name: how it is registered and logged. options: its own hyper-parameters' class (a subclass of ObjectiveOptions;
    None when it reads only GRPOLossConfig fields). needs_rollout_logprobs: it reads the inference engine's logprobs
    (refused by name where they are missing). whole_sequences: a token's term reads its sequence's other tokens at
    token level too (layer 2 then sees whole sequences). weights_inside: importance weights enter the definition
    instead of multiplying its result. gates_inside: the token gates (off_policy_mask_threshold,
    top_entropy_quantile) choose the tokens the definition aggregates (its `mask`) instead of multiplying its
    result. masks_tokens: its Surrogate names the tokens its trust region drops (a metric).
    levels: the importance_sampling_level values it takes (an objective with a ratio of its own takes "token").
    kernel: its code in the layer-2 Triton kernel, or None (PyTorch on every backend). validate(config): rules
    between the loss options it reads (ValueError naming the option)."""

    name: str
    definition: Definition
    summary: str = ""
    options: type | None = None
    needs_rollout_logprobs: bool = False
    whole_sequences: bool = False
    weights_inside: bool = False
    gates_inside: bool = False
    masks_tokens: bool = False
    levels: tuple[str, ...] = ("token", "sequence")
    kernel: int | None = None
    validate: Callable[[Any], None] | None = None

    def settings(self, values: dict) -> Any:
        """The options instance of `values` (loss.objective_options), checked; None for an objective without options
        (then `values` must be empty)."""
        if self.options is None:
            if values:
                raise ValueError(
                    f"objective_options: objective {self.name!r} has no options of its own (its hyper-parameters "
                    f"are loss options), got {sorted(values)}"
                )
            return None
        return build(self.options, values, "objective_options")


OBJECTIVE_MEMBERS = ("name", "options", "needs_rollout_logprobs", "whole_sequences", "weights_inside", "masks_tokens")
OBJECTIVE_MEMBERS += ("levels", "kernel", "validate")


def check_objective(name: str, objective: Any) -> Objective:
    """`objective` if it fulfils the contract (an Objective, or an object with its members and a callable
    `definition` and `settings`); TypeError naming what is missing otherwise."""
    missing = missing_members(objective, OBJECTIVE_MEMBERS, ("definition", "settings"))
    refuse_missing("objective", name, missing, "grpo_fast.loss.objective.Objective")
    if objective.options is not None and not (
        dataclasses.is_dataclass(objective.options) and issubclass(objective.options, ObjectiveOptions)
    ):
        raise TypeError(
            f"objective {name!r}: options must be a subclass of ObjectiveOptions, got {objective.options!r}"
        )
    return objective


OBJECTIVES = Registry(
    "objective",
    {
        "clipped": "grpo_fast.loss.objectives.trl:CLIPPED",
        "cispo": "grpo_fast.loss.objectives.trl:CISPO",
        "sapo": "grpo_fast.loss.objectives.trl:SAPO",
        "vespo": "grpo_fast.loss.objectives.trl:VESPO",
        "icepop": "grpo_fast.loss.objectives.icepop:ICEPOP",
        "kpop": "grpo_fast.loss.objectives.kpop:KPOP",
        "ipo": "grpo_fast.loss.objectives.ipo:IPO",
        "dppo_tv": "grpo_fast.loss.objectives.dppo:DPPO_TV",
        "dppo_kl": "grpo_fast.loss.objectives.dppo:DPPO_KL",
        "gmpo": "grpo_fast.loss.objectives.gmpo:GMPO",
    },
    contract=check_objective,
)
"""The objectives by name: the loss types' and any `loss.objective` names one."""
