"""Verifiable rewards for GRPO / RLVR, in TRL's convention `fn(prompts, completions, **columns) -> list`.

Each reward takes the dataset columns it names (one value per completion) and returns one float, or
None where it cannot judge, per completion. Run them through `RewardPool` / `score_completions` so a
hanging or crashing verifier costs one reward, not the run. See docs/rewards.md.

The names load on first use: importing the package (a reward worker process does) imports no
verifier and none of their dependencies (math-verify, jsonschema).
"""

from grpo_fast.registry import lazy_exports

_EXPORTS = {
    "Failure": "pool",
    "RewardPool": "pool",
    "Scores": "pool",
    "score_completions": "pool",
    "SandboxLimits": "code",
    "code_tests": "code",
    "call_reward": "columns",
    "required_columns": "columns",
    "completion_text": "text",
    "json_schema": "json_validation",
    "language_consistency": "language",
    "length_penalty": "length",
    "overlong_penalty": "length",
    "math_accuracy": "math_answer",
    "sql_execution": "sql",
    "think_format": "format",
    "reward": "registry",
    "Sample": "self_test",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
