"""`grpo_loss(..., logprobs_out=)`: the current policy's per-token logprobs from the loss's own forward (the
trainer's rollout/trainer mismatch metric reads them instead of running the lm_head a second time). Checked
against fp64 logprobs from materialised logits, on every path of the loss's forward (chunks that form the
gradient in the forward, whole-sequence chunks, the recompute path), padded and packed, and the loss and
gradients must be bit-identical with and without it."""

from __future__ import annotations

import pytest
import torch

from grpo_fast import grpo_loss
from grpo_fast.backends import available_backends
from grpo_fast.loss import GRPOLossConfig
from grpo_fast.testing.reference import naive_logprobs_and_entropy
from grpo_fast.testing.synthetic import make_loss_batch

BACKENDS = [b for b in ("torch", "cpu") if b in available_backends(torch.device("cpu"))]
PATHS = {
    "fused_chunks": {},
    "sequence_chunks": {"importance_sampling_level": "sequence"},
    "recompute": {"top_entropy_quantile": 0.5},
    "head_options": {"temperature": 0.7, "logit_scale": 1.3, "final_logit_softcapping": 4.0},
}
ATOL = 2e-5  # fp32 logprobs of logits ~N(0, 3) against fp64


def _run(batch, config, packed: bool, out: torch.Tensor | None):
    """(loss, dh, dW) of grpo_loss on `batch`, padded or packed, writing logprobs into `out`."""
    hidden = batch.hidden.clone().requires_grad_()
    weight = batch.weight.clone().requires_grad_()
    per_token = (batch.completion_ids, batch.completion_mask, batch.advantages, batch.old_logprobs)
    kwargs = {}
    if packed:
        mask = batch.completion_mask
        lengths = mask.sum(1)
        kwargs["cu_seqlens"] = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
        advantages = batch.advantages[:, None].expand_as(mask)
        per_token = (batch.completion_ids[mask], mask[mask], advantages[mask], batch.old_logprobs[mask])
        hidden_in = hidden[mask]
    else:
        hidden_in = hidden
    loss, _ = grpo_loss(hidden_in, weight, *per_token, config=config, logprobs_out=out, **kwargs)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_logprobs_out_matches_fp64_logits_and_changes_nothing(backend, path, packed):
    batch = make_loss_batch(3, 9, 16, 37, seed=4, logit_scale=3.0)
    # a small workspace: several chunks, so rows reach logprobs_out chunk by chunk
    config = GRPOLossConfig(loss_type="dapo", backend=backend, workspace_bytes=8 * 37 * 4, **PATHS[path])
    mask = batch.completion_mask
    out = torch.full(mask.shape if not packed else (int(mask.sum()),), float("nan"))
    with_out = _run(batch, config, packed, out)
    without = _run(batch, config, packed, None)
    for a, b in zip(with_out, without, strict=True):
        assert torch.equal(a, b)  # the loss and both gradients are untouched by reading the logprobs
    expected, _ = naive_logprobs_and_entropy(
        batch.hidden.double(),
        batch.weight.double(),
        batch.completion_ids,
        temperature=config.temperature,
        logit_scale=config.logit_scale,
        final_logit_softcapping=config.final_logit_softcapping,
    )
    expected = expected[mask] if packed else torch.where(mask, expected, 0.0)  # 0 outside the mask
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=ATOL)


def test_a_logprobs_out_of_the_wrong_shape_is_refused():
    batch = make_loss_batch(2, 5, 8, 11)
    per_token = (batch.completion_ids, batch.completion_mask, batch.advantages)
    with pytest.raises(ValueError, match=r"logprobs_out: expected a floating tensor of shape \(2, 5\)"):
        grpo_loss(batch.hidden, batch.weight, *per_token, logprobs_out=torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"logprobs_out: expected a floating tensor"):
        grpo_loss(batch.hidden, batch.weight, *per_token, logprobs_out=torch.zeros(2, 5, dtype=torch.long))
