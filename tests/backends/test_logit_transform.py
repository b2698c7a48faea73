"""Logit heads beyond h Wᵀ + b in every backend that runs on CPU: the logits c tanh(s (h Wᵀ + b) / c) / T
(Gemma-2/3's final_logit_softcapping c, a logit scale s as Cohere's / Granite's, or both as Muse Glimmer's)
through torch, cpu (grpo_fast._C, when built) and triton (TRITON_INTERPRET=1, atomic and deterministic
backward), against fp64 materialised logits (`naive_logprobs_and_entropy` / `naive_grpo_loss`, torch.tanh).

Tolerance rule (grpo_fast.testing.tolerance): a backend's error against the fp64 reference may be at most twice
the error of the same materialised PyTorch computation in the input precision, plus 1e-5 (fp32) / 2e-3 (bf16)
times max(1, max |reference|); the torch backend in fp64 is held to 1e-10 · max(1, max |reference|).
Logits are drawn with a spread of ~10 against caps of 2.5-3, so most of the vocabulary sits on the tanh's
saturated shoulders, where the slope 1 − tanh² is small and a wrong slope would show. The scale alone is 0.1
(Cohere's is 0.0625): at tempered logits of ±15 the torch backend's entropy (lse − Σ p z, unshifted) loses
~1e-5 to cancellation whatever the head, which this file is not about.
"""

from __future__ import annotations

import importlib
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined

import pytest  # noqa: E402

from grpo_fast import GRPOLossConfig, fused_logprobs, grpo_loss  # noqa: E402
from grpo_fast.backends.chunked import TorchEpilogue  # noqa: E402
from grpo_fast.testing.reference import naive_grpo_loss, naive_logprobs_and_entropy  # noqa: E402
from grpo_fast.testing.tolerance import ATOL, assert_within_rule, max_error  # noqa: E402


