"""Multi-turn rollouts in rounds (rollout.mode partial and async: grpo_fast.rollout.partial driving the MultiTurn
kind), with the tool agent on a byte-level BPE chat tokenizer: turns continued a few tokens a round are the turns of
one sync generation (greedy), tool results land where the sync rollout puts them, the environments' rewards and the
conversations agree, and only sampled tokens count as sampled by some weights."""

from __future__ import annotations

from collections import Counter

from tool_agent import SLOW_TIMEOUT, TOOLS, CounterEnv

from grpo_fast.rollout.base import Completion, SamplingSpec
from grpo_fast.rollout.chat_turns import ChatFormat
from grpo_fast.rollout.environments import Environments
from grpo_fast.rollout.hf_engine import HFEngine
from grpo_fast.rollout.multi_turn import MultiTurn
from grpo_fast.rollout.partial import PartialOptions, PartialRollouts
from grpo_fast.rollout.prompts import PromptEncoder
from grpo_fast.rollout.texts import CompletionTexts
from grpo_fast.rollout.tools import Tool
from grpo_fast.trainer.config import DataConfig
from grpo_fast.trainer.staleness import staleness_metrics

PROMPTS = ["m", "c", "a", "x", "t"]


def _kind(tok) -> MultiTurn:
    return MultiTurn(
        PromptEncoder(tok, DataConfig()),
        ChatFormat(tok),
        [Tool.of(fn) for fn in TOOLS],
        Environments.of(CounterEnv),
        max_iterations=3,
        max_completion_length=160,
        max_model_len=256,
        timeout=SLOW_TIMEOUT,
    )


def test_turns_continued_over_rounds_are_one_sync_generation(bpe_tool_agent):
    model, tok, _ = bpe_tool_agent
    engine = HFEngine(model, tok)
    rows = [{"prompt": p} for p in PROMPTS]
    greedy = SamplingSpec(n=1, max_tokens=160, temperature=0.0, stop_token_ids=(tok.eos_token_id,), seed=0)
    whole = _kind(tok).generate(engine, rows, greedy)

    kind = _kind(tok)
    spec = lambda max_tokens, seed: SamplingSpec(  # noqa: E731
        n=1, max_tokens=max_tokens, temperature=0.0, stop_token_ids=(tok.eos_token_id,), seed=seed
    )
    pool = PartialRollouts(PartialOptions(segment_tokens=3, groups_in_flight=1), 1, 160, 4, "restart", spec, kind=kind)
    prompt_ids = PromptEncoder(tok, DataConfig()).encode_rows(rows, range(len(rows)), cache=False)
    drawn = iter([(i, prompt_ids[i], rows[i]) for i in range(len(rows))])
    groups, counts = pool.collect(engine, 0, len(rows), lambda k: [next(drawn) for _ in range(k)], seed=0)
    by_row = {g.row: g.members[0] for g in groups}
    turns = sum(c.episode.turns for c in whole.completions)
    assert counts["rounds"] > turns, "turns must span several rounds"
    assert sum(c.episode.calls for c in whole.completions) >= 4, "the agent must call tools"
    for i, sync in enumerate(whole.completions):
        member = by_row[i]
        got = member.completion()
        CompletionTexts(tok)([member.prompt_ids], [got])
        assert member.prompt_ids == whole.prompt_ids[i]
        assert got.token_ids == sync.token_ids and got.sampled == sync.sampled, PROMPTS[i]
        assert got.finish_reason == sync.finish_reason
        assert got.episode.messages == sync.episode.messages and got.text == sync.text
        assert got.episode.environment_reward == sync.episode.environment_reward
        assert [start for start, _ in got.segments] == [0]  # one version: one segment, tool results inside it
    kind.close()


def test_stale_shares_count_sampled_tokens_only():
    """A tool's result is inserted between turns, sampled by no weights: the staleness histogram and the stale share
    count the sampled tokens, whatever version the segment around the result had."""
    # 4 sampled at version 1, 6 inserted, 2 sampled at version 3 (the trainer's): 4 of 6 sampled tokens are stale.
    sampled = [True] * 4 + [False] * 6 + [True] * 2
    c = Completion(list(range(12)), [0.0] * 12, sampled=sampled, segments=[(0, 1), (10, 3)])
    metrics = staleness_metrics([c], version=3)
    assert metrics["rollout/token_share_staleness_2"] == 4 / 6
    assert metrics["rollout/token_share_staleness_0"] == 2 / 6
    assert metrics["rollout/stale_share"] == 4 / 6
    assert Counter(k for k in metrics if "token_share" in k) == Counter(
        ["rollout/token_share_staleness_0", "rollout/token_share_staleness_2"]
    )


def test_a_resumed_pool_restarts_every_rollout_whose_environment_was_not_saved(bpe_tool_agent):
    """A checkpoint keeps the rollouts under way as plain data, never an environment instance: after a resume the
    finished members of groups still in flight start again too (their reward functions would read environments
    None: TRL's `[env.value for env in environments]` raised on each)."""
    model, tok, _ = bpe_tool_agent
    engine = HFEngine(model, tok)
    rows = [{"prompt": p} for p in PROMPTS]
    spec = lambda max_tokens, seed: SamplingSpec(  # noqa: E731
        n=1, max_tokens=max_tokens, temperature=1.0, stop_token_ids=(tok.eos_token_id,), seed=seed
    )
    options = PartialOptions(segment_tokens=3, groups_in_flight=1)
    pool = PartialRollouts(options, 2, 160, len(rows), "restart", spec, kind=_kind(tok))
    prompt_ids = PromptEncoder(tok, DataConfig()).encode_rows(rows, range(len(rows)), cache=False)
    pool.start([(i, prompt_ids[i], rows[i]) for i in range(len(rows))])
    for version in range(8):  # until some members have finished and some have not
        pool.round(engine, version, seed=version, counts=Counter())
        members = [m for g in pool.groups for m in g.members]
        if any(not m.running for m in members) and any(m.running for m in members):
            break
    finished = sum(not m.running for g in pool.groups for m in g.members)
    assert finished, "the test needs finished members in flight"

    resumed = PartialRollouts(options, 2, 160, len(rows), "restart", spec, kind=_kind(tok))
    resumed.load_state_dict(pool.state_dict())
    for member in (m for g in resumed.groups for m in g.members):
        assert member.running and not member.token_ids and member.episode.environment is not None
    for kind in (pool.kind, resumed.kind):
        kind.close()
