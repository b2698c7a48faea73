"""What a run can check about its reward functions before it starts: known-good and known-bad samples
(the verifier self-test), the range of rewards each can give, and whether it pays for correctness or
for form.

Every built-in verifier is declared with its samples where it is defined, adversarial ones included (many
answers listed, the answer outside its slot, forged test output), because a verifier that pays a bad sample as
much as a good one will be learned by the policy. A function of your own declares the same with the
`grpo_fast.rewards.reward` decorator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_fast.rewards.columns import RewardFunc
from grpo_fast.rewards.routing import unrouted

KINDS = ("accuracy", "format", "length", "other")


@dataclass(frozen=True)
class Sample:
    """One self-test case: a completion, the dataset columns of its row, and whether a correct verifier
    must score it above every `good=False` sample of the same function."""

    name: str
    completion: str
    columns: Mapping[str, Any]
    good: bool


@dataclass(frozen=True)
class RewardInfo:
    """kind: "accuracy" (pays for a correct answer), "format", "length" or "other". reward_range: the
    lowest and highest reward, given the function's bound options (±inf when unbounded)."""

    kind: str
    reward_range: Callable[[Mapping[str, Any]], tuple[float, float]]
    samples: tuple[Sample, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")


def info_of(fn: RewardFunc) -> tuple[RewardInfo | None, dict[str, Any]]:
    """(RewardInfo that `fn` — or the function a functools.partial wraps — was declared with, the partial's bound
    options); a routed function (a spec's `when`) is described by the function it routes. Only the function object
    itself is read: a function of your own never inherits a built-in's declaration by sharing its name."""
    fn = unrouted(fn)
    options = dict(getattr(fn, "keywords", None) or {})
    inner = getattr(fn, "func", fn)
    return getattr(inner, "reward_info", None), options
