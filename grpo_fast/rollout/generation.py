"""How a step's completions are produced from its dataset rows: the `Rollouts` contract and its two simplest
forms, one engine call (`SingleTurn`) and a user's own rollout function (`CustomRollouts`, TRL's `rollout_func`).
Multi-turn rollouts with tools are grpo_fast.rollout.multi_turn.MultiTurn.

Every form returns a `RolloutOutput`: for each row, `sampling.n` completions in a row, each with the prompt ids it
was generated from (they differ within a group when an environment's reset adds to the prompt), and the extra
per-completion columns its reward functions receive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec
from grpo_fast.rollout.prompts import PromptEncoder


@dataclass
class RolloutOutput:
    """[R * n] completions of R rows, row by row; prompt_ids [R * n]; columns: name -> [R * n] values for the
    reward functions (TRL's extra fields of rollout_func); seconds_tools: wall-clock seconds spent running tools."""

    prompt_ids: list[list[int]]
    completions: list[Completion]
    columns: dict[str, list] = field(default_factory=dict)
    seconds_tools: float = 0.0


class Rollouts(Protocol):
    def generate(
        self, engine: RolloutEngine, rows: Sequence[dict], sampling: SamplingSpec, keys: Sequence[int] | None = None
    ) -> RolloutOutput:
        """`sampling.n` completions of each of `rows`; `keys` (the rows' dataset indices) let prompt ids be cached."""
        ...


@dataclass
class SingleTurn:
    """One engine call: a prompt's ids, its n completions."""

    prompts: PromptEncoder

    def generate(self, engine, rows, sampling, keys=None) -> RolloutOutput:
        ids = [self.prompts.row_ids(row, key) for row, key in zip(rows, keys or [None] * len(rows), strict=True)]
        groups = engine.generate(ids, sampling)
        return RolloutOutput([p for p in ids for _ in range(sampling.n)], [c for g in groups for c in g])


@dataclass
class CustomRollouts:
    """TRL's `rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids", "logprobs", ...}`: called with the
    prompt of every rollout (each row's repeated n times, TRL's layout), it returns one entry per rollout in each
    list. Optional "env_mask" (1: a token the model sampled, 0: one inserted, e.g. an environment's feedback)
    masks the inserted tokens out of the loss; every other key is a column for the reward functions. `call` is the
    function with the trainer bound."""

    call: Callable[[list], dict]
    tokenizer: object
    stop_ids: tuple[int, ...]

    def generate(self, engine, rows, sampling, keys=None) -> RolloutOutput:
        prompts = [row["prompt"] for row in rows for _ in range(sampling.n)]
        out = self.call(prompts)
        if not isinstance(out, dict):
            raise ValueError(f"rollout_func: expected a dict, got {type(out).__name__}")
        missing = sorted({"prompt_ids", "completion_ids", "logprobs"} - set(out))
        if missing:
            raise ValueError(f"rollout_func: its output lacks {missing} (it returned {sorted(out)})")
        n = len(prompts)
        for key, values in out.items():
            if not isinstance(values, (list, tuple)) or len(values) != n:
                got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
                raise ValueError(f"rollout_func: {key!r} must hold one entry per rollout ({n}), got {got}")
        masks = out.get("env_mask") or [None] * n
        completions = []
        for i, (ids, lps, mask) in enumerate(zip(out["completion_ids"], out["logprobs"], masks, strict=True)):
            ids, lps = list(ids), [float(x) for x in (lps or [])]
            if lps and len(lps) != len(ids):
                raise ValueError(f"rollout_func: rollout {i} has {len(ids)} completion ids but {len(lps)} logprobs")
            if mask is not None and len(mask) != len(ids):
                raise ValueError(f"rollout_func: rollout {i} has {len(ids)} completion ids but {len(mask)} env_mask")
            finish = "stop" if ids and ids[-1] in self.stop_ids else "length"
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            sampled = [bool(m) for m in mask] if mask is not None else []
            completions.append(Completion(ids, lps, text, finish, sampled=sampled))
        columns = {
            k: list(v) for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask")
        }
        return RolloutOutput([list(p) for p in out["prompt_ids"]], completions, columns)
