"""Liger-Kernel's `LigerFusedLinearGRPOLoss` (liger-kernel 0.8.5) computed by grpo_fast's fused GRPO loss:
change the import and nothing else.

    - from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
    + from grpo_fast.integrations.liger import LigerFusedLinearGRPOLoss

    loss_fn = LigerFusedLinearGRPOLoss(beta=0.04, loss_type="dapo", use_ref_model=True, temperature=0.9)
    loss, metrics = loss_fn(_input, lin_weight, selected_token_ids, attention_mask, advantages,
                            bias=None, ref_per_token_logps=ref, old_per_token_logps=old, vllm_is_ratio=None)

The constructor and `forward` take Liger's arguments (names, order, defaults); the one addition is the
keyword-only `backend=` of the constructor (see grpo_fast.backends). The result is Liger's:
(loss [] fp32, metrics), metrics a tuple of detached 0-dim tensors, (kl, clip_ratio) when beta != 0 and
(clip_ratio,) otherwise, where, over the active tokens,
    kl         = mean of k3 = exp(r - ℓ) - (r - ℓ) - 1 (r reference, ℓ current logprob; k3 ρ with
                 use_bias_correction_kl)
    clip_ratio = mean of [ρ < 1 - ε_lo and A < 0] or [ρ > 1 + ε_hi and A > 0] (cispo: [ρ > ε_hi and A > 0];
                 sapo, vespo: 0).

Liger's semantics, kept:
  * use_ref_model=False: no reference policy, whatever ref_* is given. The KL is then taken to the detached
    current policy: k3 = 0 with zero gradient, so beta only adds a kl metric of 0.
  * use_ref_model=True needs ref_per_token_logps, or ref_input + ref_weight (+ ref_bias) from which the
    reference logprobs are computed without gradient at the same temperature; ref_per_token_logps wins,
    with a warning, when both are given.
  * vllm_is_ratio [B, T], [B, 1] or [B] multiplies each token's policy term (not its KL term; vespo: below).
  * dapo / cispo / vespo divide by num_items_in_batch / world_size, or, without it, by the active tokens of all
    data-parallel ranks / world_size (an all_reduce when torch.distributed is initialised).
  * lin_weight, bias (and ref_weight, ref_bias) of another dtype than the input are cast to the input's.
  * compiled and chunk_size are accepted and ignored: they tune Liger's implementation (torch.compile of
    its loss math, sequences per chunk); grpo_fast's tile size is its backend's workspace.

Differences:
  * luspo: Liger sums p_bt L_b / (B T') over all positions of its per-token loss p [B, T'] (padding
    included; T' = 1 when p is one value per sequence), grpo_fast (TRL 1.16) sums p_bt / B over the active
    tokens. They agree when p is per sequence: importance_sampling_level="sequence", no KL term and
    vllm_is_ratio None, [B, 1] or [B].
  * vespo with vllm_is_ratio: Liger (and TRL) add Σ_t log w_bt over all T positions of a [B, T] ratio,
    padding included, and log w_b once for a [B, 1] / [B] ratio; grpo_fast sums over the active tokens,
    a per-sequence ratio once per active token.
  * Errors (ValueError naming the argument) where Liger computes: a loss_type outside
    grpo_fast.loss.LOSS_TYPES; a non-default use_bias_correction_kl / sapo_* / vespo_* option that
    GRPOLossConfig has no field for; delta <= 1 + epsilon_high (Liger: <= 0) for the clipped loss types;
    epsilon_low outside [0, 1), beta < 0, temperature <= 0; num_items_in_batch <= 0 (Liger clamps it to 1).
  * dr_grpo without max_completion_length fails when constructed (Liger: an assertion when called);
    Liger's other assertions (no reference, vllm_is_ratio's shape) are ValueErrors too.
  * advantages may also be per-token [B, T]; values at padding positions are never read (Liger's loss
    turns NaN when padded old logprobs are NaN).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from contextlib import contextmanager

import torch
from torch import nn

from ..loss import LOSS_TYPES, GRPOLossConfig, Reduction, checks, fused_logprobs, grpo_loss

# Liger's loss types without sequence-level importance sampling.
_TOKEN_LEVEL_ONLY = ("cispo", "sapo", "vespo")
# Liger options passed on to GRPOLossConfig's fields of the same names; where it has no such field, only
# Liger's default (under which Liger computes what grpo_fast does without the option) is accepted.
_OPTIONAL_OPTIONS = {
    "use_bias_correction_kl": False,
    "sapo_temperature_pos": 1.0,
    "sapo_temperature_neg": 1.05,
    "vespo_k_pos": 2.0,
    "vespo_lambda_pos": 3.0,
    "vespo_k_neg": 3.0,
    "vespo_lambda_neg": 2.0,
}
# grpo_fast's argument names -> Liger's, for error messages.
_POLICY_NAMES = {
    "hidden": "_input",
    "weight": "lin_weight",
    "completion_ids": "selected_token_ids",
    "completion_mask": "attention_mask",
    "old_logprobs": "old_per_token_logps",
    "ref_logprobs": "ref_per_token_logps",
    "is_weights": "vllm_is_ratio",
}
_REFERENCE_NAMES = {"hidden": "ref_input", "weight": "ref_weight", "bias": "ref_bias", "targets": "selected_token_ids"}


class LigerFusedLinearGRPOLoss(nn.Module):
    """Liger-Kernel's fused linear GRPO loss, same arguments and results, computed by grpo_fast."""

    def __init__(
        self,
        beta: float = 0.04,
        compiled: bool = True,
        use_ref_model: bool = True,
        chunk_size: int = 1,
        epsilon_low: float = 0.2,
        epsilon_high: float = 0.2,
        loss_type: str = "dapo",
        max_completion_length: int | None = None,
        importance_sampling_level: str = "token",
        sapo_temperature_pos: float = 1.0,
        sapo_temperature_neg: float = 1.05,
        temperature: float = 1.0,
        delta: float | None = None,
        use_bias_correction_kl: bool = False,
        vespo_k_pos: float = 2.0,
        vespo_lambda_pos: float = 3.0,
        vespo_k_neg: float = 3.0,
        vespo_lambda_neg: float = 2.0,
        *,
        backend: str = "auto",
    ):
        """Liger's options (the module docstring says how each is honoured) and grpo_fast's backend:
        "auto" | "torch" | "triton" | "cuda" | "cpu". Options grpo_fast cannot honour raise ValueError here."""
        super().__init__()
        for name, value in (
            ("sapo_temperature_pos", sapo_temperature_pos),
            ("sapo_temperature_neg", sapo_temperature_neg),
            ("delta", delta),
        ):
            if value is not None and not value > 0:
                raise ValueError(f"{name}: expected a positive value, got {value!r}")
        self.beta = beta
        self.compiled = compiled
        self.use_ref_model = use_ref_model
        self.chunk_size = chunk_size
        self.epsilon_low = epsilon_low
        self.epsilon_high = epsilon_high
        self.loss_type = loss_type
        self.max_completion_length = max_completion_length
        self.importance_sampling_level = importance_sampling_level
        self.sapo_temperature_pos = sapo_temperature_pos
        self.sapo_temperature_neg = sapo_temperature_neg
        self.temperature = temperature
        self.delta = delta
        self.use_bias_correction_kl = use_bias_correction_kl
        self.vespo_k_pos = vespo_k_pos
        self.vespo_lambda_pos = vespo_lambda_pos
        self.vespo_k_neg = vespo_k_neg
        self.vespo_lambda_neg = vespo_lambda_neg
        self.backend = backend
        self.loss_config()

    def loss_config(self) -> GRPOLossConfig:
        """grpo_fast's options for the current attributes (read at every call, as Liger reads them)."""
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(
                f"loss_type: {self.loss_type!r} is not supported by grpo_fast; supported: {tuple(LOSS_TYPES)}"
            )
        if self.importance_sampling_level == "sequence" and self.loss_type in _TOKEN_LEVEL_ONLY:
            raise ValueError(
                f"importance_sampling_level: 'sequence' is not supported for loss_type={self.loss_type!r}; use 'token'"
            )
        if self.loss_type == "dr_grpo" and self.max_completion_length is None:
            raise ValueError("max_completion_length: required for loss_type='dr_grpo'")
        fields = {field.name for field in dataclasses.fields(GRPOLossConfig)}
        options = {}
        for name, default in _OPTIONAL_OPTIONS.items():
            if name in fields:
                options[name] = getattr(self, name)
            elif getattr(self, name) != default:
                raise ValueError(f"{name}: not supported by grpo_fast (no GRPOLossConfig.{name}); use {default!r}")
        return GRPOLossConfig(
            loss_type=self.loss_type,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            # Liger caps the ratio at delta in the clipped surrogate only.
            delta=self.delta if LOSS_TYPES[self.loss_type].objective.name == "clipped" else None,
            beta=self.beta,
            temperature=self.temperature,
            importance_sampling_level=self.importance_sampling_level,
            max_completion_length=self.max_completion_length,
            backend=self.backend,
            **options,
        )

    def forward(
        self,
        _input,
        lin_weight,
        selected_token_ids,
        attention_mask,
        advantages,
        bias=None,
        ref_per_token_logps=None,
        old_per_token_logps=None,
        ref_input=None,
        ref_weight=None,
        ref_bias=None,
        vllm_is_ratio=None,
        num_items_in_batch=None,
    ):
        """GRPO loss and metrics of a (micro-)batch.

        _input [B, T, H] (position t predicts selected_token_ids[:, t]), lin_weight [V, H], bias [V] | None;
        selected_token_ids, attention_mask [B, T]; advantages [B] (or [B, T]); ref_per_token_logps,
        old_per_token_logps [B, T] (old None: on-policy, ratio 1); ref_input [B, T, H], ref_weight [V, H],
        ref_bias [V]: the reference model's, read when use_ref_model and ref_per_token_logps is None;
        vllm_is_ratio [B, T], [B, 1] or [B]; num_items_in_batch: active tokens of the whole accumulated
        batch over all ranks (dapo, cispo, vespo).

        Returns (loss [] fp32, metrics tuple: (kl, clip_ratio) if beta != 0 else (clip_ratio,)), the loss
        differentiable w.r.t. _input, lin_weight and bias.
        """
        config = self.loss_config()
        ref_logprobs = self._reference_logprobs(
            config, selected_token_ids, attention_mask, ref_per_token_logps, ref_input, ref_weight, ref_bias
        )
        if ref_logprobs is None:
            # No reference (or beta == 0): Liger's KL to the detached current policy, exp(0) - 0 - 1, is 0 with
            # zero gradient, so the loss is beta = 0's.
            config = dataclasses.replace(config, beta=0.0)
        if isinstance(vllm_is_ratio, torch.Tensor) and vllm_is_ratio.dim() == 2 and vllm_is_ratio.shape[1] == 1:
            vllm_is_ratio = vllm_is_ratio[:, 0]  # one ratio per sequence: grpo_fast's [B] form
        with _liger_names(_POLICY_NAMES):
            loss, metrics = grpo_loss(
                _input,
                _cast(lin_weight, _input),
                selected_token_ids,
                attention_mask,
                advantages,
                old_logprobs=old_per_token_logps,
                ref_logprobs=ref_logprobs,
                is_weights=vllm_is_ratio,
                num_items_in_batch=_dapo_normaliser(config, attention_mask, num_items_in_batch),
                config=config,
                bias=_cast(bias, _input),
            )
        clip_ratio = metrics["clip_ratio/region_mean"]
        if self.beta == 0.0:
            return loss, (clip_ratio,)
        return loss, (metrics["kl"] if "kl" in metrics else torch.zeros_like(clip_ratio), clip_ratio)

    def _reference_logprobs(
        self, config, selected_token_ids, attention_mask, ref_per_token_logps, ref_input, ref_weight, ref_bias
    ):
        """[B, T] reference logprobs as Liger takes them; None without use_ref_model or when beta == 0."""
        if not self.use_ref_model:
            return None
        if ref_per_token_logps is None and ref_input is None:
            raise ValueError(
                "ref_per_token_logps: use_ref_model=True needs ref_per_token_logps or ref_input (with ref_weight)"
            )
        if ref_per_token_logps is not None and ref_input is not None:
            message = "Both ref_per_token_logps and ref_input are provided. Using ref_per_token_logps."
            warnings.warn(message, stacklevel=2)
        if config.beta == 0.0:
            return None
        if ref_per_token_logps is not None:
            return ref_per_token_logps
        if ref_weight is None:
            raise ValueError("ref_weight: required with ref_input (the reference model's lm_head weight [V, H])")
        ids = checks.require_tensor("selected_token_ids", selected_token_ids)
        mask = checks.require_tensor("attention_mask", attention_mask)
        checks.require_shape("attention_mask", mask, tuple(ids.shape), "[B, T] like selected_token_ids")
        # Padding positions may hold any id; their logprob is never read.
        targets = torch.where(mask != 0, ids, torch.zeros_like(ids))
        with torch.no_grad(), _liger_names(_REFERENCE_NAMES):
            return fused_logprobs(
                ref_input,
                _cast(ref_weight, ref_input),
                targets,
                temperature=self.temperature,
                backend=self.backend,
                bias=_cast(ref_bias, ref_input),
            )


