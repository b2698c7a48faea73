"""The policy sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`), and how the trainer runs it.

Sharding: every decoder layer (the model's `_no_split_modules` classes) is its own FSDP unit, all-gathered
for its forward and backward and resharded after; the root unit holds the rest (embeddings, final norm,
lm_head). Each rank keeps 1/world_size of every parameter, gradient and optimizer state. FSDP averages the
ranks' gradients; each rank's loss is its share of the whole batch's loss (the loss step normalises by the
global row and token counts), so the loss step backpropagates world_size times it: the average is then the
whole batch's gradient. (Gradient sums through FSDP's divide factor need PREMUL_SUM, which gloo lacks.)

The fused loss needs the lm_head weight outside the model's forward, and the backbone's hidden states
without the [tokens x vocab] logits. `root_forward_hidden` runs the root module's forward (so FSDP's hooks
run: the root unit is all-gathered) with `logits_to_keep` an empty index (the head computes logits for no
position) and takes the backbone's last hidden state from a forward hook. FSDP2 keeps the root unit
unsharded from its forward until the end of the backward (the root's reshard_after_forward is off), so the
lm_head weight read right after the forward is the whole [V, H] parameter, and its gradient is
reduce-scattered with the root's at the end of the backward.
"""

from __future__ import annotations

import torch
from torch import nn


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` is an FSDP2 root (its parameters DTensors outside the forward)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_policy(model: nn.Module, device: torch.device) -> nn.Module:
    """Shards `model` (a transformers CausalLM, moved to `device` first) in place over the default process
    group: one FSDP unit per decoder layer, the root unit for the rest. Returns the model."""
    from torch.distributed.fsdp import fully_shard

    if hasattr(model, "peft_config"):
        raise ValueError(
            "model.lora: LoRA with more than one process is not supported; train LoRA on one GPU, or train the "
            "full model with torchrun"
        )
    model.to(device)
    layer_types = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_types]
    if not layers:
        raise ValueError(
            f"cannot shard {type(model).__name__}: it names no decoder layer class (_no_split_modules is empty)"
        )
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def root_forward_hidden(model: nn.Module, backbone: nn.Module, **inputs) -> torch.Tensor:
    """The backbone's last hidden state ([b, L, H]) for `inputs`, through the sharded root's forward (see the
    module docstring); the head computes logits for no position."""
    captured: list[torch.Tensor] = []

    def keep(_module, _args, output):
        captured.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

    handle = backbone.register_forward_hook(keep)
    try:
        model(**inputs, use_cache=False, logits_to_keep=torch.empty(0, dtype=torch.long))
    finally:
        handle.remove()
    return captured[0]


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor shard (an all-gather every rank must join), a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
