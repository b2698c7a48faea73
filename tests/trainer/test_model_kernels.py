"""`model.liger_kernels` (grpo_fast/core/model_kernels.py): the error paths on CPU, and on a GPU a tiny
Qwen2's loss and gradients with Liger-Kernel's RMSNorm / RoPE / SwiGLU against the same model without them."""

from __future__ import annotations

import copy
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from grpo_fast.core.model_kernels import apply_model_kernels
from grpo_fast.core.policy import ModelConfig
from grpo_fast.core.tiny_models import TinyModelSpec, random_causal_lm

ON = ModelConfig(path="unused", liger_kernels=True)


SHAPE = TinyModelSpec(
    hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=176, max_position_embeddings=256
)


def tiny_qwen2(dtype=torch.float32, seed=0):
    return random_causal_lm(97, SHAPE, seed=seed, attn_implementation="sdpa").to(dtype)


@pytest.fixture
def qwen2_globals(monkeypatch):
    """Liger replaces module-level names of modeling_qwen2: restore them after the test."""
    from transformers.models.qwen2 import modeling_qwen2

    names = ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP")
    originals = {name: getattr(modeling_qwen2, name) for name in names}
    for name, value in originals.items():
        monkeypatch.setattr(modeling_qwen2, name, value)
    return modeling_qwen2, originals


def test_off_is_a_no_op():
    model = tiny_qwen2()
    assert apply_model_kernels(model, ModelConfig(path="unused")) == []


def test_not_installed_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # `import liger_kernel...` raises ImportError
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)
    with pytest.raises(ImportError, match=r"model.liger_kernels: true needs Liger-Kernel .*pip install liger-kernel"):
        apply_model_kernels(tiny_qwen2(), ON)


def test_cpu_model_is_a_clear_error_and_patches_nothing(qwen2_globals):
    pytest.importorskip("liger_kernel.transformers")
    modeling_qwen2, originals = qwen2_globals
    model = tiny_qwen2()
    forwards = {name: m.forward for name, m in model.named_modules() if "norm" in name or name.endswith("mlp")}
    with pytest.raises(RuntimeError, match=r"model.liger_kernels is GPU-only: .*Triton kernels .* on cpu"):
        apply_model_kernels(model, ON)
    for name, value in originals.items():
        assert getattr(modeling_qwen2, name) is value, name
    for name, module in model.named_modules():
        if name in forwards:
            assert module.forward == forwards[name], name


def test_unsupported_model_type_is_a_clear_error():
    pytest.importorskip("liger_kernel.transformers")
    model = nn.Linear(2, 2)
    model.config = SimpleNamespace(model_type="not_a_model")
    with pytest.raises(ValueError, match=r"no kernels for model type 'not_a_model' \(it supports: .*qwen2"):
        apply_model_kernels(model, ON)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_match_without_them_on_gpu(qwen2_globals, dtype):
    """Loss (grpo_loss on the backbone's hidden states, the trainer's path) and every parameter's gradient
    with the kernels applied vs the same weights without them; padded rows with a left-padded prompt."""
    pytest.importorskip("liger_kernel.transformers")
    from grpo_fast import grpo_loss
    from grpo_fast.loss import GRPOLossConfig

    plain = tiny_qwen2(dtype).cuda()
    patched = copy.deepcopy(plain)

    gen = torch.Generator(device="cuda").manual_seed(1)
    b, t = 3, 40
    ids = torch.randint(0, 97, (b, t), device="cuda", generator=gen)
    attn = torch.ones(b, t, dtype=torch.long, device="cuda")
    attn[0, :7] = 0  # left padding
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    completion = ids[:, 20:]
    mask = attn[:, 20:].bool()
    adv = torch.randn(b, device="cuda", generator=gen)

    def step(model):
        model.zero_grad(set_to_none=True)
        hidden = model.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
        loss, _ = grpo_loss(
            hidden[:, 19:-1], model.lm_head.weight, completion, mask, adv, config=GRPOLossConfig(entropy_coef=0.01)
        )
        loss.backward()
        return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}

    loss_a, grads_a = step(plain)  # before the patch: Liger's RoPE replaces a module-level function
    assert apply_model_kernels(patched, ON) == ["rope", "rms_norm", "swiglu"]
    assert type(patched.model.layers[0].mlp).__name__ == "Qwen2MLP"  # instance patched in place, same modules
    assert patched.model.layers[0].mlp._get_name() == "LigerSwiGLUMLP"
    loss_b, grads_b = step(patched)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(loss_b, loss_a, rtol=tol, atol=tol)
    for name, g in grads_a.items():
        scale = max(g.abs().max().item(), 1e-6)
        err = (grads_b[name] - g).abs().max().item()
        assert err <= tol * 10 * scale, f"{name}: {err:.3g} vs max {scale:.3g}"
