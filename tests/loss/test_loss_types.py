"""The loss-type registry is the single source of truth: every consumer reads it, an unknown name is an
error everywhere, and a loss type added through the registry alone works end to end."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.loss import LOSS_TYPES, LossType, Reduction, get_loss_type, register_loss_type
from grpo_fast.testing.reference import naive_grpo_loss
from grpo_fast.testing.synthetic import make_loss_batch

# A row that exists nowhere else in the code: the clipped objective with a per-call token mean.
DUMMY = LossType("clipped_token_mean", "clipped", Reduction.TOKEN_MEAN, "test-only row")


@pytest.fixture
def dummy_loss_type():
    register_loss_type(DUMMY)
    yield DUMMY.name
    LOSS_TYPES.unregister(DUMMY.name)


def _config(loss_type: str, **options) -> GRPOLossConfig:
    cispo = LOSS_TYPES[loss_type].objective.name == "cispo"
    return GRPOLossConfig(loss_type=loss_type, epsilon_high=3.0 if cispo else 0.28, **options)


def _loss_and_grads(fn, batch, config, rows=slice(None), **kwargs):
    hidden = batch.hidden[rows].clone().requires_grad_()
    weight = batch.weight.clone().requires_grad_()
    loss, _ = fn(hidden, weight, **batch.token_arguments(rows), config=config, **kwargs)
    return (loss, *torch.autograd.grad(loss, (hidden, weight)))


def test_unknown_loss_type_is_an_error_where_it_is_named():
    with pytest.raises(ValueError, match="loss_type: unknown name 'nope'; expected one of"):
        GRPOLossConfig(loss_type="nope")
    with pytest.raises(ValueError, match="loss_type: unknown name 'nope'"):
        get_loss_type("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_loss_type(LossType("dapo", "clipped", Reduction.TOKEN_MEAN))
    with pytest.raises(TypeError, match="reduction must be a member of Reduction"):
        register_loss_type(LossType("strings", "clipped", "token_mean"))
    with pytest.raises(ValueError, match="objective: unknown name 'nope'"):
        LossType("bad_objective", "nope", Reduction.TOKEN_MEAN)
    assert "strings" not in LOSS_TYPES


def test_trl_loss_types_are_rows_of_the_registry():
    """TRL 1.16's loss types, each under TRL's name with TRL's objective and reduction (`_compute_loss`); the others
    have no TRL name, so the TRL parity tests run exactly TRL's rows."""
    rows = {name: (spec.objective.name, spec.reduction) for name, spec in LOSS_TYPES.items()}
    assert rows["sapo"] == ("sapo", Reduction.SEQUENCE_MEAN)  # normalised like grpo
    assert rows["luspo"] == ("clipped", Reduction.SEQUENCE_SUM)  # (per_token_loss * mask).sum(-1).mean()
    assert rows["vespo"] == ("vespo", Reduction.GLOBAL_TOKEN_MEAN)  # normalised like dapo / cispo
    trl_rows = {name for name, spec in LOSS_TYPES.items() if spec.trl_name is not None}
    assert trl_rows == {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"}
    assert all(LOSS_TYPES[name].trl_name == name for name in trl_rows)
    assert Reduction.SEQUENCE_SUM.micro_batch_share(2, 5, 7, 30) == 2 / 5
    # vespo's φ needs whole sequences even at token level; sapo and luspo only at sequence level
    for name, token_level in (("vespo", True), ("sapo", False), ("luspo", False), ("grpo", False)):
        assert _config(name).needs_whole_sequences is token_level
        assert _config(name, importance_sampling_level="sequence").needs_whole_sequences


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("sapo_temperature_pos", 0.0),
        ("sapo_temperature_neg", -1.0),
        ("sapo_temperature_neg", float("inf")),
        ("sapo_temperature_pos", "1.0"),
        ("vespo_k_pos", -0.5),
        ("vespo_k_neg", float("nan")),
        ("vespo_lambda_pos", -1.0),
        ("vespo_lambda_neg", None),
        ("use_bias_correction_kl", 1),
        ("use_bias_correction_kl", "true"),
    ],
)
def test_trl_options_are_validated_naming_the_option(option, value):
    with pytest.raises(ValueError, match=f"^{option}: expected"):
        GRPOLossConfig(loss_type="sapo", **{option: value})


def test_trl_options_reach_the_trainer_config_by_their_names():
    from grpo_fast.trainer.config import load_config

    overrides = ["loss.loss_type=vespo", "loss.vespo_k_pos=1.5", "loss.use_bias_correction_kl=false"]
    loss = load_config(None, overrides).loss
    assert (loss.loss_type, loss.vespo_k_pos, loss.use_bias_correction_kl) == ("vespo", 1.5, False)
    with pytest.raises(ValueError, match="loss.sapo_temperature_neg: expected"):
        load_config(None, ["loss.sapo_temperature_neg=0"])


