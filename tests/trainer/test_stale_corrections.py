"""The three off-policy corrections for tokens sampled by older weights (partial rollouts), each checked by
one SGD step of the trainer against the same step on the fp64 reference loss over materialised logits:

(a) coupled: the PPO ratio against the behaviour logprobs themselves;
(b) decoupled (AReaL): the ratio against the proximal policy (the trainer's weights before the update) times
    min(π_prox / π_behaviour, C) per token;
(c) mask: tokens sampled more than k versions ago get no loss.
"""

from __future__ import annotations

import copy

import pytest
import torch

from grpo_fast.core.policy import build_sequence_batch, completion_hidden, completion_logprobs
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.rollout.base import Completion
from grpo_fast.testing.reference import naive_grpo_loss
from grpo_fast.trainer import loss_step
from grpo_fast.trainer.advantages import group_advantages
from grpo_fast.trainer.config import load_config
from grpo_fast.trainer.importance import step_correction
from grpo_fast.trainer.loss_step import LossStep
from grpo_fast.trainer.rollout_phase import RolloutBatch
from grpo_fast.trainer.staleness import token_staleness

TOK = build_char_tokenizer()
G, VERSION, LR = 4, 2, 1e-3
LENGTHS = (3, 5, 1, 4, 2, 5, 3, 4)
# (first token, version) per completion: fresh, one and two versions old, mixed.
SEGMENTS = (
    [(0, 2)],
    [(0, 0), (2, 1), (4, 2)],
    [(0, 1)],
    [(0, 0)],
    [(0, 2)],
    [(0, 1), (3, 2)],
    [(0, 0), (1, 2)],
    [(0, 2)],
)


def _perturbed(model, scale: float, seed: int):
    """An older policy: the model's weights plus noise."""
    g = torch.Generator().manual_seed(seed)
    old = copy.deepcopy(model)
    with torch.no_grad():
        for p in old.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return old


