"""Start-up checks of reward functions: a verifier that cannot work must stop a run before it starts.

A function declares one by having a `startup_check(**options)` attribute (called with the options
bound to it, e.g. by a spec's functools.partial); it returns a `VerifierStatus` (a line for the log and
the run report, metrics for the run, whether it runs unprotected) and raises VerifierStartupError when
the check fails. `code_tests` has one: its sandbox, through the real backend, with a known-correct and a
known-wrong program.

A function that keeps helpers alive in the calling process between calls (a sandbox set up ahead, a
judge) has a `release()` attribute that stops them; `release_verifiers` calls it when its owner is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from grpo_fast.rewards.columns import RewardFunc, reward_name
from grpo_fast.rewards.routing import unrouted


@dataclass(frozen=True)
class VerifierStatus:
    """What a start-up check found: `text` for the log and the run report; `metrics` the run reports under
    reward/<name>/ at every step (e.g. the sandbox backend in use); `unsafe` when the verifier runs without its
    protection (warned at every run start)."""

    text: str
    metrics: dict[str, float] = field(default_factory=dict)
    unsafe: bool = False


def check_verifiers(funcs: Sequence[RewardFunc]) -> dict[str, VerifierStatus]:
    """Run the start-up check of every function in `funcs` that has one (routed and partial functions
    included): {function name: what its check says}. Raises VerifierStartupError naming the cause."""
    checked = {}
    for fn in funcs:
        inner = unrouted(fn)
        options = dict(getattr(inner, "keywords", None) or {})
        check = _declared(fn, "startup_check")
        if check is not None:
            checked[reward_name(fn)] = check(**options)
    return checked


def release_verifiers(funcs: Sequence[RewardFunc]) -> None:
    """Stop what the functions in `funcs` keep alive in this process between calls (their `release()`)."""
    for release in dict.fromkeys(filter(None, (_declared(fn, "release") for fn in funcs))):
        release()


def _declared(fn: RewardFunc, attribute: str):
    """`attribute` of the function under `fn`'s routing and partial binding, or None."""
    inner = unrouted(fn)
    return getattr(getattr(inner, "func", inner), attribute, None)
