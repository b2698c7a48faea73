"""Old-policy logprobs cost a forward pass only when the loss needs them: on-policy (one iteration, no
importance correction) the step runs one backbone forward per micro-batch and takes the rollout/trainer
mismatch metrics from it; `grpo.old_logprobs: rollout` uses the engine's logprobs as the old policy."""

from __future__ import annotations

import copy

import pytest
import torch

from grpo_fast import grpo_loss
from grpo_fast.core.policy import backbone, build_sequence_batch, completion_hidden, completion_logprobs
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.rollout.base import Completion
from grpo_fast.trainer.config import load_config
from grpo_fast.trainer.loss_step import LossStep
from grpo_fast.trainer.rollout_phase import RolloutBatch

TOK = build_char_tokenizer()
G = 4


def _rollout(model) -> tuple[RolloutBatch, torch.Tensor]:
    """8 completions of 2 prompts with 'engine' logprobs = the model's own plus noise (a mismatch)."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, len(TOK), (n,), generator=g).tolist() for n in (4, 6)]
    lengths = (3, 5, 1, 4, 2, 5, 3, 4)
    tokens = [torch.randint(3, len(TOK), (n,), generator=g).tolist() for n in lengths]
    prompt_ids = [prompts[i // G] for i in range(2 * G)]
    batch = build_sequence_batch(prompt_ids, tokens, TOK.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(model, batch)
    engine_lp = lp + 0.05 * torch.randn(lp.shape, generator=g)
    completions = [Completion(t, engine_lp[i, : len(t)].tolist(), "", "stop") for i, t in enumerate(tokens)]
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.0])
    empty = torch.zeros(0)
    rollout = RolloutBatch(
        prompt_ids, completions, rewards, completions, [0] * 8, rewards, empty, 0.0, 0.0, 0, 0.0, 0.0, 0.0, {}
    )
    return rollout, engine_lp * batch.completion_mask


def _step(*overrides):
    model = build_tiny_model(TOK, seed=0)
    overrides = [
        "rollout.num_generations=4",
        "run.micro_batch_size=3",
        "run.packing=false",
        "optim.lr=1e-3",
        *overrides,
    ]
    cfg = load_config(None, overrides)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    rollout, engine_lp = _rollout(copy.deepcopy(model))
    before = copy.deepcopy(model)
    forwards = []
    backbone(model).register_forward_hook(lambda *_: forwards.append(1))
    stats = LossStep(cfg, model, optimizer, scheduler, TOK.pad_token_id).train_on_batch(rollout)
    return stats, len(forwards), before, model, rollout, engine_lp


def test_on_policy_runs_one_forward_per_micro_batch_and_still_measures_the_mismatch():
    on_policy, forwards, *_ = _step()
    assert forwards == 3  # 8 rows in micro-batches of 3: no old-logprob pass
    # A token-level IS correction takes its old logprobs from the update's own forward (one update, no dropout).
    inline, forwards_inline, *_ = _step("grpo.is_correction=token", "grpo.is_cap=1e9")
    assert forwards_inline == 3
    # The same metrics from a separate old-logprob pass (forced by a sequence IS correction, cap never reached).
    recomputed, forwards_recompute, *_ = _step("grpo.is_correction=sequence", "grpo.is_cap=1e9")
    assert forwards_recompute == 6
    for key in ("mismatch/abs_logprob_diff_mean", "mismatch/kl_rollout_trainer"):
        assert on_policy[key] == pytest.approx(recomputed[key], abs=1e-6)
        assert inline[key] == pytest.approx(recomputed[key], abs=1e-6)
    assert on_policy["mismatch/abs_logprob_diff_mean"] > 0.01  # the injected noise is seen


def test_rollout_logprobs_as_the_old_policy():
    stats, forwards, before, after, rollout, engine_lp = _step("grpo.old_logprobs=rollout")
    assert forwards == 3
    # The update equals one SGD step on grpo_loss with old_logprobs = the engine's logprobs.
    cfg = load_config(None, ["rollout.num_generations=4"])
    batch = build_sequence_batch(rollout.prompt_ids, [c.token_ids for c in rollout.completions], TOK.pad_token_id)
    from grpo_fast.trainer.advantages import group_advantages

    advantages, _ = group_advantages(rollout.rewards, G, "group")
    hidden = completion_hidden(before, batch)
    loss, _ = grpo_loss(
        hidden,
        before.lm_head.weight,
        batch.completion_ids,
        batch.completion_mask,
        advantages,
        old_logprobs=engine_lp,
        num_items_in_batch=int(batch.completion_mask.sum()),
        config=cfg.loss_config(),
    )
    loss.backward()
    torch.nn.utils.clip_grad_norm_(before.parameters(), 1.0)
    for (name, p0), (_, p1) in zip(before.named_parameters(), after.named_parameters(), strict=True):
        expected = p0.detach() - 1e-3 * p0.grad
        assert torch.allclose(p1.detach(), expected, atol=1e-6), name
    with pytest.raises(ValueError, match="grpo.old_logprobs"):
        load_config(None, ["grpo.old_logprobs=rollout", "grpo.is_correction=token"])


def test_old_and_reference_logprob_passes_use_the_loss_options_of_layer_1(monkeypatch):
    """loss.workspace_bytes and loss.deterministic reach every layer-1 call of the step: the old-policy pass, the
    reference pass and the loss itself (they were once dropped by the logprob passes' own argument lists)."""
    from grpo_fast import backends
    from grpo_fast.backends.chunked import ChunkedBackend, TorchEpilogue

    seen = []

    class Recording(ChunkedBackend):
        def row_chunks(self, num_rows, vocab, device, workspace_bytes):
            seen.append(workspace_bytes)
            return super().row_chunks(num_rows, vocab, device, workspace_bytes)

        def deterministic_variant(self):
            seen.append("deterministic")
            return self

    monkeypatch.setattr(backends.BACKENDS, "_entries", dict(backends.BACKENDS._entries))  # undone after the test
    backends.register_backend("recording", Recording("recording", TorchEpilogue(), 1 << 20, 1 << 20))
    options = ["loss.backend=recording", "loss.workspace_bytes=4096", "loss.deterministic=true", "loss.beta=0.1"]
    _step("grpo.num_iterations=2", *options)
    workspaces = [w for w in seen if w != "deterministic"]
    # 3 micro-batches each: old-policy pass, reference pass, and the loss of the 2 iterations
    assert len(workspaces) >= 12 and set(workspaces) == {4096}, seen
    assert seen.count("deterministic") == len(workspaces), seen