def _loads(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


_NO_NATIVE = pytest.mark.skipif(not _loads("grpo_fast.backends.native"), reason="grpo_fast._C not built")
_NO_TRITON = pytest.mark.skipif(not _loads("grpo_fast.backends.triton"), reason="triton not installed")
# (backend, deterministic): every implementation of the tile on this machine.
BACKENDS = [
    pytest.param("torch", False, id="torch"),
    pytest.param("cpu", False, id="cpu", marks=_NO_NATIVE),
    pytest.param("triton", False, id="triton", marks=_NO_TRITON),
    pytest.param("triton", True, id="triton-deterministic", marks=_NO_TRITON),
]
# (logit_scale, final_logit_softcapping)
HEADS = [
    pytest.param(1.0, 3.0, id="softcap"),
    pytest.param(0.1, None, id="scale"),
    pytest.param(0.5, 2.5, id="scale+softcap"),
]
TEMPERATURE = 0.7


def _problem(batch, length, hidden_size, vocab, dtype, seed=0):
    """hidden [B, T, H], weight [V, H], bias [V] with logits h Wᵀ + b of spread ~10; targets [B, T]."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, length, hidden_size, generator=gen)
    weight = torch.randn(vocab, hidden_size, generator=gen) * (10.0 / hidden_size**0.5)
    bias = torch.randn(vocab, generator=gen)
    targets = torch.randint(0, vocab, (batch, length), generator=gen)
    return hidden.to(dtype), weight.to(dtype), bias.to(dtype), targets


def _logprobs_and_grads(backend, deterministic, hidden, weight, bias, targets, scale, cap, workspace_bytes=None):
    """(logp, entropy, dh, dW, db) of L = Σ gℓ logp + Σ gH entropy (fixed random gℓ, gH) through `backend`
    ("naive": the materialised reference in the inputs' precision)."""
    h, w, b = (t.clone().requires_grad_(True) for t in (hidden, weight, bias))
    if backend == "naive":
        logp, entropy = naive_logprobs_and_entropy(h, w, targets, TEMPERATURE, b, scale, cap)
    else:
        logp, entropy = fused_logprobs(
            h,
            w,
            targets,
            TEMPERATURE,
            backend,
            return_entropy=True,
            bias=b,
            workspace_bytes=workspace_bytes,
            deterministic=deterministic,
            logit_scale=scale,
            final_logit_softcapping=cap,
        )
    gen = torch.Generator().manual_seed(1)
    grad_logp, grad_entropy = (torch.randn(targets.shape, generator=gen).to(logp.dtype) for _ in range(2))
    ((logp * grad_logp).sum() + (entropy * grad_entropy).sum()).backward()
    return logp.detach(), entropy.detach(), h.grad, w.grad, b.grad


@pytest.mark.parametrize(("scale", "cap"), HEADS)
@pytest.mark.parametrize(("backend", "deterministic"), BACKENDS)
def test_fused_logprobs_fp32_matches_fp64(backend, deterministic, scale, cap):
    # 18 rows in chunks of 5 (chunked backends: 4 chunks, a short last one); V=1000 and H=48 leave row,
    # vocabulary and K tails in the interpreter's 16 x 128 x 32 Triton tiles.
    hidden, weight, bias, targets = _problem(2, 9, 48, 1000, torch.float32)
    ours = _logprobs_and_grads(backend, deterministic, hidden, weight, bias, targets, scale, cap, 5 * 4 * 1000)
    peer = _logprobs_and_grads("naive", False, hidden, weight, bias, targets, scale, cap)
    oracle = _logprobs_and_grads("naive", False, *(t.double() for t in (hidden, weight, bias)), targets, scale, cap)
    for name, a, p, r in zip(("logp", "entropy", "dh", "dW", "db"), ours, peer, oracle, strict=True):
        assert a.dtype == torch.float32
        assert_within_rule(name, a, p, r, torch.float32)


@pytest.mark.parametrize(("backend", "deterministic"), BACKENDS)
def test_fused_logprobs_bf16_matches_fp64(backend, deterministic):
    hidden, weight, bias, targets = _problem(1, 21, 40, 300, torch.bfloat16, seed=2)
    ours = _logprobs_and_grads(backend, deterministic, hidden, weight, bias, targets, 0.5, 2.5, 4 * 4 * 300)
    peer = _logprobs_and_grads("naive", False, hidden, weight, bias, targets, 0.5, 2.5)
    oracle = _logprobs_and_grads("naive", False, *(t.double() for t in (hidden, weight, bias)), targets, 0.5, 2.5)
    for name, a, p, r in zip(("logp", "entropy", "dh", "dW", "db"), ours, peer, oracle, strict=True):
        assert a.dtype == (torch.float32 if name in ("logp", "entropy") else torch.bfloat16)
        assert_within_rule(name, a, p, r, torch.bfloat16)


@pytest.mark.parametrize(("scale", "cap"), HEADS)
def test_torch_backend_fp64_is_exact(scale, cap):
    hidden, weight, bias, targets = _problem(2, 9, 48, 1000, torch.float64, seed=3)
    ours = _logprobs_and_grads("torch", False, hidden, weight, bias, targets, scale, cap, 5 * 8 * 1000)
    oracle = _logprobs_and_grads("naive", False, hidden, weight, bias, targets, scale, cap)
    for name, a, r in zip(("logp", "entropy", "dh", "dW", "db"), ours, oracle, strict=True):
        bound = ATOL[torch.float64] * max(1.0, r.abs().max().item())
        assert max_error(a, r) <= bound, f"{name}: {max_error(a, r):.3g} > {bound:.3g}"


# (GRPOLossConfig options, workspace bytes): token-level dapo with KL and an entropy bonus, gradients formed in
# the forward pass (3 GEMMs, several chunks); GSPO with sequences longer than a chunk, the recompute path.
LOSS_CASES = [
    pytest.param(dict(loss_type="dapo", beta=0.05, entropy_coef=0.01), 6 * 4 * 700, id="dapo-3gemm"),
    pytest.param(dict(loss_type="grpo", importance_sampling_level="sequence"), 4 * 4 * 700, id="gspo-recompute"),
]


@pytest.mark.parametrize(("options", "workspace_bytes"), LOSS_CASES)
@pytest.mark.parametrize(("backend", "deterministic"), BACKENDS)
def test_grpo_loss_matches_fp64(backend, deterministic, options, workspace_bytes):
    hidden, weight, bias, ids = _problem(3, 7, 32, 700, torch.float32, seed=4)
    gen = torch.Generator().manual_seed(5)
    mask = (torch.rand(ids.shape, generator=gen) > 0.2).long()
    advantages = torch.randn(3, generator=gen)
    old, ref = (-torch.rand(ids.shape, generator=gen) * 3 for _ in range(2))
    head = dict(temperature=TEMPERATURE, logit_scale=0.5, final_logit_softcapping=2.5)

    def run(name, *tensors):
        """((loss, dh, dW, db), metrics) through backend `name`, or "naive" (materialised logits)."""
        h, w, b = (t.clone().requires_grad_(True) for t in tensors)
        if name == "naive":
            config = GRPOLossConfig(**options, **head)
            loss, metrics = naive_grpo_loss(h, w, ids, mask, advantages, old, ref, config=config, bias=b)
        else:
            config = GRPOLossConfig(
                **options, **head, backend=name, deterministic=deterministic, workspace_bytes=workspace_bytes
            )
            loss, metrics = grpo_loss(h, w, ids, mask, advantages, old, ref, config=config, bias=b)
        loss.backward()
        return (loss.detach(), h.grad, w.grad, b.grad), metrics

    ours, our_metrics = run(backend, hidden, weight, bias)
    peer, peer_metrics = run("naive", hidden, weight, bias)
    oracle, oracle_metrics = run("naive", *(t.double() for t in (hidden, weight, bias)))
    for name, a, p, r in zip(("loss", "dh", "dW", "db"), ours, peer, oracle, strict=True):
        assert_within_rule(name, a, p, r, torch.float32)
    for key, value in oracle_metrics.items():
        assert_within_rule(key, our_metrics[key], peer_metrics[key], value, torch.float32)


# ---------------------------------------------------------------- the epilogues on a tile


def _fp64_tile_grads(x, targets, cap, grad_logp, grad_entropy):
    """(logp, entropy, lse, ∂L/∂x) of the logits cap tanh(x / cap) in fp64 through autograd."""
    x = x.double().requires_grad_(True)
    logits = cap * torch.tanh(x / cap)
    log_p = torch.log_softmax(logits, dim=1)
    logp = log_p.gather(1, targets.view(-1, 1)).view(-1)
    entropy = -(log_p.exp() * log_p).sum(1)
    ((logp * grad_logp.double()).sum() + (entropy * grad_entropy.double()).sum()).backward()
    return logp.detach(), entropy.detach(), torch.logsumexp(logits, 1).detach(), x.grad


def _epilogues():
    yield pytest.param(TorchEpilogue(temp_bytes=8192), id="torch")
    if _loads("grpo_fast.backends.native"):
        from grpo_fast.backends.native import NativeEpilogue

        yield pytest.param(NativeEpilogue(), id="native")


# (rows, vocab): one element; below, at and past the C++ kernels' 1024-element block and a SIMD tail.
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 1024), (4, 1025), (6, 3001)])
@pytest.mark.parametrize("epilogue", list(_epilogues()))
def test_epilogue_softcap_matches_fp64(epilogue, shape):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(shape, generator=gen) * 20
    x[0, 0] = -float("inf")  # a banned token: its capped logit is −cap, its slope 0
    if shape[1] > 1:
        x[-1, -1] = 1e4  # far into saturation
    targets = torch.randint(0, shape[1], (shape[0],), generator=gen)
    grad_logp, grad_entropy = torch.randn(shape[0], generator=gen), torch.randn(shape[0], generator=gen)
    cap = 3.0
    oracle = _fp64_tile_grads(x, targets, cap, grad_logp, grad_entropy)
    peer = TorchEpilogue().stats(torch.tanh(x / cap) * cap, targets)  # PyTorch's fp32 error on capped logits
    stats = epilogue.stats(x, targets, cap)
    for name, a, p, r in zip(("logp", "entropy", "lse"), stats, peer, oracle[:3], strict=True):
        assert_within_rule(name, a, p, r, torch.float32)
    dx = x.clone()
    epilogue.grad_(dx, targets, stats[2], stats[1], grad_logp, grad_entropy, cap)
    assert torch.isfinite(dx).all()
    tanh = torch.tanh(x / cap)
    dz_peer = tanh * cap  # PyTorch in fp32: dz on the capped logits, times the slope 1 − tanh²
    TorchEpilogue().grad_(dz_peer, targets, peer[2], peer[1], grad_logp, grad_entropy)
    assert_within_rule("dx", dx, dz_peer * (1 - tanh**2), oracle[3], torch.float32)


