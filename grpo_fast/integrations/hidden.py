"""A transformers causal LM's last hidden states and output head, without running the head.

    hidden = hidden_states(model, input_ids, attention_mask, logits_to_keep=k)      # [B, K, H]
    head = output_head(model)                                                        # weight [V, H], bias, transform
    logp = fused_logprobs(hidden, head.weight, targets, temperature, bias=head.bias, **head.transform_kwargs())

`hidden_states` runs the model's backbone (`model.<base_model_prefix>`: the decoder stack with its final norm)
and returns the rows `model(..., logits_to_keep=k).logits` is computed from: `logits_to_keep` is transformers'
argument (an int k keeps the last k positions, 0 keeps all; a 1-D tensor keeps those positions).
`completion_hidden_states` returns instead the K rows that predict the last K tokens of `input_ids` (TRL's
alignment: row t predicts input_ids[:, L - K + t]).

`output_head` returns the output embedding's effective weight and bias and the head transform (a logit scale,
Gemma-2/3's final soft cap: `grpo_fast.loss.head.logit_head`). Supported:
    - any causal LM whose `get_output_embeddings()` is an nn.Linear (tied embeddings included: the weight is the
      embedding matrix itself, so gradients reach it);
    - PEFT: a PeftModel (LoRA, and the other tuners that inject layers into the backbone) is unwrapped to its base
      model, whose injected layers run as usual; on the head itself: a `modules_to_save` copy of lm_head, and a
      vanilla LoRA layer on lm_head (effective weight W + Σ scaling · B A over the active, unmerged adapters,
      differentiable in A and B).
Unsupported, with an error naming it: prompt-learning PEFT (prefix / prompt tuning: the sequence changes), LoRA
on lm_head with DoRA or another variant, lora_bias, fan_in_fan_out, or active dropout (p > 0 in training
mode: the dropped input cannot be folded into a weight); any other head module type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..loss.head import LogitHead, logit_head


@dataclass(frozen=True)
class OutputHead:
    """The output head as the fused loss takes it: logits = transform(hidden @ weight.T + bias).

    weight [V, H]; bias [V] or None; head: the scale and soft cap (`LogitHead`)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    head: LogitHead

    def transform_kwargs(self) -> dict:
        """`logit_scale` and `final_logit_softcapping`, the keyword arguments of fused_logprobs / GRPOLossConfig."""
        return {"logit_scale": self.head.logit_scale, "final_logit_softcapping": self.head.final_logit_softcapping}


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model under a PEFT wrapper (the model itself otherwise).

    Raises NotImplementedError for prompt-learning PEFT (prefix / prompt / p-tuning), whose virtual tokens change
    the sequence the backbone sees."""
    peft_config = getattr(model, "peft_config", None)
    if peft_config is not None and hasattr(model, "get_base_model"):
        active = getattr(model, "active_adapter", None)
        config = peft_config.get(active) if isinstance(peft_config, dict) else peft_config
        if getattr(config, "is_prompt_learning", False):
            raise NotImplementedError(
                f"model: prompt-learning PEFT ({type(config).__name__}) prepends virtual tokens; only adapters "
                "injected into the layers (LoRA and the like) are supported"
            )
        return model.get_base_model()
    return model


def backbone(model: nn.Module) -> nn.Module:
    """The decoder stack (with its final norm) of a transformers causal LM: `model.<base_model_prefix>`."""
    model = unwrap_peft(model)
    prefix = getattr(model, "base_model_prefix", None)
    inner = getattr(model, prefix, None) if prefix else None
    if not isinstance(inner, nn.Module) or inner is model:
        raise TypeError(
            f"model: expected a transformers *ForCausalLM with a backbone at `model.{prefix}`, "
            f"got {type(model).__name__}"
        )
    return inner


def _keep(logits_to_keep: int | torch.Tensor):
    if isinstance(logits_to_keep, torch.Tensor):
        if logits_to_keep.dim() != 1:
            raise ValueError(f"logits_to_keep: expected an int or a 1-D tensor, got shape {list(logits_to_keep.shape)}")
        return logits_to_keep
    if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
        raise ValueError(f"logits_to_keep: expected an int >= 0 or a 1-D tensor, got {logits_to_keep!r}")
    return slice(-logits_to_keep, None)  # 0 keeps everything, as in transformers


def hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    logits_to_keep: int | torch.Tensor = 0,
    **kwargs,
) -> torch.Tensor:
    """Last-layer hidden states, after the final norm: [B, K, H] for input_ids [B, L], the positions that
    `model(input_ids, attention_mask, logits_to_keep=logits_to_keep).logits` has (K = L for 0). Extra kwargs
    (position_ids, ...) go to the backbone; use_cache is off."""
    kwargs["use_cache"] = False
    out = backbone(model)(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    return out.last_hidden_state[:, _keep(logits_to_keep), :]


def completion_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    num_completion_tokens: int,
    **kwargs,
) -> torch.Tensor:
    """[B, K, H] hidden states predicting the last K = num_completion_tokens tokens of input_ids [B, L]
    (row t predicts input_ids[:, L - K + t]; the rows of `model(..., logits_to_keep=K + 1).logits[:, :-1]`)."""
    length = input_ids.shape[-1]
    if isinstance(num_completion_tokens, bool) or not isinstance(num_completion_tokens, int):
        raise ValueError(f"num_completion_tokens: expected an int, got {num_completion_tokens!r}")
    if not 1 <= num_completion_tokens < length:
        raise ValueError(f"num_completion_tokens: expected 1 <= K < L={length}, got {num_completion_tokens}")
    return hidden_states(model, input_ids, attention_mask, num_completion_tokens + 1, **kwargs)[:, :-1]


def _lora_weight(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Effective (weight, bias) of a PEFT LoRA Linear layer on the head."""
    base = layer.get_base_layer()
    weight, bias = base.weight, getattr(base, "bias", None)
    if getattr(layer, "disable_adapters", False) or getattr(layer, "merged", False):
        return weight, bias  # merged: the delta is in the base weight already
    if getattr(layer, "fan_in_fan_out", False):
        raise NotImplementedError("model: LoRA on lm_head with fan_in_fan_out=True is not supported")
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        if name in getattr(layer, "lora_variant", {}):
            variant = type(layer.lora_variant[name]).__name__
            raise NotImplementedError(f"model: LoRA variant {variant} (e.g. DoRA) on lm_head is not supported")
        if getattr(layer, "lora_bias", {}).get(name, False):
            raise NotImplementedError("model: LoRA on lm_head with lora_bias=True is not supported")
        dropout = layer.lora_dropout[name]
        if isinstance(dropout, nn.Dropout) and dropout.p > 0 and dropout.training:
            raise NotImplementedError(
                f"model: LoRA adapter {name!r} on lm_head has lora_dropout={dropout.p} in training mode; dropout on "
                "the head's input cannot be folded into a weight (use lora_dropout=0, or leave lm_head out of "
                "target_modules)"
            )
        a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
        weight = weight + (b @ a.to(b.dtype)).to(weight.dtype) * layer.scaling[name]
    return weight, bias


