// CPU epilogue kernels of the chunked layer 1 (no torch dependency: plain pointers, one row per call).
//
// A row is one token's tempered logits z [V] (fp32 or fp64, contiguous). With p = softmax(z):
//   stats:  lse = log Σ_v e^{z_v},  entropy H = lse − Σ_v p_v z_v,  target logit z_y        (one read of z)
//   grad:   z ← dz = gℓ (onehot(y) − p) − gH p (log p + H)                           (one read + one write)
//
// Soft-capped heads (Gemma's final_logit_softcapping, κ > 0 in the tile's tempered units): the row holds
// x and the logits are z = κ tanh(x / κ), formed on the fly (never stored); grad writes ∂L/∂x = dz · dz/dx.
// With e = e^{−2|x|/κ} ∈ [0, 1]:  tanh(|x| / κ) = (1 − e) / (1 + e),  dz/dx = 1 − tanh² = 4e / (1 + e)²,
// so the slope keeps its relative precision where tanh saturates. κ = 0: the plain paths, untouched.
//
// stats streams over the row in L1-sized blocks: the block max is taken first (the block stays in
// L1), then the block's Σ e^{z−m} and Σ e^{z−m}(z−m) are added with the running max m; when m grows
// the running sums are rescaled:  s ← a s,  t ← a (t + s (m_old − m_new)),  a = e^{m_old − m_new}.
// Keeping t relative to m gives H = log s − t / s without the cancellation of lse − Σ p z at |z| ~ 1e4.
//
// The fp32 inner loops use a branch-free exp (auto-vectorised in grad, generic 16-float vectors in stats) and
// compiled once per x86-64 level (target_clones: AVX-512, AVX2+FMA, baseline SSE2) with the clone
// chosen at load time from the running CPU, so the build never assumes the build machine's CPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define GRPO_FAST_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GRPO_FAST_CLONES
#endif

#if defined(__GNUC__)
#define GRPO_FAST_INLINE inline __attribute__((always_inline))
#else
#define GRPO_FAST_INLINE inline
#endif

