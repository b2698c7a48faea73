"""Layer 1 in Triton: fused linear logprobs, forward and backward, without `[N, V]` logits.

Shapes: hidden h [N, H], weight W [V, H], bias b [V] (optional), targets y [N] int64, τ⁻¹ a runtime
float. Tempered logits z = (h Wᵀ + b) τ⁻¹ exist only as `[BLOCK_N, BLOCK_V]` register tiles,
accumulated in fp32 by `tl.dot` over `BLOCK_H` slices of H.

Soft-capped heads (Gemma's final_logit_softcapping; `softcap` c > 0, the constexpr HAS_SOFTCAP): with
x = h Wᵀ + b the logits are z = c tanh(x / c) τ⁻¹, tanh(|x| / c) = (1 − e) / (1 + e) from e = e^{−2|x|/c}
(no tanh in Triton's interpreter), and every product of the backward carries the slope dz/dx =
4e / (1 + e)² τ⁻¹ = (1 − tanh²(x / c)) τ⁻¹ from the same e. That keeps a second tile live in the backward; the
slope read back from the logit, (1 − t)(1 + t) with t = z / (c τ⁻¹), did not (sm_90 AOT, bf16 defaults: the
atomic backward spilled 28 bytes, the others none; not re-measured since) but was off by ~2e-7 where tanh
saturates, times a dz that can be large. Without HAS_SOFTCAP the kernels are the plain ones.

Forward (per row): lse = LSE(z), logp = z_y − lse, entropy = lse − Σ_v softmax(z)_v z_v.
Backward, given gℓ = ∂L/∂logp and gH = ∂L/∂entropy per row (p = softmax(z)):
    dz = gℓ (onehot(y) − p) − gH p (log p + entropy)
    dh = dz W τ⁻¹,   dW = dzᵀ h τ⁻¹,   db = Σ_rows dz τ⁻¹      (dz (1 − tanh²(x / c)) with a soft cap).

Launch rules: only feature flags and block sizes are constexpr;
N, V, H, strides, τ⁻¹ and split sizes are runtime scalars, so new lengths or temperatures never
recompile (the row count is also exempt from Triton's integer specialisation,
`do_not_specialize`, so N % 16 never picks a new binary). Every grid is one-dimensional (axis 0
allows 2³¹ − 1 programs; no 65535 limit) and row / column indices are int64 before they multiply
a stride (N·H and V·H may exceed 2³¹).

Two interpreter quirks handled by the launchers: `tl.dot` on bf16 tiles is wrong under
TRITON_INTERPRET=1 (triton 3.9), so tiles are upcast to fp32 there (`DOT_UPCAST`; bf16 × bf16
products are exact in fp32, so only the accumulation order differs); fp32 inputs use IEEE dots
(`input_precision="ieee"`), never TF32, to match PyTorch's fp32 matmul.

Shared-memory fallback: the tiles' pipeline depth was sized for sm_90 with Triton 3.9 (atomic backward
~160 KiB of shared memory at 3 stages); another Triton or GPU may need more. A launch whose kernel does not
fit raises Triton's OutOfResources when it is loaded, before anything runs; `_launch` then retries with one
stage fewer, down to one, remembers the depth that ran, and logs every configuration that ran
(`launched_configs()`, for the benchmarks' JSON).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

logger = logging.getLogger(__name__)

_FLOAT_TYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class BlockConfig:
    """Tile sizes and launch options of one kernel (all constexpr / launch-time)."""

    block_n: int
    block_v: int
    block_h: int
    num_warps: int = 8
    num_stages: int = 3


# H100 / H200 choices (bf16 / fp16): 128 x 128 fp32 logits tiles (64 registers per thread at 8 warps, two
# warpgroups of m64n128 wgmma), K-slices of 64 (16 KiB per operand per stage). The deterministic kernels
# take 64-row blocks: twice the row blocks for the dh kernel's grid, and registers to spare for the RMW of
# fp32 dh / dW tiles next to the logits tile. AOT compile for sm_90 (triton 3.9, benchmarks/NOTES.md "AOT
# register/spill sweep"): no spills in any of the four kernels when H and the strides are multiples of 16
# (as for every target model); shared memory 96 / 160 / 80 / 72 KiB (forward / atomic backward / dh / dW).
# Not yet timed on a GPU.
GPU_FORWARD_BLOCKS = BlockConfig(block_n=128, block_v=128, block_h=64, num_warps=8, num_stages=3)
GPU_BACKWARD_BLOCKS = BlockConfig(block_n=128, block_v=128, block_h=64, num_warps=8, num_stages=3)
GPU_DETERMINISTIC_BLOCKS = BlockConfig(block_n=64, block_v=128, block_h=64, num_warps=8, num_stages=3)
# fp32 (IEEE dots: FMA on CUDA cores, no wgmma): the bf16 tiles with 32-wide K-slices spilled 3.2 KB per
# thread in the atomic backward and 7 KB in the dW kernel (ptxas fell back to 32 registers) in the AOT
# sweep; 64 x 128 x 16 at 2 stages is spill-free in all four kernels, 12-44 KiB of shared memory.
GPU_FP32_BLOCKS = BlockConfig(block_n=64, block_v=128, block_h=16, num_warps=8, num_stages=2)
# Interpreter (CPU tests): few, wide tiles keep numpy busy and Python overhead low; odd test shapes
# (N=37, H=48, V=1000) still leave row, K and vocabulary tails.
INTERPRETER_BLOCKS = BlockConfig(block_n=16, block_v=128, block_h=32, num_warps=4, num_stages=1)
# Programs the forward and the deterministic backward aim to launch (per SM): the vocabulary (or, for
# dW, the rows) is split when the other axis alone gives fewer.
_TARGET_PROGRAMS_PER_SM = 4
# Most memory the deterministic backward spends on fp32 partial sums of dh or dW.
_DETERMINISTIC_PARTIAL_BYTES = 1 << 30


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def default_blocks(kind: str, dtype: torch.dtype = torch.bfloat16) -> BlockConfig:
    """Tiles of `kind` ("forward", "backward", "deterministic") for inputs of `dtype`.

    bf16 / fp16 take the per-kernel GPU tiles above; fp32 takes `GPU_FP32_BLOCKS` for every kernel (its
    FMA dots need more registers per output than wgmma, and larger fp32 tiles spilled in the sm_90 AOT
    sweep). Under TRITON_INTERPRET=1 every kind takes `INTERPRETER_BLOCKS`."""
    if interpreter_active():
        return INTERPRETER_BLOCKS
    gpu = {"forward": GPU_FORWARD_BLOCKS, "backward": GPU_BACKWARD_BLOCKS, "deterministic": GPU_DETERMINISTIC_BLOCKS}
    blocks = gpu[kind]
    return GPU_FP32_BLOCKS if dtype == torch.float32 else blocks


# --------------------------------------------------------------------------------------------------
# Shared tile helpers (inlined into the kernels).
# --------------------------------------------------------------------------------------------------


@triton.jit
def _linear_tile(
    linear,
    tile,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """x [BLOCK_N, BLOCK_V] fp32 = h[rows] W[cols]ᵀ + b[cols], accumulated over H in BLOCK_H slices.

    linear = (h_ptr, w_ptr, b_ptr, H, stride_hn, stride_wv, τ⁻¹, c); tile = (rows64, row_mask, cols64,
    col_mask) [BLOCK_N] / [BLOCK_V]. Rows / columns outside the masks read zeros; the caller masks their z."""
    h_ptr, w_ptr, b_ptr, H, stride_hn, stride_wv, _, _ = linear
    rows64, row_mask, cols64, col_mask = tile
    acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    ks = tl.arange(0, BLOCK_H)
    for k0 in range(0, H, BLOCK_H):
        k = k0 + ks
        k_mask = k < H
        h = tl.load(
            h_ptr + rows64[:, None] * stride_hn + k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0
        )
        # W tile read transposed: [BLOCK_H, BLOCK_V], so the dot needs no register transpose.
        wt = tl.load(
            w_ptr + cols64[None, :] * stride_wv + k[:, None], mask=col_mask[None, :] & k_mask[:, None], other=0.0
        )
        if DOT_UPCAST:
            h = h.to(tl.float32)
            wt = wt.to(tl.float32)
        acc = tl.dot(h, wt, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols64, mask=col_mask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    return acc


@triton.jit
def _soft_cap(x, softcap):
    """c tanh(x / c) elementwise: c (1 − e) / (1 + e) with the sign of x, e = e^{−2|x|/c}."""
    e = tl.exp(tl.abs(x) * (-2.0 / softcap))
    capped = softcap * (1.0 - e) / (1.0 + e)
    return tl.where(x < 0.0, -capped, capped)


@triton.jit
def _soft_cap_with_slope(x, softcap):
    """(c tanh(x / c), its slope 1 − tanh²(x / c) = 4e / (1 + e)²) elementwise, e = e^{−2|x|/c}: the slope to a few
    ulps of itself. Formed as (1 − t)(1 + t) from t read back from the rounded logit it was off by up to ~2 ulps
    of 1 (~2e-7, either sign) where tanh saturates and the slope is ~0, times a dz that can be large."""
    e = tl.exp(tl.abs(x) * (-2.0 / softcap))
    capped = softcap * (1.0 - e) / (1.0 + e)
    return tl.where(x < 0.0, -capped, capped), 4.0 * e / ((1.0 + e) * (1.0 + e))


@triton.jit
def _logits_tile(
    linear,
    tile,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """z [BLOCK_N, BLOCK_V] fp32 = cap(h[rows] W[cols]ᵀ + b[cols]) τ⁻¹ (cap: c tanh(· / c) under HAS_SOFTCAP)."""
    x = _linear_tile(linear, tile, HAS_BIAS, BLOCK_N, BLOCK_V, BLOCK_H, DOT_UPCAST, DOT_PRECISION)
    if HAS_SOFTCAP:
        x = _soft_cap(x, linear[7])
    return x * linear[6]


@triton.jit
def _row_grads(grad_inputs, rows64, row_mask, HAS_GRAD_ENTROPY: tl.constexpr):
    """The backward's per-row inputs of rows64 [BLOCK_N]: (y, lse, entropy, gℓ, gH), each [BLOCK_N], from
    grad_inputs = (y_ptr, lse_ptr, ent_ptr, gl_ptr, gh_ptr); without HAS_GRAD_ENTROPY gH aliases gℓ (unused)."""
    y_ptr, lse_ptr, ent_ptr, gl_ptr, gh_ptr = grad_inputs
    targets = tl.load(y_ptr + rows64, mask=row_mask, other=-1)
    lse = tl.load(lse_ptr + rows64, mask=row_mask, other=0.0)
    entropy = tl.load(ent_ptr + rows64, mask=row_mask, other=0.0)
    grad_logp = tl.load(gl_ptr + rows64, mask=row_mask, other=0.0)
    grad_entropy = grad_logp
    if HAS_GRAD_ENTROPY:
        grad_entropy = tl.load(gh_ptr + rows64, mask=row_mask, other=0.0)
    return targets, lse, entropy, grad_logp, grad_entropy


@triton.jit
def _scaled_grad_tile(
    linear,
    tile,
    row_grads,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_GRAD_ENTROPY: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dz τ⁻¹ [BLOCK_N, BLOCK_V] fp32 of one tile (every backward product carries τ⁻¹; under HAS_SOFTCAP also
    the cap's slope 1 − tanh²(x / c)), zero outside the masks:
        dz = gℓ (onehot(y) − p) − gH p (log p + H),  p = e^{z − lse},
    with z recomputed as in `_logits_tile` and row_grads = (y, lse, entropy, gℓ, gH) from `_row_grads`."""
    targets, lse, entropy, grad_logp, grad_entropy = row_grads
    rows64, row_mask, cols64, col_mask = tile
    valid = row_mask[:, None] & col_mask[None, :]
    x = _linear_tile(linear, tile, HAS_BIAS, BLOCK_N, BLOCK_V, BLOCK_H, DOT_UPCAST, DOT_PRECISION)
    slope = x  # unused without HAS_SOFTCAP
    if HAS_SOFTCAP:
        x, slope = _soft_cap_with_slope(x, linear[7])
    z = x * linear[6]
    log_p = z - lse[:, None]
    p = tl.where(valid, tl.exp(log_p), 0.0)
    if HAS_GRAD_ENTROPY:
        coef = grad_logp[:, None] + grad_entropy[:, None] * (log_p + entropy[:, None])
    else:
        coef = grad_logp[:, None] + tl.zeros_like(log_p)
    hit = (cols64[None, :] == targets[:, None]) & valid
    dz = tl.where(hit, grad_logp[:, None], 0.0) - tl.where(valid, p * coef, 0.0)
    if HAS_SOFTCAP:  # the cap's slope 1 − tanh²(x / c)
        dz = dz * slope
    return dz * linear[6]