def head_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight [V, H], bias [V] | None) of an output-embedding module: nn.Linear, a PEFT LoRA layer, or a PEFT
    modules_to_save wrapper. TypeError / NotImplementedError otherwise."""
    if hasattr(module, "modules_to_save") and hasattr(module, "original_module"):  # peft ModulesToSaveWrapper
        active = [a for a in module.active_adapters if a in module.modules_to_save]
        if getattr(module, "disable_adapters", False) or not active:
            return head_weight(module.original_module)
        return head_weight(module.modules_to_save[active[0]])
    if hasattr(module, "lora_A") and hasattr(module, "get_base_layer"):
        return _lora_weight(module)
    if type(module) is nn.Linear:
        return module.weight, module.bias
    base = getattr(module, "base_layer", None)
    kind = type(module).__name__
    if base is not None:
        raise NotImplementedError(f"model: lm_head is wrapped by {kind} (a PEFT tuner other than LoRA); not supported")
    raise TypeError(f"model: expected the output embeddings to be an nn.Linear, got {kind}")


def output_head(model: nn.Module) -> OutputHead:
    """The output head of a transformers causal LM (a PEFT model's base model's): effective weight [V, H],
    bias [V] | None and the head transform (`logit_head`: scale, soft cap)."""
    inner = unwrap_peft(model)
    getter = getattr(inner, "get_output_embeddings", None)
    module = getter() if callable(getter) else None
    if module is None:
        raise TypeError(f"model: {type(inner).__name__} has no output embeddings (get_output_embeddings() is None)")
    weight, bias = head_weight(module)
    return OutputHead(weight, bias, logit_head(inner))
