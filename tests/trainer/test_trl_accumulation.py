"""The trainer's micro-batch accumulation against TRL 1.16's: `GRPOTrainer._compute_loss` called in train mode
on each of the same micro-batches (gradient_accumulation_steps = steps_per_generation = the number of
micro-batches, num_items_in_batch = the batch's active tokens), its gradients summed, for every loss type —
bnpo normalised per micro-batch and the entropy bonus a per-micro-batch mean, both / accumulation steps.

Padded layout: equal-row micro-batches (2 rows each, unequal token counts), exactly as TRL forms them.
Packed layout (micro-batches under a token budget, unequal rows): TRL has no such micro-batches; the trainer
weighs each by rows / B, which is TRL's formula with gradient_accumulation_steps = B / rows for that
micro-batch (what the test feeds TRL). Also: TRL's rollout-correction weights (vllm_importance_sampling_mode)
and its adaptive entropy controller.

Tolerances: gradients rtol 1e-4, atol 1e-6 (fp32 tiny model; the two sides compute logits differently).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from accumulation_batch import accumulation_setup, gradients_by_name

from grpo_fast.core.policy import completion_hidden
from grpo_fast.loss import LOSS_TYPES, GRPOLossConfig
from grpo_fast.testing.reference import naive_logprobs_and_entropy
from grpo_fast.testing.trl_harness import OneProcessAccelerator, bare_trl_trainer
from grpo_fast.trainer import load_config
from grpo_fast.trainer.entropy_control import AdaptiveEntropy
from grpo_fast.trainer.importance import rollout_importance_weights


def _trl():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return pytest.importorskip("trl")


def trl_micro_batch_loss(trainer, logp, entropy, ids, mask, advantages, old, ref, is_weights, num_items, steps):
    """TRL's `_compute_loss` on one micro-batch (per-token logprobs / entropies given), accumulation steps `steps`."""
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, entropy, None)
    trainer.current_gradient_accumulation_steps = steps
    trainer.args.steps_per_generation = steps  # num_items_in_batch spans exactly the accumulation window
    inputs = {
        "prompt_ids": torch.zeros(ids.shape[0], 0, dtype=torch.long),
        "prompt_mask": torch.zeros(ids.shape[0], 0, dtype=torch.long),
        "completion_ids": ids,
        "completion_mask": mask.float(),
        "advantages": advantages,
        "num_items_in_batch": torch.tensor(float(num_items)),
        "old_per_token_logps": old,
    }
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    if is_weights is not None:
        inputs["importance_sampling_ratio"] = (
            is_weights[:, None] if is_weights.dim() == 1 else torch.where(mask, is_weights, 1.0)
        )
    return trainer._compute_loss(None, inputs)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return accumulation_setup(
        tmp_path_factory.mktemp("trl_acc"), 1, (3, 5, 2, 4, 3, 2), (6, 1, 4, 7, 2, 5), masked_row=4
    )


def _config(loss_type, **options):
    epsilon_high = 5.0 if LOSS_TYPES[loss_type].objective.name == "cispo" else 0.28
    base = dict(beta=0.05, entropy_coef=0.01, max_completion_length=8, backend="torch")
    return GRPOLossConfig(loss_type=loss_type, epsilon_high=epsilon_high, **(base | options))


EXTRAS = {
    "plain": {},
    "masks": dict(top_entropy_quantile=0.5, off_policy_mask_threshold=0.0),
    "seq_is": dict(importance_sampling_level="sequence"),
}