# --------------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["N", "split_stride", "num_n_blocks"])
def _linear_logprobs_fwd_kernel(
    h_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    part_ptr,
    zy_ptr,
    N,
    V,
    H,
    stride_hn,
    stride_wv,
    inv_temperature,
    softcap,
    split_size,
    split_stride,
    num_n_blocks,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Online softmax statistics of one row block over one vocabulary split.

    Grid: num_n_blocks × S programs (row block fastest, so programs reading the same W tiles run
    together and share them in L2). Program (i, s) covers rows [i·BLOCK_N, +BLOCK_N) and columns
    [s·split_size, min((s+1)·split_size, V)) (split_size a multiple of BLOCK_V, every split non-empty).

    For z = (h Wᵀ + b) τ⁻¹ over its columns it keeps, per row, the running max m, the shifted sums
    s = Σ e^{z−m} and t = Σ e^{z−m} (z − m) (shifted so entropy keeps its precision when |z| is
    large), updated per vocabulary block with a = e^{m−m'}:  s' = a s + Σ e^{z−m'},
    t' = a (t + s (m − m')) + Σ e^{z−m'} (z − m').

    Writes part [3, S, N] fp32 (m, s, t of this split; split_stride = S·N) and zy [N] = z_y for the
    rows whose target lies in this split (exactly one split per row). The host combines splits: M = max m,
    S = Σ s e^{m−M}, T = Σ e^{m−M} (t + s (m − M)); lse = M + log S, entropy = log S − T / S,
    logp = z_y − lse. Gradient: see `_linear_logprobs_bwd_kernel`.
    """
    pid = tl.program_id(0)
    linear = (h_ptr, w_ptr, b_ptr, H, stride_hn, stride_wv, inv_temperature, softcap)
    pid_n = pid % num_n_blocks
    pid_s = pid // num_n_blocks
    rows64 = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    row_mask = rows64 < N
    targets = tl.load(y_ptr + rows64, mask=row_mask, other=-1)
    v_start = pid_s.to(tl.int64) * split_size
    v_end = tl.minimum(v_start + split_size, V)

    m = tl.full([BLOCK_N], -1.0e38, dtype=tl.float32)
    s = tl.zeros([BLOCK_N], dtype=tl.float32)
    t = tl.zeros([BLOCK_N], dtype=tl.float32)
    zy = tl.zeros([BLOCK_N], dtype=tl.float32)
    for v0 in range(v_start, v_end, BLOCK_V):
        cols64 = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        col_mask = cols64 < v_end
        z = _logits_tile(
            linear,
            (rows64, row_mask, cols64, col_mask),
            HAS_BIAS,
            HAS_SOFTCAP,
            BLOCK_N,
            BLOCK_V,
            BLOCK_H,
            DOT_UPCAST,
            DOT_PRECISION,
        )
        z_masked = tl.where(col_mask[None, :], z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z_masked, axis=1))
        alpha = tl.exp(m - m_new)
        shifted = z - m_new[:, None]
        e = tl.where(col_mask[None, :], tl.exp(shifted), 0.0)
        t = alpha * (t + s * (m - m_new)) + tl.sum(tl.where(col_mask[None, :], e * shifted, 0.0), axis=1)
        s = alpha * s + tl.sum(e, axis=1)
        m = m_new
        hit = (cols64[None, :] == targets[:, None]) & col_mask[None, :]
        zy += tl.sum(tl.where(hit, z, 0.0), axis=1)

    part = part_ptr + pid_s.to(tl.int64) * N + rows64
    tl.store(part, m, mask=row_mask)
    tl.store(part + split_stride, s, mask=row_mask)
    tl.store(part + split_stride + split_stride, t, mask=row_mask)
    owner = row_mask & (targets >= v_start) & (targets < v_end)
    tl.store(zy_ptr + rows64, zy, mask=owner)


# --------------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["N", "num_n_blocks"])
def _linear_logprobs_bwd_kernel(
    h_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    lse_ptr,
    ent_ptr,
    gl_ptr,
    gh_ptr,
    dh_ptr,
    dw_ptr,
    db_ptr,
    N,
    V,
    H,
    stride_hn,
    stride_wv,
    inv_temperature,
    softcap,
    num_n_blocks,
    num_v_blocks,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_GRAD_ENTROPY: tl.constexpr,
    GROUP_N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Backward of one [BLOCK_N, BLOCK_V] logits tile with fp32 atomics (the default, fastest mode).

    Grid: num_n_blocks × num_v_blocks programs, swizzled in groups of GROUP_N row blocks (the
    matmul tutorial's L2 grouping). Inputs: h [N, H], W [V, H], b [V], y [N], lse, entropy, gℓ [N],
    gH [N] (fp32; gH optional). Recomputes z = (h Wᵀ + b) τ⁻¹ for the tile, forms
        dz = gℓ (onehot(y) − p) − gH p (log p + entropy),  p = e^{z − lse},
    scales it by τ⁻¹, casts it to the input dtype and, slice by slice of H, atomically adds
        dh[rows] += dz W[cols] τ⁻¹  (dh [N, H] fp32),   dW[cols] += dzᵀ h[rows] τ⁻¹  (dW [V, H] fp32),
    and db[cols] += Σ_rows dz τ⁻¹ (db [V] fp32). Summation order depends on scheduling: results
    are reproducible only to rounding; use the deterministic kernels for bitwise reproducibility.
    """
    pid = tl.program_id(0)
    linear = (h_ptr, w_ptr, b_ptr, H, stride_hn, stride_wv, inv_temperature, softcap)
    grad_inputs = (y_ptr, lse_ptr, ent_ptr, gl_ptr, gh_ptr)
    tiles_per_group = GROUP_N * num_v_blocks
    group = pid // tiles_per_group
    first_n = group * GROUP_N
    group_size = tl.minimum(num_n_blocks - first_n, GROUP_N)
    pid_n = first_n + (pid % tiles_per_group) % group_size
    pid_v = (pid % tiles_per_group) // group_size

    rows64 = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    row_mask = rows64 < N
    cols64 = pid_v.to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V).to(tl.int64)
    col_mask = cols64 < V

    row_grads = _row_grads(grad_inputs, rows64, row_mask, HAS_GRAD_ENTROPY)
    dz = _scaled_grad_tile(
        linear,
        (rows64, row_mask, cols64, col_mask),
        row_grads,
        HAS_BIAS,
        HAS_SOFTCAP,
        HAS_GRAD_ENTROPY,
        BLOCK_N,
        BLOCK_V,
        BLOCK_H,
        DOT_UPCAST,
        DOT_PRECISION,
    )
    if HAS_BIAS:
        tl.atomic_add(db_ptr + cols64, tl.sum(dz, axis=0), mask=col_mask, sem="relaxed")
    dz_in = dz.to(h_ptr.dtype.element_ty)
    if DOT_UPCAST:
        dz_in = dz_in.to(tl.float32)

    ks = tl.arange(0, BLOCK_H)
    for k0 in range(0, H, BLOCK_H):
        k = k0 + ks
        k_mask = k < H
        w = tl.load(
            w_ptr + cols64[:, None] * stride_wv + k[None, :], mask=col_mask[:, None] & k_mask[None, :], other=0.0
        )
        h = tl.load(
            h_ptr + rows64[:, None] * stride_hn + k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0
        )
        if DOT_UPCAST:
            w = w.to(tl.float32)
            h = h.to(tl.float32)
        dh = tl.dot(dz_in, w, input_precision=DOT_PRECISION)
        tl.atomic_add(
            dh_ptr + rows64[:, None] * H + k[None, :], dh, mask=row_mask[:, None] & k_mask[None, :], sem="relaxed"
        )
        dw = tl.dot(tl.trans(dz_in), h, input_precision=DOT_PRECISION)
        tl.atomic_add(
            dw_ptr + cols64[:, None] * H + k[None, :], dw, mask=col_mask[:, None] & k_mask[None, :], sem="relaxed"
        )