// The generic-vector helpers below are always inlined into the ISA clones; their by-value vector
// arguments never cross a real call, so GCC's note about the AVX-512 calling convention is moot.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace grpo_fast {
namespace cpu {

// Below this, e^x is under the smallest normal fp32: the exp returns 0 and products use this value.
constexpr float kMinLogF = -87.33654f;
constexpr int64_t kBlock = 1024;  // 4 KiB of fp32: the block max pass and the exp pass share L1.

// e^x = 2^n e^r for clamped x (T = float or VecF below): n = round(x / ln2), r = x − n ln2 (ln2 in two parts),
// e^r by Cephes' degree-6 polynomial. Returns e^r and sets n; the callers build 2^n in the exponent bits.
template <typename T>
GRPO_FAST_INLINE T exp_reduced(T xc, T& n) {
  const T magic = T{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  n = (xc * 1.44269504088896341f + magic) - magic;
  T r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  T p = T{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * (r * r) + r + 1.0f;
}

// e^x for x <= 88 (exp of (z − max) or log p, so x <= ~0), by exp_reduced.
// Max error ~2 ulp; 0 below kMinLogF; NaN in, NaN out (through the arithmetic). Branch-free so loops around it vectorise.
GRPO_FAST_INLINE float exp_f32(float x) {
  float n;
  const float p = exp_reduced(std::min(std::max(x, kMinLogF), 88.3762626647949f), n);
  // 2^n in the exponent bits, or +0 below kMinLogF (an integer select: nothing for the vectoriser to guard).
  const uint32_t bits = x < kMinLogF ? 0u : static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// The same exp on a GCC/Clang generic vector of 16 floats (one zmm, two ymm or four xmm registers,
// whichever the clone's ISA has), for the reductions of stats whose partial sums must stay in registers.
typedef float VecF __attribute__((vector_size(64)));
typedef int32_t VecI __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

// A NaN in `a` comes out as it went in (as std::max / std::min keep it), so exp_vec(NaN) is NaN and a NaN logit
// makes its row's statistics NaN instead of vanishing from the sums.
GRPO_FAST_INLINE VecF vmax(VecF a, VecF b) { return a < b ? b : a; }
GRPO_FAST_INLINE VecF vmin(VecF a, VecF b) { return a > b ? b : a; }
GRPO_FAST_INLINE VecF splat(float x) { return VecF{} + x; }

GRPO_FAST_INLINE VecF exp_vec(VecF x) {
  VecF n;
  const VecF p = exp_reduced(vmin(vmax(x, splat(kMinLogF)), splat(88.3762626647949f)), n);
  const VecI ni = __builtin_convertvector(n, VecI);
  const VecI bits = x < splat(kMinLogF) ? VecI{} : (ni + 127) << 23;
  VecF scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

GRPO_FAST_INLINE VecF load_vec(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The soft cap of one value: z = κ tanh(x / κ) and its slope dz/dx = 4e / (1 + e)², e = e^{−2|x|/κ}
// (inv_cap = 1 / κ). fp32 through exp_f32 (e = 0 below e^{−87}: z = ±κ, slope 0); fp64 through std::exp.
template <typename T>
struct Capped {
  T value;
  T slope;
};

GRPO_FAST_INLINE Capped<float> soft_cap(float x, float cap, float inv_cap) {
  const float e = exp_f32(-2.0f * std::fabs(x) * inv_cap);
  const float t = (1.0f - e) / (1.0f + e);
  return {std::copysign(cap * t, x), 4.0f * e / ((1.0f + e) * (1.0f + e))};
}

GRPO_FAST_INLINE Capped<double> soft_cap(double x, double cap, double inv_cap) {
  const double e = std::exp(-2.0 * std::fabs(x) * inv_cap);
  const double t = (1.0 - e) / (1.0 + e);
  return {std::copysign(cap * t, x), 4.0 * e / ((1.0 + e) * (1.0 + e))};
}

// Per-row results of stats, in the row's precision.
template <typename T>
struct RowStats {
  T lse;
  T entropy;
};

// ---- fp32: vectorised, multi-versioned -------------------------------------------------------

// The reductions keep 16 independent partial sums in a generic vector: a plain float sum may not be
// reordered by the compiler, and GCC's `omp simd reduction` spilled its lane arrays to memory every
// iteration (3.5x slower than the grad loop, measured).
// cap > 0: each block is soft-capped into an L1 buffer first (the row itself is left intact).
GRPO_FAST_CLONES
inline RowStats<float> row_stats_f32(const float* z, int64_t vocab, float cap) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float m = neg_inf;
  float s = 0.0f, t = 0.0f;
  alignas(64) float capped[kBlock];
  const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
  for (int64_t begin = 0; begin < vocab; begin += kBlock) {
    const float* zb = z + begin;
    const int64_t len = std::min(kBlock, vocab - begin);
    if (cap > 0.0f) {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) capped[i] = soft_cap(zb[i], cap, inv_cap).value;
      zb = capped;
    }
    const int64_t body = len - len % kLanes;
    VecF lane_max = splat(neg_inf);
    for (int64_t i = 0; i < body; i += kLanes) lane_max = vmax(lane_max, load_vec(zb + i));
    float block_max = neg_inf;
    for (int64_t j = 0; j < kLanes; ++j) block_max = std::max(block_max, lane_max[j]);
    for (int64_t i = body; i < len; ++i) block_max = std::max(block_max, zb[i]);
    if (block_max > m) {
      if (s > 0.0f) {
        const float shift = m - block_max;
        const float a = std::exp(shift);
        t = a * (t + s * shift);
        s *= a;
      }
      m = block_max;
    }
    if (m == neg_inf) continue;  // only −inf so far
    VecF lane_s{}, lane_t{};
    const VecF mv = splat(m);
    for (int64_t i = 0; i < body; i += kLanes) {
      const VecF d = load_vec(zb + i) - mv;
      const VecF e = exp_vec(d);
      lane_s += e;
      lane_t += e * vmax(d, splat(kMinLogF));  // e == 0 there: keeps −inf logits from making 0·∞
    }
    for (int64_t i = body; i < len; ++i) {
      const float d = zb[i] - m;
      const float e = exp_f32(d);
      s += e;
      t += e * std::max(d, kMinLogF);
    }
    for (int64_t j = 0; j < kLanes; ++j) {
      s += lane_s[j];
      t += lane_t[j];
    }
  }
  const float log_s = std::log(s);
  return {m + log_s, log_s - t / s};
}

// cap > 0: the row holds x, the logits are κ tanh(x / κ), and the row becomes ∂L/∂x (without the one-hot term).
GRPO_FAST_CLONES
inline void row_grad_f32(float* z, int64_t vocab, float lse, float entropy, float grad_logp, float grad_entropy,
                         float cap) {
  if (grad_logp == 0.0f && grad_entropy == 0.0f) {  // masked token: dz = 0, no exp needed
    std::memset(z, 0, sizeof(float) * vocab);
    return;
  }
  const float c = grad_logp + grad_entropy * entropy;
  if (cap > 0.0f) {
    const float inv_cap = 1.0f / cap;
#pragma omp simd
    for (int64_t i = 0; i < vocab; ++i) {
      const Capped<float> zc = soft_cap(z[i], cap, inv_cap);
      const float log_p = zc.value - lse;
      const float p = exp_f32(log_p);
      z[i] = -p * (c + grad_entropy * std::max(log_p, kMinLogF)) * zc.slope;
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < vocab; ++i) {
    const float log_p = z[i] - lse;
    const float p = exp_f32(log_p);
    z[i] = -p * (c + grad_entropy * std::max(log_p, kMinLogF));
  }
}

// ---- fp64: plain loops (fp64 inputs are for gradcheck-style checks, not speed) -------------

inline RowStats<double> row_stats_f64(const double* z, int64_t vocab, double cap) {
  const double inv_cap = cap > 0.0 ? 1.0 / cap : 0.0;
  auto logit = [&](int64_t i) { return cap > 0.0 ? soft_cap(z[i], cap, inv_cap).value : z[i]; };
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < vocab; ++i) m = std::max(m, logit(i));
  double s = 0.0, t = 0.0;
  if (m != -std::numeric_limits<double>::infinity()) {
    for (int64_t i = 0; i < vocab; ++i) {
      const double d = logit(i) - m;
      const double e = std::exp(d);
      s += e;
      t += e == 0.0 ? 0.0 : e * d;
    }
  }
  const double log_s = std::log(s);
  return {m + log_s, log_s - t / s};
}

inline void row_grad_f64(double* z, int64_t vocab, double lse, double entropy, double grad_logp,
                         double grad_entropy, double cap) {
  const double c = grad_logp + grad_entropy * entropy;
  const double inv_cap = cap > 0.0 ? 1.0 / cap : 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    const Capped<double> zc = cap > 0.0 ? soft_cap(z[i], cap, inv_cap) : Capped<double>{z[i], 1.0};
    const double log_p = zc.value - lse;
    const double p = std::exp(log_p);
    z[i] = p == 0.0 ? 0.0 : -p * (c + grad_entropy * log_p) * zc.slope;
  }
}

GRPO_FAST_INLINE RowStats<float> row_stats(const float* z, int64_t vocab, float cap) {
  return row_stats_f32(z, vocab, cap);
}
GRPO_FAST_INLINE RowStats<double> row_stats(const double* z, int64_t vocab, double cap) {
  return row_stats_f64(z, vocab, cap);
}
GRPO_FAST_INLINE void row_grad(float* z, int64_t vocab, float lse, float entropy, float gl, float gh, float cap) {
  row_grad_f32(z, vocab, lse, entropy, gl, gh, cap);
}
GRPO_FAST_INLINE void row_grad(double* z, int64_t vocab, double lse, double entropy, double gl, double gh,
                               double cap) {
  row_grad_f64(z, vocab, lse, entropy, gl, gh, cap);
}

}  // namespace cpu
}  // namespace grpo_fast
