"""Liger-Kernel's model kernels on the policy (`model.liger_kernels: true`), GPU only.

`apply_model_kernels(model, model_config)` patches an already loaded policy through Liger-Kernel's
entry point for model instances (`liger_kernel.transformers._apply_liger_kernel_to_instance`, which
dispatches on `model.config.model_type` through `MODEL_TYPE_TO_APPLY_LIGER_FN`). The model kernels
(RMSNorm, RoPE, SwiGLU / GeGLU, ... as Liger enables them by default for the architecture; Qwen2:
rope, rms_norm, swiglu) are switched on; Liger's cross-entropy and fused linear cross-entropy are
always switched off: the lm_head and the loss stay grpo_fast's fused path (`grpo_loss` on the
backbone's hidden states).

What Liger patches for an instance is partly global: besides the instance's own RMSNorm / MLP
modules, it replaces module-level names of the architecture's transformers module (Qwen2:
`modeling_qwen2.apply_rotary_pos_emb`, `Qwen2RMSNorm`, `Qwen2MLP`), so every model of that
architecture in the process, and every one built later, uses Liger's RoPE (and its RMSNorm / MLP
classes when built after the call).

Liger's kernels are Triton GPU kernels: they need CUDA tensors, so the option is GPU-only and this
raises on a model that is not on a CUDA device (apply it after moving the model to the GPU).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

# Liger's loss kernels: never on here (grpo_fast's fused head computes the loss from hidden states).
LOSS_KERNELS = ("cross_entropy", "fused_linear_cross_entropy")


def apply_model_kernels(model: nn.Module, model_config) -> list[str]:
    """Patch `model` (a transformers causal LM, on a CUDA device) with Liger-Kernel's model kernels
    when `model_config.liger_kernels` is true; returns the names of the kernels applied (Liger's
    option names, e.g. ["rope", "rms_norm", "swiglu"] for Qwen2), [] when the option is off.

    Raises ImportError when liger-kernel is not installed, ValueError when Liger has no kernels for
    the model's architecture, RuntimeError when the model is not on a CUDA device; nothing is patched
    then."""
    if not getattr(model_config, "liger_kernels", False):
        return []
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as err:
        raise ImportError(
            f"model.liger_kernels: true needs Liger-Kernel ({err}); install it with `pip install liger-kernel` "
            "(or the gpu extra: pip install 'grpo_fast[gpu]'), or set model.liger_kernels: false"
        ) from err

    if hasattr(model, "get_base_model"):  # a PEFT model: patch the transformers model inside
        model = model.get_base_model()
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    apply_fn = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply_fn is None:
        raise ValueError(
            f"model.liger_kernels: Liger-Kernel has no kernels for model type {model_type!r} "
            f"(it supports: {', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); set model.liger_kernels: false"
        )

    devices = sorted({p.device.type for p in model.parameters()})
    if devices != ["cuda"]:
        raise RuntimeError(
            "model.liger_kernels is GPU-only: Liger-Kernel's RMSNorm, RoPE and SwiGLU are Triton kernels that "
            f"need CUDA tensors, and the policy's parameters are on {', '.join(devices) or 'no device'}"
            + ("" if torch.cuda.is_available() else " (no CUDA device here)")
            + "; set model.liger_kernels: false, or apply the kernels after moving the model to the GPU"
        )

    params = inspect.signature(apply_fn).parameters
    # Liger's own per-architecture defaults decide which model kernels are on (its RoPE, for example, is
    # off by default for DeepSeek-V2/V3 and Qwen3.5); the loss kernels are forced off.
    applied = [
        name
        for name, p in params.items()
        if name not in LOSS_KERNELS and name != "model" and isinstance(p.default, bool) and p.default
    ]
    _apply_liger_kernel_to_instance(model=model, **{name: False for name in LOSS_KERNELS if name in params})
    return applied
