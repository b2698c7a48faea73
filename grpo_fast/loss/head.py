"""The model's logit head beyond h Wᵀ + b: a logit scale and a final soft cap, read from a transformers
model or config as TRL's `add_fused_lm_head` reads them, and folded into the two numbers the backends'
logits tile takes (an inverse temperature and a soft cap).

With x = h Wᵀ + b, the scale s, the cap c (Gemma-2/3's final_logit_softcapping) and the sampling
temperature T, the models (and TRL) apply the scale first, then the cap, then the temperature:

    logits = c tanh(s x / c) / T          (no cap: logits = s x / T)

Since c tanh(s x / c) = s · c' tanh(x / c') with c' = c / s, the backends see the cap c' on x and the
inverse temperature s / T (a scale alone is only the inverse temperature s / T).

Where each model keeps them (TRL 1.16's reading order; the first one set wins for the scale):
    final_logit_softcapping   Gemma-2/3/4, VaultGemma, T5Gemma, nanochat, Muse Glimmer: the cap c
    logit_scale               Cohere, Cohere2 (logits · s; None = no scale, as on MPT)
    output_multiplier         Muse Glimmer (logits · s, before the cap)
    lm_head_multiplier        Falcon-H1 (logits · s)
    logits_scaling            Granite, MiniCPM3 (logits / s; MiniCPM3 divides the hidden states, the same
                              map without a head bias); HyperCLOVA X multiplies by it
Beyond TRL's list (read here too, after it): xLSTM caps its logits with `output_logit_soft_cap` (a cap c);
Inkling divides the hidden states by `logits_mup_width_multiplier` (a scale 1 / m) and slices the logits
to `unpadded_vocab_size` columns, which the loss cannot express (NotImplementedError).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

_FP32_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class LogitHead:
    """logits = c tanh(s (h Wᵀ + b) / c) / T with s = logit_scale and c = final_logit_softcapping (None: no
    cap, logits = s (h Wᵀ + b) / T). TRL's names; both must be positive and finite."""

    logit_scale: float = 1.0
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        for name in ("logit_scale", "final_logit_softcapping"):
            value = getattr(self, name)
            if value is None and name == "final_logit_softcapping":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                none = " or None (no cap)" if name == "final_logit_softcapping" else ""
                raise ValueError(f"{name}: expected a finite number > 0{none}, got {value!r}")

    def tile(self, temperature: float) -> tuple[float, float]:
        """(inv_temperature, softcap) of the backends' tile logits = c' tanh(x / c') · inv_temperature:
        s / T and c' = c / s (softcap 0: no cap, logits = x · s / T)."""
        inv_temperature = self.logit_scale / temperature
        if not inv_temperature <= _FP32_MAX:  # inf, or a tile scale float32 cannot hold: every logit inf or NaN
            raise ValueError(
                f"temperature: logit_scale / temperature = {self.logit_scale:g} / {temperature:g} is beyond float32's "
                f"range ({_FP32_MAX:.3g}); for greedy sampling use temperature 1 in the loss (0 in rollout.temperature)"
            )
        if self.final_logit_softcapping is None:
            return inv_temperature, 0.0
        return inv_temperature, self.final_logit_softcapping / self.logit_scale


def logit_head(model_or_config) -> LogitHead:
    """The head transform of a transformers model (or its config; a PEFT model's base model's).

    Raises NotImplementedError for a head transform the loss cannot express (Inkling's vocabulary slice,
    a non-numeric scale such as MPT's "inv_sqrt_d_model"), ValueError for a scale or cap that is not > 0.
    """
    config = model_or_config.config if isinstance(model_or_config, torch.nn.Module) else model_or_config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(text, "model_type", None)
    unpadded = getattr(text, "unpadded_vocab_size", None)
    if unpadded is not None and unpadded < text.vocab_size:
        raise NotImplementedError(
            f"{model_type}: the head keeps the first unpadded_vocab_size={unpadded} of vocab_size={text.vocab_size} "
            "logits; the fused loss takes a softmax over every row of the lm_head weight"
        )
    cap = getattr(text, "final_logit_softcapping", None)
    if cap is None:  # xLSTM's name for it
        cap = getattr(text, "output_logit_soft_cap", None)
    # TRL's order: the first of logit_scale, output_multiplier, lm_head_multiplier, logits_scaling that is set.
    names = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling", "logits_mup_width_multiplier")
    source = next((name for name in names if getattr(text, name, None) is not None), None)
    if source is None:
        return LogitHead(1.0, None if cap is None else float(cap))
    scale = getattr(text, source)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise NotImplementedError(f"{model_type}: config.{source}={scale!r} is not a number the loss can fold in")
    if source == "logits_mup_width_multiplier" or (source == "logits_scaling" and model_type != "hyperclovax"):
        scale = 1.0 / scale  # Granite, MiniCPM3, Inkling divide by it
    return LogitHead(float(scale), None if cap is None else float(cap))


def with_model_head(config, model_or_config):
    """`config` (a GRPOLossConfig) with the model's head transform (`logit_head`). A value the config sets
    already (not the default) must agree with the model's: otherwise ValueError."""
    head, default = logit_head(model_or_config), LogitHead()
    for field in dataclasses.fields(LogitHead):
        ours, model = getattr(config, field.name), getattr(head, field.name)
        if ours != getattr(default, field.name) and ours != model:
            raise ValueError(f"loss.{field.name}: {ours!r}, but the model's head has {model!r}; leave it unset")
    return dataclasses.replace(config, **dataclasses.asdict(head))