@_NO_NATIVE
def test_native_ops_softcap_opcheck_and_checks():
    ops = torch.ops.grpo_fast
    gen = torch.Generator().manual_seed(7)
    z = torch.randn(5, 300, generator=gen) * 10
    y = torch.randint(0, 300, (5,), generator=gen)
    logp, entropy, lse = ops.logprob_stats(z, y, 2.0)
    torch.library.opcheck(ops.logprob_stats, (z, y, 2.0))
    torch.library.opcheck(ops.logprob_grad_, (z.clone(), y, lse, entropy, torch.randn(5), torch.randn(5), 2.0))
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="softcap"):
            ops.logprob_stats(z, y, bad)


def test_fp64_tile_of_native_and_torch_epilogues_agree():
    """fp64 tiles (gradcheck inputs) keep fp64 math in both epilogues, soft cap included."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(4, 500, generator=gen, dtype=torch.float64) * 20
    targets = torch.randint(0, 500, (4,), generator=gen)
    grad_logp, grad_entropy = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    oracle = _fp64_tile_grads(x, targets, 3.0, grad_logp, grad_entropy)
    for param in _epilogues():
        epilogue = param.values[0]
        stats = epilogue.stats(x, targets, 3.0)
        dx = x.clone()
        epilogue.grad_(dx, targets, stats[2], stats[1], grad_logp.double(), grad_entropy.double(), 3.0)
        for name, a, r in zip(("logp", "entropy", "lse", "dx"), (*stats, dx), oracle, strict=True):
            assert max_error(a, r) <= 1e-12 * max(1.0, r.abs().max().item()), (param.id, name)


def test_bad_head_options_are_rejected():
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        GRPOLossConfig(final_logit_softcapping=0.0)
    with pytest.raises(ValueError, match="logit_scale"):
        GRPOLossConfig(logit_scale=-1.0)
    hidden, weight, _, targets = _problem(1, 3, 8, 11, torch.float32)
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        fused_logprobs(hidden, weight, targets, final_logit_softcapping=float("inf"))
    with pytest.raises(ValueError, match="logit_scale"):
        fused_logprobs(hidden, weight, targets, logit_scale=0)
