"""Streaming the trainer's parameters to a rollout engine in bounded buckets."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn


def trainer_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of the policy's parameters. For a PEFT LoRA model: the base weights with the
    active adapters' deltas added (computed per tensor, the model is never modified, so no merge/unmerge
    rounding accumulates in the base weights), under the base model's names (no `base_model.model.` /
    `.base_layer`); adapter tensors are skipped."""
    if not hasattr(model, "peft_config"):
        for name, param in model.named_parameters():
            yield name, param.detach()
        return
    modules = dict(model.named_modules())
    for name, param in model.named_parameters():
        if "lora_" in name:
            continue
        tensor = param.detach()
        owner_name, _, leaf = name.rpartition(".base_layer.")
        owner = modules.get(owner_name)
        if leaf == "weight" and owner is not None and hasattr(owner, "get_delta_weight") and not owner.merged:
            for adapter in owner.active_adapters:
                if adapter in owner.lora_A:
                    tensor = tensor + owner.get_delta_weight(adapter).detach()
        yield name.removeprefix("base_model.model.").replace(".base_layer", ""), tensor


def iter_weight_buckets(
    weights: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int = 256 << 20,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    stats: dict | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Re-yields `weights` converted to the engine's dtype/device, materialising at most `bucket_bytes`
    of converted copies at a time (a tensor larger than the budget is its own bucket). Parameters already
    in the right dtype/device are passed through without a copy. `stats` (if given) gets `bytes`,
    `tensors` and `buckets`."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    n_bytes = n_tensors = n_buckets = 0

    def flush():
        nonlocal bucket, size, n_buckets
        n_buckets += 1
        out, bucket, size = bucket, [], 0
        return out

    for name, tensor in weights:
        converted = tensor.to(dtype=dtype or tensor.dtype, device=device or tensor.device).contiguous()
        nbytes = converted.numel() * converted.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield from flush()
        bucket.append((name, converted))
        size += nbytes
        n_bytes += nbytes
        n_tensors += 1
    if bucket:
        yield from flush()
    if stats is not None:
        stats.update(bytes=n_bytes, tensors=n_tensors, buckets=n_buckets)