@triton.jit(do_not_specialize=["N", "num_n_blocks"])
def _linear_logprobs_bwd_dh_kernel(
    h_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    lse_ptr,
    ent_ptr,
    gl_ptr,
    gh_ptr,
    dh_ptr,
    N,
    V,
    H,
    stride_hn,
    stride_wv,
    inv_temperature,
    softcap,
    split_size,
    num_n_blocks,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_GRAD_ENTROPY: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Deterministic dh: program (i, s) owns dh_part[s, rows of block i] and walks its vocabulary split in order.

    Grid: num_n_blocks × S (row block fastest); split s covers columns [s·split_size,
    min((s+1)·split_size, V)). For each vocabulary block it recomputes z, forms
    dz = gℓ (onehot(y) − p) − gH p (log p + entropy) τ⁻¹ (cast to the input dtype), and adds
    dz W[cols] into dh_part[s, rows] (dh_part [S, N, H] fp32, zero-initialised) by a plain
    read-modify-write: no other program touches these elements and the order is fixed. The host sums
    the S partials in a fixed order, so the result is bitwise reproducible (S > 1 only when N alone
    gives too few programs to fill the GPU).
    """
    pid = tl.program_id(0)
    linear = (h_ptr, w_ptr, b_ptr, H, stride_hn, stride_wv, inv_temperature, softcap)
    grad_inputs = (y_ptr, lse_ptr, ent_ptr, gl_ptr, gh_ptr)
    pid_n = pid % num_n_blocks
    pid_s = pid // num_n_blocks
    v_start = pid_s.to(tl.int64) * split_size
    v_end = tl.minimum(v_start + split_size, V)
    dh_ptr += pid_s.to(tl.int64) * N * H
    rows64 = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    row_mask = rows64 < N
    row_grads = _row_grads(grad_inputs, rows64, row_mask, HAS_GRAD_ENTROPY)
    ks = tl.arange(0, BLOCK_H)
    for v0 in range(v_start, v_end, BLOCK_V):
        cols64 = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        col_mask = cols64 < v_end
        dz = _scaled_grad_tile(
            linear,
            (rows64, row_mask, cols64, col_mask),
            row_grads,
            HAS_BIAS,
            HAS_SOFTCAP,
            HAS_GRAD_ENTROPY,
            BLOCK_N,
            BLOCK_V,
            BLOCK_H,
            DOT_UPCAST,
            DOT_PRECISION,
        )
        dz_in = dz.to(h_ptr.dtype.element_ty)
        if DOT_UPCAST:
            dz_in = dz_in.to(tl.float32)
        for k0 in range(0, H, BLOCK_H):
            k = k0 + ks
            k_mask = k < H
            w = tl.load(
                w_ptr + cols64[:, None] * stride_wv + k[None, :], mask=col_mask[:, None] & k_mask[None, :], other=0.0
            )
            if DOT_UPCAST:
                w = w.to(tl.float32)
            out = dh_ptr + rows64[:, None] * H + k[None, :]
            out_mask = row_mask[:, None] & k_mask[None, :]
            acc = tl.load(out, mask=out_mask, other=0.0)
            acc = tl.dot(dz_in, w, acc, input_precision=DOT_PRECISION)
            tl.store(out, acc, mask=out_mask)


@triton.jit(do_not_specialize=["N", "split_size"])
def _linear_logprobs_bwd_dw_kernel(
    h_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    lse_ptr,
    ent_ptr,
    gl_ptr,
    gh_ptr,
    dw_ptr,
    db_ptr,
    N,
    V,
    H,
    stride_hn,
    stride_wv,
    inv_temperature,
    softcap,
    split_size,
    num_v_blocks,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_GRAD_ENTROPY: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Deterministic dW, db: program (j, s) owns dW_part[s, cols of block j] and walks its row split in order.

    Grid: num_v_blocks × S (vocabulary block fastest); split s covers rows [s·split_size,
    min((s+1)·split_size, N)). For each row block it recomputes z, forms dz τ⁻¹ as in the dh kernel,
    adds dzᵀ h[rows] into dW_part[s, cols] (dW_part [S, V, H] fp32, zero-initialised) by a plain
    read-modify-write and Σ_rows dz τ⁻¹ into a register accumulator written once to db_part[s, cols]
    (db_part [S, V] fp32). Fixed order, no float atomics; the host sums the S partials in a fixed
    order (S > 1 only for small vocabularies, where V alone gives too few programs).
    """
    pid = tl.program_id(0)
    linear = (h_ptr, w_ptr, b_ptr, H, stride_hn, stride_wv, inv_temperature, softcap)
    grad_inputs = (y_ptr, lse_ptr, ent_ptr, gl_ptr, gh_ptr)
    pid_v = pid % num_v_blocks
    pid_s = pid // num_v_blocks
    n_start = pid_s.to(tl.int64) * split_size
    n_end = tl.minimum(n_start + split_size, N)
    dw_ptr += pid_s.to(tl.int64) * V * H
    db_ptr += pid_s.to(tl.int64) * V
    cols64 = pid_v.to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V).to(tl.int64)
    col_mask = cols64 < V
    db = tl.zeros([BLOCK_V], dtype=tl.float32)
    ks = tl.arange(0, BLOCK_H)
    for n0 in range(n_start, n_end, BLOCK_N):
        rows64 = n0 + tl.arange(0, BLOCK_N).to(tl.int64)
        row_mask = rows64 < n_end
        row_grads = _row_grads(grad_inputs, rows64, row_mask, HAS_GRAD_ENTROPY)
        dz = _scaled_grad_tile(
            linear,
            (rows64, row_mask, cols64, col_mask),
            row_grads,
            HAS_BIAS,
            HAS_SOFTCAP,
            HAS_GRAD_ENTROPY,
            BLOCK_N,
            BLOCK_V,
            BLOCK_H,
            DOT_UPCAST,
            DOT_PRECISION,
        )
        db += tl.sum(dz, axis=0)
        dz_t = tl.trans(dz.to(h_ptr.dtype.element_ty))
        if DOT_UPCAST:
            dz_t = dz_t.to(tl.float32)
        for k0 in range(0, H, BLOCK_H):
            k = k0 + ks
            k_mask = k < H
            h = tl.load(
                h_ptr + rows64[:, None] * stride_hn + k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0
            )
            if DOT_UPCAST:
                h = h.to(tl.float32)
            out = dw_ptr + cols64[:, None] * H + k[None, :]
            out_mask = col_mask[:, None] & k_mask[None, :]
            acc = tl.load(out, mask=out_mask, other=0.0)
            acc = tl.dot(dz_t, h, acc, input_precision=DOT_PRECISION)
            tl.store(out, acc, mask=out_mask)
    if HAS_BIAS:
        tl.store(db_ptr + cols64, db, mask=col_mask)


