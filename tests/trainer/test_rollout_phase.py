"""The rollout phase on its own: a real engine (transformers generation of the tiny model), real reward
functions, DAPO's dynamic sampling replacing the groups whose rewards are all equal, and reward.overlap_chunks
auto splitting generation only while the rewards cost enough to hide."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.rewards.reward_set import RewardSet
from grpo_fast.rollout.hf_engine import HFEngine
from grpo_fast.rollout.prompts import PromptEncoder, stop_token_ids
from grpo_fast.trainer import load_config
from grpo_fast.trainer.data_sampler import PromptSampler
from grpo_fast.trainer.metrics import step_metrics
from grpo_fast.trainer.rollout_phase import RolloutPhase
from grpo_fast.trainer.staleness import staleness_metrics

G = 4


def flat_on_even_prompts(prompts, completions, **_):
    """1.0 for every completion of an even-numbered prompt (a zero-variance group); otherwise 1.0 for the
    completions that repeat their prompt's digit, a reward that varies within a group."""
    return [1.0 if int(p) % 2 == 0 else float(p in c) for p, c in zip(prompts, completions, strict=True)]


def slow_flat_on_even_prompts(prompts, completions, **_):
    """flat_on_even_prompts after 0.2 s per completion: a reward worth overlapping with generation."""
    time.sleep(0.2 * len(completions))
    return flat_on_even_prompts(prompts, completions)


def _phase(
    dynamic: bool, rounds: int = 3, reward=flat_on_even_prompts, mode: str = "sync", workers: int = 2, segment: int = 2
):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=1)
    overrides = [f"rollout.num_generations={G}", "rollout.max_completion_length=6", "run.prompts_per_step=3"]
    overrides += [f"rollout.mode={mode}", f"rollout.partial.segment_tokens={segment}"]
    overrides += [f"grpo.dynamic_sampling={str(dynamic).lower()}", f"grpo.max_resample_rounds={rounds}"]
    cfg = load_config(None, overrides)
    rows = [{"prompt": str(i)} for i in range(10)]
    phase = RolloutPhase(
        cfg,
        rows,
        PromptEncoder(tok, cfg.data),
        RewardSet([reward], workers=workers),
        PromptSampler(len(rows), seed=0),
        stop_token_ids(tok, []),
    )
    return phase, HFEngine(model, tok)


def _groups(values, size=G):
    return [values[i : i + size] for i in range(0, len(values), size)]


def test_batch_is_groups_of_g_with_their_prompts_and_rewards():
    phase, engine = _phase(dynamic=False)
    batch = phase.collect(engine, step=0)
    assert len(batch.completions) == len(batch.prompt_ids) == batch.rewards.numel() == 3 * G
    assert batch.generated == batch.completions and batch.resample_rounds == 0
    for prompts, completions, rewards in zip(
        _groups(batch.prompt_ids), _groups(batch.completions), _groups(batch.rewards), strict=True
    ):
        assert all(p == prompts[0] for p in prompts)
        digit = engine.tokenizer.decode(prompts[0]).strip()
        want = flat_on_even_prompts([digit] * G, [c.text for c in completions])
        torch.testing.assert_close(rewards, torch.tensor(want))
    assert batch.generated_rewards_per_func.shape == (3 * G, 1)


@pytest.mark.parametrize("mode", ["sync", "partial"])
def test_dynamic_sampling_replaces_zero_variance_groups(mode):
    """Sync mode draws new prompts; partial mode takes more complete groups from the rollouts under way (rounds
    run on until they complete)."""
    phase, engine = _phase(dynamic=True, mode=mode)
    batch = phase.collect(engine, step=0)
    kept = _groups(batch.rewards)
    flat = [bool((g == g[0]).all()) for g in kept]
    generated_groups = len(batch.generated) // G
    assert len(kept) == 3
    assert batch.frac_zero_var_groups > 0 and batch.resample_rounds >= 1  # even prompts were drawn and dropped
    assert generated_groups > 3
    # Zero-variance groups are kept only when the rounds ran out without enough others.
    assert not any(flat) or batch.resample_rounds == 3
    assert batch.generated_rewards.numel() == len(batch.generated) == generated_groups * G


