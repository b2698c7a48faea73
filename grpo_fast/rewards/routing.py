"""Per-row routing of reward functions: a spec's `when: {column: value or [values]}`.

DeepSeek-R1's last RL stage scores each prompt with the reward that fits it: a verifier for the rows
with a checkable answer, a learned reward model for the open-ended ones:

    reward:
      funcs:
        - {name: math_accuracy, when: {reward_type: verifiable}}
        - {name: reward_model, path: /models/rm, in_process: true, when: {reward_type: open}}

A routed function scores only the rows whose columns match and gives the others None ("not scored by
it"), so the weighted nansum of the run's rewards (advantages.combine_rewards) combines, for each row,
only the functions that apply to it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_fast.rewards.columns import RewardFunc, call_reward, reward_name


class RoutedReward:
    """`fn` restricted to the rows whose dataset columns match `when`: every column named must match
    (and); a list of values matches any of them (so a column whose values are lists cannot be routed on).

    A top-level class holding the function and the condition, so it pickles for a RewardPool worker. Its
    signature is fn's with the `when` columns required and **columns added: `call_reward` and the pool
    check the columns up front (a missing one is a KeyError naming it) and pass it every column.
    """

    def __init__(self, fn: RewardFunc, when: Mapping[str, Any]) -> None:
        self.fn = fn
        self.__name__ = reward_name(fn)
        if not isinstance(when, Mapping) or not when:
            raise ValueError(f"reward {self.__name__!r}: when: expected {{column: value or [values]}}, got {when!r}")
        self.when = {str(c): tuple(v) if isinstance(v, (list, tuple)) else (v,) for c, v in when.items()}
        empty = sorted(c for c, values in self.when.items() if not values)
        if empty:
            raise ValueError(f"reward {self.__name__!r}: when: no value given for column(s) {empty}")

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Whether this function scores `row` (a dataset row); KeyError naming a `when` column it lacks."""
        self._check_columns(row)
        return all(row[c] in values for c, values in self.when.items())

    def _check_columns(self, available: Mapping[str, Any]) -> None:
        missing = [c for c in self.when if c not in available]
        if missing:
            raise KeyError(
                f"reward {self.__name__!r}: when: dataset column(s) {missing} missing; "
                f"available columns: {sorted(available)}"
            )

    @property
    def __signature__(self) -> inspect.Signature:
        sig = inspect.signature(self.fn)
        params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD and p.name not in self.when]
        params += [inspect.Parameter(c, inspect.Parameter.KEYWORD_ONLY) for c in self.when]
        rest = "columns"
        while rest in sig.parameters or rest in self.when:
            rest = f"_{rest}"
        return sig.replace(parameters=[*params, inspect.Parameter(rest, inspect.Parameter.VAR_KEYWORD)])

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float | None]:
        """fn on the matching rows, None for the others. Keyword arguments that are lists or tuples with one
        value per completion are dataset columns (subset with the rows); others (trainer_state) pass as they are."""
        n = len(completions)
        self._check_columns(columns)
        keep = [i for i in range(n) if self.matches({c: columns[c][i] for c in self.when})]
        out: list[float | None] = [None] * n
        if not keep:
            return out
        per_row = {k for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) == n}
        subset = {k: [v[i] for i in keep] if k in per_row else v for k, v in columns.items()}
        values = call_reward(self.fn, [prompts[i] for i in keep], [completions[i] for i in keep], subset)
        for i, value in zip(keep, values, strict=True):
            out[i] = value
        return out


def unrouted(fn: RewardFunc) -> RewardFunc:
    """The function a RoutedReward restricts (what its self-test and declared range are about); fn otherwise."""
    return fn.fn if isinstance(fn, RoutedReward) else fn
