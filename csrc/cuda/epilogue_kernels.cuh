// CUDA epilogue kernels of the chunked layer 1 (backend "cuda"): plain pointers, no torch headers, so
// CI compile-checks them with nvcc alone (tests/test_cuda_compile.py).
//
// A tile z [R, V] (T = float | __half | __nv_bfloat16, row-major, written by the cuBLAS GEMM) holds the
// tempered logits of R tokens. One thread block per row; each thread streams its share of the row with
// 128-bit loads (4 fp32 / 8 fp16|bf16) when the row is 16-byte aligned, scalar loads otherwise; all math
// in fp32; per-thread partial results are merged with warp shuffles, then across warps in shared
// memory. No atomics; any V (vector body + scalar tail), any R (one block per row, grid.x = R).
//
//   logprob_stats_kernel:  lse = log Σ e^{z},  entropy = lse − Σ p z,  logp = z_y − lse   (one read of z)
//     kept as (m, s, t) = (running max, Σ e^{z−m}, Σ e^{z−m}(z−m)); merging (m1,s1,t1) with (m2,s2,t2)
//     at M = max(m1, m2):  s = Σ a_i s_i,  t = Σ a_i (t_i + s_i (m_i − M)),  a_i = e^{m_i − M};
//     entropy = log s − t / s (no cancellation at |z| ~ 1e4), lse = M + log s.
//   logprob_grad_kernel:   z ← dz = gℓ (onehot(y) − p) − gH p (log p + H),  p = e^{z − lse}
//     (gH = nullptr means 0); masked rows (gℓ = gH = 0) are zero-filled.    (one read + one write)
//
// kSoftcap (Gemma's final_logit_softcapping; κ > 0 in the tile's tempered units): the tile holds x and the
// logits are z = κ tanh(x / κ), formed in registers; grad writes ∂L/∂x = dz · (1 − tanh²). With
// e = e^{−2|x|/κ}: tanh(|x| / κ) = (1 − e) / (1 + e) and 1 − tanh² = 4e / (1 + e)² (precise where tanh
// saturates). Without kSoftcap the kernels are the plain ones (a template flag: no cost when off).
//
// An out-of-range target (outside [0, V)) cannot raise from a kernel and is not checked before the launch (that
// would cost a synchronisation per op): stats writes NaN to its logp and grad NaN over its row unless the row is
// masked (gℓ = gH = 0), so the loss and its gradient show it; the Python front ends check token ids per call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace grpo_fast {
namespace cuda {

constexpr int kThreads = 256;  // 8 warps per row
constexpr float kMinLogF = -87.33654f;

template <typename T>
struct Convert;
template <>
struct Convert<float> {
  __device__ static float to_float(float x) { return x; }
  __device__ static float from_float(float x) { return x; }
};
template <>
struct Convert<__half> {
  __device__ static float to_float(__half x) { return __half2float(x); }
  __device__ static __half from_float(float x) { return __float2half_rn(x); }
};
template <>
struct Convert<__nv_bfloat16> {
  __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

// 16 bytes of T: the unit of a vectorised load / store.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// Running (max, Σ e^{z−m}, Σ e^{z−m}(z−m)) of a set of logits.
struct Online {
  float m, s, t;
};

// e^x: the fast SFU exponential on the device; expf in host builds of these helpers (CPU tests).
__host__ __device__ __forceinline__ float fast_exp(float x) {
#ifdef __CUDA_ARCH__
  return __expf(x);
#else
  return expf(x);
#endif
}

// The soft cap of one value (inv_cap = 1 / κ): z = κ tanh(x / κ) and its slope dz/dx = 4e / (1 + e)².
struct Capped {
  float value, slope;
};

__host__ __device__ __forceinline__ Capped soft_cap(float x, float cap, float inv_cap) {
  const float e = fast_exp(-2.0f * fabsf(x) * inv_cap);
  const float t = (1.0f - e) / (1.0f + e);
  return {copysignf(cap * t, x), 4.0f * e / ((1.0f + e) * (1.0f + e))};
}

__host__ __device__ __forceinline__ void online_add(Online& a, float x) {
  if (x == -INFINITY) return;  // a banned token: contributes nothing (and −inf − −inf would be NaN)
  if (x > a.m) {  // new max: rescale what we have
    if (a.s > 0.0f) {
      const float shift = a.m - x;
      const float f = fast_exp(shift);
      a.t = f * (a.t + a.s * shift);
      a.s = f * a.s;
    } else {  // first finite value: a.m = −inf, so a.s · shift would be 0 · −inf = NaN
      a.t = 0.0f;
      a.s = 0.0f;
    }
    a.m = x;
  }
  const float d = x - a.m;
  const float e = d < kMinLogF ? 0.0f : fast_exp(d);
  a.s += e;
  a.t += e == 0.0f ? 0.0f : e * d;
}

__host__ __device__ __forceinline__ Online online_merge(const Online& a, const Online& b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a;
  const float fa = a.s > 0.0f ? fast_exp(a.m - m) : 0.0f;
  const float fb = b.s > 0.0f ? fast_exp(b.m - m) : 0.0f;
  Online r;
  r.m = m;
  r.s = fa * a.s + fb * b.s;
  r.t = (a.s > 0.0f ? fa * (a.t + a.s * (a.m - m)) : 0.0f) + (b.s > 0.0f ? fb * (b.t + b.s * (b.m - m)) : 0.0f);
  return r;
}

// The merge of a warp's 32 lanes by butterfly shuffles: every lane ends with the warp's result.
__device__ __forceinline__ Online warp_merge(Online v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    Online o;
    o.m = __shfl_xor_sync(0xffffffffu, v.m, offset);
    o.s = __shfl_xor_sync(0xffffffffu, v.s, offset);
    o.t = __shfl_xor_sync(0xffffffffu, v.t, offset);
    v = online_merge(v, o);
  }
  return v;
}

__device__ __forceinline__ Online block_merge(Online v) {
  __shared__ Online warp_results[kThreads / 32];
  v = warp_merge(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  if (warp == 0) v = warp_merge(lane < kThreads / 32 ? warp_results[lane] : Online{-INFINITY, 0.0f, 0.0f});
  return v;  // valid in thread 0
}

// logits [R, V] T; targets [R] int64; logp, entropy, lse [R] fp32; cap = κ (kSoftcap). grid = (R), block = (kThreads).
template <typename T, bool kVector, bool kSoftcap>
__global__ void __launch_bounds__(kThreads)
    logprob_stats_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets, float* __restrict__ logp,
                         float* __restrict__ entropy, float* __restrict__ lse, int64_t vocab, float cap) {
  const int64_t row = blockIdx.x;
  const T* z = logits + row * vocab;
  const float inv_cap = kSoftcap ? 1.0f / cap : 0.0f;
  auto logit = [&](T v) {
    const float x = Convert<T>::to_float(v);
    return kSoftcap ? soft_cap(x, cap, inv_cap).value : x;
  };
  Online acc{-INFINITY, 0.0f, 0.0f};
  int64_t tail_begin = 0;
  if (kVector) {
    constexpr int kPack = Pack<T>::kSize;
    const int64_t packs = vocab / kPack;
    const Pack<T>* zp = reinterpret_cast<const Pack<T>*>(z);
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      const Pack<T> p = zp[i];
#pragma unroll
      for (int k = 0; k < kPack; ++k) online_add(acc, logit(p.v[k]));
    }
    tail_begin = packs * kPack;
  }
  for (int64_t i = tail_begin + threadIdx.x; i < vocab; i += kThreads) online_add(acc, logit(z[i]));
  acc = block_merge(acc);
  if (threadIdx.x == 0) {
    const float log_s = logf(acc.s);
    const float row_lse = acc.m + log_s;
    const int64_t y = targets[row];
    lse[row] = row_lse;
    entropy[row] = log_s - acc.t / acc.s;
    logp[row] = (y >= 0 && y < vocab) ? logit(z[y]) - row_lse : NAN;
  }
}

