"""Partial rollouts (grpo_fast.rollout.partial) with real engines: a completion continued over rounds is the
completion generated in one go (greedy; and under sampling its behaviour logprobs are the policy's own given
the whole prefix), every token's weight version is recorded, the staleness bound holds exactly, a group is
handed out only whole, and the state survives a checkpoint as plain data."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
import torch

from grpo_fast.core.policy import build_sequence_batch, completion_logprobs
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.hf_engine import HFEngine
from grpo_fast.rollout.partial import PartialOptions, PartialRollouts
from grpo_fast.rollout.weight_sync import trainer_weights
from grpo_fast.trainer.staleness import staleness_metrics, token_staleness

TOK = build_char_tokenizer()
PROMPTS = [TOK("12+7=")["input_ids"], TOK("3*9=")["input_ids"], TOK("40-6=")["input_ids"], TOK("5*5=")["input_ids"]]


def _pool(
    g: int,
    max_len: int,
    segment: int,
    temperature: float,
    max_staleness: int = 4,
    stale: str = "restart",
    in_flight: float = 1.0,
) -> PartialRollouts:
    options = PartialOptions(segment_tokens=segment, groups_in_flight=in_flight)
    return PartialRollouts(
        options,
        g,
        max_len,
        max_staleness,
        stale,
        lambda max_tokens, seed: SamplingSpec(n=1, max_tokens=max_tokens, temperature=temperature, seed=seed),
    )


def _drawer():
    """draw(k) over PROMPTS in turn (row = index into PROMPTS, cycling), counting what was drawn."""
    drawn = Counter()

    def draw(k):
        out = []
        for _ in range(k):
            row = sum(drawn.values()) % len(PROMPTS)
            drawn[row] += 1
            out.append((row, PROMPTS[row]))
        return out

    return draw, drawn


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(TOK, seed=3)


def _continued_equals_whole(engine, length: int, segment: int) -> None:
    whole = engine.generate(PROMPTS[:2], SamplingSpec(n=1, max_tokens=length, temperature=0.0))
    pool = _pool(1, length, segment, temperature=0.0)
    draw, _ = _drawer()
    groups, counts = pool.collect(engine, version=0, needed=2, draw=draw, seed=0)
    assert counts["rounds"] > 1, "the test must continue completions over several rounds"
    for group, (expected,) in zip(sorted(groups, key=lambda g: g.row), whole, strict=True):
        got = group.members[0]
        assert got.token_ids == expected.token_ids
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(expected.logprobs), atol=1e-4, rtol=0)
        assert got.finish_reason == expected.finish_reason


def test_hf_continuation_equals_one_generation(model):
    _continued_equals_whole(HFEngine(model, TOK), length=17, segment=5)


def test_vllm_continuation_equals_one_generation(vllm_engine, model):
    vllm_engine.load_weights(trainer_weights(model))
    _continued_equals_whole(vllm_engine, length=17, segment=5)


def test_vllm_sampled_continuation_is_conditioned_on_its_whole_prefix(vllm_engine, model):
    """Sampled over rounds of 3 tokens, each token's behaviour logprob is the policy's logprob of it after the
    prompt and every earlier token (fp32 teacher forcing): a continuation that lost or re-tokenised part of its
    prefix would sample from another distribution."""
    vllm_engine.load_weights(trainer_weights(model))
    pool = _pool(4, 20, 3, temperature=1.0)
    draw, _ = _drawer()
    groups, counts = pool.collect(vllm_engine, version=0, needed=2, draw=draw, seed=11)
    completions = [m.completion() for g in groups for m in g.members]
    prompts = [g.prompt_ids for g in groups for _ in g.members]
    assert counts["rounds"] > 2 and max(len(c.token_ids) for c in completions) > 6
    batch = build_sequence_batch(prompts, [c.token_ids for c in completions], TOK.pad_token_id)
    with torch.no_grad():
        trainer_lp = completion_logprobs(model, batch)
    for i, c in enumerate(completions):
        torch.testing.assert_close(torch.tensor(c.logprobs), trainer_lp[i, : len(c.token_ids)], atol=2e-4, rtol=0)


def test_versions_are_recorded_per_segment(model):
    """Completions started at version 0 and continued at 1 and 2 carry (start, version) segments that tile
    their tokens; token staleness and the step metrics read them back."""
    engine = HFEngine(model, TOK)
    pool = _pool(2, 24, 4, temperature=1.0, in_flight=3.0)
    draw, _ = _drawer()
    handed = []
    for version in range(6):
        groups, _ = pool.collect(engine, version=version, needed=1, draw=draw, seed=version)
        handed += [(version, g) for g in groups]
    continued = [(v, m) for v, g in handed for m in g.members if len({ver for _, ver in m.segments}) > 1]
    assert continued, "some completion must span versions"
    for version, group in handed:
        for m in group.members:
            starts = [s for s, _ in m.segments]
            versions = [v for _, v in m.segments]
            assert starts[0] == 0 and starts == sorted(set(starts)) and starts[-1] < len(m.token_ids)
            assert versions == sorted(set(versions)) and versions[-1] <= version  # one segment per version
        comps = [m.completion() for m in group.members]
        width = max(len(c.token_ids) for c in comps)
        stale = token_staleness(comps, version, width)
        for row, c in enumerate(comps):
            for (start, v), end in zip(c.segments, [s for s, _ in c.segments[1:]] + [len(c.token_ids)], strict=True):
                assert (stale[row, start:end] == version - v).all()
        metrics = staleness_metrics(comps, version)
        assert metrics["rollout/staleness_max"] == max(version - c.segments[0][1] for c in comps)
        assert sum(v for k, v in metrics.items() if "token_share" in k) == pytest.approx(1.0)


@pytest.mark.parametrize("stale", ["restart", "drop"])
def test_staleness_bound_is_never_exceeded_and_groups_are_whole(model, stale):
    engine = HFEngine(model, TOK)
    max_staleness, g = 1, 3
    pool = _pool(g, 24, 2, temperature=1.0, max_staleness=max_staleness, stale=stale, in_flight=3.0)
    draw, drawn = _drawer()
    totals, handed = Counter(), 0
    for version in range(6):
        groups, counts = pool.collect(engine, version=version, needed=1, draw=draw, seed=version)
        totals.update(counts)
        handed += len(groups)
        assert len(groups) == 1
        for group in groups:
            assert len(group.members) == g and group.done
            assert all(m.finish_reason in ("stop", "length") for m in group.members)
            assert version - group.oldest_version(version) <= max_staleness
            assert group.prompt_ids == PROMPTS[group.row]
    assert totals["restarted" if stale == "restart" else "dropped"] > 0, "the bound must have been exercised"
    # Every group started is handed out, still under way, or dropped: none lost, none twice.
    assert sum(drawn.values()) == totals["started"] == handed + len(pool.groups) + totals["dropped"]


def test_state_is_plain_data_and_round_trips(model):
    engine = HFEngine(model, TOK)
    pool = _pool(2, 16, 3, temperature=1.0, in_flight=3.0)
    draw, _ = _drawer()
    pool.collect(engine, version=0, needed=1, draw=draw, seed=0)
    assert any(not g.done for g in pool.groups)
    state = json.loads(json.dumps(pool.state_dict()))
    again = _pool(2, 16, 3, temperature=1.0, in_flight=3.0)
    again.load_state_dict(state)
    assert again.groups == pool.groups


def test_long_completions_are_not_starved(model):
    """Short completions can fill a step's groups in its first round; the step still runs min_rounds rounds, so a
    completion that needs the whole length finishes within max_staleness steps and is never restarted."""
    stops = tuple(TOK.convert_tokens_to_ids(list("012")))
    options = PartialOptions(segment_tokens=2, groups_in_flight=2.0, hand_out="oldest")  # nothing waits past the bound
    pool = PartialRollouts(
        options, 2, 16, 2, "restart",
        lambda max_tokens, seed: SamplingSpec(n=1, max_tokens=max_tokens, temperature=1.0, seed=seed,
                                              stop_token_ids=stops),
    )  # fmt: skip
    assert pool.min_rounds == 4
    engine, (draw, _), totals, lengths = HFEngine(model, TOK), _drawer(), Counter(), []
    for version in range(8):
        groups, counts = pool.collect(engine, version=version, needed=1, draw=draw, seed=version)
        totals.update(counts)
        assert counts["rounds"] >= pool.min_rounds
        lengths += [len(m.token_ids) for g in groups for m in g.members]
    assert max(lengths) == 16 and min(lengths) < 8, "the test needs short and full-length completions"
    assert totals["restarted"] == 0


def _hand_out_run(
    model, hand_out: str, steps: int = 6, max_len: int = 4, segment: int = 64, stops=()
) -> tuple[list[float], Counter, list]:
    """Steps of a pool with the default over-provisioning (groups_in_flight 2, max_staleness 4) on completions that
    finish within a round: each step's share of handed-out sampled tokens from older weights, the counts, and the
    handed-out completions' lengths."""
    options = PartialOptions(segment_tokens=segment, groups_in_flight=2.0, hand_out=hand_out)
    spec = lambda max_tokens, seed: SamplingSpec(  # noqa: E731
        n=1, max_tokens=max_tokens, temperature=1.0, seed=seed, stop_token_ids=stops
    )
    pool = PartialRollouts(options, 2, max_len, 4, "restart", spec)
    engine, (draw, _), shares, totals, lengths = HFEngine(model, TOK), _drawer(), [], Counter(), []
    for version in range(steps):
        groups, counts = pool.collect(engine, version=version, needed=2, draw=draw, seed=version)
        totals.update(counts)
        comps = [m.completion() for g in groups for m in g.members]
        shares.append(staleness_metrics(comps, version)["rollout/stale_share"])
        lengths += [len(c.token_ids) for c in comps]
    return shares, totals, lengths


