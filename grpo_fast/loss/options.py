"""Options of the GRPO loss, as one frozen dataclass (the Cut Cross-Entropy habit: non-tensor
options travel together, not as a wall of positional arguments).

Names and semantics follow Hugging Face TRL's `GRPOConfig` / `GRPOTrainer._compute_loss`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .head import LogitHead
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
        "cispo"   REINFORCE with the detached ratio clipped at `epsilon_high`, reduced like "dapo";
        "sapo"    sigmoid-gated ratio -(4/tau) sigmoid(tau (ratio - 1)) A (no clipping), reduced like "grpo";
        "luspo"   clipped surrogate; sum over each sequence's tokens, then mean over sequences (TRL
                  recommends importance_sampling_level="sequence");
        "vespo"   REINFORCE scaled by a detached gamma weight of the sequence's summed log-ratio (the
                  `vespo_*` options), reduced like "dapo"; is_weights enter that weight instead of scaling
                  the loss: per-token weights [B, T] add Σ_i log w_i, per-sequence weights ([B] or [B, 1])
                  add log w_b once per sequence (as TRL's [B, 1] ratio).
    epsilon_low, epsilon_high: clip range [1 - epsilon_low, 1 + epsilon_high] of the ratio; epsilon_high=None
        means epsilon_low (DAPO's clip-higher uses 0.28). For "cispo", epsilon_high is the ratio's upper
        bound itself (ScaleRL recommends 5.0) and must be given. Unused by "sapo" and "vespo".
    delta: two-sided clipping (INTELLECT-2): the unclipped ratio is capped at delta (> 1 + epsilon_high).
        Clipped objectives only (grpo, bnpo, dr_grpo, dapo, luspo); ignored by the others, as in TRL.
    beta: coefficient of the k3 KL estimate exp(ref - logp) - (ref - logp) - 1 to the reference policy.
    use_bias_correction_kl: multiply the KL estimate by the (differentiable) importance ratio of
        `importance_sampling_level` (DeepSeek-V3.2's unbiased KL gradient); TRL's default True. It changes
        the gradient whenever beta != 0, even on-policy where the ratio is 1; the "kl" metric is the
        corrected one.
    sapo_temperature_pos, sapo_temperature_neg: "sapo"'s gate temperature tau for tokens with advantage
        > 0 and <= 0 (TRL's defaults 1.0 and 1.05; > 0).
    vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: "vespo"'s gamma weight
        phi(W) = exp(lambda + k log W - lambda W) of the sequence ratio W, (k, lambda) for advantages >= 0
        and < 0 (TRL's defaults (2, 3) and (3, 2); each >= 0, lambda floored at 1e-4 as in TRL).
    temperature: logits are divided by it before the softmax (match the sampling temperature).
    logit_scale, final_logit_softcapping: the model's head transform, logits = c tanh(s (h Wᵀ + b) / c) / T
        (c None: s (h Wᵀ + b) / T), as TRL applies them; `grpo_fast.loss.head.logit_head(model)` reads them
        from a transformers model (Gemma-2/3's cap, Cohere's / Granite's / Falcon-H1's scale).
    entropy_coef: entropy bonus; the loss gets - entropy_coef * (masked mean entropy).
    top_entropy_quantile: rho of "Beyond the 80/20 rule" (TRL's option, default 1.0 = off): only the tokens whose
        entropy is at least the (1 - rho) quantile of this call's active tokens' entropies (fp32, linear
        interpolation; 0.0 keeps the highest only) keep their policy term (KL untouched), and the entropy bonus is
        the mean over those tokens, as TRL's `get_high_entropy_mask`. The quantile is per call: in TRL and in the
        trainer, per micro-batch. The mask is a step function of the entropies (no gradient through it). Needs
        every row of the call at once (the chunked backends recompute the logits tiles in backward).
    off_policy_mask_threshold: DeepSeek-V3.2's off-policy sequence masking (TRL's option, None = off): the policy
        term of a token with advantage < 0 is dropped when its sequence's mean sg(o - logp) (old minus current
        logprob, over the sequence's active tokens) exceeds the threshold; KL and entropy terms stay. TRL measures
        against the sampling engine's logprobs when it has them, else old_logprobs; here always old_logprobs
        (the current logprobs when None: nothing is masked).
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
    use_bias_correction_kl: bool = True
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    temperature: float = 1.0
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0
    off_policy_mask_threshold: float | None = None
    importance_sampling_level: str = "token"
    max_completion_length: int | None = None
    backend: str = "auto"
    workspace_bytes: int | None = None
    deterministic: bool = False
    logit_scale: float = 1.0
    final_logit_softcapping: float | None = None

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
        for name in ("use_bias_correction_kl", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            _check_finite(name, getattr(self, name), low=0.0, low_inclusive=False)
        for name in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
            _check_finite(name, getattr(self, name), low=0.0)
        _check_finite("temperature", self.temperature, low=0.0, low_inclusive=False)
        LogitHead(self.logit_scale, self.final_logit_softcapping)  # checks both
        _check_finite("entropy_coef", self.entropy_coef)
        _check_finite("top_entropy_quantile", self.top_entropy_quantile, low=0.0, high=1.0)
        if self.off_policy_mask_threshold is not None:
            _check_finite("off_policy_mask_threshold", self.off_policy_mask_threshold)
        if self.max_completion_length is not None and (
            not _is_int(self.max_completion_length) or self.max_completion_length < 1
        ):
            raise ValueError(
                f"max_completion_length: expected a positive int or None, got {self.max_completion_length!r}"
            )
        if self.workspace_bytes is not None and (not _is_int(self.workspace_bytes) or self.workspace_bytes < 1):
            raise ValueError(f"workspace_bytes: expected a positive int or None, got {self.workspace_bytes!r}")

    @property
    def loss_spec(self) -> LossType:
        """The row of the loss-type table that `loss_type` names."""
        return get_loss_type(self.loss_type)

    @property
    def needs_whole_sequences(self) -> bool:
        """Whether layer 2 must see whole sequences at once: sequence-level ratios (GSPO), or an objective
        with a per-sequence term at token level too (vespo), or off-policy sequence masking."""
        return (
            self.importance_sampling_level == "sequence"
            or self.loss_spec.objective.needs_whole_sequences
            or self.off_policy_mask_threshold is not None
        )

    @property
    def needs_all_rows(self) -> bool:
        """Whether layer 2 must see every row of the call at once (the entropy quantile of
        top_entropy_quantile < 1)."""
        return self.top_entropy_quantile < 1.0

    @property
    def clip_high(self) -> float:
        """epsilon_high with TRL's default (epsilon_low when not given)."""
        return self.epsilon_low if self.epsilon_high is None else self.epsilon_high


def _is_int(value: object) -> bool:
    """An int that is not a bool (True would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


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