__host__ __device__ __forceinline__ float grad_value(float x, float lse, float c, float gh) {
  const float log_p = x - lse;
  const float p = log_p < kMinLogF ? 0.0f : fast_exp(log_p);
  return p == 0.0f ? 0.0f : -p * (c + gh * log_p);
}

// ∂L/∂x of one tile value x at column i: dz (+ gℓ at the target), times the cap's slope under kSoftcap.
template <bool kSoftcap>
__host__ __device__ __forceinline__ float tile_grad(float x, bool target, float lse, float c, float gl, float gh,
                                                    float cap, float inv_cap) {
  if (!kSoftcap) return grad_value(x, lse, c, gh) + (target ? gl : 0.0f);
  const Capped zc = soft_cap(x, cap, inv_cap);
  return (grad_value(zc.value, lse, c, gh) + (target ? gl : 0.0f)) * zc.slope;
}

// logits [R, V] T (overwritten with ∂L/∂x); targets [R]; lse, entropy, grad_logp [R] fp32; grad_entropy [R]
// fp32 or nullptr; cap = κ (kSoftcap). grid = (R), block = (kThreads).
template <typename T, bool kVector, bool kSoftcap>
__global__ void __launch_bounds__(kThreads)
    logprob_grad_kernel(T* __restrict__ logits, const int64_t* __restrict__ targets, const float* __restrict__ lse,
                        const float* __restrict__ entropy, const float* __restrict__ grad_logp,
                        const float* __restrict__ grad_entropy, int64_t vocab, float cap) {
  const int64_t row = blockIdx.x;
  T* z = logits + row * vocab;
  const float gl = grad_logp[row];
  const float gh = grad_entropy == nullptr ? 0.0f : grad_entropy[row];
  const float row_lse = lse[row];
  const float c = gl + gh * entropy[row];
  const int64_t y = targets[row];
  const bool masked = gl == 0.0f && gh == 0.0f;
  const bool bad_target = !masked && (y < 0 || y >= vocab);  // its logp is NaN (stats): so is its gradient
  const float inv_cap = kSoftcap ? 1.0f / cap : 0.0f;
  int64_t tail_begin = 0;
  if (kVector) {
    constexpr int kPack = Pack<T>::kSize;
    const int64_t packs = vocab / kPack;
    Pack<T>* zp = reinterpret_cast<Pack<T>*>(z);
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      Pack<T> p = zp[i];
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float x = Convert<T>::to_float(p.v[k]);
        const float d = masked       ? 0.0f
                        : bad_target ? NAN
                                     : tile_grad<kSoftcap>(x, i * kPack + k == y, row_lse, c, gl, gh, cap, inv_cap);
        p.v[k] = Convert<T>::from_float(d);
      }
      zp[i] = p;
    }
    tail_begin = packs * kPack;
  }
  for (int64_t i = tail_begin + threadIdx.x; i < vocab; i += kThreads) {
    const float x = Convert<T>::to_float(z[i]);
    const float d = masked ? 0.0f : bad_target ? NAN : tile_grad<kSoftcap>(x, i == y, row_lse, c, gl, gh, cap, inv_cap);
    z[i] = Convert<T>::from_float(d);
  }
}

