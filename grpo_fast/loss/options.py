"""Options of the GRPO loss, as one frozen dataclass (the Cut Cross-Entropy habit: non-tensor
options travel together, not as a wall of positional arguments).

Names and semantics follow Hugging Face TRL's `GRPOConfig` / `GRPOTrainer._compute_loss`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from ..backends import BACKENDS
from ..config_fields import check_fields, option
from .head import LogitHead
from .loss_types import LOSS_TYPES, LossType, get_loss_type
from .objective import OBJECTIVES, Objective


@dataclass(frozen=True)
class GRPOLossConfig:
    """Options of `grpo_loss` / `GRPOLoss`; each field's help is its metadata (`help(GRPOLossConfig)` or
    `grpo-fast train --help-config` prints them). The loss types and objectives: grpo_fast.loss.loss_types and
    grpo_fast.loss.objectives (docs/config.md lists them, generated from the registries)."""

    # The objective's options, built once in __post_init__, live in a slot: __dict__ holds the fields alone (code
    # that copies a config through it keeps working), and torch.compile reads a built object instead of tracing
    # the options' construction and checks (which it cannot: they resolve type hints).
    __slots__ = ("_objective_settings", "__dict__", "__weakref__")

    loss_type: str = option(
        "dapo",
        "the loss type: an objective and a reduction (the loss types table of docs/config.md; TRL's names where TRL "
        "has the row), or a plug-in row as package.module:attribute",
        choices=LOSS_TYPES,
    )
    objective: str | None = option(
        None,
        "the per-token objective, in place of the loss type's (its reduction stays): a registered objective (the "
        "objectives table of docs/config.md) or package.module:attribute (null: the loss type's)",
        choices=OBJECTIVES,
    )
    epsilon_low: float = option(
        0.2, "clip range [1 - epsilon_low, 1 + epsilon_high] of the ratio", low=0, high=1, high_open=True
    )
    epsilon_high: float | None = option(
        None,
        "upper clip (null: epsilon_low; DAPO's clip-higher uses 0.28); for cispo the ratio's cap itself (needed; "
        "ScaleRL: 5.0); unused by sapo and vespo",
        low=0,
    )
    delta: float | None = option(
        None,
        "two-sided clipping (INTELLECT-2): the unclipped ratio capped at delta (> 1 + epsilon_high); clipped "
        "objectives only",
    )
    beta: float = option(0.0, "coefficient of the k3 KL estimate to the reference policy", low=0)
    use_bias_correction_kl: bool = option(
        True, "multiply the KL estimate by the importance ratio (DeepSeek-V3.2's unbiased KL gradient; TRL's default)"
    )
    sapo_temperature_pos: float = option(1.0, "sapo's gate temperature for advantages > 0", low=0, low_open=True)
    sapo_temperature_neg: float = option(1.05, "sapo's gate temperature for advantages <= 0", low=0, low_open=True)
    vespo_k_pos: float = option(2.0, "vespo's k for advantages >= 0 (phi(W) = exp(lambda + k log W - lambda W))", low=0)
    vespo_lambda_pos: float = option(3.0, "vespo's lambda for advantages >= 0 (floored at 1e-4)", low=0)
    vespo_k_neg: float = option(3.0, "vespo's k for advantages < 0", low=0)
    vespo_lambda_neg: float = option(2.0, "vespo's lambda for advantages < 0 (floored at 1e-4)", low=0)
    temperature: float = option(1.0, "logits are divided by it (match the sampling temperature)", low=0, low_open=True)
    entropy_coef: float = option(0.0, "entropy bonus: the loss gets - entropy_coef x (masked mean entropy)")
    top_entropy_quantile: float = option(
        1.0,
        "keep the policy term only for tokens whose entropy is in the top quantile of this call's tokens (TRL's "
        "'80/20' option; 1: off); needs every row of the call at once",
        low=0,
        high=1,
    )
    off_policy_mask_threshold: float | None = option(
        None,
        "DeepSeek-V3.2's off-policy masking: drop the policy term of tokens with advantage < 0 in sequences whose "
        "mean (old - current logprob) exceeds it (null: off)",
    )
    importance_sampling_level: Literal["token", "sequence"] = option(
        "token", "per-token ratios, or one per sequence from the mean masked log-ratio (GSPO)"
    )
    max_completion_length: int | None = option(
        None, "dr_grpo's normaliser (null: the padded length; packed: the longest sequence)", low=1
    )
    backend: str = option(
        "auto",
        "layer 1's backend (grpo_fast.backends; auto: the fastest that passes its self-check here), a registered "
        "one or package.module:attribute",
        choices=BACKENDS,
        also=("auto",),
    )
    workspace_bytes: int | None = option(
        None, "bytes of one logits tile of the chunked backends (null: the backend's default)", low=1
    )
    deterministic: bool = option(False, "Triton backward without float atomics (bitwise reproducible)")
    logit_scale: float = option(
        1.0,
        "the model's logit scale s of logits = c tanh(s (h W + b) / c) / T (loss.head.logit_head reads it)",
        low=0,
        low_open=True,
    )
    final_logit_softcapping: float | None = option(
        None, "the model's final logit soft cap c (null: none)", low=0, low_open=True
    )
    objective_options: dict = dataclasses.field(
        default_factory=dict,
        hash=False,
        metadata={
            "help": "the objective's own hyper-parameters (its options section: the objectives table of "
            "docs/config.md), e.g. {alpha: 0.5, beta: 5.0} for icepop"
        },
    )

    def __post_init__(self) -> None:
        check_fields(self)
        objective = self.objective_spec
        object.__setattr__(self, "_objective_settings", objective.settings(dict(self.objective_options)))
        if self.importance_sampling_level not in objective.levels:
            raise ValueError(
                f"importance_sampling_level: the objective {objective.name!r} takes {list(objective.levels)} (its "
                f"ratio is its own), got {self.importance_sampling_level!r}"
            )
        if objective.validate is not None:
            objective.validate(self)
        if self.delta is not None and not self.delta > 1.0 + self.clip_high:
            raise ValueError(f"delta: expected a value > {1.0 + self.clip_high} (1 + epsilon_high), got {self.delta!r}")
        LogitHead(self.logit_scale, self.final_logit_softcapping)  # checks both

    def __getstate__(self) -> dict:
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, "_objective_settings", self.objective_spec.settings(dict(self.objective_options)))

    @property
    def loss_spec(self) -> LossType:
        """The loss type that `loss_type` names."""
        return get_loss_type(self.loss_type)

    @property
    def objective_spec(self) -> Objective:
        """The objective: `objective` when given, else the loss type's."""
        if self.objective is None:
            return self.loss_spec.objective
        return OBJECTIVES.get(self.objective, key="objective")

    @property
    def options(self) -> Any:
        """The objective's options (an instance of its `options` class, from objective_options), or None."""
        return self._objective_settings

    @property
    def needs_whole_sequences(self) -> bool:
        """Whether layer 2 must see whole sequences at once: sequence-level ratios (GSPO), or an objective
        with a per-sequence term at token level too (vespo, gmpo), or off-policy sequence masking."""
        return (
            self.importance_sampling_level == "sequence"
            or self.objective_spec.whole_sequences
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
