"""Start-up checks of reward functions: a verifier that cannot work must stop a run before it starts.

A function declares one by having a `startup_check(**options)` attribute (called with the options
bound to it, e.g. by a spec's functools.partial); it returns a line that says what it checked (for
the log and the run report) and raises VerifierStartupError when the check fails. `code_tests` has
one: its sandbox, through the real backend, with a known-correct and a known-wrong program.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpo_fast.rewards.columns import RewardFunc, reward_name
from grpo_fast.rewards.routing import unrouted


def check_verifiers(funcs: Sequence[RewardFunc]) -> dict[str, str]:
    """Run the start-up check of every function in `funcs` that has one (routed and partial functions
    included): {function name: what its check says}. Raises VerifierStartupError naming the cause."""
    checked = {}
    for fn in funcs:
        inner = unrouted(fn)
        options = dict(getattr(inner, "keywords", None) or {})
        check = getattr(getattr(inner, "func", inner), "startup_check", None)
        if check is not None:
            checked[reward_name(fn)] = check(**options)
    return checked
