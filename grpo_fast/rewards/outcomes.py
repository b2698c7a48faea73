"""How a verifier says that scoring failed, and whose fault it was.

Rule: a failure the completion can cause (its program crashed, hung, answered garbage, broke the
judge) scores as a wrong answer and is counted; a failure it cannot cause (no interpreter, sandbox or
service to run it) is not a score at all, and is loud.

- `ProgramFailure(value, reason)`: a float (the wrong-answer reward, usually 0.0, or the verifier's
  lowest value) that remembers why the completion failed. Anything that reads rewards as floats reads
  it as `value`; `RewardPool` counts it in `Scores.failures` with cause "program".
- `InfrastructureError`: raised by a verifier that cannot score for reasons outside the completion.
  `RewardPool` gives that completion None (skipped) with cause "infrastructure", and raises once more
  than `max_infra_failures` have happened; called directly, the verifier's caller sees the exception.
- `VerifierStartupError`: the verifier's start-up check (a known-correct and a known-wrong sample
  through the real machinery) failed: nothing it would score can be trusted.
- `VerifierConfigError`: the verifier's options or files cannot work (a learned reward model's path that does
  not load): a ValueError naming the option, and an InfrastructureError, so that it is never scored as the
  completions' failure.
"""

from __future__ import annotations

from grpo_fast.errors import InfrastructureError


class ProgramFailure(float):
    """A reward of `value` for a completion that failed by its own doing; `reason` says how."""

    reason: str

    def __new__(cls, value: float = 0.0, reason: str = "") -> ProgramFailure:
        self = super().__new__(cls, value)
        self.reason = reason
        return self

    def __reduce__(self):
        return ProgramFailure, (float(self), self.reason)

    def __repr__(self) -> str:
        return f"ProgramFailure({float(self)!r}, {self.reason!r})"


class VerifierStartupError(InfrastructureError):
    """A verifier's start-up check failed: the message names the check and the cause."""


class VerifierConfigError(VerifierStartupError, ValueError):
    """A verifier's options or files cannot work, whatever it is given to score: the message names the option."""