class EachRequestSeeded(HFEngine):
    """The transformers engine counted as one that seeds each request (as vLLM does), for the auto split's rule."""

    seeds_each_request = True


@pytest.mark.parametrize(
    ("reward", "engine_class", "calls"),
    [
        (flat_on_even_prompts, EachRequestSeeded, [1, 1, 1]),
        (slow_flat_on_even_prompts, EachRequestSeeded, [1, 2, 2]),
        # It split too: one seed per call, so the samples followed the timing (and a resume, or two ranks, differed).
        (slow_flat_on_even_prompts, HFEngine, [1, 1, 1]),
    ],
    ids=["cheap", "slow", "slow_seeded_per_call"],
)
def test_overlap_chunks_auto_splits_generation_only_for_rewards_worth_hiding(reward, engine_class, calls, caplog):
    """Step 0 generates in one engine call; the cheap reward then scores in-process and generation stays one call,
    the slow one stays in the pool and later rounds split generation in two (logged), with an engine that seeds
    each request. The rewards do not depend on the split."""
    phase, hf = _phase(dynamic=False, reward=reward)
    engine = engine_class(hf.model, hf.tokenizer)
    made, generate = [], engine.generate

    def counted(prompt_ids, sampling):
        made[-1] += 1
        return generate(prompt_ids, sampling)

    engine.generate = counted
    try:
        with caplog.at_level(logging.INFO, logger="grpo_fast.trainer.rollout_phase"):
            for step in range(3):
                made.append(0)
                batch = phase.collect(engine, step=step)
                assert batch.rewards.numel() == 3 * G
    finally:
        phase.rewards.close()
    assert made == calls
    assert ("2 generation call(s) per round from now on" in caplog.text) == (calls[-1] == 2)


def test_partial_generation_rate_counts_the_tokens_generated_this_step():
    """rollout.mode partial generates tokens of more groups than it hands out (groups_in_flight 2), and hands out
    tokens generated in earlier steps: tokens_per_second/generate is the tokens the engine returned during the
    step's generation time, counted here at the engine."""
    phase, engine = _phase(dynamic=False, mode="partial", workers=0)
    returned, generate = [], engine.generate

    def counted(prompt_ids, sampling):
        groups = generate(prompt_ids, sampling)
        returned.append(sum(len(c.token_ids) for group in groups for c in group))
        return groups

    engine.generate = counted
    for step in range(2):
        returned.clear()
        batch = phase.collect(engine, step=step)
        metrics = step_metrics(batch, phase.rewards.names, {"train": 0.0, "sync": 0.0, "step": 1.0})
        assert sum(returned) != sum(len(c.token_ids) for c in batch.completions)
        assert metrics["tokens_per_second/generate"] == pytest.approx(sum(returned) / batch.time_generate)
        counts = ("rounds", "started", "restarted", "dropped", "generated_tokens")  # every step: series without gaps
        assert all(f"rollout/{name}" in metrics for name in counts) and metrics["rollout/dropped"] == 0


def test_partial_defaults_train_fresh_groups_without_a_long_tail():
    """The demo's case: every completion ends within a round, so the over-provisioned groups (groups_in_flight 2)
    complete with the step's own. With the defaults a step trains the groups completed in its own rounds, not the
    last step's leftovers (oldest first trained only those: every token a version old from the second step on)."""
    phase, engine = _phase(dynamic=False, mode="partial", workers=0, segment=64)
    for step in range(4):
        batch = phase.collect(engine, step=step)
        assert staleness_metrics(batch.completions, step)["rollout/token_share_staleness_0"] == 1.0, step
