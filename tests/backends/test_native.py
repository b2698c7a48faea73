"""The C++ backend "cpu" (grpo_fast._C epilogue ops + ATen GEMMs) against the torch backend and the
naive fp64 reference: epilogue ops, fused_logprobs, grpo_loss for every loss type, bad inputs,
the torch.compile / fake-tensor path and the fallback when the extension is missing.

Tolerance rule (grpo_fast.testing.tolerance): the cpu backend's error against the fp64 reference may be
at most 2x the torch backend's own error in the same precision, plus a small per-dtype atol.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grpo_fast import fused_logprobs, grpo_loss
from grpo_fast.backends import get_backend
from grpo_fast.backends.chunked import TORCH_BACKEND, TorchEpilogue
from grpo_fast.loss import GRPOLossConfig
from grpo_fast.testing.reference import naive_grpo_loss, naive_logprobs_and_entropy
from grpo_fast.testing.tolerance import assert_within_rule, max_error

native = pytest.importorskip(
    "grpo_fast.backends.native", reason="grpo_fast._C not built (pip install --no-build-isolation -e .)"
)
ops = torch.ops.grpo_fast


def fp64_stats(z, targets):
    """(logp, entropy, lse) of a tile in fp64 through log_softmax."""
    z = z.double()
    log_p = torch.log_softmax(z, dim=1)
    p = log_p.exp()
    entropy = -(p * torch.where(p > 0, log_p, torch.zeros_like(log_p))).sum(1)
    return log_p.gather(1, targets.view(-1, 1)).view(-1), entropy, torch.logsumexp(z, 1)


def fp64_grad(z, targets, grad_logp, grad_entropy):
    z = z.double().requires_grad_(True)
    logp, entropy, _ = fp64_stats(z, targets)
    loss = (logp * grad_logp.double()).sum()
    if grad_entropy is not None:
        loss = loss + (entropy * grad_entropy.double()).sum()
    (dz,) = torch.autograd.grad(loss, z)
    return dz


# ---------------------------------------------------------------- epilogue ops on a tile


# (rows, vocab): one element; vocab below / at / past the 1024-element block and a SIMD tail;
# several blocks with a tail; a real vocabulary size (151936, Qwen2) for one row.
TILE_SHAPES = [(1, 1), (3, 7), (5, 1024), (4, 1025), (9, 3001), (1, 151936)]


@pytest.mark.parametrize("shape", TILE_SHAPES)
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_stats_op_matches_fp64(shape, scale):
    torch.manual_seed(0)
    z = torch.randn(shape) * scale
    y = torch.randint(0, shape[1], (shape[0],))
    ours = ops.logprob_stats(z, y)
    torch_ours = TorchEpilogue().stats(z, y)
    for name, a, b, ref in zip(("logp", "entropy", "lse"), ours, torch_ours, fp64_stats(z, y), strict=True):
        assert a.dtype == torch.float32 and a.shape == (shape[0],)
        assert_within_rule(name, a, b, ref, torch.float32)


@pytest.mark.parametrize("shape", TILE_SHAPES)
@pytest.mark.parametrize("with_entropy", [True, False])
def test_grad_op_matches_fp64(shape, with_entropy):
    torch.manual_seed(1)
    z = torch.randn(shape) * 4
    y = torch.randint(0, shape[1], (shape[0],))
    gl = torch.randn(shape[0])
    gh = torch.randn(shape[0]) if with_entropy else None
    logp, entropy, lse = TorchEpilogue().stats(z, y)
    ours, theirs = z.clone(), z.clone()
    ops.logprob_grad_(ours, y, lse, entropy, gl, gh)
    TorchEpilogue().grad_(theirs, y, lse, entropy, gl, gh)
    assert_within_rule("dz", ours, theirs, fp64_grad(z, y, gl, gh), torch.float32)


def test_extreme_logits_and_banned_tokens():
    """|z| ~ 1e4 (fp32 keeps ~1e-3 absolute there) and −inf logits (banned tokens) stay finite."""
    torch.manual_seed(2)
    z = torch.randn(6, 2049) * 1e4
    z[1] = 1e4  # a flat row: entropy log V
    z[2, 5:] = float("-inf")  # only 5 allowed tokens
    y = torch.randint(0, 5, (6,))
    logp, entropy, lse = ops.logprob_stats(z, y)
    ref = fp64_stats(z, y)
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    torch_ours = TorchEpilogue().stats(z.clone(), y)
    for name, a, b, r in zip(("logp", "entropy", "lse"), (logp, entropy, lse), torch_ours, ref, strict=True):
        finite = torch.isfinite(b)  # the torch epilogue's Σ p·z is NaN on the −inf row: compare where it is finite
        assert_within_rule(name, a[finite], b[finite], r[finite], torch.float32)
    assert abs(entropy[1].item() - torch.log(torch.tensor(2049.0)).item()) < 1e-5
    assert max_error(entropy[2], ref[1][2]) < 1e-5
    gl, gh = torch.randn(6), torch.randn(6)
    dz = z.clone()
    ops.logprob_grad_(dz, y, lse, entropy, gl, gh)
    assert torch.isfinite(dz).all()
    assert max_error(dz, fp64_grad(z, y, gl, gh)) < 1e-4
    assert (dz[2, 5:] == 0).all()


def test_masked_rows_give_zero_gradient():
    torch.manual_seed(3)
    z = torch.randn(4, 777) * 3
    y = torch.randint(0, 777, (4,))
    _, entropy, lse = ops.logprob_stats(z, y)
    gl, gh = torch.randn(4), torch.randn(4)
    gl[[0, 2]] = 0.0
    gh[[0, 2]] = 0.0
    ops.logprob_grad_(z, y, lse, entropy, gl, gh)
    assert (z[[0, 2]] == 0).all() and (z[[1, 3]] != 0).any()


def test_fp64_tiles():
    torch.manual_seed(4)
    z = torch.randn(3, 2500, dtype=torch.float64) * 5
    y = torch.randint(0, 2500, (3,))
    ours = ops.logprob_stats(z, y)
    assert all(t.dtype == torch.float64 for t in ours)
    for a, ref in zip(ours, fp64_stats(z, y), strict=True):
        assert max_error(a, ref) < 1e-10
    gl, gh = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    dz = z.clone()
    ops.logprob_grad_(dz, y, ours[2], ours[1], gl, gh)
    assert max_error(dz, fp64_grad(z, y, gl, gh)) < 1e-10


def test_empty_tile():
    z, y = torch.empty(0, 10), torch.empty(0, dtype=torch.int64)
    assert all(t.shape == (0,) for t in ops.logprob_stats(z, y))
    ops.logprob_grad_(z, y, torch.empty(0), torch.empty(0), torch.empty(0), None)


# ---------------------------------------------------------------- bad inputs at the C++ boundary


def _tile():
    z = torch.randn(4, 10)
    return z, torch.randint(0, 10, (4,)), torch.zeros(4)


STATS_BAD_INPUTS = [
    (lambda z, y, v: (z[0], y), ValueError, r"expected a 2-d tile \[R, V\], got shape \[10\]$"),
    (lambda z, y, v: (z[:, :0], y), ValueError, "vocabulary of at least 1"),
    (lambda z, y, v: (z.t(), y), RuntimeError, r"contiguous tensor \(strides \[1, 10\] for shape \[10, 4\]\)$"),
    (lambda z, y, v: (z.half(), y), TypeError, "expected dtype torch.float32 or torch.float64"),
    (lambda z, y, v: (z, y[:3]), ValueError, r"targets: expected shape \[R=4\], got \[3\]$"),
    (lambda z, y, v: (z, y.int()), TypeError, "targets: expected dtype torch.int64"),
    (lambda z, y, v: (z, torch.randint(0, 10, (8,))[::2]), RuntimeError, "targets: expected a contiguous"),
    (lambda z, y, v: (z, torch.full((4,), 10)), ValueError, r"token ids in \[0, 10\), got 10"),
    (lambda z, y, v: (z, torch.full((4,), -1)), ValueError, r"token ids in \[0, 10\), got -1 at row \d$"),
    (lambda z, y, v: (z, y, float("inf")), ValueError, r"softcap: expected 0 \(off\) or a value in"),
    (lambda z, y, v: (z, y, -1.0), ValueError, r"softcap: expected 0 \(off\) or a value in"),
    (
        lambda z, y, v: (z, y, 1e39),
        ValueError,
        r"in \[1.17549e-38, 3.40282e\+38\] \(the kernels' fp32 range\), got 1e\+39$",
    ),
    (lambda z, y, v: (z, y, 1e-39), ValueError, r"softcap: .* \(the kernels' fp32 range\), got 1e-39"),
    (lambda z, y, v: (z.double(), y, 1e39), ValueError, r"softcap: .* \(the kernels' fp32 range\)"),
]


@pytest.mark.parametrize("make, error, match", STATS_BAD_INPUTS)
def test_stats_rejects_bad_inputs(make, error, match):
    with pytest.raises(error, match=match):
        ops.logprob_stats(*make(*_tile()))


GRAD_BAD_INPUTS = [
    (2, torch.zeros(3), ValueError, r"lse: expected shape \[R=4\]"),
    (3, torch.zeros(4, dtype=torch.float64), TypeError, "entropy: expected dtype Float"),
    (4, torch.zeros(8)[::2], RuntimeError, "grad_logp: expected a contiguous"),
    (5, torch.zeros(4, 1), ValueError, r"grad_entropy: expected shape \[R=4\]"),
    (1, torch.full((4,), 11), ValueError, r"token ids in \[0, 10\)"),
    (6, 1e39, ValueError, r"softcap: .* \(the kernels' fp32 range\), got 1e\+39"),
]


@pytest.mark.parametrize("position, value, error, match", GRAD_BAD_INPUTS)
def test_grad_rejects_bad_inputs(position, value, error, match):
    z, y, v = _tile()
    args = [z, y, v, v.clone(), v.clone(), v.clone(), 0.0]
    args[position] = value
    with pytest.raises(error, match=match):
        ops.logprob_grad_(*args)


def test_device_mismatch_is_rejected():
    """Without a GPU the only other device is meta, which dispatches to the fake implementation."""
    z, y, v = _tile()
    with pytest.raises((RuntimeError, ValueError)):
        ops.logprob_stats(z, y.to("meta"))


# An LD_PRELOAD library that makes libstdc++'s ostream number formatters (what c10::str's ostringstream calls for an
# integer, a shape or a double) exit the process with status 86 when grpo_fast._C calls them, and forwards every
# other caller's call. On the GPU image of the first runs, such a call from this extension's checks died of SIGSEGV
# (benchmarks/NOTES.md, "The bad-input crash"): the checks must format their numbers themselves (csrc/ops.h).
NUMBER_FORMATTER_TRAP = r"""
#include <dlfcn.h>
#include <unistd.h>
#include <cstring>

