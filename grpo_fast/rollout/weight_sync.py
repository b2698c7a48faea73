"""Streaming the trainer's parameters to a rollout engine in bounded buckets."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn


def trainer_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of the policy's parameters, with LoRA adapters merged when the model is a PEFT
    model (names without PEFT's `base_model.model.` / `.base_layer` wrappers; adapter tensors skipped)."""
    merged = hasattr(model, "merge_adapter") and hasattr(model, "peft_config")
    if merged:
        model.merge_adapter()
    try:
        for name, param in model.named_parameters():
            if merged:
                if "lora_" in name:
                    continue
                name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            yield name, param.detach()
    finally:
        if merged:
            model.unmerge_adapter()


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
