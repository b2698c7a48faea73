"""Reward functions by name, so that a YAML run can combine any of them with options:

    reward:
      funcs: [math_accuracy, think_format, {name: overlong_penalty, max_completion_length: 512, overlong_buffer: 128}]
      weights: [1.0, 0.2, 1.0]

A spec is a callable (used as is), a name, or a mapping {"name": ..., <option>: <value>, ...}; the
options are bound with functools.partial (picklable, so the function can run in a RewardPool
worker) and must be keyword parameters of the function. A name is a built-in below, one declared with
`@reward("name", ...)`, or "package.module:function"; a string with a "/" that is none of these is, as in TRL, a
learned reward model's hub name or directory ({"name": "reward_model", "path": ...}).

    @reward("my_accuracy", kind="accuracy", range=(0.0, 1.0), samples=[Sample("right", "4", {"answer": "4"}, True),
                                                                     Sample("wrong", "5", {"answer": "4"}, False)])
    def my_accuracy(prompts, completions, answer, **_): ...

declares the function's kind, range and self-test samples (grpo_fast.rewards.self_test, read by the launch
checklist) on the function object itself and registers it under the name.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from grpo_fast.registry import Registry, callable_contract
from grpo_fast.rewards.columns import RewardFunc
from grpo_fast.rewards.self_test import RewardInfo, Sample

REWARD_FUNCTIONS = Registry(
    "reward function",
    {
        "math_accuracy": "grpo_fast.rewards.math_answer:math_accuracy",
        "code_tests": "grpo_fast.rewards.code.reward:code_tests",
        "think_format": "grpo_fast.rewards.format:think_format",
        "overlong_penalty": "grpo_fast.rewards.length:overlong_penalty",
        "length_penalty": "grpo_fast.rewards.length:length_penalty",
        "json_schema": "grpo_fast.rewards.json_validation:json_schema",
        "sql_execution": "grpo_fast.rewards.sql:sql_execution",
        "language_consistency": "grpo_fast.rewards.language:language_consistency",
        "exact_match": "grpo_fast.rewards.tasks:exact_match_reward",
        "countdown": "grpo_fast.rewards.tasks:countdown_reward",
        "reward_model": "grpo_fast.rewards.reward_model:reward_model",
    },
    contract=callable_contract("reward function"),
)


def reward(
    name: str | None = None,
    *,
    kind: str,
    range: tuple[float, float] | Callable[[Mapping[str, Any]], tuple[float, float]],  # noqa: A002 (the option's name)
    samples: Iterable[Sample] = (),
    batch_option: str | None = None,
) -> Callable[[RewardFunc], RewardFunc]:
    """Decorator: declare a reward function's kind ("accuracy", "format", "length" or "other"), its range (lowest,
    highest) — or a function of its bound options giving it — and its self-test samples; with a `name`, also
    register it in REWARD_FUNCTIONS (a name is registered once). batch_option: the name of its option that sets
    how many completions one call may score together in the reward pool (a model that scores in batches);
    without it the pool calls it once per completion."""
    reward_range = range if callable(range) else (lambda _options, bounds=tuple(range): bounds)
    info = RewardInfo(kind, reward_range, tuple(samples), batch_option)

    def declare(fn: RewardFunc) -> RewardFunc:
        if batch_option is not None and batch_option not in inspect.signature(fn).parameters:
            raise ValueError(f"reward {fn.__name__!r}: batch_option {batch_option!r} is not one of its parameters")
        fn.reward_info = info
        if name is not None:
            REWARD_FUNCTIONS.register(name, fn)
        return fn

    return declare


def reward_from_spec(spec: Any) -> RewardFunc:
    """The reward function a spec describes (see module doc); ValueError naming what is wrong."""
    if callable(spec):
        return spec
    if isinstance(spec, str) and spec not in REWARD_FUNCTIONS and "/" in spec and ":" not in spec:
        return reward_from_spec({"name": "reward_model", "path": spec})  # TRL's spelling: a model's hub name or path
    if isinstance(spec, str):
        return _checked(REWARD_FUNCTIONS.get(spec), spec)
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        options = {k: v for k, v in spec.items() if k != "name"}
        fn = _checked(REWARD_FUNCTIONS.get(spec["name"]), spec["name"])
        _check_options(fn, spec["name"], options)
        return functools.partial(fn, **options) if options else fn
    raise ValueError(f"reward function: expected a callable, a name or {{name: ..., options}}, got {spec!r}")


def _checked(fn: Any, name: str) -> RewardFunc:
    if not callable(fn):
        raise ValueError(f"reward function {name!r}: {fn!r} is not callable")
    return fn


CALL_ARGUMENTS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra", "environments"}
)
"""What the trainer passes a reward function at each call (as TRL does): never a spec's option."""


def _check_options(fn: RewardFunc, name: str, options: Mapping[str, Any]) -> None:
    params = inspect.signature(fn).parameters
    keyword = {n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    known = keyword - CALL_ARGUMENTS
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"reward function {name!r}: unknown option(s) {unknown}; its options: {sorted(known)}")