static bool from_extension(void* caller) {
  Dl_info info;
  return dladdr(caller, &info) != 0 && info.dli_fname != nullptr && std::strstr(info.dli_fname, "grpo_fast/_C.");
}
static int forwarded = 0;
extern "C" int forwarded_number_insertions() { return forwarded; }

#define TRAP(symbol, type)                                                                  \
  extern "C" void* symbol(void* stream, type value) {                                       \
    if (from_extension(__builtin_return_address(0))) _exit(86);                             \
    ++forwarded;                                                                            \
    static auto real = reinterpret_cast<void* (*)(void*, type)>(dlsym(RTLD_NEXT, #symbol)); \
    return real(stream, value);                                                             \
  }
TRAP(_ZNSo9_M_insertIlEERSoT_, long)                // operator<<(long)
TRAP(_ZNSo9_M_insertImEERSoT_, unsigned long)       // operator<<(unsigned long / unsigned int)
TRAP(_ZNSo9_M_insertIxEERSoT_, long long)           // operator<<(long long)
TRAP(_ZNSo9_M_insertIyEERSoT_, unsigned long long)  // operator<<(unsigned long long)
TRAP(_ZNSo9_M_insertIdEERSoT_, double)              // operator<<(double / float)
TRAP(_ZNSolsEi, int)                                // operator<<(int)
"""

# Every bad input of the tests above, in one interpreter with the trap preloaded; each case's name first, so an
# exit names the case. Then a control: an error of torch's own that formats integers goes through the trap.
TRAPPED_CASES = r"""
import ctypes, importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("native_cases", sys.argv[1])
cases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cases)
for i, (make, error, _) in enumerate(cases.STATS_BAD_INPUTS):
    print("logprob_stats bad input", i, flush=True)
    try:
        torch.ops.grpo_fast.logprob_stats(*make(*cases._tile()))
    except error:
        pass
for i, (position, value, error, _) in enumerate(cases.GRAD_BAD_INPUTS):
    print("logprob_grad_ bad input", i, flush=True)
    z, y, v = cases._tile()
    args = [z, y, v, v.clone(), v.clone(), v.clone(), 0.0]
    args[position] = value
    try:
        torch.ops.grpo_fast.logprob_grad_(*args)
    except error:
        pass
try:
    torch.zeros(2, 3).view(7)
except RuntimeError:
    pass
print("forwarded", ctypes.CDLL(None).forwarded_number_insertions(), flush=True)
"""


def test_bad_input_messages_format_numbers_without_ostream(tmp_path):
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None or not sys.platform.startswith("linux"):
        pytest.skip("needs Linux and a C++ compiler (the trap is an LD_PRELOAD library)")
    (tmp_path / "trap.cpp").write_text(NUMBER_FORMATTER_TRAP)
    build = [compiler, "-shared", "-fPIC", "-O1", str(tmp_path / "trap.cpp"), "-o", str(tmp_path / "trap.so"), "-ldl"]
    subprocess.run(build, check=True, capture_output=True, timeout=120)
    env = {**os.environ, "LD_PRELOAD": str(tmp_path / "trap.so")}
    run = subprocess.run(
        [sys.executable, "-c", TRAPPED_CASES, __file__], env=env, capture_output=True, text=True, timeout=300
    )
    last = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
    assert run.returncode == 0, (
        f"exit status {run.returncode} at {last!r} (86: the extension formatted a number "
        f"through an ostream)\n{run.stderr[-2000:]}"
    )
    assert last.startswith("forwarded ") and int(last.split()[1]) > 0, f"the trap caught no call of torch's: {last!r}"


def test_gpu_bad_inputs_run_isolated_past_a_crash(tmp_path):
    """tests/backends/test_native_gpu.py calls its bad inputs in a child interpreter started again after a crash:
    each case keeps its own outcome, the cases after a crash still run."""
    path = Path(__file__).with_name("test_native_gpu.py")
    spec = importlib.util.spec_from_file_location("native_gpu_tests", path)
    gpu_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_tests)
    cases = tmp_path / "cases.py"
    cases.write_text(
        "import ctypes\n"
        "def call(key):\n"
        "    if key == 'crash':\n"
        "        ctypes.string_at(0)\n"
        "    if key == 'raise':\n"
        "        raise ValueError('bad\\n input [4, 10]')\n"
    )
    outcomes = gpu_tests.run_isolated(str(cases), "call", ["ok", "raise", "crash", "after"], timeout=120)
    assert outcomes["ok"] == outcomes["after"] == "no error", outcomes
    assert outcomes["raise"] == "ValueError: bad input [4, 10]", outcomes
    assert outcomes["crash"].startswith("crashed: exit status -11\n") and "Segmentation fault" in outcomes["crash"]


# ---------------------------------------------------------------- fused_logprobs through the backend


# (B, T, H, V): tiny; odd sizes everywhere (V past one 1024 block with a tail); rows > one chunk.
LINEAR_SHAPES = [(1, 1, 8, 5), (2, 7, 33, 1031), (3, 37, 64, 4099)]


@pytest.mark.parametrize("shape", LINEAR_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_logprobs_values_and_grads(shape, dtype):
    B, T, H, V = shape
    torch.manual_seed(5)
    h = (torch.randn(B, T, H) * 2).to(dtype)
    w = (torch.randn(V, H) / H**0.5).to(dtype)
    bias = (torch.randn(V) * 0.1).to(dtype)
    y = torch.randint(0, V, (B, T))
    g_l, g_h = torch.randn(B, T), torch.randn(B, T)
    temperature = 0.7

    def run(backend):
        if backend == "naive":  # fp64 leaves: gradients not rounded back to the inputs' dtype
            hh, ww, bb = (t.double().requires_grad_(True) for t in (h, w, bias))
            logp, ent = naive_logprobs_and_entropy(hh, ww, y, temperature, bb)
        else:
            hh, ww, bb = (t.clone().requires_grad_(True) for t in (h, w, bias))
            # 3 rows per chunk at V=4099 (workspace 50 KB): several chunks and a short last one.
            logp, ent = fused_logprobs(hh, ww, y, temperature, backend, True, bb, workspace_bytes=50_000)
        ((logp * g_l).sum() + (ent * g_h).sum()).backward()
        return logp.detach(), ent.detach(), hh.grad, ww.grad, bb.grad

    ours, theirs, ref = run("cpu"), run("torch"), run("naive")
    for name, a, b, r in zip(("logp", "entropy", "dh", "dW", "db"), ours, theirs, ref, strict=True):
        assert a.dtype == (torch.float32 if name in ("logp", "entropy") else dtype)
        assert_within_rule(name, a, b, r, dtype)


def test_auto_picks_cpu_backend():
    assert get_backend("auto", torch.device("cpu")) is native.CPU_BACKEND
    assert native.CPU_BACKEND.name == "cpu"


# ---------------------------------------------------------------- grpo_loss, every loss type


LOSS_CONFIGS = [
    dict(loss_type="grpo"),
    dict(loss_type="bnpo", beta=0.04),
    dict(loss_type="dr_grpo", max_completion_length=16),
    dict(loss_type="dapo", epsilon_high=0.28, entropy_coef=0.01),
    dict(loss_type="cispo", epsilon_high=5.0),
    dict(loss_type="grpo", importance_sampling_level="sequence", delta=2.0),
    dict(loss_type="dapo", temperature=0.6, beta=0.1, entropy_coef=0.02),
]


def _batch(B, T, H, V, dtype, seed=6):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(B, T, H, generator=g) * 2).to(dtype)
    w = (torch.randn(V, H, generator=g) / H**0.5).to(dtype)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.25).long()
    mask[0, :] = 0  # a fully masked sequence
    adv = torch.randn(B, generator=g)
    old = -torch.rand(B, T, generator=g) * 3
    ref = -torch.rand(B, T, generator=g) * 3
    return h, w, ids, mask, adv, old, ref


@pytest.mark.parametrize("options", LOSS_CONFIGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grpo_loss_matches_reference(options, dtype):
    B, T, H, V = 3, 11, 48, 2053
    h, w, ids, mask, adv, old, ref = _batch(B, T, H, V, dtype)
    # Sequences of 11 rows; ~26 rows per chunk (workspace 220 KB): several sequence-aligned chunks.
    workspace = 220_000

    def run(backend):
        hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        if backend == "naive":
            cfg = GRPOLossConfig(**options)
            loss, metrics = naive_grpo_loss(hh.double(), ww.double(), ids, mask, adv, old, ref, config=cfg)
        else:
            cfg = GRPOLossConfig(**options, backend=backend, workspace_bytes=workspace)
            loss, metrics = grpo_loss(hh, ww, ids, mask, adv, old, ref, config=cfg)
        loss.backward()
        return loss.detach(), metrics, hh.grad, ww.grad

    ours, theirs, naive = run("cpu"), run("torch"), run("naive")
    for name, i in (("loss", 0), ("dh", 2), ("dW", 3)):
        assert_within_rule(name, ours[i], theirs[i], naive[i], dtype)
    for key, value in naive[1].items():
        assert_within_rule(key, ours[1][key], theirs[1][key], value, dtype)


def test_grpo_loss_on_policy_recompute_path():
    """Sequences longer than a chunk force the recompute path (forward, then backward with 4 GEMMs)."""
    B, T, H, V = 2, 40, 32, 1500
    h, w, ids, mask, adv, _, _ = _batch(B, T, H, V, torch.float32, seed=7)
    cfg = dict(loss_type="grpo", importance_sampling_level="sequence")
    results = []
    for backend in ("cpu", "torch"):
        hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        loss, _ = grpo_loss(
            hh, ww, ids, mask, adv, config=GRPOLossConfig(**cfg, backend=backend, workspace_bytes=60_000)
        )
        loss.backward()
        results.append((loss.detach(), hh.grad, ww.grad))
    hh, ww = h.double().requires_grad_(True), w.double().requires_grad_(True)
    loss, _ = naive_grpo_loss(hh, ww, ids, mask, adv, config=GRPOLossConfig(**cfg))
    loss.backward()
    for a, b, r in zip(results[0], results[1], (loss.detach(), hh.grad, ww.grad), strict=True):
        assert_within_rule("recompute", a, b, r, torch.float32)


# ---------------------------------------------------------------- torch.compile / fake tensors


def test_opcheck():
    torch.manual_seed(8)
    z = torch.randn(5, 300) * 3
    y = torch.randint(0, 300, (5,))
    logp, entropy, lse = ops.logprob_stats(z, y)
    torch.library.opcheck(ops.logprob_stats, (z, y))
    torch.library.opcheck(ops.logprob_grad_, (z.clone(), y, lse, entropy, torch.randn(5), torch.randn(5)))
    torch.library.opcheck(ops.logprob_grad_, (z.clone(), y, lse, entropy, torch.randn(5), None))


def test_torch_compile_fullgraph_traces_the_ops():
    torch.manual_seed(9)
    z = torch.randn(6, 500)
    y = torch.randint(0, 500, (6,))
    gl = torch.randn(6)
    epilogue = native.NativeEpilogue()

    def step(z, y, gl):
        logp, entropy, lse = epilogue.stats(z, y)
        dz = z.clone()
        epilogue.grad_(dz, y, lse, entropy, gl, None)
        return logp, dz

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    for a, b in zip(compiled(z, y, gl), step(z, y, gl), strict=True):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------- missing extension


def test_missing_extension_falls_back_and_explains():
    """With grpo_fast._C unimportable, auto falls back to torch and backend='cpu' says how to build it."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["grpo_fast._C"] = None  # import of it raises ImportError
        import torch
        from grpo_fast.backends import get_backend
        assert get_backend("auto", torch.device("cpu")).name == "torch"
        try:
            get_backend("cpu", torch.device("cpu"))
        except ImportError as err:
            print(err)
        else:
            raise SystemExit("backend 'cpu' loaded without the extension")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install --no-build-isolation -e ." in out.stdout
    assert "backend 'cpu' is unavailable" in out.stdout


def test_torch_backend_unchanged_reference():
    """Sanity: the oracle the comparisons use is the torch backend itself."""
    assert get_backend("torch", torch.device("cpu")) is TORCH_BACKEND
