"""The C++/CUDA backend "cuda" on a GPU against the torch backend and the naive reference, at real
shapes (Qwen2.5-7B's lm_head: H=3584, V=152064, bf16, N=4096 tokens). Skipped without CUDA.

Tolerance rule as in tests/backends/test_native.py: error vs the reference <= 2x the torch backend's error in the
same precision + atol (bf16: 2e-3 relative to the largest reference value — bf16 inputs, fp32 GEMM
accumulation; fp32: 1e-5, TF32 off)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from grpo_fast.testing.tolerance import assert_within_rule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def native():
    mod = pytest.importorskip("grpo_fast.backends.native")
    if not mod.built_with_cuda():
        pytest.skip("grpo_fast._C was built without CUDA kernels")
    return mod


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 1001, 4096, 152064])  # tail-only, scalar path (odd), vector path, Qwen2
def test_ops_match_fp64(native, dtype, vocab):
    torch.manual_seed(0)
    rows = 33
    z = (torch.randn(rows, vocab, device="cuda") * 4).to(dtype)
    y = torch.randint(0, vocab, (rows,), device="cuda")
    logp, entropy, lse = torch.ops.grpo_fast.logprob_stats(z, y)
    z64 = z.double()
    log_p = torch.log_softmax(z64, 1)
    ref = (log_p.gather(1, y.view(-1, 1)).view(-1), -(log_p.exp() * log_p).sum(1), torch.logsumexp(z64, 1))
    for a, r in zip((logp, entropy, lse), ref, strict=True):
        assert (a.double() - r).abs().max().item() < 1e-4 * max(1.0, r.abs().max().item())
    gl, gh = torch.randn(rows, device="cuda"), torch.randn(rows, device="cuda")
    gl[0] = gh[0] = 0.0
    dz = z.clone()
    torch.ops.grpo_fast.logprob_grad_(dz, y, lse, entropy, gl, gh)
    z64.requires_grad_(True)
    lp = torch.log_softmax(z64, 1)
    loss = (lp.gather(1, y.view(-1, 1)).view(-1) * gl.double()).sum() - ((lp.exp() * lp).sum(1) * gh.double()).sum()
    (ref_dz,) = torch.autograd.grad(loss, z64)
    tol = 1e-5 if dtype == torch.float32 else 1e-2 * ref_dz.abs().max().item()
    assert (dz.double() - ref_dz).abs().max().item() <= tol + 1e-6
    assert (dz[0] == 0).all()


# Every argument of both ops, each way it can be wrong: a clear error before any launch (the first two GPU runs died
# of a segmentation fault in these cases, the second in every case whose message streamed a shape). Each case in
# its own test, so that `pytest -v` names the one that fails, and all of them called in a child interpreter that is
# started again after a crash, so that one crash does not hide the outcome of the others. make(z, y, v): the
# arguments from a good [4, 10] fp32 tile z, targets y and a row vector v.
def _cuda_ids(n, step=1):
    return torch.randint(0, 10, (n * step,), device="cuda")[::step]


STATS_BAD_INPUTS = {
    "targets on the CPU": (lambda z, y, v: (z, y.cpu()), RuntimeError, "targets: expected device cuda"),
    "logits on the CPU": (lambda z, y, v: (z.cpu(), y), RuntimeError, "logits: expected a CUDA tensor"),
    "fp64 logits": (lambda z, y, v: (z.double(), y), TypeError, "expected dtype torch.float32, torch.float16 or"),
    "int64 logits": (lambda z, y, v: (z.long(), y), TypeError, "expected dtype torch.float32, torch.float16 or"),
    "transposed logits": (lambda z, y, v: (z.t(), _cuda_ids(10)), RuntimeError, "logits: expected a contiguous"),
    "1-d logits": (lambda z, y, v: (z[0], _cuda_ids(10)), ValueError, "expected a 2-d tile"),
    "3-d logits": (lambda z, y, v: (z[None], y), ValueError, "expected a 2-d tile"),
    "empty vocabulary": (lambda z, y, v: (z[:, :0], y), ValueError, "vocabulary of at least 1"),
    "short targets": (lambda z, y, v: (z, y[:3]), ValueError, r"targets: expected shape \[R=4\]"),
    "int32 targets": (lambda z, y, v: (z, y.int()), TypeError, "targets: expected dtype torch.int64"),
    "strided targets": (lambda z, y, v: (z, _cuda_ids(4, 2)), RuntimeError, "targets: expected a contiguous"),
    "softcap past fp32": (lambda z, y, v: (z, y, 1e39), ValueError, r"softcap: .*fp32 range"),
    "softcap NaN": (lambda z, y, v: (z, y, float("nan")), ValueError, "softcap: expected 0"),
    "negative softcap": (lambda z, y, v: (z, y, -1.0), ValueError, "softcap: expected 0"),
}
GRAD_BAD_INPUTS = {  # logprob_grad_(logits, targets, lse, entropy, grad_logp, grad_entropy, softcap)
    "lse on the CPU": (2, lambda v: v.cpu(), RuntimeError, "lse: expected device cuda"),
    "fp64 entropy": (3, lambda v: v.double(), TypeError, "entropy: expected dtype Float"),
    "short grad_logp": (4, lambda v: v[:3], ValueError, r"grad_logp: expected shape \[R=4\]"),
    "strided grad_logp": (4, lambda v: torch.zeros(8, device="cuda")[::2], RuntimeError, "grad_logp: expected a cont"),
    "2-d grad_entropy": (5, lambda v: v[:, None], ValueError, r"grad_entropy: expected shape \[R=4\]"),
    "grad_entropy on the CPU": (5, lambda v: v.cpu(), RuntimeError, "grad_entropy: expected device cuda"),
    "targets on the CPU": (1, lambda v: torch.zeros(4, dtype=torch.int64), RuntimeError, "targets: expected device"),
    "softcap past fp32": (6, lambda v: 1e39, ValueError, r"softcap: .*fp32 range"),
}


def _cuda_tile():
    gen = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(4, 10, device="cuda", generator=gen)
    return z, torch.randint(0, 10, (4,), device="cuda", generator=gen), torch.zeros(4, device="cuda")


def call_bad_input(key: str) -> None:
    """Call an op with a bad input: `key` "stats:<i>" is STATS_BAD_INPUTS' i-th case, "grad:<i>" GRAD_BAD_INPUTS'."""
    import grpo_fast.backends.native  # noqa: F401 - loads grpo_fast._C (a child interpreter calls this)

    kind, index = key.split(":")
    if kind == "stats":
        make, _, _ = list(STATS_BAD_INPUTS.values())[int(index)]
        torch.ops.grpo_fast.logprob_stats(*make(*_cuda_tile()))
        return
    position, make, _, _ = list(GRAD_BAD_INPUTS.values())[int(index)]
    z, y, v = _cuda_tile()
    args = [z, y, v, v.clone(), v.clone(), v.clone(), 0.0]
    args[position] = make(v)
    torch.ops.grpo_fast.logprob_grad_(*args)


_CHILD = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("isolated_cases", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
call = getattr(module, sys.argv[2])
for key in sys.argv[3:]:
    print("start", key, flush=True)
    try:
        call(key)
        outcome = "no error"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    print("outcome", key, outcome, flush=True)
"""