def _stale_rollout(model) -> tuple[RolloutBatch, torch.Tensor]:
    """8 completions of 2 prompts whose tokens were sampled by versions 0, 1 and 2 (= the trainer's): behaviour
    logprobs from two perturbed copies of the model and the model itself, segment by segment."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, len(TOK), (n,), generator=g).tolist() for n in (4, 6)]
    tokens = [torch.randint(3, len(TOK), (n,), generator=g).tolist() for n in LENGTHS]
    prompt_ids = [prompts[i // G] for i in range(2 * G)]
    batch = build_sequence_batch(prompt_ids, tokens, TOK.pad_token_id)
    policies = {0: _perturbed(model, 0.05, 1), 1: _perturbed(model, 0.02, 2), 2: model}
    with torch.no_grad():
        by_version = {v: completion_logprobs(p, batch) for v, p in policies.items()}
    staleness = token_staleness(
        [Completion(t, segments=s) for t, s in zip(tokens, SEGMENTS, strict=True)],
        VERSION,
        batch.completion_ids.shape[1],
    )
    behaviour = torch.zeros_like(by_version[2])
    for v, lp in by_version.items():
        behaviour = torch.where(staleness == VERSION - v, lp, behaviour)
    behaviour = behaviour * batch.completion_mask
    completions = [
        Completion(t, behaviour[i, : len(t)].tolist(), "", "stop", segments=SEGMENTS[i]) for i, t in enumerate(tokens)
    ]
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.0])
    empty = torch.zeros(0)
    rollout = RolloutBatch(
        prompt_ids,
        completions,
        rewards,
        completions,
        [0] * 8,
        rewards,
        empty,
        0.0,
        0.0,
        0,
        0.0,
        0.0,
        0.0,
        {},
        version=VERSION,
    )
    return rollout, behaviour


def _trainer_step(model, rollout, overrides):
    cfg = load_config(None, ["rollout.num_generations=4", "run.micro_batch_size=3", "run.packing=false", *overrides])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return LossStep(cfg, model, optimizer, scheduler, TOK.pad_token_id).train_on_batch(rollout)


PARTIAL = "rollout.mode=partial"
VARIANTS = {
    "coupled": [PARTIAL, "rollout.partial.correction=coupled"],
    "decoupled": [PARTIAL, "rollout.partial.correction=decoupled", "grpo.vllm_importance_sampling_clip_max=1.02"],
    "mask": [PARTIAL, "rollout.partial.correction=mask", "rollout.partial.mask_staleness=0"],
    # The decoupled weights from a second forward pass (as for a model with dropout), not the update's own.
    "decoupled_two_passes": [
        PARTIAL,
        "rollout.partial.correction=decoupled",
        "grpo.vllm_importance_sampling_clip_max=1.02",
    ],
    # The same corrections through the grpo options, outside partial mode.
    "coupled_grpo": ["grpo.old_logprobs=rollout"],
    "decoupled_grpo": [
        "grpo.vllm_importance_sampling_correction=true",
        "grpo.vllm_importance_sampling_mode=token_truncate",
        "grpo.vllm_importance_sampling_clip_max=1.02",
    ],
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_correction_matches_the_fp64_reference_step(variant, monkeypatch):
    model = build_tiny_model(TOK, seed=0)
    rollout, behaviour = _stale_rollout(model)
    before = copy.deepcopy(model).double()
    passes = []  # the policy's extra forward passes before the update
    monkeypatch.setattr(LossStep, "logprobs", _counted(LossStep.logprobs, passes))
    if variant == "decoupled_two_passes":
        monkeypatch.setattr(loss_step, "drops_out", lambda model: True)
    stats = _trainer_step(model, rollout, VARIANTS[variant])
    assert len(passes) == (variant == "decoupled_two_passes")  # the one update's forward gives π_prox otherwise

    batch = build_sequence_batch(rollout.prompt_ids, [c.token_ids for c in rollout.completions], TOK.pad_token_id)
    mask = batch.completion_mask.clone()
    staleness = token_staleness(rollout.completions, VERSION, mask.shape[1])
    kwargs = {}
    hidden = completion_hidden(before, batch)
    if variant.startswith("coupled"):
        kwargs["old_logprobs"] = behaviour.double()
    elif variant.startswith("decoupled"):
        with torch.no_grad():  # the proximal policy: the weights before this update, in fp64
            prox = completion_logprobs(before, batch)
        kwargs["is_weights"] = torch.clamp(torch.exp((prox - behaviour.double()) * mask), max=1.02)
        assert ((kwargs["is_weights"] < 1.02) & mask).any() and ((kwargs["is_weights"] == 1.02) & mask).any()
    else:
        mask &= staleness <= 0
        assert 0 < mask.sum() < batch.completion_mask.sum()
    advantages, _ = group_advantages(rollout.rewards, G, "group")
    loss, _ = naive_grpo_loss(
        hidden,
        before.lm_head.weight,
        batch.completion_ids,
        mask,
        advantages.double(),
        num_items_in_batch=int(mask.sum()),
        config=load_config(None, ["rollout.num_generations=4"]).loss_config(),
        **kwargs,
    )
    loss.backward()
    torch.nn.utils.clip_grad_norm_(before.parameters(), 1.0)
    for (name, p0), (_, p1) in zip(before.named_parameters(), model.named_parameters(), strict=True):
        torch.testing.assert_close(p1.detach().double(), p0.detach() - LR * p0.grad, atol=2e-6, rtol=0, msg=name)
    if variant == "mask":  # the mismatch is measured over the tokens trained on
        assert not any(k.startswith("mismatch/abs_logprob_diff_staleness") for k in stats)
    else:  # the older the weights that sampled a token, the further the trainer is from its behaviour logprob
        assert stats["mismatch/abs_logprob_diff_staleness_2"] > stats["mismatch/abs_logprob_diff_staleness_1"] > 0
        assert stats["mismatch/abs_logprob_diff_staleness_0"] < 1e-5


def _counted(method, calls: list):
    def counted(self, *args, **kwargs):
        calls.append(1)
        return method(self, *args, **kwargs)

    return counted


def test_completions_without_segments_count_as_current():
    """Completions built outside the rollout phase (no segments recorded) are trained as current: staleness 0."""
    from grpo_fast.trainer.staleness import staleness_metrics

    comps = [Completion([5, 6, 7]), Completion([5], segments=[(0, 1)])]
    assert token_staleness(comps, 2, 4).tolist() == [[0, 0, 0, 0], [1, 0, 0, 0]]
    metrics = staleness_metrics(comps, 2)
    assert metrics["rollout/token_share_staleness_0"] == 0.75 and metrics["rollout/staleness_max"] == 1


@pytest.mark.parametrize("mode", ["partial", "async"])
@pytest.mark.parametrize("correction", ["decoupled", "none"])
def test_old_logprobs_from_the_rollout_is_refused_where_it_would_replace_the_correction(mode, correction):
    """grpo.old_logprobs 'rollout' takes the behaviour logprobs as the old policy: the coupled correction. With the
    decoupled correction (the default) or none it would silently train coupled; the config names both keys."""
    overrides = [f"rollout.mode={mode}", f"rollout.partial.correction={correction}", "grpo.old_logprobs=rollout"]
    with pytest.raises(ValueError, match="grpo.old_logprobs.*rollout.partial.correction"):
        load_config(None, overrides)
    coupled = load_config(None, [f"rollout.mode={mode}", "rollout.partial.correction=coupled", overrides[-1]])
    assert step_correction(coupled).old_from_rollout
