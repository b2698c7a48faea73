"""Bad input gets a clear error naming the argument, never a crash or silent garbage."""

import pytest
import torch

from grpo_fast import GRPOLossConfig, fused_logprobs, grpo_loss, logits_grpo_loss
from grpo_fast.testing.synthetic import make_loss_batch

B, T, H, V = 2, 5, 8, 17


@pytest.fixture
def args():
    batch = make_loss_batch(B, T, H, V, seed=0)
    arguments = batch.token_arguments()
    del arguments["is_weights"]
    return dict(hidden=batch.hidden, weight=batch.weight, **arguments, config=GRPOLossConfig(beta=0.1, backend="torch"))


def _nan_at_active(x):
    x = x.clone()
    x[0, 0] = float("nan")
    return x


BAD = {
    "hidden 2-D in padded layout": (dict(hidden=torch.randn(B * T, H)), ValueError, "hidden"),
    "hidden int": (dict(hidden=torch.zeros(B, T, H, dtype=torch.long)), TypeError, "hidden"),
    "weight wrong H": (dict(weight=torch.randn(V, H + 1)), ValueError, "weight"),
    "weight other dtype": (dict(weight=torch.randn(V, H, dtype=torch.float64)), TypeError, "weight"),
    "weight on meta device": (dict(weight=torch.empty(V, H, device="meta")), ValueError, "weight"),
    "float targets": (dict(completion_ids=torch.zeros(B, T)), TypeError, "completion_ids"),
    "targets >= V": (dict(completion_ids=torch.full((B, T), V)), ValueError, "completion_ids"),
    "negative targets": (dict(completion_ids=torch.full((B, T), -1)), ValueError, "completion_ids"),
    "targets wrong shape": (dict(completion_ids=torch.zeros(B, T + 1, dtype=torch.long)), ValueError, "completion_ids"),
    "mask wrong shape": (dict(completion_mask=torch.ones(B, T + 1)), ValueError, "completion_mask"),
    "mask not 0/1": (dict(completion_mask=torch.full((B, T), 0.5)), ValueError, "completion_mask"),
    "integer mask of 2": (dict(completion_mask=torch.full((B, T), 2)), ValueError, "completion_mask"),
    "advantages wrong shape": (dict(advantages=torch.zeros(B + 1)), ValueError, "advantages"),
    "advantages NaN": (dict(advantages=torch.tensor([float("nan"), 0.0])), ValueError, "advantages"),
    "advantages inf": (dict(advantages=torch.tensor([float("inf"), 0.0])), ValueError, "advantages"),
    "advantages int": (dict(advantages=torch.zeros(B, dtype=torch.long)), TypeError, "advantages"),
    "old logprobs NaN": ("old_nan", ValueError, "old_logprobs"),
    "ref logprobs inf": ("ref_inf", ValueError, "ref_logprobs"),
    "ref wrong shape": (dict(ref_logprobs=torch.zeros(B, T - 1)), ValueError, "ref_logprobs"),
    "is_weights NaN": (dict(is_weights=torch.tensor([1.0, float("nan")])), ValueError, "is_weights"),
    "beta without ref": (dict(ref_logprobs=None), ValueError, "ref_logprobs"),
    "num_items_in_batch zero": (dict(num_items_in_batch=0), ValueError, "num_items_in_batch"),
    "config not a config": (dict(config={"loss_type": "grpo"}), TypeError, "config"),
    "hidden not a tensor": (dict(hidden=[[0.0]]), TypeError, "hidden"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_grpo_loss_rejects(args, case):
    change, error, name = BAD[case]
    if change == "old_nan":
        change = dict(old_logprobs=_nan_at_active(args["old_logprobs"]))
    elif change == "ref_inf":
        change = dict(ref_logprobs=_nan_at_active(args["ref_logprobs"]).nan_to_num(nan=float("inf")))
    with pytest.raises(error, match=name):
        grpo_loss(**(args | change))


def test_padding_positions_may_hold_anything(args):
    """Out-of-vocabulary ids, NaN old logprobs etc. at masked-out positions are ignored."""
    mask = args["completion_mask"].clone()
    mask[:, -1] = False
    ids = args["completion_ids"].clone()
    ids[:, -1] = -100
    old = args["old_logprobs"].clone()
    old[:, -1] = float("nan")
    loss, _ = grpo_loss(**(args | dict(completion_mask=mask, completion_ids=ids, old_logprobs=old)))
    assert torch.isfinite(loss)


@pytest.mark.parametrize(
    "options,name",
    [
        (dict(loss_type="ppo"), "loss_type"),
        (dict(importance_sampling_level="tokens"), "importance_sampling_level"),
        (dict(epsilon_low=-0.1), "epsilon_low"),
        (dict(epsilon_low=1.0), "epsilon_low"),
        (dict(epsilon_high=float("nan")), "epsilon_high"),
        (dict(delta=1.1), "delta"),
        (dict(beta=-1.0), "beta"),
        (dict(temperature=0.0), "temperature"),
        (dict(loss_type="cispo"), "epsilon_high"),
        (dict(loss_type="cispo", epsilon_high=0.0), "epsilon_high"),  # every token's weight 0: a silent no-op
        (dict(max_completion_length=0), "max_completion_length"),
        (dict(backend="tpu"), "backend"),
        (dict(workspace_bytes=0), "workspace_bytes"),
    ],
)
def test_config_rejects(options, name):
    with pytest.raises(ValueError, match=name):
        GRPOLossConfig(**options)


def test_fused_logprobs_rejects():
    h, w = torch.randn(4, H), torch.randn(V, H)
    with pytest.raises(TypeError, match="targets"):
        fused_logprobs(h, w, torch.zeros(4))
    with pytest.raises(ValueError, match="targets"):
        fused_logprobs(h, w, torch.full((4,), V))
    with pytest.raises(ValueError, match="targets"):
        fused_logprobs(h, w, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        fused_logprobs(h, w, torch.zeros(4, dtype=torch.long), temperature=-1.0)
    with pytest.raises(ValueError, match="bias"):
        fused_logprobs(h, w, torch.zeros(4, dtype=torch.long), bias=torch.zeros(V + 1))
    with pytest.raises(ValueError, match="backend"):
        fused_logprobs(h, w, torch.zeros(4, dtype=torch.long), backend="cuda")
    # Beyond float32: all NaN, or an overflow inside addmm. Empty H or V: a reshape or ZeroDivisionError inside.
    for head in (dict(temperature=1e-310), dict(temperature=0.5, logit_scale=1e308)):
        with pytest.raises(ValueError, match=r"temperature: logit_scale / temperature = .* beyond float32's range"):
            fused_logprobs(h, w, torch.zeros(4, dtype=torch.long), **head)
    for shape in ((V, 0), (0, H)):
        with pytest.raises(ValueError, match=r"weight: expected a vocabulary and a hidden size of at least 1"):
            fused_logprobs(torch.randn(4, shape[1]), torch.randn(shape), torch.zeros(4, dtype=torch.long))


def test_logits_grpo_loss_rejects():
    ids, mask, adv = torch.zeros(B, T, dtype=torch.long), torch.ones(B, T), torch.zeros(B)
    with pytest.raises(ValueError, match="logits"):
        logits_grpo_loss(torch.randn(B * T, V), ids, mask, adv)
    with pytest.raises(ValueError, match="completion_ids"):
        logits_grpo_loss(torch.randn(B, T + 1, V), ids, mask, adv)
    with pytest.raises(ValueError, match=r"logits: expected a vocabulary of at least 1"):
        logits_grpo_loss(torch.randn(B, T, 0), ids, mask, adv)
    with pytest.raises(ValueError, match="logits"):
        logits_grpo_loss(torch.randn(B, V, T).transpose(1, 2), ids, mask, adv, inplace_backward=True)
    for head in (dict(logit_scale=0.1), dict(final_logit_softcapping=30.0)):  # the logits are capped already
        with pytest.raises(ValueError, match="config.logit_scale / final_logit_softcapping"):
            logits_grpo_loss(torch.randn(B, T, V), ids, mask, adv, config=GRPOLossConfig(**head))


def test_packed_layout_rejects_bad_cu_seqlens():
    h, w = torch.randn(6, H), torch.randn(V, H)
    ids, mask, adv = torch.zeros(6, dtype=torch.long), torch.ones(6), torch.zeros(2)
    with pytest.raises(ValueError, match="cu_seqlens"):
        grpo_loss(h, w, ids, mask, adv, cu_seqlens=torch.tensor([0, 3, 5]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        grpo_loss(h, w, ids, mask, adv, cu_seqlens=torch.tensor([0, 4, 3, 6]))
    with pytest.raises(TypeError, match="cu_seqlens"):
        grpo_loss(h, w, ids, mask, adv, cu_seqlens=torch.tensor([0.0, 3.0, 6.0]))