# --------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------


def _check_inputs(hidden, weight, bias, targets):
    if hidden.dtype not in _FLOAT_TYPES:
        raise TypeError(
            f"hidden: the Triton kernels take float32, bfloat16 or float16, got {hidden.dtype} "
            "(use backend='torch' for float64)"
        )
    if weight.dtype != hidden.dtype or (bias is not None and bias.dtype != hidden.dtype):
        raise TypeError(f"weight/bias: expected dtype {hidden.dtype} (the dtype of hidden)")
    if hidden.dim() != 2 or weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"hidden [N, H] / weight [V, H]: got {list(hidden.shape)} and {list(weight.shape)}")
    if targets.shape != (hidden.shape[0],) or targets.dtype != torch.int64:
        raise ValueError(f"targets: expected [N={hidden.shape[0]}] int64, got {list(targets.shape)} {targets.dtype}")


def _dot_options(dtype: torch.dtype) -> dict:
    return {
        "DOT_UPCAST": interpreter_active() and dtype == torch.bfloat16,
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
    }


def _contiguous_rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _partials(out: torch.Tensor, splits: int) -> torch.Tensor:
    """[splits, *out.shape] zeroed partial sums; `out` itself (viewed [1, ...]) when there is one split."""
    if splits == 1:
        return out.unsqueeze(0)
    return torch.zeros((splits, *out.shape), dtype=out.dtype, device=out.device)


