"""GRPOLoss is a drop-in for Liger-Kernel's LigerFusedLinearGRPOLoss: same loss, gradients and KL /
clip metrics for the same settings (Liger runs uncompiled on CPU: plain PyTorch chunks)."""

import pytest
import torch

from grpo_fast import GRPOLoss, GRPOLossConfig
from grpo_fast.loss import LOSS_TYPES, Objective
from grpo_fast.testing.synthetic import make_loss_batch

liger = pytest.importorskip("liger_kernel.chunked_loss")

# Liger has no sequence-level cispo.
CASES = [(t, "token") for t in LOSS_TYPES]
CASES += [(t, "sequence") for t, spec in LOSS_TYPES.items() if spec.objective is not Objective.CISPO]


@pytest.mark.parametrize("loss_type,level", CASES)
def test_matches_liger(loss_type, level):
    batch = make_loss_batch(3, 7, 24, 53, seed=1)  # odd shapes, fp32
    options = dict(
        beta=0.04,
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=1.2 if LOSS_TYPES[loss_type].objective is Objective.CISPO else 0.28,
        temperature=0.9,
        importance_sampling_level=level,
        max_completion_length=7 if loss_type == "dr_grpo" else None,
    )
    theirs_fn = liger.LigerFusedLinearGRPOLoss(compiled=False, use_ref_model=True, **options)
    ours_fn = GRPOLoss(GRPOLossConfig(backend="torch", **options))
    results = []
    for fn, kwargs in (
        (theirs_fn, dict(ref_per_token_logps=batch.ref_logprobs, old_per_token_logps=batch.old_logprobs)),
        (ours_fn, dict(ref_logprobs=batch.ref_logprobs, old_logprobs=batch.old_logprobs)),
    ):
        hidden, weight = batch.hidden.clone().requires_grad_(), batch.weight.clone().requires_grad_()
        mask = batch.completion_mask.float()
        loss, metrics = fn(hidden, weight, batch.completion_ids, mask, batch.advantages, **kwargs)
        loss.backward()
        results.append((loss.detach(), hidden.grad, weight.grad, metrics))
    (loss_l, dh_l, dw_l, metrics_l), (loss_o, dh_o, dw_o, metrics_o) = results
    # fp32 on both sides, different chunking and summation order: a few ulps of the values involved.
    torch.testing.assert_close(loss_o, loss_l, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dh_o, dh_l, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(dw_o, dw_l, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(metrics_o["kl"], metrics_l[0], rtol=1e-5, atol=1e-6)
    if level == "token":
        torch.testing.assert_close(metrics_o["clip_ratio/region_mean"], metrics_l[1], rtol=1e-5, atol=1e-6)