@pytest.mark.parametrize("extra", list(EXTRAS))
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("loss_type", [t for t, row in LOSS_TYPES.items() if row.trl_name is not None])
def test_accumulated_gradient_is_trls(setup, loss_type, packed, extra):
    _trl()
    trainer, batch, inp = setup
    model, step = trainer.model, trainer.loss_step
    step.config.run.packing = packed
    trainer.config.run.micro_batch_tokens = 11
    plan = step.micro_batches(batch)
    row_tokens = batch.completion_mask.sum(1)
    if packed:
        assert len({mb.num_rows for mb in plan}) > 1, "the packs should have unequal rows"
    else:
        assert len(plan) == 3 and len({int(row_tokens[mb.index].sum()) for mb in plan}) == 3
    config = _config(loss_type, **EXTRAS[extra])
    step.loss_config = config
    is_weights = inp["seq_is_weights"] if extra == "seq_is" else inp["is_weights"]
    model.zero_grad(set_to_none=True)
    step.accumulate_gradients(batch, inp["advantages"], inp["old_lp"], inp["ref_lp"], is_weights, plan=plan)
    ours = gradients_by_name(model)

    model.zero_grad(set_to_none=True)
    n_rows, num_items = batch.completion_ids.shape[0], int(row_tokens.sum())
    trl = bare_trl_trainer(config, 8, use_is=True, training=True)
    for mb in plan:
        rows = list(mb.row_list)
        part = batch.rows(rows)
        hidden = completion_hidden(model, part)
        logp, entropy = naive_logprobs_and_entropy(hidden, model.lm_head.weight, part.completion_ids)
        loss = trl_micro_batch_loss(
            trl,
            logp,
            entropy,
            part.completion_ids,
            part.completion_mask,
            inp["advantages"][rows],
            inp["old_lp"][rows],
            inp["ref_lp"][rows],
            is_weights[rows],
            num_items,
            steps=n_rows / len(rows),  # the number of micro-batches when they have equal rows
        )
        loss.backward()
    theirs = gradients_by_name(model)
    assert ours.keys() == theirs.keys()
    for name, grad in theirs.items():
        torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_bnpo_is_no_longer_dapo_in_the_trainer(setup):
    """bnpo's token mean is each micro-batch's own (TRL), so with unequal token counts it differs from dapo's
    batch token mean, which the whole-batch call still gives."""
    trainer, batch, inp = setup
    step = trainer.loss_step
    step.config.run.packing = False
    plan = step.micro_batches(batch)
    grads = {}
    for loss_type in ("bnpo", "dapo"):
        step.loss_config = _config(loss_type, beta=0.0, entropy_coef=0.0)
        trainer.model.zero_grad(set_to_none=True)
        step.accumulate_gradients(batch, inp["advantages"], inp["old_lp"], None, None, plan=plan)
        grads[loss_type] = gradients_by_name(trainer.model)
    name = "lm_head.weight"
    assert not torch.allclose(grads["bnpo"][name], grads["dapo"][name], rtol=1e-3, atol=0)


# ----------------------------------------------------------------------------------------------
# rollout correction (TRL's vllm_importance_sampling_*)
# ----------------------------------------------------------------------------------------------


def _trl_is_ratio(old, sampling, mask, mode, clip_min, clip_max):
    """TRL 1.16's lines in `_generate_and_score_completions`, transcribed."""
    per_token_logps_diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode in ["sequence_mask", "sequence_truncate"]:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -math.inf
    max_val = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize(("clip_min", "clip_max"), [(None, 1.3), (0.8, None), (0.9, 1.2)])