def _sum_partials(out: torch.Tensor, partials: torch.Tensor) -> None:
    """out = Σ_s partials[s], added in order s = 0, 1, ... (bitwise reproducible)."""
    if partials.shape[0] == 1 and partials.data_ptr() == out.data_ptr():
        return
    out.copy_(partials[0])
    for part in partials[1:]:
        out.add_(part)


# (kernel, tiles, device, constexpr arguments) -> the tiles that launched (num_stages possibly lowered)
_LAUNCHED: dict[tuple, BlockConfig] = {}


def _launch(kernel, grid: tuple[int], args: tuple, blocks: BlockConfig, device: torch.device, **constexprs) -> None:
    """kernel[grid](*args, BLOCK_N/V/H, num_warps, num_stages of `blocks`, **constexprs); on OutOfResources
    (the compiled kernel needs more shared memory than the device has: raised at load time, before the
    kernel runs) again with one pipeline stage fewer, down to one. The first launch of each configuration
    logs what ran; later launches start from the depth that worked."""
    key = (kernel.fn.__name__, blocks, str(device), tuple(sorted(constexprs.items())))
    ran = _LAUNCHED.get(key, blocks)
    while True:
        try:
            kernel[grid](
                *args,
                BLOCK_N=ran.block_n,
                BLOCK_V=ran.block_v,
                BLOCK_H=ran.block_h,
                num_warps=ran.num_warps,
                num_stages=ran.num_stages,
                **constexprs,
            )
            break
        except OutOfResources as err:
            if ran.num_stages <= 1:
                raise
            logger.warning("%s: %s; retrying with num_stages=%d", key[0], err, ran.num_stages - 1)
            ran = replace(ran, num_stages=ran.num_stages - 1)
    if key not in _LAUNCHED:
        _LAUNCHED[key] = ran
        logger.info("%s on %s: %s (asked for num_stages=%d)", key[0], device, ran, blocks.num_stages)