def run_isolated(path: str, function: str, keys: list[str], timeout: float = 300) -> dict[str, str]:
    """key -> outcome of `function(key)` from the module file `path` ("no error", "<Exception type>: <message on
    one line>", or "crashed: exit status N" with the end of its stderr), each key called once, in order, in a child
    interpreter started again after a crash with the keys after the one that crashed. Keys hold no whitespace."""
    outcomes: dict[str, str] = {}
    while len(outcomes) < len(keys):
        left = [key for key in keys if key not in outcomes]
        cmd = [sys.executable, "-X", "faulthandler", "-c", _CHILD, path, function, *left]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        started = None
        for line in run.stdout.splitlines():
            word, _, rest = line.partition(" ")
            if word == "start":
                started = rest
            elif word == "outcome":
                key, _, outcome = rest.partition(" ")
                outcomes[key] = outcome
        if run.returncode != 0:
            crashed = started if started is not None and started not in outcomes else None
            for key in [crashed] if crashed else left:  # before the first case: every case is lost
                outcomes[key] = f"crashed: exit status {run.returncode}\n{run.stderr[-3000:]}"
    return outcomes


@pytest.fixture(scope="module")
def bad_input_outcomes(native):
    keys = [f"stats:{i}" for i in range(len(STATS_BAD_INPUTS))] + [f"grad:{i}" for i in range(len(GRAD_BAD_INPUTS))]
    return run_isolated(__file__, "call_bad_input", keys)


