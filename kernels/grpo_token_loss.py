"""Layer 2 in Triton: the O(N) GRPO token math as one fused kernel, one program per sequence.

The twin of grpo_fast.loss.token_math.grpo_token_loss (whose docstring has the full derivation); both
must agree on every option. Per token i of sequence b, with ℓ logprob, o old logprob (ℓ when
absent), r reference logprob, A advantage, w importance weight (1 when absent), H entropy, m mask,
c reduction weight, e entropy weight, L_b = Σ_{i∈b} m_i:

  s_i = ℓ_i − o_i (token level)  or  s_b = Σ_{j∈b} m_j (ℓ_j − o_j) / max(L_b, 1) (sequence level)
  ρ = e^s;  clipped:     t1 = min(ρ, δ), t2 = clip(ρ, 1 − ε_lo, 1 + ε_hi), p = −min(t1 A, t2 A)
            cispo:       p = −min(ρ, ε_hi) A ℓ   (the capped ratio is detached)
  kl = e^{r−ℓ} − (r − ℓ) − 1 (0 on padding rows)
  L = Σ c (w p + β kl) − entropy_coef Σ e H

  gℓ_i = c_i w_i ∂p_i/∂s_i + β c_i (1 − e^{r_i−ℓ_i})                              (token level, cispo)
  gℓ_j = m_j / max(L_b, 1) · Σ_{i∈b} c_i w_i ∂p_i/∂s_b + β c_j (1 − e^{r_j−ℓ_j})   (sequence level)
  with ∂p/∂s = −A ρ [ρ ≤ δ] (first branch of the min) or −A ρ [1−ε_lo ≤ ρ ≤ 1+ε_hi] (second);
  gH_i = −entropy_coef e_i.

Hyper-parameters (ε_lo, ε_hi, δ — +inf when off —, β, entropy_coef) are runtime scalars; only the
loss family, the ratio level and which optional inputs exist are constexpr.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..loss.loss_types import Objective, get_loss_type

NUM_SUMS = 8  # loss, kl, clip_low, clip_high, clip_region, entropy, logprob, is_weight (token_math.SUM_NAMES)


@triton.jit
def _ratio_terms(
    ratio,
    adv,
    logp,
    c,
    w,
    mask,
    clip_low,
    clip_high,
    delta,
    IS_CISPO: tl.constexpr,
):
    """Per-token (w·p, c·w·∂p/∂s, low, high) for ratios ρ [BLOCK_T]; low/high as 0/1 floats, masked."""
    if IS_CISPO:
        capped = tl.minimum(ratio, clip_high)
        per_token = -capped * adv * logp
        d_ratio = c * w * (-capped * adv)
        high = tl.where((ratio > clip_high) & (adv > 0), 1.0, 0.0)
        low = tl.zeros_like(high)
    else:
        lo = 1.0 - clip_low
        hi = 1.0 + clip_high
        t1 = tl.minimum(ratio, delta)
        t2 = tl.minimum(tl.maximum(ratio, lo), hi)
        dt1 = tl.where(ratio <= delta, ratio, 0.0)
        dt2 = tl.where((ratio >= lo) & (ratio <= hi), ratio, 0.0)
        first = t1 * adv <= t2 * adv
        per_token = -tl.minimum(t1 * adv, t2 * adv)
        d_ratio = c * w * (-adv * tl.where(first, dt1, dt2))
        low = tl.where((ratio < lo) & (adv < 0), 1.0, 0.0)
        high = tl.where((ratio > hi) & (adv > 0), 1.0, 0.0)
    return per_token, d_ratio, low * mask, high * mask


@triton.jit
def _grpo_token_loss_kernel(
    logp_ptr,
    ent_ptr,
    old_ptr,
    ref_ptr,
    adv_ptr,
    isw_ptr,
    c_ptr,
    e_ptr,
    mask_ptr,
    cu_ptr,
    sums_ptr,
    gl_ptr,
    gh_ptr,
    clip_low,
    clip_high,
    delta,
    beta,
    entropy_coef,
    IS_CISPO: tl.constexpr,
    SEQ_LEVEL: tl.constexpr,
    SEQ_GRAD: tl.constexpr,
    HAS_OLD: tl.constexpr,
    HAS_REF: tl.constexpr,
    HAS_IS_WEIGHTS: tl.constexpr,
    HAS_ENTROPY: tl.constexpr,
    WRITE_GRAD_ENTROPY: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """One sequence b: rows [cu[b], cu[b+1]) of the flat [N] fp32 inputs, in blocks of BLOCK_T.

    Inputs: ℓ, H (HAS_ENTROPY), o (HAS_OLD), r (HAS_REF, i.e. β ≠ 0), A, w (HAS_IS_WEIGHTS), c, e, m,
    all [N] fp32; cu [B+1] int64. Outputs: sums [B, 8] fp32 — this sequence's Σ of (loss, m·kl,
    m·low, m·high, m·(low|high), m·H, m·ℓ, m·w); gℓ [N] fp32; gH [N] = −entropy_coef·e
    (WRITE_GRAD_ENTROPY, i.e. entropy_coef ≠ 0). SEQ_GRAD = sequence level and not cispo (cispo's
    gradient stays per token). Formulas: module docstring. Passes over the sequence: at sequence level,
    (1) Σ m (ℓ − o) and L_b, (2) loss terms, metrics, β-part of gℓ and Σ c w ∂p/∂s_b,
    (3) gℓ += m Σ / max(L_b, 1); at token level pass (2) alone writes everything.
    """
    seq = tl.program_id(0)
    start = tl.load(cu_ptr + seq)
    end = tl.load(cu_ptr + seq + 1)
    offs = tl.arange(0, BLOCK_T)

    seq_ratio = 0.0
    seq_len = 1.0
    if SEQ_LEVEL:
        acc_lr = tl.zeros([BLOCK_T], dtype=tl.float32)
        acc_m = tl.zeros([BLOCK_T], dtype=tl.float32)
        for t0 in range(start, end, BLOCK_T):
            rows = t0 + offs
            inside = rows < end
            mask = tl.load(mask_ptr + rows, mask=inside, other=0.0)
            logp = tl.load(logp_ptr + rows, mask=inside, other=0.0)
            old = logp
            if HAS_OLD:
                old = tl.load(old_ptr + rows, mask=inside, other=0.0)
            acc_lr += (logp - old) * mask
            acc_m += mask
        seq_len = tl.maximum(tl.sum(acc_m, axis=0), 1.0)
        seq_ratio = tl.exp(tl.sum(acc_lr, axis=0) / seq_len)

    acc_loss = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_kl = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_low = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_high = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_region = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_ent = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_logp = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_w = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_dseq = tl.zeros([BLOCK_T], dtype=tl.float32)
    for t0 in range(start, end, BLOCK_T):
        rows = t0 + offs
        inside = rows < end
        mask = tl.load(mask_ptr + rows, mask=inside, other=0.0)
        logp = tl.load(logp_ptr + rows, mask=inside, other=0.0)
        adv = tl.load(adv_ptr + rows, mask=inside, other=0.0)
        c = tl.load(c_ptr + rows, mask=inside, other=0.0)
        w = tl.full([BLOCK_T], 1.0, dtype=tl.float32)
        if HAS_IS_WEIGHTS:
            w = tl.load(isw_ptr + rows, mask=inside, other=0.0)
        if SEQ_LEVEL:
            ratio = tl.zeros([BLOCK_T], dtype=tl.float32) + seq_ratio
        else:
            old = logp
            if HAS_OLD:
                old = tl.load(old_ptr + rows, mask=inside, other=0.0)
            ratio = tl.exp(logp - old)
        per_token, d_ratio, low, high = _ratio_terms(ratio, adv, logp, c, w, mask, clip_low, clip_high, delta, IS_CISPO)
        loss = c * w * per_token
        grad = d_ratio
        if SEQ_GRAD:
            acc_dseq += tl.where(inside, d_ratio, 0.0)
            grad = tl.zeros_like(d_ratio)
        if HAS_REF:
            ref = tl.load(ref_ptr + rows, mask=inside, other=0.0)
            gap = tl.where(mask > 0, ref - logp, 0.0)
            egap = tl.exp(gap)
            kl = egap - gap - 1.0
            loss = loss + beta * c * kl
            grad = grad + beta * c * (1.0 - egap)
            acc_kl += mask * kl
        if WRITE_GRAD_ENTROPY:
            e = tl.load(e_ptr + rows, mask=inside, other=0.0)
            tl.store(gh_ptr + rows, -entropy_coef * e, mask=inside)
        if HAS_ENTROPY:
            ent = tl.load(ent_ptr + rows, mask=inside, other=0.0)
            acc_ent += mask * ent
            if WRITE_GRAD_ENTROPY:
                loss = loss - entropy_coef * (e * ent)
        acc_loss += tl.where(inside, loss, 0.0)
        acc_low += low
        acc_high += high
        acc_region += tl.maximum(low, high)
        acc_logp += mask * logp
        acc_w += mask * w
        tl.store(gl_ptr + rows, grad, mask=inside)

    if SEQ_GRAD:
        d_seq = tl.sum(acc_dseq, axis=0) / seq_len
        for t0 in range(start, end, BLOCK_T):
            rows = t0 + offs
            inside = rows < end
            mask = tl.load(mask_ptr + rows, mask=inside, other=0.0)
            partial = tl.load(gl_ptr + rows, mask=inside, other=0.0)
            tl.store(gl_ptr + rows, mask * d_seq + partial, mask=inside)

    out = sums_ptr + seq.to(tl.int64) * 8
    tl.store(out + 0, tl.sum(acc_loss, axis=0))
    tl.store(out + 1, tl.sum(acc_kl, axis=0))
    tl.store(out + 2, tl.sum(acc_low, axis=0))
    tl.store(out + 3, tl.sum(acc_high, axis=0))
    tl.store(out + 4, tl.sum(acc_region, axis=0))
    tl.store(out + 5, tl.sum(acc_ent, axis=0))
    tl.store(out + 6, tl.sum(acc_logp, axis=0))
    tl.store(out + 7, tl.sum(acc_w, axis=0))


def grpo_token_loss_triton(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    is_weights: torch.Tensor | None,
    loss_weights: torch.Tensor,
    entropy_weights: torch.Tensor,
    mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    loss_type: str,
    sequence_level: bool,
    clip_low: float,
    clip_high: float,
    delta: float | None,
    beta: float,
    entropy_coef: float,
    block_t: int = 256,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Flat [N] fp32 inputs, cu_seqlens [B+1] -> (sums [8], gℓ [N], gH [N] | None), all fp32.

    loss_type names a row of the loss-type table; the kernel implements its objective (the reduction
    arrives as `loss_weights`). The per-sequence partial sums [B, 8] are added up in torch (a
    fixed-order, deterministic reduction)."""
    objective = get_loss_type(loss_type).objective
    if objective not in (Objective.CLIPPED, Objective.CISPO):
        raise NotImplementedError(f"loss_type {loss_type!r}: objective {objective.value!r} has no Triton kernel")
    tensors = [logprobs, entropy, old_logprobs, ref_logprobs, advantages, is_weights, loss_weights, entropy_weights]
    for tensor in tensors + [mask]:
        if tensor is not None and tensor.dtype != torch.float32:
            raise TypeError(f"grpo_token_loss_triton: expected float32 per-token inputs, got {tensor.dtype}")
    num_rows = logprobs.numel()
    num_seqs = cu_seqlens.numel() - 1
    device = logprobs.device
    has_ref = ref_logprobs is not None and beta != 0.0
    write_gh = entropy_coef != 0.0
    grad_logp = torch.empty(num_rows, dtype=torch.float32, device=device)
    grad_entropy = torch.empty(num_rows, dtype=torch.float32, device=device) if write_gh else None
    partial = torch.empty(max(num_seqs, 1), NUM_SUMS, dtype=torch.float32, device=device)
    if num_seqs == 0:
        return partial.new_zeros(NUM_SUMS), grad_logp, grad_entropy
    contiguous = [None if t is None else t.contiguous() for t in tensors]
    logp_c = contiguous[0]
    args = [t if t is not None else logp_c for t in contiguous]
    _grpo_token_loss_kernel[(num_seqs,)](
        *args,
        mask.contiguous(),
        cu_seqlens.to(device=device, dtype=torch.int64).contiguous(),
        partial,
        grad_logp,
        grad_entropy if grad_entropy is not None else grad_logp,
        float(clip_low),
        float(clip_high),
        float("inf") if delta is None else float(delta),
        float(beta),
        float(entropy_coef),
        IS_CISPO=objective is Objective.CISPO,
        SEQ_LEVEL=sequence_level,
        SEQ_GRAD=sequence_level and objective is Objective.CLIPPED,
        HAS_OLD=old_logprobs is not None,
        HAS_REF=has_ref,
        HAS_IS_WEIGHTS=is_weights is not None,
        HAS_ENTROPY=entropy is not None,
        WRITE_GRAD_ENTROPY=write_gh,
        BLOCK_T=block_t,
        num_warps=num_warps,
    )
    return partial[:num_seqs].sum(dim=0), grad_logp, grad_entropy
