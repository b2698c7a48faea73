"""Invalid inputs: a valid fuzz case (backend, seed) with one argument made invalid.

The call must raise a ValueError or TypeError whose message names that argument: never another exception (a
crash), never a result. NaN in hidden or weight is not validated (that would read every activation back from the
device on each call); it must propagate: the loss or a metric (fused_logprobs: the logprobs or entropies) comes
out NaN or inf, never all finite. (±inf there can be meaningful, a −inf logit is a banned token, and is not
fuzzed.)

The mutations are those of grpo_fast.testing.fuzz.mutations.
"""

from __future__ import annotations

import random
import time
import traceback
from dataclasses import dataclass

import torch

from .cases import draw_params
from .inputs import build
from .mutations import MUTATIONS
from .run import arguments


@dataclass
class InvalidResult:
    """One invalid-input case: its parameters, the mutation, and what went wrong (None: the expected error)."""

    params: dict
    mutation: str = ""
    failure: str | None = None
    seconds: float = 0.0


def run_invalid_case(backend: str, seed: int) -> InvalidResult:
    """Build case (backend, seed), make one argument invalid, call, and judge the outcome."""
    start = time.perf_counter()
    result = InvalidResult(params=draw_params(backend, seed))
    try:
        result.params, inputs = build(backend, seed)
        rng = random.Random(seed)
        mutations = list(MUTATIONS)
        rng.shuffle(mutations)
        for mutation in mutations:
            drawn = mutation(result.params, inputs, arguments(result.params, inputs), rng)
            if drawn is not None:
                break
        result.mutation, thunk, names = drawn
        result.failure = _judge(thunk, names)
    except Exception as err:  # noqa: BLE001 - building the case failed: the campaign's own failure
        result.failure = f"case generator: {type(err).__name__}: {err}"
    result.seconds = time.perf_counter() - start
    return result


def _judge(thunk, names) -> str | None:
    try:
        out = thunk()
    except (ValueError, TypeError) as err:
        if names is None:
            return f"raised {type(err).__name__}: {err} (expected the NaN to propagate)"
        if not any(name in str(err) for name in names):
            return f"{type(err).__name__} does not name {' or '.join(names)}: {err}"
        return None
    except Exception as err:  # noqa: BLE001 - any other exception is the failure being looked for
        frame = traceback.extract_tb(err.__traceback__)[-1]
        return f"crashed with {type(err).__name__}: {err} (at {frame.filename}:{frame.lineno})"
    if names is not None:
        return f"accepted (expected an error naming {' or '.join(names)})"
    if all(bool(torch.isfinite(value).all()) for value in _results(out)):
        return "NaN in the inputs gave all-finite results"
    return None


def _results(out) -> list[torch.Tensor]:
    """The tensors an entry point returned: logp (and entropy), or the loss and its metrics."""
    if isinstance(out, torch.Tensor):
        return [out]
    first, rest = out
    return [first, *rest.values()] if isinstance(rest, dict) else [first, rest]
