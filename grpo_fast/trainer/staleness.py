"""Which weights sampled each token: staleness per completion and per token, from the completions' segments
(grpo_fast.rollout.base.Completion.segments), and the step's staleness metrics.

The staleness of a token is the trainer's weight version minus the version of the segment that sampled it; a
completion's is its oldest token's. Version v is the weights after v trainer steps (each of grpo.num_iterations
optimizer updates), so rollout.max_staleness bounds a token's lag at num_iterations x max_staleness updates. With
rollout.mode sync every token has staleness 0. Only sampled tokens count: a tool's result, inserted between turns,
was sampled by no weights.
"""

from __future__ import annotations

from collections import Counter

import torch

from grpo_fast.rollout.base import Completion


def token_staleness(completions: list[Completion], version: int, width: int) -> torch.Tensor:
    """[B, width] int64: version minus the version of each token's segment (0 past a completion's end and
    where no segments were recorded: an engine outside the trainer's rollout phase)."""
    out = torch.zeros(len(completions), width, dtype=torch.long)
    for i, c in enumerate(completions):
        for start, end, v in _stretches(c, version):
            out[i, start : min(end, width)] = version - v
    return out


def _stretches(c: Completion, version: int) -> list[tuple[int, int, int]]:
    """(start, end, version) of each segment of `c`; without recorded segments, one stretch at `version`."""
    segments = c.segments or [(0, version)]
    ends = [start for start, _ in segments[1:]] + [len(c.token_ids)]
    return [(start, end, v) for (start, v), end in zip(segments, ends, strict=True)]


def staleness_metrics(completions: list[Completion], version: int) -> dict[str, float]:
    """rollout/staleness_mean and _max over completions (each its oldest token's); the histogram,
    rollout/token_share_staleness_<k>, the share of the step's trained sampled tokens k versions old (k present
    only); and rollout/stale_share, the share of them from older weights (every step, 0 when none)."""
    per_completion = [version - c.segments[0][1] if c.segments else 0 for c in completions]
    tokens: Counter = Counter()
    for c in completions:
        for start, end, v in _stretches(c, version):
            tokens[version - v] += sum(c.sampled[start:end]) if c.sampled else end - start
    total = max(sum(tokens.values()), 1)
    out = {
        "rollout/staleness_mean": sum(per_completion) / max(len(per_completion), 1),
        "rollout/staleness_max": float(max(per_completion, default=0)),
        "rollout/stale_share": sum(n for k, n in tokens.items() if k > 0) / total,
    }
    out.update({f"rollout/token_share_staleness_{k}": n / total for k, n in sorted(tokens.items())})
    return out
