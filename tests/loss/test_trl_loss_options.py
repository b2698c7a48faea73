"""TRL 1.16's per-token loss options beyond the loss types: `top_entropy_quantile` (the policy term and the
entropy bonus on the high-entropy tokens only), `off_policy_mask_threshold` (off-policy sequence masking) and
vespo with importance-sampling weights given per sequence ([B] or [B, 1]: log w_b enters φ once).

(a) every backend that runs here (torch, cpu, triton under TRITON_INTERPRET=1 — its layer 2 hands the two
    masks to the PyTorch twin —) against the fp64 reference: loss, ∂L/∂hidden, ∂L/∂weight; fp64 rtol 1e-9,
    atol 1e-12; fp32 the rule of grpo_fast.testing.tolerance.
(b) our loss against TRL's own `GRPOTrainer._compute_loss` (the harness of test_trl_loss_types): loss to
    rtol 1e-5 (fp64); in fp32 the shared rule, TRL's fp32 loss the peer and its fp64 loss the oracle.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_trl_loss_types import TRL_OPTIONS, WORKSPACES, _backends, _config, _run, _trl, _trl_loss

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.testing.reference import naive_grpo_loss
from grpo_fast.testing.synthetic import make_loss_batch
from grpo_fast.testing.tolerance import assert_within_rule

SHAPE = dict(batch=6, length=7, hidden_size=16, vocab=40)
EVERYTHING = dict(beta=0.04, entropy_coef=0.01, temperature=0.9, **TRL_OPTIONS)

# (loss_type, level, options, per-sequence is_weights shape or None)
CASES = [
    ("vespo", "token", EVERYTHING, "B"),
    ("vespo", "sequence", EVERYTHING, "B1"),
    ("grpo", "token", EVERYTHING | dict(top_entropy_quantile=0.3), None),
    ("dapo", "sequence", EVERYTHING | dict(top_entropy_quantile=0.5), "B"),
    ("vespo", "token", EVERYTHING | dict(top_entropy_quantile=0.4), None),
    ("grpo", "sequence", EVERYTHING | dict(off_policy_mask_threshold=0.0), None),
    ("cispo", "token", EVERYTHING | dict(off_policy_mask_threshold=0.0), None),
    ("sapo", "token", EVERYTHING | dict(off_policy_mask_threshold=0.0), "B"),
    ("vespo", "token", EVERYTHING | dict(off_policy_mask_threshold=0.0, top_entropy_quantile=0.5), "B"),
    ("bnpo", "token", EVERYTHING | dict(off_policy_mask_threshold=-0.02, top_entropy_quantile=0.2), None),
    ("dr_grpo", "token", EVERYTHING | dict(top_entropy_quantile=0.0), None),
]
IDS = [f"{t}-{level}-{i}" for i, (t, level, _, _) in enumerate(CASES)]


def _arguments(batch, per_sequence):
    args = batch.token_arguments()
    if per_sequence is not None:
        gen = torch.Generator().manual_seed(11)
        weights = torch.rand(batch.completion_ids.shape[0], generator=gen, dtype=torch.float64) * 1.5 + 0.5
        weights[1] = 0.0  # a sequence_mask-rejected sequence: log 0 floors at log 1e-8 inside vespo's φ
        args["is_weights"] = weights if per_sequence == "B" else weights[:, None]
    return args


@pytest.mark.parametrize("workspace", list(WORKSPACES))
@pytest.mark.parametrize(("loss_type", "level", "options", "per_sequence"), CASES, ids=IDS)
@pytest.mark.parametrize("backend", _backends())
def test_backend_matches_fp64_reference(backend, loss_type, level, options, per_sequence, workspace):
    if backend == "triton" and workspace != "one_chunk":
        pytest.skip("the triton backend has no workspace")
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=sum(map(ord, loss_type + level)))
    args = _arguments(batch, per_sequence)
    base = _config(loss_type, importance_sampling_level=level, **options)
    ours_cfg = dataclasses.replace(base, backend=backend, workspace_bytes=WORKSPACES[workspace])
    oracle, _ = _run(naive_grpo_loss, batch, base, torch.float64, args)

    if backend != "triton":
        ours, _ = _run(grpo_loss, batch, ours_cfg, torch.float64, args)
        for name, got, want in zip(("loss", "grad_hidden", "grad_weight"), ours, oracle, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=name)

    peer, _ = _run(naive_grpo_loss, batch, base, torch.float32, args)
    ours, _ = _run(grpo_loss, batch, ours_cfg, torch.float32, args)
    for name, got, ref, want in zip(("loss", "grad_hidden", "grad_weight"), ours, peer, oracle, strict=True):
        assert_within_rule(name, got.detach(), ref.detach(), want, torch.float32)


@pytest.mark.parametrize(("loss_type", "level", "options", "per_sequence"), CASES, ids=IDS)
def test_each_option_changes_the_loss(loss_type, level, options, per_sequence):
    """The cases exercise the options: turning each one off changes the loss or its gradient."""
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=sum(map(ord, loss_type + level)))
    args = _arguments(batch, per_sequence)
    config = _config(loss_type, importance_sampling_level=level, backend="torch", **options)
    base = _run(grpo_loss, batch, config, torch.float64, args)[0]
    offs = [dict(top_entropy_quantile=1.0), dict(off_policy_mask_threshold=None)]
    for off in offs:
        if any(getattr(config, k) != v for k, v in off.items()):
            other = _run(grpo_loss, batch, dataclasses.replace(config, **off), torch.float64, args)[0]
            assert not torch.allclose(base[2], other[2], rtol=1e-6, atol=0), off


def test_vespo_counts_a_sequence_weight_once():
    """A [B] weight w_b gives φ the sequence ratio W·w_b (log w_b once), not W·w_b^L_b; [B], [B, 1] and the
    per-token layout with w_b on one active token and 1 elsewhere agree."""
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=5)
    args = _arguments(batch, "B")
    config = _config("vespo", backend="torch", **TRL_OPTIONS)
    per_token = torch.ones_like(batch.is_weights)
    per_token[:, 0] = args["is_weights"]  # every sequence has its first token active
    once = _run(grpo_loss, batch, config, torch.float64, args | dict(is_weights=per_token))[0]
    for weights in (args["is_weights"], args["is_weights"][:, None]):
        got = _run(grpo_loss, batch, config, torch.float64, args | dict(is_weights=weights))[0]
        for a, b in zip(got, once, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    broadcast = args["is_weights"][:, None].expand_as(per_token).contiguous()
    per_token_result = _run(grpo_loss, batch, config, torch.float64, args | dict(is_weights=broadcast))[0]
    assert not torch.allclose(per_token_result[2], once[2], rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("top_entropy_quantile", -0.1),
        ("top_entropy_quantile", 1.5),
        ("top_entropy_quantile", float("nan")),
        ("off_policy_mask_threshold", float("inf")),
        ("off_policy_mask_threshold", "0.5"),
    ],
)
def test_bad_options_name_the_option(name, value):
    with pytest.raises(ValueError, match=name):
        GRPOLossConfig(**{name: value})


def test_defaults_and_names_are_trls():
    trl_defaults = {f.name: f.default for f in dataclasses.fields(_trl().GRPOConfig)}
    ours = {f.name: f.default for f in dataclasses.fields(GRPOLossConfig)}
    for name in ("top_entropy_quantile", "off_policy_mask_threshold"):
        assert ours[name] == trl_defaults[name], name


# ----------------------------------------------------------------------------------------------
# (b) against TRL's GRPOTrainer._compute_loss
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize(("loss_type", "level", "options", "per_sequence"), CASES, ids=IDS)
def test_matches_trl_compute_loss(loss_type, level, options, per_sequence, dtype):
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=sum(map(ord, loss_type + level)) + 1)
    args = _arguments(batch, per_sequence)
    config = _config(
        loss_type, importance_sampling_level=level, max_completion_length=SHAPE["length"], backend="torch", **options
    )
    num_items = int(batch.completion_mask.sum()) + 3
    theirs = _trl_loss(batch, config, args, dtype, num_items)[0]
    ours = _run(grpo_loss, batch, config, dtype, args, num_items_in_batch=num_items)[0]
    if dtype == torch.float32:  # the shared rule: TRL in fp32 the peer, TRL in fp64 the oracle (vespo's φ =
        # exp(λ + k log W − λ W) amplifies the rounding of log W on both sides: the peer's error says how much)
        exact = _trl_loss(batch, config, args, torch.float64, num_items)[0]
        for name, got, want, oracle in zip(("loss", "grad_hidden", "grad_weight"), ours, theirs, exact, strict=True):
            assert_within_rule(name, got.detach(), want.detach(), oracle.detach(), dtype)
        return
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-8, msg="loss")
    for name, got, want in zip(("grad_hidden", "grad_weight"), ours[1:], theirs[1:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("backend", _backends())
def test_sequence_level_clip_ratios_are_shares_of_sequences_as_trls(backend):
    """At importance_sampling_level="sequence" TRL's flags are [B, 1] and its global_masked_mean averages them over
    the sequences: one long and one short sequence, the short one clipped high, give 0.5 whatever the lengths (a
    share of tokens gave 0.2)."""
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 4, 8), torch.randn(11, 8)
    ids = torch.randint(11, (2, 4))
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    with torch.no_grad():
        logp = torch.log_softmax(hidden @ weight.t(), -1).gather(-1, ids[..., None])[..., 0]
    old = logp.clone()
    old[0, 0] -= 1.0  # sequence 0's ratio e^1: above 1 + epsilon_high
    config = GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", backend=backend)
    _, metrics = grpo_loss(hidden, weight, ids, mask, torch.tensor([1.0, 1.0]), old_logprobs=old, config=config)
    assert float(metrics["clip_ratio/high_mean"]) == pytest.approx(0.5)
    assert float(metrics["clip_ratio/region_mean"]) == pytest.approx(0.5)
    assert float(metrics["clip_ratio/low_mean"]) == 0.0
