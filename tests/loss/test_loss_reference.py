"""grpo_loss / fused_logprobs / logits_grpo_loss (torch backend) against the naive fp64 oracle that
materialises the logits and differentiates TRL's formulas with autograd (grpo_fast.testing.reference)."""

import pytest
import torch

from grpo_fast import GRPOLoss, GRPOLossConfig, fused_logprobs, grpo_loss, logits_grpo_loss
from grpo_fast.loss import LOSS_TYPES
from grpo_fast.testing.reference import naive_grpo_loss, naive_logprobs_and_entropy
from grpo_fast.testing.synthetic import make_loss_batch

# B=3, T=7, H=24, V=53: odd sizes so no dimension is a multiple of another or of a chunk.
SHAPE = dict(batch=3, length=7, hidden_size=24, vocab=53)
# Tiny workspace: 2 rows per chunk at V=53 in fp64, so token chunks cut through sequences and
# sequence-level losses fall back to the recompute path (T=7 > 2 rows).
TINY_WORKSPACE = 2 * 53 * 8

OPTION_SETS = {
    "plain": dict(),
    "kl+entropy+temp": dict(beta=0.04, entropy_coef=0.01, temperature=0.7),
    "delta+clip_higher": dict(delta=1.5, epsilon_high=0.28),
    "all": dict(beta=0.1, entropy_coef=0.05, temperature=1.3, delta=1.6, epsilon_high=0.3),
}


def _config(loss_type, level, options, workspace=None):
    options = dict(options)
    if LOSS_TYPES[loss_type].objective.name == "cispo":
        options.pop("delta", None)
        options["epsilon_high"] = 1.2
    return GRPOLossConfig(
        loss_type=loss_type, importance_sampling_level=level, workspace_bytes=workspace, backend="torch", **options
    )


def _leaves(batch, bias=False):
    hidden = batch.hidden.clone().requires_grad_()
    weight = batch.weight.clone().requires_grad_()
    b = (0.1 * torch.randn(weight.shape[0], dtype=weight.dtype)).requires_grad_() if bias else None
    return hidden, weight, b


def _compare(loss, metrics, grads, ref_loss, ref_metrics, ref_grads, atol):
    assert torch.allclose(loss.double(), ref_loss.double(), rtol=1e-9, atol=atol), (float(loss), float(ref_loss))
    assert set(metrics) == set(ref_metrics)
    for key in ref_metrics:
        assert torch.allclose(metrics[key].double(), ref_metrics[key].double(), atol=atol), key
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=atol)


@pytest.mark.parametrize("workspace", [None, TINY_WORKSPACE], ids=["one_chunk", "tiny_chunks"])
@pytest.mark.parametrize("options", list(OPTION_SETS), ids=list(OPTION_SETS))
@pytest.mark.parametrize("loss_type,level", [(t, lv) for t, row in LOSS_TYPES.items() for lv in row.objective.levels])
def test_grpo_loss_matches_naive_fp64(loss_type, level, options, workspace):
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=hash((loss_type, level)) % 1000)
    config = _config(loss_type, level, OPTION_SETS[options], workspace)
    use_is = options in ("plain", "all")
    args = (batch.completion_ids, batch.completion_mask, batch.advantages, batch.old_logprobs, batch.ref_logprobs)
    extra = dict(is_weights=batch.is_weights if use_is else None, rollout_logprobs=batch.rollout_logprobs)

    h, w, b = _leaves(batch, bias=options == "all")
    ref_loss, ref_metrics = naive_grpo_loss(h, w, *args, **extra, config=config, bias=b)
    leaves = (h, w) if b is None else (h, w, b)
    ref_grads = torch.autograd.grad(ref_loss, leaves)

    h2, w2, _ = _leaves(batch)
    b2 = None if b is None else b.detach().clone().requires_grad_()
    leaves2 = (h2, w2) if b2 is None else (h2, w2, b2)
    loss, metrics = grpo_loss(h2, w2, *args, **extra, config=config, bias=b2)
    grads = torch.autograd.grad(loss, leaves2)
    _compare(loss, metrics, grads, ref_loss, ref_metrics, ref_grads, atol=1e-12)


