"""The messages between a trainer and its engine processes (rollout.mode async), one dataclass each. Every queue of
the link carries its own kinds (grpo_fast.rollout.engine_link.Channel), checked field by field on arrival:

    "groups"      engine -> trainer    FROM_ENGINE: Ready, Group, Failure
    "prompts/k"   trainer -> engine k  PROMPTS: Prompt
    "control/k"   trainer -> engine k  CONTROL: Weights, Stop
"""

from __future__ import annotations

from dataclasses import dataclass

PER_TOKEN = {"logprobs": ((float, int), True), "sampled": ((bool,), True)}  # empty: none (an engine without them)
"""A group member's lists that hold an item per token of its token_ids: (item types, whether it may be empty
instead, e.g. `sampled`'s "every token was sampled")."""
MEMBER_FIELDS = ("token_ids", "logprobs", "segments", "finish_reason")


@dataclass(frozen=True)
class Ready:
    """The engine process holds the trainer's weights and generates."""


@dataclass(frozen=True)
class Group:
    """A complete group, as PartialRollouts.group_state writes it, and the engine's counts since its last group
    ("generated_tokens", "busy_seconds", ...)."""

    state: dict
    counts: dict

    def __post_init__(self) -> None:
        check_group_state(self.state)
        bad = next((k for k, v in self.counts.items() if type(v) not in (int, float) or not isinstance(k, str)), None)
        if bad is not None:
            raise ValueError(f"group counts: {bad!r} is not a count")


@dataclass(frozen=True)
class Failure:
    """The engine process failed; its traceback."""

    traceback: str


@dataclass(frozen=True)
class Prompt:
    """A prompt to start a group from: its dataset row's index and token ids, and the row itself for a rollout kind
    that reads it (`Rollouts.reads_rows`: its chat messages, an environment's reset)."""

    row: int
    prompt_ids: list[int]
    data: dict | None = None


@dataclass(frozen=True)
class Weights:
    """New weights follow over the weights' process group, as `version`."""

    version: int


@dataclass(frozen=True)
class Stop:
    """The run ends: the engine process finishes its round and exits."""


FROM_ENGINE = (Ready, Group, Failure)
PROMPTS = (Prompt,)
CONTROL = (Weights, Stop)


def check_group_state(state: dict) -> None:
    """ValueError naming the field when `state` is not a complete group: its row, prompt ids and members, each with
    token ids, per-token lists of as many items (PER_TOKEN), a text, segments [first token, version] in order
    within its tokens, and a finish reason. Further fields (what a group comes to carry) pass as the plain data
    the link's codec allows."""
    _require(state, ("row", "prompt_ids", "members"), "group")
    _expect(type(state["row"]) is int, "group.row", "an int", state["row"])
    _ints(state["prompt_ids"], "group.prompt_ids")
    members = state["members"]
    _expect(isinstance(members, list) and len(members) > 0, "group.members", "a non-empty list", members)
    for i, member in enumerate(members):
        _check_member(member, f"group.members[{i}]")


def _check_member(member: dict, key: str) -> None:
    _require(member, MEMBER_FIELDS, key)
    ids = member["token_ids"]
    _ints(ids, f"{key}.token_ids")
    for name, (kinds, may_be_empty) in PER_TOKEN.items():
        if name not in member:
            continue
        values = member[name]
        ok = isinstance(values, list) and set(map(type, values)) <= set(kinds)
        _expect(ok, f"{key}.{name}", f"a list of {kinds[0].__name__}", values)
        if len(values) != len(ids) and not (may_be_empty and not values):
            raise ValueError(f"{key}.{name}: {len(values)} items for {len(ids)} tokens")
    reason = member["finish_reason"]
    _expect(isinstance(reason, str), f"{key}.finish_reason", "a string (the group is complete)", reason)
    segments = member["segments"]
    pairs = isinstance(segments, list) and all(
        isinstance(s, list) and len(s) == 2 and all(type(x) is int for x in s) for s in segments
    )
    _expect(pairs, f"{key}.segments", "a list of [first token, version] pairs", segments)
    starts = [s[0] for s in segments]
    if starts != sorted(starts) or any(not 0 <= s <= len(ids) for s in starts):
        raise ValueError(f"{key}.segments: first tokens {starts} not in order within its {len(ids)} tokens")


def _require(data, fields: tuple[str, ...], key: str) -> None:
    _expect(isinstance(data, dict), key, "a mapping", data)
    missing = [f for f in fields if f not in data]
    if missing:
        raise ValueError(f"{key}: missing {missing}")


def _ints(values, key: str) -> None:
    _expect(isinstance(values, list) and set(map(type, values)) <= {int}, key, "a list of ints", values)


def _expect(ok: bool, key: str, what: str, value) -> None:
    if not ok:
        raise ValueError(f"{key}: expected {what}, got {type(value).__name__} {str(value)[:80]}")