def _assert_raised(outcome: str, error: type[Exception], match: str) -> None:
    assert outcome.startswith(f"{error.__name__}: ") and re.search(match, outcome), outcome


@pytest.mark.parametrize("case", list(STATS_BAD_INPUTS))
def test_stats_rejects_bad_inputs(bad_input_outcomes, case):
    _, error, match = STATS_BAD_INPUTS[case]
    _assert_raised(bad_input_outcomes[f"stats:{list(STATS_BAD_INPUTS).index(case)}"], error, match)


@pytest.mark.parametrize("case", list(GRAD_BAD_INPUTS))
def test_grad_rejects_bad_inputs(bad_input_outcomes, case):
    _, _, error, match = GRAD_BAD_INPUTS[case]
    _assert_raised(bad_input_outcomes[f"grad:{list(GRAD_BAD_INPUTS).index(case)}"], error, match)


def test_out_of_range_targets_give_nan_rows(native):
    """Token ids outside [0, V) are not checked before a launch on CUDA (a synchronisation per op): their row's logp
    and gradient are NaN, a masked row's gradient stays 0, every other row is untouched."""
    z, y, _ = _cuda_tile()
    y[1], y[2] = 10, -1
    logp, entropy, lse = torch.ops.grpo_fast.logprob_stats(z, y)
    assert torch.isnan(logp[1:3]).all() and torch.isfinite(logp[[0, 3]]).all() and torch.isfinite(lse).all()
    gl = torch.tensor([1.0, 1.0, 0.0, 1.0], device="cuda")  # row 2 masked
    dz = z.clone()
    torch.ops.grpo_fast.logprob_grad_(dz, y, lse, entropy, gl, None)
    assert torch.isnan(dz[1]).all() and (dz[2] == 0).all() and torch.isfinite(dz[[0, 3]]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_fused_logprobs_real_shape(native, dtype):
    """N=4096, H=3584, V=152064 bf16: values and gradients vs the naive fp32 logits path."""
    from grpo_fast import fused_logprobs
    from grpo_fast.testing.reference import naive_logprobs_and_entropy

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1)
    n, h, v = 4096, 3584, 152064
    hidden = torch.randn(n, h, device="cuda").to(dtype)
    weight = (torch.randn(v, h, device="cuda") / h**0.5).to(dtype)
    y = torch.randint(0, v, (n,), device="cuda")
    g_l, g_h = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")

    def run(backend):
        hh, ww = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        if backend == "naive":  # fp32 logits from the bf16 inputs: the reference for both backends
            logp, ent = naive_logprobs_and_entropy(hh.float()[None], ww.float(), y[None])
            logp, ent = logp[0], ent[0]
        else:
            logp, ent = fused_logprobs(hh, ww, y, backend=backend, return_entropy=True)
        ((logp * g_l).sum() + (ent * g_h).sum()).backward()
        out = (logp.detach().float(), ent.detach().float(), hh.grad.float(), ww.grad.float())
        del hh, ww
        return out

    ref = run("naive")
    torch.cuda.empty_cache()
    ours, theirs = run("cuda"), run("torch")
    for name, a, b, r in zip(("logp", "entropy", "dh", "dW"), ours, theirs, ref, strict=True):
        assert_within_rule(name, a, b, r, dtype)