def test_an_objective_without_a_kernel_falls_back_to_pytorch_with_one_line(monkeypatch, caplog):
    """An objective without a code in the layer-2 kernels (icepop, a user's): a backend with such a kernel runs its
    token math in PyTorch (one logged line) instead of raising."""
    import logging

    from grpo_fast.backends import Capabilities
    from grpo_fast.loss import token_loss
    from grpo_fast.loss.token_math import grpo_token_loss

    class WithKernel:  # a backend that declares a layer-2 kernel
        name = "with_kernel"
        capabilities = Capabilities(token_loss_kernel=lambda *args: pytest.fail("the kernel must not run"))

    monkeypatch.setattr(token_loss, "_LOGGED_FALLBACKS", set())
    config = _config("icepop")
    with caplog.at_level(logging.INFO, logger="grpo_fast.loss.token_loss"):
        chosen = [token_loss.select_token_loss(WithKernel(), config) for _ in range(3)]
    assert all(c is grpo_token_loss for c in chosen)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "has no with_kernel layer-2 kernel" in lines[0], lines


def test_unknown_loss_type_is_an_error_in_the_trainer_config():
    from grpo_fast.trainer.config import load_config

    with pytest.raises(ValueError, match="loss.loss_type: unknown name 'nope'; expected one of"):
        load_config(None, ["loss.loss_type=nope"])


@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_micro_batch_shares_add_up_to_the_batch_loss(loss_type):
    """Each reduction's micro_batch_share (what the trainer scales a micro-batch's loss by) makes
    micro-batch losses and gradients add up to the whole batch's, global counts given as the trainer does —
    except bnpo's token mean, which is each micro-batch's own, as in TRL (tests/trainer/test_trl_accumulation.py)."""
    if LOSS_TYPES[loss_type].reduction is Reduction.TOKEN_MEAN:
        assert LOSS_TYPES[loss_type].reduction.micro_batch_share(2, 5, 7, 30) == 2 / 5
        pytest.skip("bnpo is normalised per micro-batch (TRL): its micro-batches do not add up to the batch's")
    batch = make_loss_batch(batch=5, length=6, hidden_size=16, vocab=31, dtype=torch.float64, seed=5)
    config = _config(loss_type, beta=0.05, max_completion_length=6, backend="torch")
    full = _loss_and_grads(grpo_loss, batch, config)
    mask = batch.completion_mask
    batch_tokens = int(mask.sum())
    total = [torch.zeros_like(t) for t in full]
    for rows in (slice(0, 2), slice(2, 3), slice(3, 5)):
        share = LOSS_TYPES[loss_type].reduction.micro_batch_share(
            rows.stop - rows.start, 5, int(mask[rows].sum()), batch_tokens
        )
        part = _loss_and_grads(grpo_loss, batch, config, rows, num_items_in_batch=batch_tokens)
        total[0] += share * part[0]
        total[1][rows] += share * part[1]
        total[2] += share * part[2]
    for got, want in zip(total, full, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_loss_type_added_through_the_registry_alone_works(dummy_loss_type):
    """Config, token math, the fp64 reference and the trainer's micro-batch share all take the new row;
    it gives exactly what the built-in row with the same objective and reduction (bnpo) gives."""
    batch = make_loss_batch(batch=3, length=7, hidden_size=24, vocab=53, dtype=torch.float64, seed=9)
    options = dict(beta=0.04, entropy_coef=0.01, backend="torch")
    ours = _loss_and_grads(grpo_loss, batch, _config(dummy_loss_type, **options))
    reference = _loss_and_grads(naive_grpo_loss, batch, _config(dummy_loss_type, **options))
    builtin = _loss_and_grads(grpo_loss, batch, _config("bnpo", **options))
    for got, ref, same in zip(ours, reference, builtin, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(got, same, rtol=0, atol=0)
    assert get_loss_type(dummy_loss_type).reduction.micro_batch_share(2, 4, 3, 12) == 0.5  # rows / B, like bnpo


@pytest.mark.triton
def test_a_loss_type_added_through_the_registry_alone_runs_in_the_triton_kernels(dummy_loss_type):
    pytest.importorskip("triton")
    batch = make_loss_batch(batch=2, length=5, hidden_size=16, vocab=40, seed=4)
    torch_result = _loss_and_grads(grpo_loss, batch, _config(dummy_loss_type, beta=0.04, backend="torch"))
    triton_result = _loss_and_grads(grpo_loss, batch, _config(dummy_loss_type, beta=0.04, backend="triton"))
    for got, want in zip(triton_result, torch_result, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_config_copied_keeps_its_objective_options():
    """The objective's options are built once, outside __dict__: a copy through __dict__ (the benchmarks'), a pickle
    (a process boundary), a deepcopy and dataclasses.replace each carry them, and __dict__ holds the fields alone."""
    config = GRPOLossConfig(loss_type="icepop", objective_options={"alpha": 0.4})
    assert set(config.__dict__) == {f.name for f in dataclasses.fields(config)}
    copies = [GRPOLossConfig(**config.__dict__), pickle.loads(pickle.dumps(config)), copy.deepcopy(config)]
    copies.append(dataclasses.replace(config, beta=0.1))
    for other in copies:
        assert (other.options.alpha, other.options.beta) == (0.4, config.options.beta)