def test_rollout_importance_weights_are_trls(mode, clip_min, clip_max):
    g = torch.Generator().manual_seed(3)
    old = torch.randn(5, 7, generator=g).double()
    sampling = old + 0.1 * torch.randn(5, 7, generator=g).double()
    sampling[2, 3] = float("nan")  # a token the engine could not score
    mask = torch.rand(5, 7, generator=g) > 0.3
    ours = rollout_importance_weights(old, sampling, mask, mode, clip_min, clip_max)
    theirs = _trl_is_ratio(old, sampling, mask, mode, clip_min, clip_max)
    if mode.startswith("sequence"):
        assert ours.shape == (5,)
        theirs = theirs.squeeze(1)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_rollout_correction_config():
    trl_fields = {f.name: f.default for f in __import__("dataclasses").fields(_trl().GRPOConfig)}
    cfg = load_config(None, ["grpo.vllm_importance_sampling_correction=true"])
    for name in ("mode", "clip_max", "clip_min"):
        key = f"vllm_importance_sampling_{name}"
        assert getattr(cfg.grpo, key) == trl_fields[key], key
    assert cfg.grpo.rollout_correction() == ("sequence_mask", None, 3.0)
    assert load_config(None, []).grpo.rollout_correction() is None
    old = load_config(None, ["grpo.is_correction=token", "grpo.is_cap=2.5"]).grpo.rollout_correction()
    assert old == ("token_truncate", None, 2.5)
    capped = ["grpo.vllm_importance_sampling_correction=true", "grpo.vllm_importance_sampling_cap=4.0"]
    assert load_config(None, capped).grpo.rollout_correction()[2] == 4.0
    bad = [
        (["grpo.vllm_importance_sampling_mode=token"], "grpo.vllm_importance_sampling_mode"),
        (["grpo.vllm_importance_sampling_clip_min=3.0"], "grpo.vllm_importance_sampling_clip_min"),
        (
            [
                "grpo.vllm_importance_sampling_correction=true",
                "grpo.vllm_importance_sampling_mode=token_truncate",
                "grpo.vllm_importance_sampling_clip_max=null",
            ],
            "grpo.vllm_importance_sampling_mode",
        ),
        (["grpo.vllm_importance_sampling_clip_max=-1"], "grpo.vllm_importance_sampling_clip_max"),
        (["grpo.vllm_importance_sampling_correction=true", "grpo.is_correction=token"], "grpo.is_correction"),
        (["grpo.vllm_importance_sampling_correction=true", "grpo.old_logprobs=rollout"], "grpo.old_logprobs"),
    ]
    for overrides, key in bad:
        with pytest.raises(ValueError, match=key):
            load_config(None, overrides)


# ----------------------------------------------------------------------------------------------
# adaptive entropy (TRL's use_adaptive_entropy)
# ----------------------------------------------------------------------------------------------


def test_adaptive_entropy_follows_trls_update_rule():
    """Windows of micro-batches through TRL's `_compute_loss` (use_adaptive_entropy) and through our
    controller fed each window's entropy sum and token count: the same coefficient applied and updated."""
    _trl()
    g = torch.Generator().manual_seed(4)
    config = GRPOLossConfig(loss_type="grpo", entropy_coef=0.02)
    extra = dict(entropy_target=1.0, entropy_coef_delta=0.015, entropy_coef_min=0.005, entropy_coef_max=0.04)
    trl = bare_trl_trainer(config, 5, use_is=False, training=True, **extra)
    trl.use_adaptive_entropy = True
    trl._entropy_bonus_enabled = True
    ours = AdaptiveEntropy(0.02, 1.0, 0.015, 0.005, 0.04)
    accelerator = OneProcessAccelerator()
    trl.accelerator = accelerator
    for window, scale in enumerate((2.0, 0.5, 0.6, 0.4, 3.0, 0.2, 0.1)):
        h_sum, count = 0.0, 0.0
        for micro in range(2):
            logp = -torch.rand(3, 5, generator=g, dtype=torch.float64)
            entropy = (scale * (0.5 + torch.rand(3, 5, generator=g, dtype=torch.float64))).requires_grad_()
            mask = torch.rand(3, 5, generator=g) > 0.3
            advantages = torch.randn(3, generator=g, dtype=torch.float64)
            accelerator.sync_gradients = micro == 1
            applied = ours.applied_coef()
            loss = trl_micro_batch_loss(
                trl, logp, entropy, torch.zeros(3, 5, dtype=torch.long), mask, advantages, logp, None, None, 1, 2
            )
            (grad,) = torch.autograd.grad(loss, entropy)
            # TRL's bonus gradient is -apply_coef * m / Σm / steps (its mask in fp32: rtol 1e-6)
            expected = -applied * mask / mask.sum().clamp(min=1) / 2
            torch.testing.assert_close(grad, expected.double(), rtol=1e-6, atol=1e-12, msg=f"window {window}")
            h_sum += float((entropy.detach() * mask).sum())
            count += float(mask.sum())
        ours.update(h_sum, count)
        assert ours.coef == pytest.approx(trl.entropy_coef, rel=1e-12), window
        assert ours.last_entropy == pytest.approx(trl._last_world_entropy, rel=1e-12), window