def launched_configs() -> list[dict]:
    """Every kernel configuration launched in this process: kernel, device, the tiles that ran and the
    num_stages asked for (lower than `num_stages` when the shared-memory fallback stepped in)."""
    return [
        {"kernel": name, "device": device, **vars(ran), "asked_num_stages": asked.num_stages}
        for (name, asked, device, _), ran in _LAUNCHED.items()
    ]


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def vocab_splits(num_n_blocks: int, num_v_blocks: int, device: torch.device) -> int:
    """How many vocabulary splits give the forward about 4 programs per SM (1 when N alone does)."""
    target = _TARGET_PROGRAMS_PER_SM * _num_sms(device)
    return max(1, min(num_v_blocks, triton.cdiv(target, max(num_n_blocks, 1))))


def linear_logprobs_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    inv_temperature: float,
    blocks: BlockConfig | None = None,
    splits: int | None = None,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [N, H], weight [V, H], bias [V] | None, targets [N] int64 -> (logp, entropy, lse), each [N] fp32,
    of the logits c tanh((h Wᵀ + b) / c) τ⁻¹ (softcap c > 0) or (h Wᵀ + b) τ⁻¹ (softcap 0).

    `splits` vocabulary splits (default: enough programs to fill the GPU) are combined on the host
    with an O(S·N) log-sum-exp merge."""
    _check_inputs(hidden, weight, bias, targets)
    blocks = blocks or default_blocks("forward", hidden.dtype)
    hidden, weight = _contiguous_rows(hidden), _contiguous_rows(weight)
    num_rows, hidden_size = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    if num_rows == 0:
        empty = torch.empty(0, dtype=torch.float32, device=device)
        return empty, empty.clone(), empty.clone()
    num_n_blocks = triton.cdiv(num_rows, blocks.block_n)
    num_v_blocks = triton.cdiv(vocab, blocks.block_v)
    splits = vocab_splits(num_n_blocks, num_v_blocks, device) if splits is None else max(1, min(splits, num_v_blocks))
    split_size = triton.cdiv(num_v_blocks, splits) * blocks.block_v
    splits = triton.cdiv(vocab, split_size)  # every split non-empty
    part = torch.empty(3, splits, num_rows, dtype=torch.float32, device=device)
    zy = torch.empty(num_rows, dtype=torch.float32, device=device)
    args = (hidden, weight, bias if bias is not None else hidden, targets, part, zy, num_rows, vocab, hidden_size)
    args += (hidden.stride(0), weight.stride(0), float(inv_temperature), float(softcap), split_size)
    args += (splits * num_rows, num_n_blocks)
    _launch(
        _linear_logprobs_fwd_kernel,
        (num_n_blocks * splits,),
        args,
        blocks,
        device,
        HAS_BIAS=bias is not None,
        HAS_SOFTCAP=softcap > 0,
        **_dot_options(hidden.dtype),
    )
    m, s, t = part.unbind(0)
    if splits == 1:
        m_all, s_all, t_all = m[0], s[0], t[0]
    else:
        m_all = m.amax(dim=0)
        scale = torch.exp(m - m_all)
        s_all = (s * scale).sum(dim=0)
        t_all = (scale * (t + s * (m - m_all))).sum(dim=0)
    log_s = torch.log(s_all)
    lse = m_all + log_s
    entropy = log_s - t_all / s_all
    return zy - lse, entropy, lse


def linear_logprobs_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    inv_temperature: float,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    grad_logp: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    deterministic: bool = False,
    blocks: BlockConfig | None = None,
    group_n: int = 16,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Recompute-mode backward -> (dh [N, H] in hidden's dtype, dW [V, H] fp32, db [V] fp32 | None).

    lse, entropy, grad_logp, grad_entropy: [N] fp32 (grad_entropy None = 0); softcap as in the forward.
    deterministic=True uses the two atomic-free kernels (one more recompute of the logits, bitwise
    reproducible)."""
    _check_inputs(hidden, weight, bias, targets)
    blocks = blocks or default_blocks("deterministic" if deterministic else "backward", hidden.dtype)
    hidden, weight = _contiguous_rows(hidden), _contiguous_rows(weight)
    num_rows, hidden_size = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    lse, entropy = lse.float().contiguous(), entropy.float().contiguous()
    grad_logp = grad_logp.float().contiguous()
    has_gh = grad_entropy is not None
    grad_entropy = grad_entropy.float().contiguous() if has_gh else grad_logp
    grad_hidden = torch.zeros(num_rows, hidden_size, dtype=torch.float32, device=device)
    grad_weight = torch.zeros(vocab, hidden_size, dtype=torch.float32, device=device)
    grad_bias = torch.zeros(vocab, dtype=torch.float32, device=device) if bias is not None else None
    if num_rows == 0:
        return grad_hidden.to(hidden.dtype), grad_weight, grad_bias
    num_n_blocks = triton.cdiv(num_rows, blocks.block_n)
    num_v_blocks = triton.cdiv(vocab, blocks.block_v)
    common = dict(HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap > 0, HAS_GRAD_ENTROPY=has_gh)
    common |= _dot_options(hidden.dtype)
    bias_arg = bias if bias is not None else hidden
    db_arg = grad_bias if grad_bias is not None else grad_weight
    inputs = (hidden, weight, bias_arg, targets, lse, entropy, grad_logp, grad_entropy)
    scalars = (num_rows, vocab, hidden_size, hidden.stride(0), weight.stride(0), float(inv_temperature), float(softcap))
    if deterministic:
        # Split the vocabulary (for dh) / the rows (for dW) only when the other axis alone gives too
        # few programs, and only as far as a partial-sum budget allows; partials are summed in order.
        target = _TARGET_PROGRAMS_PER_SM * _num_sms(device)
        budget = _DETERMINISTIC_PARTIAL_BYTES // (4 * hidden_size)
        dh_splits = min(num_v_blocks, triton.cdiv(target, num_n_blocks), max(1, budget // num_rows))
        dh_split = triton.cdiv(num_v_blocks, dh_splits) * blocks.block_v
        dh_splits = triton.cdiv(vocab, dh_split)
        dw_splits = min(num_n_blocks, triton.cdiv(target, num_v_blocks), max(1, budget // vocab))
        dw_split = triton.cdiv(num_n_blocks, dw_splits) * blocks.block_n
        dw_splits = triton.cdiv(num_rows, dw_split)
        dh_part = _partials(grad_hidden, dh_splits)
        dw_part = _partials(grad_weight, dw_splits)
        db_part = _partials(grad_bias, dw_splits) if grad_bias is not None else dw_part
        dh_args = (*inputs, dh_part, *scalars, dh_split, num_n_blocks)
        _launch(_linear_logprobs_bwd_dh_kernel, (num_n_blocks * dh_splits,), dh_args, blocks, device, **common)
        dw_args = (*inputs, dw_part, db_part, *scalars, dw_split, num_v_blocks)
        _launch(_linear_logprobs_bwd_dw_kernel, (num_v_blocks * dw_splits,), dw_args, blocks, device, **common)
        _sum_partials(grad_hidden, dh_part)
        _sum_partials(grad_weight, dw_part)
        if grad_bias is not None:
            _sum_partials(grad_bias, db_part)
    else:
        args = (*inputs, grad_hidden, grad_weight, db_arg, *scalars, num_n_blocks, num_v_blocks)
        grid = (num_n_blocks * num_v_blocks,)
        _launch(_linear_logprobs_bwd_kernel, grid, args, blocks, device, GROUP_N=group_n, **common)
    return grad_hidden.to(hidden.dtype), grad_weight, grad_bias
