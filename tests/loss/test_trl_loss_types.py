"""TRL 1.16's loss types sapo / luspo / vespo and its `use_bias_correction_kl` option:

(a) every backend that runs on this machine (torch, cpu — the C++ extension —, triton — on CPU through
    TRITON_INTERPRET=1 —) against the naive fp64 reference (grpo_fast.testing.reference: materialised
    logits, autograd): loss, ∂L/∂hidden and ∂L/∂weight;
(b) our loss against TRL's own `GRPOTrainer._compute_loss`, called on a bare trainer instance with the
    per-token logprobs and entropies computed as TRL does (log_softmax of the materialised logits).

Tolerances: fp64 (torch, cpu): rtol 1e-9, atol 1e-12 against the reference. fp32 (all backends): the
tolerance rule of grpo_fast.testing.tolerance — error against the fp64 reference at most twice the fp32
reference's own error plus 1e-5 · max(1, |reference|). Against TRL: in fp64 the loss and gradients to rtol 1e-5
(TRL's sapo/vespo hyper-parameters pass through fp32 tensors, ~5e-8 relative); in fp32 the same rule, TRL's fp32
loss the peer and TRL's fp64 loss the oracle (both sides sum in fp32 in their own orders, which CPUs round
differently).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.backends import available_backends
from grpo_fast.loss import LOSS_TYPES
from grpo_fast.testing.reference import naive_grpo_loss, naive_logprobs_and_entropy
from grpo_fast.testing.synthetic import make_loss_batch
from grpo_fast.testing.tolerance import assert_within_rule
from grpo_fast.testing.trl_harness import bare_trl_trainer

NEW_TYPES = ("sapo", "luspo", "vespo")
# Non-default hyper-parameters, so that a swapped or ignored option shows.
TRL_OPTIONS = dict(
    sapo_temperature_pos=0.8,
    sapo_temperature_neg=1.3,
    vespo_k_pos=1.5,
    vespo_lambda_pos=2.5,
    vespo_k_neg=2.5,
    vespo_lambda_neg=1.5,
)
SHAPE = dict(batch=3, length=7, hidden_size=16, vocab=40)  # odd sizes; T=7 rows per sequence


def _config(loss_type, **options):
    epsilon_high = 1.2 if LOSS_TYPES[loss_type].objective.name == "cispo" else 0.28
    return GRPOLossConfig(loss_type=loss_type, epsilon_high=epsilon_high, **options)


# ----------------------------------------------------------------------------------------------
# (a) every CPU backend against the fp64 reference
# ----------------------------------------------------------------------------------------------


def _backends():
    """torch, cpu and triton, each skipped (with the reason) where it does not run on CPU here."""
    names = available_backends(torch.device("cpu"))
    hints = {"triton": "set TRITON_INTERPRET=1 (and install triton)", "cpu": "grpo_fast._C not built"}
    params = []
    for name in ("torch", "cpu", "triton"):
        marks = [pytest.mark.triton] if name == "triton" else []
        if name not in names:
            marks.append(pytest.mark.skip(reason=hints.get(name, name)))
        params.append(pytest.param(name, id=name, marks=marks))
    return params


# (loss_type, level, options): each new type at both levels with everything on (KL with the bias
# correction, entropy bonus, temperature, importance weights, non-default hyper-parameters), the bias
# correction on the older objectives, and per-token advantages (vespo's φ and sapo's τ per token).
ALL_ON = dict(beta=0.04, entropy_coef=0.01, temperature=0.9, **TRL_OPTIONS)
BACKEND_CASES = [
    *[(t, level, ALL_ON) for t in NEW_TYPES for level in ("token", "sequence")],
    ("luspo", "sequence", ALL_ON | dict(delta=1.6)),
    ("grpo", "token", dict(beta=0.1, use_bias_correction_kl=True)),
    ("grpo", "sequence", dict(beta=0.1, use_bias_correction_kl=True, delta=1.6)),
    ("cispo", "sequence", dict(beta=0.1, use_bias_correction_kl=True)),
    ("dapo", "token", dict(beta=0.1, use_bias_correction_kl=False)),
]
CASE_IDS = [f"{t}-{level}-{i}" for i, (t, level, _) in enumerate(BACKEND_CASES)]
# Workspaces (rows of one fp32 tile at V=40): one chunk; 10 rows (token chunks would cut the 7-row
# sequences, so vespo and sequence-level ratios take whole-sequence chunks); 2 rows (the recompute path).
WORKSPACES = {"one_chunk": None, "seq_chunks": 10 * 40 * 4, "recompute": 2 * 40 * 4}


def _arguments(batch, per_token_advantages=False):
    args = batch.token_arguments()
    if per_token_advantages:
        gen = torch.Generator().manual_seed(5)
        noise = torch.randn(batch.completion_ids.shape, generator=gen, dtype=args["advantages"].dtype)
        args["advantages"] = args["advantages"].unsqueeze(1) + 0.5 * noise
    return args


def _run(fn, batch, config, dtype, args, **kwargs):
    hidden = batch.hidden.to(dtype).clone().requires_grad_()
    weight = batch.weight.to(dtype).clone().requires_grad_()
    loss, metrics = fn(hidden, weight, **args, config=config, **kwargs)
    return (loss, *torch.autograd.grad(loss, (hidden, weight))), metrics


@pytest.mark.parametrize("workspace", list(WORKSPACES))
@pytest.mark.parametrize(("loss_type", "level", "options"), BACKEND_CASES, ids=CASE_IDS)
@pytest.mark.parametrize("backend", _backends())
def test_backend_matches_fp64_reference(backend, loss_type, level, options, workspace):
    if backend == "triton" and workspace != "one_chunk":
        pytest.skip("the triton backend has no workspace")
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=sum(map(ord, loss_type + level)))
    args = _arguments(batch, per_token_advantages=loss_type in ("sapo", "vespo") and level == "token")
    base = _config(loss_type, importance_sampling_level=level, **options)
    ours_cfg = dataclasses.replace(base, backend=backend, workspace_bytes=WORKSPACES[workspace])
    oracle, oracle_metrics = _run(naive_grpo_loss, batch, base, torch.float64, args)

    if backend != "triton":  # fp64 end to end (triton's layer 1 is fp32 / bf16 / fp16)
        ours, metrics = _run(grpo_loss, batch, ours_cfg, torch.float64, args)
        for name, got, want in zip(("loss", "grad_hidden", "grad_weight"), ours, oracle, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=name)
        assert set(metrics) == set(oracle_metrics)
        for key, want in oracle_metrics.items():
            torch.testing.assert_close(metrics[key], want, rtol=1e-9, atol=1e-12, msg=key)

    peer, _ = _run(naive_grpo_loss, batch, base, torch.float32, args)
    ours, metrics = _run(grpo_loss, batch, ours_cfg, torch.float32, args)
    for name, got, ref, want in zip(("loss", "grad_hidden", "grad_weight"), ours, peer, oracle, strict=True):
        assert_within_rule(name, got.detach(), ref.detach(), want, torch.float32)
    for key, want in oracle_metrics.items():
        torch.testing.assert_close(metrics[key].double(), want, rtol=1e-5, atol=1e-6, msg=key)


def test_vespo_and_sapo_ignore_importance_sampling_level_where_trl_does():
    """vespo's φ comes from the summed token log-ratios whatever the level (only the bias-corrected KL
    sees the level's ratio); without KL the two levels give the same loss and gradients."""
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=3)
    results = [
        _run(grpo_loss, batch, _config("vespo", importance_sampling_level=level), torch.float64, _arguments(batch))[0]
        for level in ("token", "sequence")
    ]
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_on_policy_sapo_has_the_clipped_gradient_and_vespo_is_reinforce():
    """At ρ = 1 the sapo gate has slope 1 (its gradient is grpo's); on-policy φ = 1 (vespo is dapo's
    REINFORCE −A ℓ, i.e. cispo with the cap above 1; no importance weights, which vespo puts into φ)."""
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=4)
    args = _arguments(batch) | dict(old_logprobs=None, is_weights=None)

    def grads(loss_type, **options):
        return _run(grpo_loss, batch, _config(loss_type, **options), torch.float64, args)[0]

    sapo, grpo = grads("sapo", **TRL_OPTIONS), grads("grpo")
    for got, want in zip(sapo[1:], grpo[1:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
    vespo, cispo = grads("vespo", **TRL_OPTIONS), grads("cispo")
    for got, want in zip(vespo, cispo, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


def test_luspo_is_grpo_times_length_for_equal_lengths():
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=6)
    args = _arguments(batch) | dict(completion_mask=torch.ones_like(batch.completion_mask))
    luspo = _run(grpo_loss, batch, _config("luspo", beta=0.05), torch.float64, args)[0]
    grpo = _run(grpo_loss, batch, _config("grpo", beta=0.05), torch.float64, args)[0]
    for got, want in zip(luspo, grpo, strict=True):
        torch.testing.assert_close(got, SHAPE["length"] * want, rtol=1e-12, atol=1e-14)


def test_bias_correction_changes_only_the_kl_term():
    """Without KL (beta = 0) the option changes nothing; on-policy with KL, the loss is the same (ρ = 1)
    but the gradient gets β c kl ∂ρ/∂ℓ."""
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=8)
    args = _arguments(batch)
    for beta, on_policy in ((0.0, False), (0.1, True)):
        run_args = args | (dict(old_logprobs=None) if on_policy else {})
        on, off = (
            _run(grpo_loss, batch, _config("dapo", beta=beta, use_bias_correction_kl=flag), torch.float64, run_args)[0]
            for flag in (True, False)
        )
        torch.testing.assert_close(on[0], off[0], rtol=1e-12, atol=0)
        if beta == 0.0:
            assert all(torch.equal(a, b) for a, b in zip(on, off, strict=True))
        else:
            assert not torch.allclose(on[2], off[2], rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------------------------
# (b) against TRL's GRPOTrainer._compute_loss
# ----------------------------------------------------------------------------------------------


def _trl():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return pytest.importorskip("trl")


def test_defaults_and_names_are_trls():
    trl_defaults = {f.name: f.default for f in dataclasses.fields(_trl().GRPOConfig)}
    ours = {f.name: f.default for f in dataclasses.fields(GRPOLossConfig)}
    shared = [
        "loss_type",
        "epsilon_high",
        "delta",
        "beta",
        "use_bias_correction_kl",
        "sapo_temperature_pos",
        "sapo_temperature_neg",
        "vespo_k_pos",
        "vespo_lambda_pos",
        "vespo_k_neg",
        "vespo_lambda_neg",
        "temperature",
        "entropy_coef",
        "importance_sampling_level",
    ]
    for name in shared:
        assert ours[name] == trl_defaults[name], name
    assert ours["epsilon_low"] == trl_defaults["epsilon"]  # TRL calls it `epsilon`


def _trl_loss(batch, config, args, dtype, num_items_in_batch):
    """TRL's loss, gradients and metrics: per-token logprobs and entropies from the materialised logits
    (what `_get_per_token_logps_and_entropies` computes), then `_compute_loss` itself. Old logprobs when
    args has them; is_weights [B, T] per token, [B] or [B, 1] per sequence (TRL's sequence_* modes take
    them as a [B, 1] importance_sampling_ratio)."""
    _trl()
    hidden = batch.hidden.to(dtype).clone().requires_grad_()
    weight = batch.weight.to(dtype).clone().requires_grad_()
    ids, mask = args["completion_ids"], args["completion_mask"]
    logp, entropy = naive_logprobs_and_entropy(hidden, weight, ids, config.temperature)
    is_weights = args.get("is_weights")
    trainer = bare_trl_trainer(config, ids.shape[1], is_weights is not None)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, entropy, None)
    cast = lambda t: t.to(logp.dtype)  # noqa: E731
    inputs = {
        "prompt_ids": torch.zeros(ids.shape[0], 0, dtype=torch.long),
        "prompt_mask": torch.zeros(ids.shape[0], 0, dtype=torch.long),
        "completion_ids": ids,
        "completion_mask": cast(mask),
        "advantages": cast(args["advantages"]),
        "num_items_in_batch": torch.tensor(float(num_items_in_batch), dtype=logp.dtype),
    }
    if args.get("old_logprobs") is not None:
        inputs["old_per_token_logps"] = cast(args["old_logprobs"])
    if config.beta != 0.0:
        inputs["ref_per_token_logps"] = cast(args["ref_logprobs"])
    if is_weights is not None:
        if is_weights.dim() == 1 or is_weights.shape[-1] == 1:  # TRL's sequence_* modes: [B, 1]
            inputs["importance_sampling_ratio"] = cast(is_weights.reshape(-1, 1))
        else:  # TRL's ratio is exp(0) = 1 at padding
            inputs["importance_sampling_ratio"] = torch.where(mask, cast(is_weights), 1.0)
    loss = trainer._compute_loss(None, inputs)
    grads = torch.autograd.grad(loss, (hidden, weight))
    metrics = {key: values[-1] for key, values in trainer._metrics["eval"].items()}
    return (loss, *grads), metrics


TRL_CASES = [  # exactly the loss types TRL has (their trl_name)
    pytest.param(loss_type, level, bias_kl, id=f"{loss_type}-{level}-{'biaskl' if bias_kl else 'kl'}")
    for loss_type, row in LOSS_TYPES.items()
    if row.trl_name is not None
    for level in ("token", "sequence")
    for bias_kl in (True, False)
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize(("loss_type", "level", "bias_kl"), TRL_CASES)
def test_matches_trl_compute_loss(loss_type, level, bias_kl, dtype):
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=sum(map(ord, loss_type + level)) + bias_kl)
    args = _arguments(batch, per_token_advantages=loss_type in ("sapo", "vespo") and level == "token")
    options = dict(TRL_OPTIONS, beta=0.04, entropy_coef=0.01, temperature=0.9, use_bias_correction_kl=bias_kl)
    if LOSS_TYPES[loss_type].objective.name == "clipped":
        options["delta"] = 1.6
    config = _config(loss_type, importance_sampling_level=level, max_completion_length=SHAPE["length"], **options)
    num_items = int(batch.completion_mask.sum()) + 5  # a global count other than this batch's

    theirs, trl_metrics = _trl_loss(batch, config, args, dtype, num_items)
    ours, metrics = _run(
        grpo_loss, batch, dataclasses.replace(config, backend="torch"), dtype, args, num_items_in_batch=num_items
    )
    # TRL's metrics: the (bias-corrected) KL and entropy always; the clip ratios of the clipped objective
    # at token level (at sequence level TRL averages them over sequences, we over tokens).
    keys = ["kl", "entropy"]
    if level == "token" and LOSS_TYPES[loss_type].objective.name == "clipped":
        keys += ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]
    if dtype == torch.float32:  # the shared rule: TRL in fp32 the peer, TRL in fp64 the oracle
        exact, exact_metrics = _trl_loss(batch, config, args, torch.float64, num_items)
        for name, got, want, oracle in zip(("loss", "grad_hidden", "grad_weight"), ours, theirs, exact, strict=True):
            assert_within_rule(name, got.detach(), want.detach(), oracle.detach(), dtype)
        for key in keys:
            value = lambda v: torch.tensor(float(v), dtype=torch.float64)  # noqa: E731
            assert_within_rule(key, value(metrics[key]), value(trl_metrics[key]), value(exact_metrics[key]), dtype)
        return
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-8, msg="loss")
    for name, got, want in zip(("grad_hidden", "grad_weight"), ours[1:], theirs[1:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, msg=name)
    for key in keys:
        assert float(metrics[key]) == pytest.approx(trl_metrics[key], rel=1e-5, abs=1e-7), key


def test_vespo_importance_weights_enter_phi_like_trl_token_mask():
    """TRL's token_mask mode zeroes the ratio of rejected tokens: log 0 is floored at log 1e-8 inside φ."""
    batch = make_loss_batch(**SHAPE, dtype=torch.float64, seed=12)
    args = _arguments(batch)
    args["is_weights"] = args["is_weights"].clone()
    args["is_weights"][1, 0] = 0.0
    config = _config("vespo", beta=0.04, **TRL_OPTIONS)
    num_items = int(batch.completion_mask.sum())
    theirs, _ = _trl_loss(batch, config, args, torch.float64, num_items)
    ours, _ = _run(grpo_loss, batch, dataclasses.replace(config, backend="torch"), torch.float64, args)
    for got, want in zip(ours, theirs, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-10)