def test_adaptive_entropy_config_and_trainer_wiring(setup):
    trl_fields = {f.name: f.default for f in __import__("dataclasses").fields(_trl().GRPOConfig)}
    cfg = load_config(None, [])
    for name in ("use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta"):
        assert getattr(cfg.grpo, name) == trl_fields[name], name
    assert cfg.grpo.entropy_target == trl_fields["entropy_target"]
    for overrides, key in [
        (["grpo.entropy_coef_delta=-0.1"], "grpo.entropy_coef_delta"),
        (["grpo.entropy_coef_min=0.5", "grpo.entropy_coef_max=0.1"], "grpo.entropy_coef_min"),
        (["grpo.use_adaptive_entropy=true", "loss.top_entropy_quantile=0.2"], "grpo.use_adaptive_entropy"),
    ]:
        with pytest.raises(ValueError, match=key):
            load_config(None, overrides)

    # accumulate_gradients takes the controller's coefficient and returns what the controller measures
    trainer, batch, inp = setup
    step = trainer.loss_step
    step.config.run.packing = False
    step.loss_config = _config("grpo", beta=0.0, entropy_coef=0.0)
    plan = step.micro_batches(batch)
    results = {}
    for coef in (0.0, 0.3):
        trainer.model.zero_grad(set_to_none=True)
        entropy_sum, tokens = step.accumulate_gradients(
            batch, inp["advantages"], None, None, None, plan=plan, entropy_coef=coef
        )
        results[coef] = gradients_by_name(trainer.model)
    assert tokens == int(batch.completion_mask.sum())
    with torch.no_grad():
        _, entropy = naive_logprobs_and_entropy(
            completion_hidden(trainer.model, batch), trainer.model.lm_head.weight, batch.completion_ids
        )
    torch.testing.assert_close(float(entropy_sum), float((entropy * batch.completion_mask).sum()), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(results[0.0]["lm_head.weight"], results[0.3]["lm_head.weight"])


def test_training_with_adaptive_entropy_and_rollout_correction(tmp_path):
    """End to end (transformers engine): the controller moves entropy_coef once per optimizer step (entropy
    always below a target of 100 nats: +delta per step), the checkpoint keeps it, and sequence_mask weights
    reach the loss."""
    from test_trainer_hf import _trainer  # noqa: PLC0415

    from grpo_fast.core import checkpoint as ckpt  # noqa: PLC0415

    overrides = [
        "run.max_steps=2",
        "run.plots=false",
        "run.save_final=false",
        "loss.entropy_coef=0.02",
        "grpo.use_adaptive_entropy=true",
        "grpo.entropy_target=100.0",
        "grpo.entropy_coef_delta=0.01",
        "grpo.vllm_importance_sampling_correction=true",
        "grpo.vllm_importance_sampling_mode=sequence_mask",
        "grpo.vllm_importance_sampling_clip_min=0.5",
    ]
    t = _trainer(tmp_path / "run", overrides)
    last = t.train()
    assert last["entropy_coef"] == pytest.approx(0.04)
    assert "is_weight_mean" in last
    state = ckpt.load_trainer_state(t.save())
    assert state["entropy_control"]["entropy_coef"] == pytest.approx(0.04)
    assert state["entropy_control"]["last_world_entropy"] <= 100.0