def _cast(value, like):
    """`value` in `like`'s dtype when both are floating-point tensors (Liger computes in the input's dtype;
    the cast is differentiable, so gradients come back in value's dtype)."""
    if isinstance(value, torch.Tensor) and isinstance(like, torch.Tensor) and like.is_floating_point():
        return value.to(like.dtype) if value.is_floating_point() else value
    return value


def _dapo_normaliser(config: GRPOLossConfig, attention_mask, num_items_in_batch):
    """num_items_in_batch for grpo_fast matching Liger's dapo / cispo / vespo normaliser: under torch.distributed,
    Liger divides by the world size W, counting the active tokens of all ranks when none is given:
    N = num_items_in_batch / W, or N = all_reduce(Σ mask) / W."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not distributed or config.loss_spec.reduction is not Reduction.GLOBAL_TOKEN_MEAN:
        return num_items_in_batch
    if num_items_in_batch is None:
        num_items_in_batch = checks.require_tensor("attention_mask", attention_mask).to(torch.float32).sum()
        torch.distributed.all_reduce(num_items_in_batch)
    return num_items_in_batch / torch.distributed.get_world_size()


@contextmanager
def _liger_names(names: dict[str, str]):
    """Re-raise grpo_fast's ValueError / TypeError with its argument names replaced by Liger's."""
    try:
        yield
    except (TypeError, ValueError) as err:
        if type(err) not in (TypeError, ValueError):
            raise
        message = re.sub(r"\b(" + "|".join(names) + r")\b", lambda match: names[match.group(1)], str(err))
        raise type(err)(message) from err