// Whether rows of `vocab` elements starting at `base` can use 16-byte loads.
template <typename T>
inline bool rows_are_16B_aligned(const void* base, int64_t vocab) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && (vocab * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

// Host launchers (stream-ordered, no synchronisation). rows >= 1, vocab >= 1; rows <= 2^31 − 1; softcap = κ
// (0 = off: the plain kernels).
template <typename T>
inline cudaError_t launch_logprob_stats(const T* logits, const int64_t* targets, float* logp, float* entropy,
                                        float* lse, int64_t rows, int64_t vocab, float softcap,
                                        cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(rows));
  const bool vector = rows_are_16B_aligned<T>(logits, vocab), capped = softcap > 0.0f;
  auto kernel = vector ? (capped ? logprob_stats_kernel<T, true, true> : logprob_stats_kernel<T, true, false>)
                       : (capped ? logprob_stats_kernel<T, false, true> : logprob_stats_kernel<T, false, false>);
  kernel<<<grid, kThreads, 0, stream>>>(logits, targets, logp, entropy, lse, vocab, softcap);
  return cudaGetLastError();
}

template <typename T>
inline cudaError_t launch_logprob_grad(T* logits, const int64_t* targets, const float* lse, const float* entropy,
                                       const float* grad_logp, const float* grad_entropy, int64_t rows, int64_t vocab,
                                       float softcap, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(rows));
  const bool vector = rows_are_16B_aligned<T>(logits, vocab), capped = softcap > 0.0f;
  auto kernel = vector ? (capped ? logprob_grad_kernel<T, true, true> : logprob_grad_kernel<T, true, false>)
                       : (capped ? logprob_grad_kernel<T, false, true> : logprob_grad_kernel<T, false, false>);
  kernel<<<grid, kThreads, 0, stream>>>(logits, targets, lse, entropy, grad_logp, grad_entropy, vocab, softcap);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace grpo_fast
