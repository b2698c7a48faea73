"""Verifiable rewards for GRPO / RLVR, in TRL's convention `fn(prompts, completions, **columns) -> list`.

Each reward takes the dataset columns it names (one value per completion) and returns one float, or
None where it cannot judge, per completion. Run them through `RewardPool` / `score_completions` so a
hanging or crashing verifier costs one reward, not the run. See docs/rewards.md.
"""

from grpo_fast.rewards.code import SandboxLimits, code_tests
from grpo_fast.rewards.columns import call_reward, required_columns
from grpo_fast.rewards.format import think_format
from grpo_fast.rewards.json_schema import json_schema
from grpo_fast.rewards.language import language_consistency
from grpo_fast.rewards.length import length_penalty, overlong_penalty
from grpo_fast.rewards.math_answer import math_accuracy
from grpo_fast.rewards.pool import Failure, RewardPool, Scores, score_completions
from grpo_fast.rewards.sql import sql_execution
from grpo_fast.rewards.text import completion_text

__all__ = [
    "Failure",
    "RewardPool",
    "Scores",
    "SandboxLimits",
    "call_reward",
    "code_tests",
    "completion_text",
    "json_schema",
    "language_consistency",
    "length_penalty",
    "math_accuracy",
    "overlong_penalty",
    "required_columns",
    "score_completions",
    "sql_execution",
    "think_format",
]
