"""Layer 2 in Triton: the O(N) GRPO token math as one fused kernel, one program per sequence.

The twin of grpo_fast.loss.token_math.grpo_token_loss (whose docstring has the full derivation); both
must agree on every option. Per token i of sequence b, with ℓ logprob, o old logprob (ℓ when
absent), r reference logprob, A advantage, w importance weight (1 when absent), H entropy, m mask,
c reduction weight, e entropy weight, L_b = Σ_{i∈b} m_i:

  s_i = ℓ_i − o_i (token level)  or  s_b = Σ_{j∈b} m_j (ℓ_j − o_j) / max(L_b, 1) (sequence level)
  ρ = e^s;  clipped:     t1 = min(ρ, δ), t2 = clip(ρ, 1 − ε_lo, 1 + ε_hi), p = −min(t1 A, t2 A)
            cispo:       p = −min(ρ, ε_hi) A ℓ   (the capped ratio is detached)
            sapo:        p = −(4/τ) σ(τ (ρ − 1)) A,  τ = τ_pos if A > 0 else τ_neg
            vespo:       p = −φ A ℓ (φ detached), φ = e^{λ + k log W_b − λ W_b} (0 if not finite),
                         log W_b = clamp(Σ_{j∈b} m_j (clamp(ℓ_j − o_j, ±20) + clamp(log w_j, log 1e-8, 20)),
                                         log 1e-8, 20)  (IS_PER_SEQ: w_j = w_b for all j, added once:
                                         Σ_j m_j clamp(log w_j) / max(L_b, 1)),
                         (k, λ) = the _pos pair if A ≥ 0 else the _neg pair; w enters W_b only (v = 1, else v = w)
  kl = e^{r−ℓ} − (r − ℓ) − 1 (0 on padding rows);  κ = kl ρ (BIAS_KL) or kl
  L = Σ c (v p + β κ) − entropy_coef Σ e H

  d_i = c_i v_i ∂p_i/∂ℓ_i + β c_i (1 − e^{r_i−ℓ_i}) (· ρ_i if BIAS_KL)        (direct: cispo, vespo, KL)
  q_i = c_i v_i ∂p_i/∂s_i (+ β c_i kl_i ρ_i if BIAS_KL)                          (through the ratio)
  with ∂p/∂s = −A ρ [ρ ≤ δ] (first branch of the min) or −A ρ [1−ε_lo ≤ ρ ≤ 1+ε_hi] (second) for clipped,
  −4 A σ (1 − σ) ρ for sapo;
  gℓ_i = d_i + q_i (token level);  gℓ_j = d_j + m_j / max(L_b, 1) · Σ_{i∈b} q_i (sequence level);
  gH_i = −entropy_coef e_i.

Hyper-parameters (ε_lo, ε_hi, δ — +inf when off —, β, entropy_coef, τ_pos, τ_neg, the vespo k and λ)
are runtime scalars; only the objective, the ratio level, the KL correction and which optional inputs
exist are constexpr.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import torch
import triton
import triton.language as tl

NUM_SUMS = 8  # loss, kl, clip_low, clip_high, clip_region, entropy, logprob, is_weight (token_math.SUM_NAMES)


class KernelObjective(IntEnum):
    """The per-token surrogates this kernel implements (its OBJECTIVE constexpr)."""

    CLIPPED = 0
    CISPO = 1
    SAPO = 2
    VESPO = 3


@dataclass(frozen=True)
class TokenLossOptions:
    """The kernel's options as plain numbers. delta: +inf when off. vespo_lambda_*: already floored (TRL: 1e-4).
    is_weights_per_sequence: the importance weights are one per sequence, broadcast over its rows."""

    objective: KernelObjective
    sequence_level: bool
    clip_low: float
    clip_high: float
    delta: float
    beta: float
    entropy_coef: float
    use_bias_correction_kl: bool
    sapo_temperature_pos: float
    sapo_temperature_neg: float
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float
    is_weights_per_sequence: bool = False


_LOG_FLOOR = tl.constexpr(math.log(1e-8))  # vespo's floor of log-ratios (TRL's get_gamma_weights)


@triton.jit
def _objective_terms(
    ratio,
    adv,
    logp,
    phi,
    c,
    w,
    clip_low,
    clip_high,
    delta,
    tau_pos,
    tau_neg,
    OBJECTIVE: tl.constexpr,
):
    """Per-token (p, d, q, low, high) of the objective for ratios ρ [BLOCK_T]: the surrogate p, its gradient
    parts d = c w ∂p/∂ℓ (direct) and q = c w ∂p/∂s (through the ratio), and the clip flags as 0/1 floats
    (unmasked). `w` is v of the module docstring (1 for vespo); `phi` is vespo's φ (unused otherwise)."""
    zero = tl.zeros_like(ratio)
    if OBJECTIVE == 1:  # cispo
        capped = tl.minimum(ratio, clip_high)
        per_token = -capped * adv * logp
        d = c * w * (-capped * adv)
        q = zero
        high = tl.where((ratio > clip_high) & (adv > 0), 1.0, 0.0)
        low = zero
    elif OBJECTIVE == 2:  # sapo
        tau = tl.where(adv > 0, tau_pos, tau_neg)
        gate = tl.sigmoid(tau * (ratio - 1.0))
        per_token = -(4.0 / tau) * gate * adv
        d = zero
        q = c * w * (-4.0 * adv * gate * (1.0 - gate) * ratio)
        low = zero
        high = zero
    elif OBJECTIVE == 3:  # vespo
        per_token = -phi * adv * logp
        d = c * w * (-phi * adv)
        q = zero
        low = zero
        high = zero
    else:  # clipped
        lo = 1.0 - clip_low
        hi = 1.0 + clip_high
        t1 = tl.minimum(ratio, delta)
        t2 = tl.minimum(tl.maximum(ratio, lo), hi)
        dt1 = tl.where(ratio <= delta, ratio, 0.0)
        dt2 = tl.where((ratio >= lo) & (ratio <= hi), ratio, 0.0)
        first = t1 * adv <= t2 * adv
        per_token = -tl.minimum(t1 * adv, t2 * adv)
        d = zero
        q = c * w * (-adv * tl.where(first, dt1, dt2))
        low = tl.where((ratio < lo) & (adv < 0), 1.0, 0.0)
        high = tl.where((ratio > hi) & (adv > 0), 1.0, 0.0)
    return per_token, d, q, low, high


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
    tau_pos,
    tau_neg,
    k_pos,
    lam_pos,
    k_neg,
    lam_neg,
    OBJECTIVE: tl.constexpr,
    SEQ_LEVEL: tl.constexpr,
    SEQ_STATS: tl.constexpr,
    SEQ_GRAD: tl.constexpr,
    BIAS_KL: tl.constexpr,
    HAS_OLD: tl.constexpr,
    HAS_REF: tl.constexpr,
    HAS_IS_WEIGHTS: tl.constexpr,
    HAS_ENTROPY: tl.constexpr,
    WRITE_GRAD_ENTROPY: tl.constexpr,
    BLOCK_T: tl.constexpr,
    IS_PER_SEQ: tl.constexpr,
):
    """One sequence b: rows [cu[b], cu[b+1]) of the flat [N] fp32 inputs, in blocks of BLOCK_T.

    Inputs: ℓ, H (HAS_ENTROPY), o (HAS_OLD), r (HAS_REF, i.e. β ≠ 0), A, w (HAS_IS_WEIGHTS), c, e, m,
    all [N] fp32; cu [B+1] int64. Outputs: sums [B, 8] fp32 — this sequence's Σ of (loss, m·κ,
    m·low, m·high, m·(low|high), m·H, m·ℓ, m·w); gℓ [N] fp32; gH [N] = −entropy_coef·e
    (WRITE_GRAD_ENTROPY, i.e. entropy_coef ≠ 0). OBJECTIVE: 0 clipped, 1 cispo, 2 sapo, 3 vespo.
    SEQ_STATS = sequence level or vespo; SEQ_GRAD = sequence level with some q ≠ 0 (clipped, sapo, or
    BIAS_KL). BIAS_KL = use_bias_correction_kl with β ≠ 0. IS_PER_SEQ: w is one weight per sequence
    broadcast over its rows, so vespo adds clamp(log w_b) to log W_b once (Σ m · / L_b).
    Formulas: module docstring. Passes over the sequence: (1, SEQ_STATS) Σ m (ℓ − o), L_b and vespo's
    log W_b, (2) loss terms, metrics, gℓ's direct part (and, at token level, all of it) and Σ q,
    (3, SEQ_GRAD) gℓ += m Σ q / max(L_b, 1).
    """
    seq = tl.program_id(0)
    start = tl.load(cu_ptr + seq)
    end = tl.load(cu_ptr + seq + 1)
    offs = tl.arange(0, BLOCK_T)

    seq_ratio = 0.0
    seq_len = 1.0
    log_w = 0.0
    w_seq = 1.0
    if SEQ_STATS:
        acc_lr = tl.zeros([BLOCK_T], dtype=tl.float32)
        acc_m = tl.zeros([BLOCK_T], dtype=tl.float32)
        acc_vespo = tl.zeros([BLOCK_T], dtype=tl.float32)
        acc_vespo_is = tl.zeros([BLOCK_T], dtype=tl.float32)
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
            if OBJECTIVE == 3:
                term = tl.minimum(tl.maximum(logp - old, -20.0), 20.0)
                if HAS_IS_WEIGHTS:  # log 0 = −inf (masked-out ratios) clamps to log 1e-8
                    isw = tl.where(mask > 0, tl.load(isw_ptr + rows, mask=inside, other=1.0), 1.0)
                    log_is = tl.minimum(tl.maximum(tl.log(isw), _LOG_FLOOR), 20.0)
                    if IS_PER_SEQ:
                        acc_vespo_is += mask * log_is
                    else:
                        term += log_is
                acc_vespo += mask * term
        seq_len = tl.maximum(tl.sum(acc_m, axis=0), 1.0)
        if SEQ_LEVEL:
            seq_ratio = tl.exp(tl.sum(acc_lr, axis=0) / seq_len)
        if OBJECTIVE == 3:
            log_w = tl.sum(acc_vespo, axis=0)
            if IS_PER_SEQ:  # the sequence's one weight, once
                log_w += tl.sum(acc_vespo_is, axis=0) / seq_len
            log_w = tl.minimum(tl.maximum(log_w, _LOG_FLOOR), 20.0)
            w_seq = tl.exp(log_w)

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
        v = w
        phi = tl.zeros([BLOCK_T], dtype=tl.float32)
        if OBJECTIVE == 3:
            nonneg = adv >= 0
            lam = tl.where(nonneg, lam_pos, lam_neg)
            phi = tl.exp(lam + tl.where(nonneg, k_pos, k_neg) * log_w - lam * w_seq)
            phi = tl.where(phi < float("inf"), phi, 0.0)  # TRL's nan_to_num(posinf=0, nan=0)
            v = tl.full([BLOCK_T], 1.0, dtype=tl.float32)
        per_token, grad, dq, low, high = _objective_terms(
            ratio, adv, logp, phi, c, v, clip_low, clip_high, delta, tau_pos, tau_neg, OBJECTIVE
        )
        loss = c * v * per_token
        if HAS_REF:
            ref = tl.load(ref_ptr + rows, mask=inside, other=0.0)
            gap = tl.where(mask > 0, ref - logp, 0.0)
            egap = tl.exp(gap)
            kl = egap - gap - 1.0
            dkl = 1.0 - egap
            if BIAS_KL:  # κ = kl ρ
                dkl = dkl * ratio
                dq += beta * c * kl * ratio
                kl = kl * ratio
            loss = loss + beta * c * kl
            grad = grad + beta * c * dkl
            acc_kl += mask * kl
        if SEQ_GRAD:
            acc_dseq += tl.where(inside, dq, 0.0)
        else:
            grad = grad + dq
        if WRITE_GRAD_ENTROPY:
            e = tl.load(e_ptr + rows, mask=inside, other=0.0)
            tl.store(gh_ptr + rows, -entropy_coef * e, mask=inside)
        if HAS_ENTROPY:
            ent = tl.load(ent_ptr + rows, mask=inside, other=0.0)
            acc_ent += mask * ent
            if WRITE_GRAD_ENTROPY:
                loss = loss - entropy_coef * (e * ent)
        acc_loss += tl.where(inside, loss, 0.0)
        acc_low += low * mask
        acc_high += high * mask
        acc_region += tl.maximum(low, high) * mask
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
            tl.store(gl_ptr + rows, partial + mask * d_seq, mask=inside)

    out = sums_ptr + seq.to(tl.int64) * 8
    flag_scale = 1.0 / seq_len if SEQ_LEVEL else 1.0  # one flag per sequence at sequence level (TRL's metric)
    tl.store(out + 0, tl.sum(acc_loss, axis=0))
    tl.store(out + 1, tl.sum(acc_kl, axis=0))
    tl.store(out + 2, tl.sum(acc_low, axis=0) * flag_scale)
    tl.store(out + 3, tl.sum(acc_high, axis=0) * flag_scale)
    tl.store(out + 4, tl.sum(acc_region, axis=0) * flag_scale)
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
    options: TokenLossOptions,
    *,
    block_t: int = 256,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Flat [N] fp32 inputs, cu_seqlens [B+1] -> (sums [8], gℓ [N], gH [N] | None), all fp32.

    The reduction arrives as `loss_weights` (c); `options` carries the objective and its hyper-parameters.
    The per-sequence partial sums [B, 8] are added up in torch (a fixed-order, deterministic reduction)."""
    tensors = [logprobs, entropy, old_logprobs, ref_logprobs, advantages, is_weights, loss_weights, entropy_weights]
    for tensor in tensors + [mask]:
        if tensor is not None and tensor.dtype != torch.float32:
            raise TypeError(f"grpo_token_loss_triton: expected float32 per-token inputs, got {tensor.dtype}")
    objective = KernelObjective(options.objective)
    num_rows = logprobs.numel()
    num_seqs = cu_seqlens.numel() - 1
    device = logprobs.device
    has_ref = ref_logprobs is not None and options.beta != 0.0
    bias_kl = has_ref and options.use_bias_correction_kl
    write_gh = options.entropy_coef != 0.0
    grad_logp = torch.empty(num_rows, dtype=torch.float32, device=device)
    grad_entropy = torch.empty(num_rows, dtype=torch.float32, device=device) if write_gh else None
    partial = torch.empty(max(num_seqs, 1), NUM_SUMS, dtype=torch.float32, device=device)
    if num_seqs == 0:
        return partial.new_zeros(NUM_SUMS), grad_logp, grad_entropy
    contiguous = [None if t is None else t.contiguous() for t in tensors]
    logp_c = contiguous[0]
    args = [t if t is not None else logp_c for t in contiguous]
    through_ratio = objective in (KernelObjective.CLIPPED, KernelObjective.SAPO)  # q ≠ 0
    _grpo_token_loss_kernel[(num_seqs,)](
        *args,
        mask.contiguous(),
        cu_seqlens.to(device=device, dtype=torch.int64).contiguous(),
        partial,
        grad_logp,
        grad_entropy if grad_entropy is not None else grad_logp,
        float(options.clip_low),
        float(options.clip_high),
        float(options.delta),
        float(options.beta),
        float(options.entropy_coef),
        float(options.sapo_temperature_pos),
        float(options.sapo_temperature_neg),
        float(options.vespo_k_pos),
        float(options.vespo_lambda_pos),
        float(options.vespo_k_neg),
        float(options.vespo_lambda_neg),
        OBJECTIVE=int(objective),
        SEQ_LEVEL=options.sequence_level,
        SEQ_STATS=options.sequence_level or objective is KernelObjective.VESPO,
        SEQ_GRAD=options.sequence_level and (through_ratio or bias_kl),
        BIAS_KL=bias_kl,
        HAS_OLD=old_logprobs is not None,
        HAS_REF=has_ref,
        HAS_IS_WEIGHTS=is_weights is not None,
        IS_PER_SEQ=is_weights is not None and options.is_weights_per_sequence,
        HAS_ENTROPY=entropy is not None,
        WRITE_GRAD_ENTROPY=write_gh,
        BLOCK_T=block_t,
        num_warps=num_warps,
    )
    return partial[:num_seqs].sum(dim=0), grad_logp, grad_entropy
