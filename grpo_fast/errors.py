"""Errors shared across the layers."""

from __future__ import annotations


class InfrastructureError(RuntimeError):
    """A failure of grpo_fast's own machinery that no completion can cause (a sandbox or verifier that cannot
    start, an unreachable service): loud, never scored or handed to the model as the completion's doing."""
