"""The trainer's micro-batch gradient accumulation equals one `grpo_loss` on the whole batch, for every loss
type whose reduction is a whole-batch quantity and both micro-batch layouts (padded rows; sequences packed
padding-free under a token budget), with uneven micro-batches, sequences of different lengths, a fully masked
(truncated) completion, old / ref logprobs and importance weights.

Not the entropy bonus nor bnpo: as in TRL 1.16 both are means over each micro-batch's own tokens, weighed
like a micro-batch (tests/trainer/test_trl_accumulation.py checks them against TRL's `_compute_loss`)."""

from __future__ import annotations

import pytest
import torch
from accumulation_batch import accumulation_setup, gradients_by_name, loss_gradients

from grpo_fast.core.policy import completion_hidden
from grpo_fast.loss import LOSS_TYPES, GRPOLossConfig, Reduction


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return accumulation_setup(tmp_path_factory.mktemp("acc"), 0, (3, 5, 2, 4, 3), (6, 1, 4, 6, 2), masked_row=3)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("loss_type", [t for t, row in LOSS_TYPES.items() if row.reduction is not Reduction.TOKEN_MEAN])
def test_micro_batches_accumulate_to_the_full_batch_gradient(setup, loss_type, packed):
    trainer, batch, inp = setup
    model = trainer.model
    trainer.loss_step.config.run.packing = packed
    trainer.config.run.micro_batch_tokens = 9  # sequences of 9, 6, 6, 5 tokens (+ the masked one): 4 packs
    plan = trainer.loss_step.micro_batches(batch)
    assert len(plan) == (4 if packed else 3)
    trainer.loss_step.loss_config = GRPOLossConfig(
        loss_type=loss_type,
        epsilon_high=5.0 if LOSS_TYPES[loss_type].objective.name == "cispo" else 0.28,
        beta=0.05,
        max_completion_length=8,
        backend="torch",
    )
    model.zero_grad(set_to_none=True)
    engine_lp = inp["ref_lp"]  # logprobs other than the old ones, as the engine's (read by icepop, kpop, ipo)
    trainer.loss_step.accumulate_gradients(
        batch, inp["advantages"], inp["old_lp"], inp["ref_lp"], inp["is_weights"], plan=plan, rollout_lp=engine_lp
    )
    accumulated = gradients_by_name(model)

    _, full = loss_gradients(
        model,
        batch,
        completion_hidden,
        inp["advantages"],
        old_logprobs=inp["old_lp"],
        ref_logprobs=inp["ref_lp"],
        is_weights=inp["is_weights"],
        config=trainer.loss_step.loss_config,
        rollout_logprobs=engine_lp,
    )
    assert accumulated.keys() == full.keys()
    for name, grad in full.items():
        torch.testing.assert_close(accumulated[name], grad, rtol=1e-4, atol=1e-6, msg=name)