@pytest.mark.parametrize("loss_type,level", [(t, lv) for t, row in LOSS_TYPES.items() for lv in row.objective.levels])
def test_packed_layout_equals_padded(loss_type, level):
    """Packing the active tokens of each sequence (no padding) gives the padded result exactly."""
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=3)
    config = _config(loss_type, level, OPTION_SETS["all"] | {"max_completion_length": 7})
    h, w, _ = _leaves(batch)
    padded, padded_metrics = grpo_loss(h, w, **batch.token_arguments(), config=config)
    padded_grads = torch.autograd.grad(padded, (h, w))

    mask = batch.completion_mask
    lengths = mask.sum(1)
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    h2, w2, _ = _leaves(batch)
    packed, packed_metrics = grpo_loss(
        h2[mask],
        w2,
        batch.completion_ids[mask],
        torch.ones(int(lengths.sum()), dtype=torch.bool),
        batch.advantages,
        batch.old_logprobs[mask],
        batch.ref_logprobs[mask],
        batch.is_weights[mask],
        config=config,
        cu_seqlens=cu_seqlens,
        rollout_logprobs=batch.rollout_logprobs[mask],
    )
    packed_grad_h, packed_grad_w = torch.autograd.grad(packed, (h2, w2))
    torch.testing.assert_close(packed, padded, rtol=1e-12, atol=1e-12)
    for key in padded_metrics:
        torch.testing.assert_close(packed_metrics[key], padded_metrics[key], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(packed_grad_w, padded_grads[1], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(packed_grad_h, padded_grads[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_fused_logprobs_and_entropy_match_naive(temperature):
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=7)
    h, w, b = _leaves(batch, bias=True)
    ref_logp, ref_entropy = naive_logprobs_and_entropy(h, w, batch.completion_ids, temperature, b)
    # A loss through both outputs, so the entropy gradient is exercised too.
    upstream = torch.randn_like(ref_logp), torch.randn_like(ref_entropy)
    ref_grads = torch.autograd.grad((ref_logp * upstream[0]).sum() + (ref_entropy * upstream[1]).sum(), (h, w, b))

    h2, w2, _ = _leaves(batch)
    b2 = b.detach().clone().requires_grad_()
    logp, entropy = fused_logprobs(
        h2,
        w2,
        batch.completion_ids,
        temperature,
        backend="torch",
        return_entropy=True,
        bias=b2,
        workspace_bytes=TINY_WORKSPACE,
    )
    grads = torch.autograd.grad((logp * upstream[0]).sum() + (entropy * upstream[1]).sum(), (h2, w2, b2))
    torch.testing.assert_close(logp, ref_logp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_gradcheck_fused_logprobs():
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(5, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(11, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.randint(0, 11, (5,), generator=gen)

    def both(h, w, b):
        return fused_logprobs(h, w, y, 0.8, backend="torch", return_entropy=True, bias=b, workspace_bytes=2 * 11 * 8)

    assert torch.autograd.gradcheck(both, (h, w, b))


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_gradcheck_grpo_loss(level):
    batch = make_loss_batch(batch=2, length=4, hidden_size=5, vocab=9, dtype=torch.float64, seed=11, drift=0.05)
    config = GRPOLossConfig(
        loss_type="grpo",
        beta=0.1,
        entropy_coef=0.1,
        importance_sampling_level=level,
        backend="torch",
        epsilon_low=0.3,
        epsilon_high=0.4,
    )
    h, w, _ = _leaves(batch)

    def loss(h, w):
        return grpo_loss(h, w, **batch.token_arguments(), config=config)[0]

    assert torch.autograd.gradcheck(loss, (h, w))


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_logits_grpo_loss_matches_naive(loss_type, inplace):
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=13)
    config = _config(loss_type, "token", OPTION_SETS["all"], workspace=TINY_WORKSPACE)
    args = (batch.completion_ids, batch.completion_mask, batch.advantages, batch.old_logprobs, batch.ref_logprobs)
    extra = dict(is_weights=batch.is_weights, rollout_logprobs=batch.rollout_logprobs)
    h, w, _ = _leaves(batch)
    ref_loss, ref_metrics = naive_grpo_loss(h, w, *args, **extra, config=config)
    ref_grad_h, ref_grad_w = torch.autograd.grad(ref_loss, (h, w))

    h2, w2, _ = _leaves(batch)
    logits = h2 @ w2.t()  # the lm_head matmul: its backward needs h and W, not the logits
    loss, metrics = logits_grpo_loss(logits, *args, **extra, config=config, inplace_backward=inplace)
    grad_h, grad_w = torch.autograd.grad(loss, (h2, w2))
    _compare(loss, metrics, (grad_h, grad_w), ref_loss, ref_metrics, (ref_grad_h, ref_grad_w), atol=1e-12)
    if inplace:  # the buffer now holds ∂L/∂logits, not the logits
        assert not torch.allclose(logits.detach(), (h2 @ w2.t()).detach())


def test_grpo_loss_module_matches_function():
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=17)
    config = GRPOLossConfig(loss_type="bnpo", beta=0.02, backend="torch")
    module = GRPOLoss(config)
    args = (batch.hidden, batch.weight, batch.completion_ids, batch.completion_mask, batch.advantages)
    by_module, _ = module(*args, ref_logprobs=batch.ref_logprobs, old_logprobs=batch.old_logprobs)
    by_function, _ = grpo_loss(*args, batch.old_logprobs, batch.ref_logprobs, config=config)
    assert torch.equal(by_module, by_function)
    assert GRPOLoss(loss_type="bnpo", beta=0.02, backend="torch").config == config


def test_no_grad_call_returns_the_same_loss():
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=19)
    args = (batch.hidden, batch.weight, batch.completion_ids, batch.completion_mask, batch.advantages)
    config = GRPOLossConfig(backend="torch")
    with torch.no_grad():
        cold, _ = grpo_loss(*args, batch.old_logprobs, config=config)
    h, w, _ = _leaves(batch)
    warm, _ = grpo_loss(h, w, *args[2:], batch.old_logprobs, config=config)
    assert not cold.requires_grad and warm.requires_grad
    torch.testing.assert_close(cold, warm.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_error_within_twice_pytorch_own(dtype):
    """Tolerance rule: our error vs fp64 is at most ~2x the naive path's error in the same dtype."""
    batch = make_loss_batch(batch=4, length=16, hidden_size=64, vocab=1000, dtype=torch.float64, seed=23)
    config = GRPOLossConfig(loss_type="dapo", beta=0.04, entropy_coef=0.01, backend="torch", workspace_bytes=16 * 4000)
    args = (batch.completion_ids, batch.completion_mask, batch.advantages, batch.old_logprobs, batch.ref_logprobs)

    def run(fn, h, w):
        h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss, _ = fn(h, w, *args, config=config)
        return (loss.double(), *(g.double() for g in torch.autograd.grad(loss, (h, w))))

    exact = run(naive_grpo_loss, batch.hidden, batch.weight)
    low_h, low_w = batch.hidden.to(dtype), batch.weight.to(dtype)
    theirs = run(naive_grpo_loss, low_h, low_w)
    ours = run(grpo_loss, low_h, low_w)
    atol = {torch.float32: 1e-7, torch.bfloat16: 1e-4}[dtype]
    for name, e, t, o in zip(("loss", "grad_hidden", "grad_weight"), exact, theirs, ours, strict=True):
        err_theirs = float((t - e).abs().max())
        err_ours = float((o - e).abs().max())
        assert err_ours <= 2 * err_theirs + atol, (name, err_ours, err_theirs)


def test_fused_logprobs_traces_under_torch_compile_fullgraph():
    """The custom ops (with fake implementations and an autograd formula) let dynamo trace the call whole."""
    batch = make_loss_batch(**SHAPE, seed=29)

    def logprob_sum(h, w):
        logp, entropy = fused_logprobs(h, w, batch.completion_ids, 0.8, backend="torch", return_entropy=True)
        return logp.sum() + 0.1 * entropy.sum()

    compiled = torch.compile(logprob_sum, fullgraph=True, backend="aot_eager")
    h, w, _ = _leaves(batch)
    h2, w2, _ = _leaves(batch)
    eager = logprob_sum(h, w)
    traced = compiled(h2, w2)
    torch.testing.assert_close(traced, eager)
    for got, want in zip(torch.autograd.grad(traced, (h2, w2)), torch.autograd.grad(eager, (h, w)), strict=True):
        torch.testing.assert_close(got, want)