def test_oldest_first_trains_last_steps_leftovers_and_freshest_first_trains_fresh_groups(model):
    """No long tail (four tokens, one round): over-provisioned groups complete in the same round as the step's own.
    Oldest first then trains only the last step's leftovers (every token one version old); freshest first trains
    the groups completed this step, and the leftovers wait (restarted past the bound); bounded holds the share."""
    oldest, _, _ = _hand_out_run(model, "oldest")
    assert oldest[1:] == [1.0] * 5
    freshest, totals, _ = _hand_out_run(model, "freshest")
    assert freshest == [0.0] * 6 and totals["restarted"] > 0
    bounded, _, _ = _hand_out_run(model, "bounded")
    assert max(bounded) <= 0.5 + 1e-9 and max(bounded[1:]) > 0


def test_freshest_first_never_starves_long_completions(model):
    """A completion that runs several steps is fresh when it completes: freshest first trains it then (the
    completions passed over are short ones that completed earlier)."""
    stops = tuple(TOK.convert_tokens_to_ids(list("012")))
    _, _, lengths = _hand_out_run(model, "freshest", steps=10, max_len=16, segment=2, stops=stops)
    assert max(lengths) == 16 and min(lengths) < 8


class _WithoutLogprobs(HFEngine):
    """An engine (a plug-in's, say) that returns no sampling logprobs."""

    def generate(self, prompt_ids, sampling):
        groups = super().generate(prompt_ids, sampling)
        return [[dataclasses.replace(c, logprobs=[]) for c in group] for group in groups]


def test_an_engine_without_logprobs_gives_completions_without_them_not_zeros(model):
    """As in one sync call: no behaviour logprobs, so the loss has none to correct against (zeros made every token
    look 400x less likely to the engine than to the trainer)."""
    pool = _pool(2, 12, 4, temperature=1.0)
    draw, _ = _drawer()
    groups, counts = pool.collect(_WithoutLogprobs(model, TOK), version=0, needed=2, draw=draw, seed=0)
    assert counts["rounds"] > 1
    completions = [m.completion() for g in groups for m in g.members]
    assert all(c.token_ids and c.logprobs == [] for c in completions)
