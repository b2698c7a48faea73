"""Edge cases of the loss (torch backend) against the naive fp64 oracle, plus property-based tests."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_fast import GRPOLossConfig, fused_logprobs, grpo_loss
from grpo_fast.loss import LOSS_TYPES
from grpo_fast.testing.reference import naive_grpo_loss, naive_logprobs_and_entropy
from grpo_fast.testing.synthetic import make_loss_batch


def _both(batch, config, **overrides):
    """(our loss, grads) and (naive loss, grads) on fp64 leaves of the same batch."""
    fields = batch.token_arguments() | overrides
    results = []
    for fn in (grpo_loss, naive_grpo_loss):
        h = batch.hidden.clone().requires_grad_()
        w = batch.weight.clone().requires_grad_()
        loss, metrics = fn(h, w, config=config, **fields)
        results.append((loss, metrics, torch.autograd.grad(loss, (h, w), allow_unused=True)))
    return results


def _assert_same(ours, naive, atol=1e-11):
    (loss, metrics, grads), (ref_loss, ref_metrics, ref_grads) = ours, naive
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, ref_loss.to(loss.dtype), rtol=1e-9, atol=atol)
    for key in ref_metrics:
        torch.testing.assert_close(metrics[key], ref_metrics[key].to(metrics[key].dtype), rtol=1e-9, atol=atol)
    for got, want in zip(grads, ref_grads, strict=True):
        want = torch.zeros_like(got) if want is None else want
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-8, atol=atol)


CONFIG = GRPOLossConfig(loss_type="grpo", beta=0.05, entropy_coef=0.01, backend="torch")


def test_fully_masked_sequence_contributes_nothing():
    batch = make_loss_batch(batch=3, length=5, hidden_size=8, vocab=17, dtype=torch.float64, seed=1)
    mask = batch.completion_mask.clone()
    mask[1] = False
    for level in ("token", "sequence"):
        config = GRPOLossConfig(loss_type="grpo", beta=0.05, importance_sampling_level=level, backend="torch")
        ours, naive = _both(batch, config, completion_mask=mask)
        _assert_same(ours, naive)
        assert torch.all(ours[2][0][1] == 0), "a fully masked sequence must get no gradient"


def test_everything_masked_gives_zero_loss_and_gradients():
    batch = make_loss_batch(batch=2, length=4, hidden_size=8, vocab=17, dtype=torch.float64, seed=2)
    for loss_type in LOSS_TYPES:
        epsilon_high = 2.0 if LOSS_TYPES[loss_type].objective.name == "cispo" else None
        config = GRPOLossConfig(
            loss_type=loss_type, epsilon_high=epsilon_high, beta=0.05, entropy_coef=0.1, backend="torch"
        )
        loss, _, grads = _both(batch, config, completion_mask=torch.zeros_like(batch.completion_mask))[0]
        assert float(loss) == 0.0
        assert all(torch.count_nonzero(g) == 0 for g in grads)


def test_single_token():
    batch = make_loss_batch(batch=1, length=1, hidden_size=8, vocab=17, dtype=torch.float64, seed=3)
    ours, naive = _both(batch, CONFIG, completion_mask=torch.ones(1, 1, dtype=torch.bool))
    _assert_same(ours, naive)


def test_zero_advantages_leave_only_kl_and_entropy_gradients():
    batch = make_loss_batch(batch=2, length=6, hidden_size=8, vocab=17, dtype=torch.float64, seed=4)
    zeros = torch.zeros_like(batch.advantages)
    ours, naive = _both(batch, GRPOLossConfig(loss_type="dapo", backend="torch"), advantages=zeros)
    _assert_same(ours, naive)
    assert float(ours[0]) == 0.0 and all(torch.count_nonzero(g) == 0 for g in ours[2])
    ours, naive = _both(batch, CONFIG, advantages=zeros)
    _assert_same(ours, naive)


@pytest.mark.parametrize("scale", [1e4, -1e4])
def test_extreme_logits(scale):
    """|z| ~ 1e4: the online max keeps exp from overflowing; results stay finite and exact."""
    batch = make_loss_batch(batch=2, length=5, hidden_size=8, vocab=23, dtype=torch.float64, seed=5)
    batch.hidden = batch.hidden * (abs(scale) ** 0.5)
    batch.weight = batch.weight * (abs(scale) ** 0.5) * (1 if scale > 0 else -1)
    with torch.no_grad():
        current = naive_logprobs_and_entropy(batch.hidden, batch.weight, batch.completion_ids)[0]
    ours, naive = _both(batch, CONFIG, old_logprobs=current, ref_logprobs=current)
    _assert_same(ours, naive, atol=1e-9)


def test_identical_old_and_current_logprobs_is_on_policy():
    """old == current logprobs gives the on-policy loss (old_logprobs=None) and its gradient."""
    batch = make_loss_batch(batch=3, length=5, hidden_size=8, vocab=17, dtype=torch.float64, seed=6)
    with torch.no_grad():
        current = naive_logprobs_and_entropy(batch.hidden, batch.weight, batch.completion_ids)[0]
    with_old, naive = _both(batch, CONFIG, old_logprobs=current)
    _assert_same(with_old, naive)
    on_policy, _ = _both(batch, CONFIG, old_logprobs=None)
    _assert_same(with_old, on_policy)
    assert float(with_old[1]["clip_ratio/region_mean"]) == 0.0


def test_tied_logits():
    """All logits equal: p is uniform, entropy log V, no NaN from ties in the max."""
    batch = make_loss_batch(batch=2, length=3, hidden_size=8, vocab=19, dtype=torch.float64, seed=7)
    batch.weight = torch.ones_like(batch.weight)
    logp, entropy = fused_logprobs(
        batch.hidden, batch.weight, batch.completion_ids, backend="torch", return_entropy=True
    )
    torch.testing.assert_close(logp, torch.full_like(logp, -torch.log(torch.tensor(19.0, dtype=torch.float64))))
    torch.testing.assert_close(entropy, torch.full_like(entropy, torch.log(torch.tensor(19.0, dtype=torch.float64))))
    _assert_same(*_both(batch, CONFIG))


def test_vocabulary_smaller_than_one_row():
    batch = make_loss_batch(batch=2, length=3, hidden_size=8, vocab=2, dtype=torch.float64, seed=8)
    _assert_same(*_both(batch, CONFIG))


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 4),
    length=st.integers(1, 9),
    hidden_size=st.integers(1, 12),
    vocab=st.integers(2, 40),
    case=st.sampled_from([(t, level) for t, row in LOSS_TYPES.items() for level in row.objective.levels]),
    beta=st.sampled_from([0.0, 0.1]),
    entropy_coef=st.sampled_from([0.0, 0.02]),
    temperature=st.floats(0.3, 2.0),
    rows_per_chunk=st.integers(1, 12),
    seed=st.integers(0, 10_000),
)
def test_property_matches_naive(
    batch, length, hidden_size, vocab, case, beta, entropy_coef, temperature, rows_per_chunk, seed
):
    loss_type, level = case
    data = make_loss_batch(batch, length, hidden_size, vocab, dtype=torch.float64, seed=seed, logit_scale=3.0)
    config = GRPOLossConfig(
        loss_type=loss_type,
        importance_sampling_level=level,
        beta=beta,
        entropy_coef=entropy_coef,
        temperature=temperature,
        epsilon_high=2.0 if LOSS_TYPES[loss_type].objective.name == "cispo" else None,
        backend="torch",
        workspace_bytes=rows_per_chunk * vocab * 8,
    )
    _assert_same(*_both(data, config), atol=1e-10)


def test_zero_tokens():
    """A packed batch of one empty sequence (N=0) is valid: empty results, zero loss, zero gradients."""
    hidden = torch.randn(0, 8, requires_grad=True)
    weight = torch.randn(5, 8, requires_grad=True)
    ids = torch.zeros(0, dtype=torch.long)
    assert fused_logprobs(hidden, weight, ids, backend="torch").shape == (0,)
    loss, _ = grpo_loss(
        hidden,
        weight,
        ids,
        torch.zeros(0),
        torch.zeros(1),
        config=GRPOLossConfig(backend="torch"),
        cu_seqlens=torch.zeros(2, dtype=torch.long),
    )
    loss.backward()
    assert float(loss) == 0.0 and torch.count_nonzero(weight.grad) == 0
