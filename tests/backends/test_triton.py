"""Triton kernels vs the PyTorch oracle, on CPU through TRITON_INTERPRET=1 (on CUDA when present).

Tolerance rule (grpo_fast.testing.tolerance): against an fp64 oracle, a kernel's error may be at most twice the
error of the `torch` backend in the same input precision, plus a small atol (relative to the size of
the quantity: 1e-5 for fp32, 2e-3 for bf16/fp16 where the bf16 cast of dz dominates).
The interpreter is slow, so shapes are tiny and the interpreter tiles (16 x 128 x 32) are chosen
so that these shapes still leave row, vocabulary and K tails; each shape says why it is there.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined

import pytest  # noqa: E402

pytest.importorskip("triton")

from grpo_fast.kernels.linear_logprobs import BlockConfig, linear_logprobs_backward, linear_logprobs_forward  # noqa: E402

from grpo_fast import GRPOLossConfig, fused_logprobs, grpo_loss  # noqa: E402
from grpo_fast.backends.chunked import TORCH_BACKEND  # noqa: E402
from grpo_fast.backends.triton import TRITON_BACKEND, TRITON_DETERMINISTIC_BACKEND  # noqa: E402
from grpo_fast.loss import LOSS_TYPES  # noqa: E402
from grpo_fast.loss.layout import packed_layout, padded_layout  # noqa: E402
from grpo_fast.loss.token_loss import select_token_loss  # noqa: E402
from grpo_fast.loss.token_math import TokenInputs, entropy_weights, grpo_token_loss, reduction_weights  # noqa: E402
from grpo_fast.testing.reference import naive_logprobs_and_entropy  # noqa: E402
from grpo_fast.testing.tolerance import assert_within_rule  # noqa: E402

pytestmark = pytest.mark.triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _problem(n, h, v, dtype, bias, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen)
    weight = torch.randn(v, h, generator=gen) * (scale / h**0.5)
    b = torch.randn(v, generator=gen) if bias else None
    targets = torch.randint(0, v, (n,), generator=gen)
    cast = lambda x: None if x is None else x.to(dtype=dtype, device=DEVICE)  # noqa: E731
    return cast(hidden), cast(weight), cast(b), targets.to(DEVICE)


def _f64(x):
    return None if x is None else x.double()


# (N, H, V, bias, temperature): why each shape is here
LAYER1_SHAPES = [
    # odd everything: 3 row blocks (tail 5), 8 vocabulary blocks (tail 104) over 4 splits, 2 K-slices (tail 16)
    pytest.param(37, 48, 1000, True, 0.7, id="odd-N37-H48-V1000-bias-tau0.7"),
    # a single token; vocabulary smaller than one block; H smaller than one K-slice
    pytest.param(1, 24, 20, False, 1.0, id="single-token-V20-H24"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("n", "h", "v", "bias", "tau"), LAYER1_SHAPES)
def test_linear_logprobs_forward_backward(n, h, v, bias, tau, dtype):
    hidden, weight, b, targets = _problem(n, h, v, dtype, bias, scale=3.0)
    inv_t = 1.0 / tau
    gen = torch.Generator().manual_seed(1)
    grad_logp = torch.randn(n, generator=gen).to(DEVICE)
    grad_entropy = torch.randn(n, generator=gen).to(DEVICE)

    oracle = TORCH_BACKEND.forward(_f64(hidden), _f64(weight), _f64(b), targets, inv_t)
    reference = TORCH_BACKEND.forward(hidden, weight, b, targets, inv_t)
    stats = TRITON_BACKEND.forward(hidden, weight, b, targets, inv_t)
    for name in ("logprobs", "entropy", "lse"):
        assert_within_rule(name, getattr(stats, name), getattr(reference, name), getattr(oracle, name), dtype)

    args = (grad_logp, grad_entropy)
    oracle_g = TORCH_BACKEND.backward(
        _f64(hidden), _f64(weight), _f64(b), targets, inv_t, oracle, *(g.double() for g in args)
    )
    reference_g = _plain_pytorch_grads(hidden, weight, b, targets, tau, *args)
    for backend in (TRITON_BACKEND, TRITON_DETERMINISTIC_BACKEND):
        grads = backend.backward(hidden, weight, b, targets, inv_t, stats, *args)
        assert grads[0].dtype == dtype and grads[1].dtype == torch.float32
        assert (grads[2] is None) == (b is None)
        for name, actual, ref, orc in zip(("dh", "dW", "db"), grads, reference_g, oracle_g, strict=True):
            if orc is not None:
                assert_within_rule(f"{name} (deterministic={backend.deterministic})", actual, ref, orc, dtype)


def _plain_pytorch_grads(hidden, weight, bias, targets, tau, grad_logp, grad_entropy):
    """The tolerance rule's peer for the gradients: autograd through logits materialised in the inputs' dtype
    (the torch backend is no peer for bf16 on CPU any more: it upcasts to fp32 GEMMs there)."""
    leaves = [t.detach().clone().requires_grad_() for t in (hidden, weight, bias) if t is not None]
    logp, entropy = naive_logprobs_and_entropy(
        leaves[0], leaves[1], targets, tau, leaves[2] if bias is not None else None
    )
    grads = torch.autograd.grad((logp * grad_logp).sum() + (entropy * grad_entropy).sum(), leaves)
    return (*grads, None) if bias is None else grads


def test_deterministic_backward_is_bitwise_reproducible():
    # N=37 over 3 row blocks: dW rows get 3 contributions, so the summation order matters.
    hidden, weight, b, targets = _problem(37, 48, 300, torch.float32, bias=True, seed=3)
    stats = TRITON_BACKEND.forward(hidden, weight, b, targets, 1.0)
    grad_logp = torch.randn(37, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    first = TRITON_DETERMINISTIC_BACKEND.backward(hidden, weight, b, targets, 1.0, stats, grad_logp, None)
    second = TRITON_DETERMINISTIC_BACKEND.backward(hidden, weight, b, targets, 1.0, stats, grad_logp, None)
    for a, c in zip(first, second, strict=True):
        assert torch.equal(a, c)


def test_forward_vocab_splits_and_extreme_logits():
    # |z| ~ 1e4 with ties: the target's logit tied with the max in another split; the split merge and
    # the shifted Σ p (z − m) must stay finite and exact. V=700 over 6 splits of 128 columns.
    n, h, v = 5, 32, 700
    hidden = torch.zeros(n, h, device=DEVICE)
    hidden[:, 0] = 1.0
    weight = torch.randn(v, h, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    weight[:, 0] = torch.linspace(-1e4, 1e4, v, device=DEVICE)
    weight[10, 0] = weight[-1, 0]  # tie with the maximum, in the first split
    targets = torch.tensor([10, 699, 0, 350, 128], device=DEVICE)
    oracle = TORCH_BACKEND.forward(hidden.double(), weight.double(), None, targets, 1.0)
    for splits in (1, 6):
        blocks = BlockConfig(block_n=16, block_v=128, block_h=32, num_warps=4, num_stages=1)
        logp, entropy, lse = linear_logprobs_forward(hidden, weight, None, targets, 1.0, blocks=blocks, splits=splits)
        assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
        torch.testing.assert_close(lse.double(), oracle.lse, rtol=1e-6, atol=0)
        torch.testing.assert_close(logp.double(), oracle.logprobs, rtol=0, atol=2e-3)  # fp32 spacing at 1e4: 1e-3
        torch.testing.assert_close(entropy.double(), oracle.entropy, rtol=0, atol=1e-5)


def test_fp64_raises_type_error():
    hidden, weight, _, targets = _problem(4, 16, 40, torch.float64, bias=False)
    with pytest.raises(TypeError, match="float64"):
        linear_logprobs_forward(hidden, weight, None, targets, 1.0)
    stats = TORCH_BACKEND.forward(hidden, weight, None, targets, 1.0)
    with pytest.raises(TypeError, match="float64"):
        linear_logprobs_backward(hidden, weight, None, targets, 1.0, stats.lse, stats.entropy, stats.lse, None)


def test_fused_logprobs_triton_matches_torch():
    # the autograd front end, gradients through both outputs; fp16 is the third input dtype.
    hidden, weight, _, targets = _problem(21, 40, 150, torch.float16, bias=False, seed=6)
    outs = {}
    for backend in ("torch", "triton"):
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        logp, entropy = fused_logprobs(h, w, targets, temperature=1.3, backend=backend, return_entropy=True)
        (logp.sum() + 0.5 * entropy.sum()).backward()
        outs[backend] = (logp, entropy, h.grad, w.grad)
    for name, a, b in zip(("logp", "entropy", "dh", "dW"), outs["triton"], outs["torch"], strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=2e-3, msg=name)


# ----------------------------------------------------------------------------------------------
# Layer 2: the fused token kernel vs its PyTorch twin (exact same formulas, fp32 both).
# ----------------------------------------------------------------------------------------------


def _packed_case(seed=0):
    """Packed layout with an empty sequence, a single-token one, a long one and masked tokens."""
    gen = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, 5, 5, 300, 301, 330])  # 295 tokens: 2 blocks of 256 at the interpreter's BLOCK_T
    n = int(cu[-1])
    mask = torch.rand(n, generator=gen) > 0.2
    logp = -torch.rand(n, generator=gen) * 3
    values = {
        "logp": logp,
        "entropy": torch.rand(n, generator=gen) * 2,
        "old": logp + 0.3 * torch.randn(n, generator=gen),
        "ref": logp + 0.2 * torch.randn(n, generator=gen),
        "adv": torch.randn(n, generator=gen),
        "isw": torch.rand(n, generator=gen) + 0.5,
    }
    return packed_layout(mask.to(DEVICE), cu.to(DEVICE)), {k: v.to(DEVICE) for k, v in values.items()}


# Every loss type whose objective has a kernel code x both levels; the "all options" variant turns on beta, delta
# (not for cispo), entropy_coef, is_weights and old logprobs together, "plain" has none (on-policy, ratio 1).
TOKEN_CASES = [
    pytest.param(loss_type, level, full, id=f"{loss_type}-{level}-{'all' if full else 'plain'}")
    for loss_type, row in LOSS_TYPES.items()
    if row.objective.kernel is not None
    for level in ("token", "sequence")
    for full in (True, False)
]


@pytest.mark.parametrize(("loss_type", "level", "full"), TOKEN_CASES)
def test_token_kernel_matches_twin(loss_type, level, full):
    layout, x = _packed_case()
    cispo = LOSS_TYPES[loss_type].objective.name == "cispo"
    config = GRPOLossConfig(
        loss_type=loss_type,
        importance_sampling_level=level,
        epsilon_high=5.0 if cispo else 0.28,
        delta=1.4 if full and not cispo else None,
        beta=0.05 if full else 0.0,
        entropy_coef=0.01 if full else 0.0,
    )
    inputs = TokenInputs(
        old_logprobs=x["old"] if full else None,
        ref_logprobs=x["ref"] if full else None,
        advantages=x["adv"] * layout.mask,
        is_weights=x["isw"] if full else None,
        loss_weights=reduction_weights(layout, config, None),
        entropy_weights=entropy_weights(layout),
    )
    want = grpo_token_loss(x["logp"], x["entropy"], inputs, layout, config)
    got = select_token_loss(TRITON_BACKEND, config)(x["logp"], x["entropy"], inputs, layout, config)
    torch.testing.assert_close(got.sums, want.sums, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.grad_logprobs, want.grad_logprobs, rtol=1e-5, atol=1e-7)
    assert (got.grad_entropy is None) == (want.grad_entropy is None)
    if want.grad_entropy is not None:
        torch.testing.assert_close(got.grad_entropy, want.grad_entropy, rtol=1e-6, atol=0)


def test_token_kernel_padded_layout_with_fully_masked_sequence():
    gen = torch.Generator().manual_seed(7)
    mask = torch.rand(4, 9, generator=gen) > 0.3
    mask[2] = False  # a fully masked sequence
    layout = padded_layout(mask.to(DEVICE))
    n = layout.num_tokens
    logp = -torch.rand(n, generator=gen).to(DEVICE)
    config = GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", beta=0.1)
    inputs = TokenInputs(
        old_logprobs=logp + 0.1 * torch.randn(n, generator=gen).to(DEVICE),
        ref_logprobs=logp + 0.1 * torch.randn(n, generator=gen).to(DEVICE),
        advantages=torch.randn(n, generator=gen).to(DEVICE) * layout.mask,
        is_weights=None,
        loss_weights=reduction_weights(layout, config, None),
        entropy_weights=entropy_weights(layout),
    )
    want = grpo_token_loss(logp, None, inputs, layout, config)
    got = select_token_loss(TRITON_BACKEND, config)(logp, None, inputs, layout, config)
    torch.testing.assert_close(got.sums, want.sums, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.grad_logprobs, want.grad_logprobs, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------------------------
# The whole loss: grpo_loss(backend="triton") vs backend="torch".
# ----------------------------------------------------------------------------------------------

LOSS_CASES = [
    # sequence-level GSPO with everything on, packed layout (sequences cross row blocks), recompute path
    pytest.param(dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.04, delta=1.5,
                      entropy_coef=0.01, temperature=0.8), True, False, id="grpo-seq-packed-all"),
    # DAPO token level, padded layout, deterministic backward
    pytest.param(dict(loss_type="dapo", epsilon_high=0.28, beta=0.0), False, True, id="dapo-token-padded-det"),
    # CISPO with IS weights, padded layout
    pytest.param(dict(loss_type="cispo", epsilon_high=5.0, beta=0.02), False, False, id="cispo-token-padded"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "packed", "deterministic"), LOSS_CASES)
def test_grpo_loss_triton_matches_torch(options, packed, deterministic):
    gen = torch.Generator().manual_seed(8)
    batch, length, h, v = 3, 13, 40, 300  # N=39: 3 row blocks of 16; V=300: 3 vocabulary blocks with a tail
    hidden = torch.randn(batch, length, h, generator=gen).to(DEVICE)
    weight = (torch.randn(v, h, generator=gen) / h**0.5).to(DEVICE)
    ids = torch.randint(0, v, (batch, length), generator=gen).to(DEVICE)
    mask = (torch.rand(batch, length, generator=gen) > 0.2).to(DEVICE)
    adv = torch.randn(batch, generator=gen).to(DEVICE)
    old = (-torch.rand(batch, length, generator=gen) * 6).to(DEVICE)
    ref = (-torch.rand(batch, length, generator=gen) * 6).to(DEVICE)
    isw = (torch.rand(batch, length, generator=gen) + 0.5).to(DEVICE)
    kwargs = dict(old_logprobs=old, ref_logprobs=ref, is_weights=isw)
    if packed:
        hidden, ids, mask = hidden.reshape(-1, h), ids.reshape(-1), mask.reshape(-1)
        kwargs = {k: t.reshape(-1) for k, t in kwargs.items()}
        kwargs["cu_seqlens"] = torch.tensor([0, 10, 11, 39], device=DEVICE)  # long, single-token, long
        adv = torch.randn(3, generator=gen).to(DEVICE)
    results = {}
    for backend in ("torch", "triton"):
        hid = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        config = GRPOLossConfig(backend=backend, deterministic=deterministic, **options)
        loss, metrics = grpo_loss(hid, w, ids, mask, adv, config=config, **kwargs)
        loss.backward()
        results[backend] = (loss, metrics, hid.grad, w.grad)
    (loss_t, metrics_t, dh_t, dw_t), (loss_r, metrics_r, dh_r, dw_r) = results["triton"], results["torch"]
    torch.testing.assert_close(loss_t, loss_r, rtol=1e-5, atol=1e-6)
    assert metrics_t.keys() == metrics_r.keys()
    for key in metrics_r:
        torch.testing.assert_close(metrics_t[key], metrics_r[key], rtol=1e-5, atol=1e-6, msg=key)
    torch.testing.assert_close(dh_t, dh_r, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(dw_t, dw_r, rtol=1e-4, atol=1e-6)


def test_deterministic_flag_selects_atomic_free_backend():
    assert TRITON_BACKEND.deterministic_variant() is TRITON_DETERMINISTIC_BACKEND
    assert TRITON_DETERMINISTIC_BACKEND.deterministic and not TRITON_BACKEND.deterministic
    assert TRITON_BACKEND.name == TRITON_DETERMINISTIC_BACKEND.name == "triton"


# sm_90 AOT compile of the GPU default tiles (benchmarks/aot_triton_sweep.py --defaults --dtypes bf16,fp32,
# triton 3.9, H and strides multiples of 16): (registers, spill-store bytes, shared KiB) per kernel. Changing a
# default means re-running the sweep and updating this table and benchmarks/NOTES.md.
_AOT_SM90 = {
    ("forward", torch.bfloat16): ((128, 128, 64, 8, 3), {"fwd": (255, 0, 96)}),
    ("backward", torch.bfloat16): ((128, 128, 64, 8, 3), {"bwd": (254, 0, 160)}),
    ("deterministic", torch.bfloat16): ((64, 128, 64, 8, 3), {"dh": (179, 0, 80), "dw": (217, 0, 72)}),
    ("forward", torch.float32): ((64, 128, 16, 8, 2), {"fwd": (190, 0, 12)}),
    ("backward", torch.float32): ((64, 128, 16, 8, 2), {"bwd": (206, 0, 44)}),
    ("deterministic", torch.float32): ((64, 128, 16, 8, 2), {"dh": (182, 0, 40), "dw": (216, 0, 36)}),
}


def test_gpu_default_blocks_are_the_aot_checked_ones(monkeypatch):
    # The GPU defaults are the tiles the sm_90 AOT sweep found spill-free and under 200 KiB of shared memory
    # (of 227 KiB per block); fp32 (FMA dots, no wgmma) takes smaller tiles than bf16. The interpreter keeps
    # its own tiles.
    from grpo_fast.kernels.linear_logprobs import INTERPRETER_BLOCKS, default_blocks

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for (kind, dtype), (tiles, kernels) in _AOT_SM90.items():
        b = default_blocks(kind, dtype)
        assert (b.block_n, b.block_v, b.block_h, b.num_warps, b.num_stages) == tiles, (kind, dtype)
        for _regs, spill_bytes, shared_kib in kernels.values():
            assert spill_bytes == 0 and shared_kib < 200
    assert default_blocks("forward", torch.float16) == default_blocks("forward", torch.bfloat16)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert all(default_blocks(kind, dtype) == INTERPRETER_BLOCKS for kind, dtype in _AOT_SM90)
    assert (INTERPRETER_BLOCKS.block_n, INTERPRETER_BLOCKS.block_v, INTERPRETER_BLOCKS.block_h) == (16, 128, 32)