def test_grpo_loss_real_shape(native):
    from grpo_fast import grpo_loss
    from grpo_fast.loss import GRPOLossConfig

    torch.manual_seed(2)
    b, t, h, v = 4, 1024, 3584, 152064
    hidden = torch.randn(b, t, h, device="cuda", dtype=torch.bfloat16)
    weight = (torch.randn(v, h, device="cuda") / h**0.5).to(torch.bfloat16)
    ids = torch.randint(0, v, (b, t), device="cuda")
    mask = (torch.rand(b, t, device="cuda") > 0.1).long()
    adv = torch.randn(b, device="cuda")
    old = -torch.rand(b, t, device="cuda") * 3
    results = []
    for backend in ("cuda", "torch"):
        hh, ww = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        cfg = GRPOLossConfig(loss_type="dapo", epsilon_high=0.28, entropy_coef=0.01, backend=backend)
        loss, _ = grpo_loss(hh, ww, ids, mask, adv, old, config=cfg)
        loss.backward()
        results.append((loss.detach().float(), hh.grad.float(), ww.grad.float()))
    for a, b_ in zip(*results, strict=True):
        scale = max(1.0, b_.abs().max().item())
        assert (a - b_).abs().max().item() <= 2e-2 * scale


# ---------------------------------------------------------------- dW accumulation (chunked.py, torch and cuda backends)


def test_fp32_accumulating_addmm_is_used():
    """torch >= 2.11 (the GPU image's): `torch.addmm(dW_fp32, dzᵀ_bf16, h_bf16, out_dtype=fp32, out=dW)`
    accumulates in place, so the bf16 dW path is one cuBLAS GEMM per chunk (no fp32 temporary)."""
    from grpo_fast.backends import chunked

    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 11):
        pytest.skip(f"torch {torch.__version__}: the fp32-C out_dtype addmm is expected from 2.11 on")
    assert chunked._cuda_addmm_accumulates_in_fp32(torch.device("cuda", torch.cuda.current_device()))
    hidden = torch.randn(8, 16, device="cuda", dtype=torch.bfloat16)
    acc = chunked._GradAccumulator(hidden, torch.randn(32, 16, device="cuda", dtype=torch.bfloat16), None, 1.0)
    assert acc.weight_mode == "out_dtype_addmm"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dw_accumulation_matches_fp64(dtype):
    """Every CUDA mode of the low-precision dW accumulation against fp64 (bf16-rounded dz, as both modes
    use it), absolute bound, not relative to a peer: the fast mode must be fp32-accurate and allocate
    nothing dW-sized."""
    from grpo_fast.backends import chunked

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(5)
    n, h, v, step, inv_t = 700, 1024, 50_001, 256, 1 / 0.7
    hidden = torch.randn(n, h, device="cuda", generator=gen).to(dtype)
    weight = (torch.randn(v, h, device="cuda", generator=gen) / h**0.5).to(dtype)
    chunks = [slice(s, min(s + step, n)) for s in range(0, n, step)]
    tiles = [torch.randn(c.stop - c.start, v, device="cuda", generator=gen) * 1e-2 for c in chunks]
    ref = sum(dz.to(dtype).double().t() @ hidden[c].double() for c, dz in zip(chunks, tiles, strict=True)) * inv_t
    scale = ref.abs().max().item()
    modes = ["slices"] + (["out_dtype_addmm"] if chunked._cuda_addmm_accumulates_in_fp32(hidden.device) else [])
    for mode in modes:
        acc = chunked._GradAccumulator(hidden, weight, None, inv_t)
        acc.weight_mode = mode
        acc.add(chunks[0], tiles[0].clone())  # first chunk: also the warm-up (cuBLAS handle, workspace)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        for c, dz in zip(chunks[1:], tiles[1:], strict=True):
            acc.add(c, dz.clone())
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - before
        err = (acc.grad_weight.double() - ref).abs().max().item()
        assert err <= 1e-5 * scale, f"{mode}: error {err:.3g}, scale {scale:.3g}"
        if mode == "out_dtype_addmm":  # per chunk: the dz tile's clone (fp32) and its bf16 copy, nothing [V, H]
            assert extra <= step * v * 6 + (64 << 20) < v * h * 4, f"{mode}: {extra / 2**20:.1f} MiB extra"
