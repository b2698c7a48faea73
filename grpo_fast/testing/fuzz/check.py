"""One fuzz case checked: every quantity of the backend under test against the fp64 oracle.

The bound of each quantity is the tolerance rule's (grpo_fast.testing.tolerance: twice the peer's error plus
ATOL[dtype] · max(1, max |oracle|)), with two adjustments where the rule's assumptions fail, both stated here:

  * the peer's error is the largest over PEER_ORDERINGS evaluations of PyTorch in the case's precision (the
    plain one and re-ordered ones, grpo_fast.testing.fuzz.orderings): one evaluation is one draw of a rounding
    error, which for an ill-conditioned quantity can fall far below its usual size. Where the peer in the
    case's dtype is not finite but the oracle is (fp16: the naive path's fp16 GEMM writes logits above 65504
    as inf), the peer runs in fp32 on the same values (a stricter bound), recorded in `Check.peer`;
  * a slack for quantities computed from terms much larger than themselves (their conditioning,
    grpo_fast.testing.fuzz.scales): 16 ulps of the accumulation precision (fp32; fp64 for fp64 cases) of all
    those terms, plus one ulp of the input precision of the gradients' terms dz where the input dtype is
    narrower (bf16 / fp16: dz rounded to it before its GEMM, at most half an ulp each, and the result's own
    rounding, at most another half).
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field

import torch

from ...loss import GRPOLossConfig
from ..tolerance import max_error, rule_bound
from .cases import draw_params
from .inputs import DTYPES, build
from .oracle import reference_outputs
from .orderings import reordered, restore
from .run import run_entry_point
from .scales import conditioning_scales

PEER_ORDERINGS = 4  # evaluations of the peer: the plain one and 3 re-ordered ones
CONDITIONING_ULPS = 16  # of the accumulation precision, on the terms a quantity is computed from


@dataclass(frozen=True)
class Check:
    """One quantity of a case: max |actual − oracle| and its bound (the rule's own, plus the slack)."""

    name: str  # "loss", "logp", "entropy", "metric/<TRL name>", "grad/<leaf>"
    error: float
    rule: float  # the tolerance rule's bound
    slack: float  # what the quantity's conditioning adds to it
    peer: str  # the dtype the peer ran in

    @property
    def bound(self) -> float:
        return self.rule + self.slack

    @property
    def category(self) -> str:
        """ "grad", "metric" or "loss" (the loss; fused_logprobs' logprobs and entropies)."""
        return self.name.split("/")[0] if "/" in self.name else "loss"

    @property
    def ratio(self) -> float:
        """error / bound: at most 1 passes (inf for a non-finite result)."""
        return self.error / self.bound if math.isfinite(self.error) else math.inf


@dataclass
class CaseResult:
    """A case's parameters (as built), its checks, and the exception it raised (None if it ran)."""

    params: dict
    checks: list[Check] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.error is not None or any(not c.ratio <= 1.0 for c in self.checks)

    def failures(self) -> list[str]:
        """What failed, one line each."""
        lines = [] if self.error is None else [self.error]
        for c in self.checks:
            if not c.ratio <= 1.0:
                lines.append(f"{c.name}: error {c.error:.3g} > bound {c.bound:.3g} (peer in {c.peer})")
        return lines


def run_case(backend: str, seed: int) -> CaseResult:
    """Build case (backend, seed), run it and check it; an exception is the case's failure, not the caller's."""
    start = time.perf_counter()
    result = CaseResult(params=draw_params(backend, seed))
    try:
        result.params, inputs = build(backend, seed)
        result.checks = check_case(result.params, inputs)
    except Exception as err:  # noqa: BLE001 - a crash of the code under test is a failing case
        frame = traceback.extract_tb(err.__traceback__)[-1]
        result.error = f"{type(err).__name__}: {err} (at {frame.filename}:{frame.lineno})"
    result.seconds = time.perf_counter() - start
    return result


def check_case(params: dict, inputs) -> list[Check]:
    """The checks of every quantity of the case; raises when the backend's quantities are not the oracle's."""
    dtype = DTYPES[params["dtype"]]
    accumulation = torch.float64 if dtype == torch.float64 else torch.float32
    actual = run_entry_point(params, inputs)
    oracle, trace = reference_outputs(params, inputs, torch.float64)
    if set(actual) != set(oracle):
        raise AssertionError(f"quantities {sorted(actual)} differ from the reference's {sorted(oracle)}")
    for name, value in oracle.items():
        if not bool(torch.isfinite(value).all()):
            raise AssertionError(f"case generator: the oracle's {name} is not finite")
    scales = conditioning_scales(inputs, GRPOLossConfig(**params["config"]), trace, params["seed"])
    peer, peer_dtype = _peer(params, inputs, dtype, oracle)
    checks = []
    for name, want in oracle.items():
        got = actual[name]
        if got.shape != want.shape:
            raise AssertionError(f"{name}: shape {list(got.shape)}, expected {list(want.shape)}")
        slack = _slack(name, scales, dtype, accumulation)
        rule = rule_bound(peer[name], want, dtype)
        checks.append(Check(name, _error(got, want), rule, slack, str(peer_dtype).removeprefix("torch.")))
    return checks


def _slack(name: str, scales, dtype: torch.dtype, accumulation: torch.dtype) -> float:
    terms, dz_terms = scales.accumulation.get(name, 0.0), scales.input.get(name, 0.0)
    slack = CONDITIONING_ULPS * torch.finfo(accumulation).eps * (terms + dz_terms)
    return slack + (torch.finfo(dtype).eps * dz_terms if dtype != accumulation else 0.0)


def _peer(params, inputs, dtype, oracle) -> tuple[dict[str, torch.Tensor], torch.dtype]:
    """The peer's quantities, each the farthest from the oracle over PEER_ORDERINGS evaluations; in fp32
    where the case dtype's are not finite (fp64 cases: the oracle itself, error 0)."""
    if dtype == torch.float64:
        return oracle, dtype
    for peer_dtype in (dtype, torch.float32):
        evaluations = [reference_outputs(params, inputs, peer_dtype)[0]]
        for index in range(1, PEER_ORDERINGS):
            case, maps = reordered(inputs, params["seed"] * PEER_ORDERINGS + index)
            evaluations.append(restore(reference_outputs(params, case, peer_dtype)[0], maps))
        if all(bool(torch.isfinite(v).all()) for peer in evaluations for v in peer.values()):
            break
    farthest = {
        name: max((peer[name] for peer in evaluations), key=lambda value, want=want: max_error(value, want))
        for name, want in oracle.items()
    }
    return farthest, peer_dtype


def _error(actual: torch.Tensor, oracle: torch.Tensor) -> float:
    """max |actual − oracle|; inf when actual is not finite."""
    if actual.numel() and not bool(torch.isfinite(actual).all()):
        return math.inf
    return max_error(actual, oracle)
