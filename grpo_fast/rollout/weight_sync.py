"""Streaming the trainer's parameters to a rollout engine in bounded buckets."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from grpo_fast.distributed.fsdp import full_tensor


def trainer_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of the policy's parameters, as the forward uses them. For a PEFT LoRA model, what
    `merge_and_unload()` would give, computed per tensor (the model is never modified, so no merge/unmerge
    rounding accumulates in the base weights), under the base model's names (no `base_model.model.`,
    `.base_layer`, `.original_module`, `.modules_to_save.<adapter>`); adapter-only tensors are never yielded:

    - a LoRA layer's weight W (its base layer's), for each active adapter in turn: plain LoRA
      W <- W + delta (`get_delta_weight`: scaling * B @ A, in W's layout); DoRA on a Linear layer
      W <- m / ||W0 + delta|| * (W + delta), the norm taken per output row of W0 + delta ([out, in] layout,
      W0 the base weight, m = `lora_magnitude_vector`: [out]), as PEFT's DoRA merge computes it; with
      `lora_bias`, the bias b <- b + scaling * lora_B.bias. Other LoRA variants raise NotImplementedError.
    - a `modules_to_save` wrapper: the copy its forward uses (the active adapter's trained copy, or the
      original module when no adapter of it is active), under the wrapped module's name."""
    if not hasattr(model, "peft_config"):
        for name, param in model.named_parameters():
            yield name, full_tensor(param.detach())  # an FSDP2 shard: gathered here, one parameter at a time
        return
    from peft.tuners.lora.variants import DoraLinearVariant
    from peft.utils.other import transpose

    modules = dict(model.named_modules())
    in_use = {}  # modules_to_save wrapper path -> the prefix of the copy its forward uses
    for path, module in modules.items():
        if hasattr(module, "original_module") and hasattr(module, "modules_to_save"):
            active = module.active_adapters[0] if module.active_adapters and not module.disable_adapters else None
            in_use[path] = f"modules_to_save.{active}" if active in module.modules_to_save else "original_module"
    for name, param in model.named_parameters():
        if "lora_" in name:
            continue
        tensor = param.detach()
        wrapper = next((p for p in in_use if name.startswith(p + ".")), None)
        if wrapper is not None:
            copy = name[len(wrapper) + 1 :]
            if not copy.startswith(in_use[wrapper] + "."):
                continue
            name = f"{wrapper}.{copy[len(in_use[wrapper]) + 1 :]}"
        owner_name, _, leaf = name.rpartition(".base_layer.")
        owner = modules.get(owner_name)
        if leaf in ("weight", "bias") and owner is not None and hasattr(owner, "get_delta_weight") and not owner.merged:
            base = tensor
            for adapter in owner.active_adapters:
                if adapter not in owner.lora_A:
                    continue
                variant = owner.lora_variant.get(adapter)
                if leaf == "bias":
                    if owner.lora_bias.get(adapter):
                        tensor = tensor + owner.lora_B[adapter].bias.detach() * owner.scaling[adapter]
                elif variant is None:
                    tensor = tensor + owner.get_delta_weight(adapter).detach()
                elif type(variant) is DoraLinearVariant:  # exactly: the Embedding / conv variants subclass it
                    delta = owner.get_delta_weight(adapter).detach()
                    dora = owner.lora_magnitude_vector[adapter]
                    norm = dora.get_weight_norm(base, transpose(delta, owner.fan_in_fan_out), scaling=1).detach()
                    factor = transpose((dora.weight.detach() / norm).view(-1, 1), owner.fan_in_fan_out)
                    tensor = factor * (tensor + delta)
                else:
                    raise NotImplementedError(
                        f"weight sync of the LoRA variant {type(variant).__name__} ({owner_name}, adapter {adapter!r}) "
                        "is not implemented: merge the adapter, or use plain LoRA or DoRA on Linear layers"
                    )
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
