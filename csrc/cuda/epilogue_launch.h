// Host entry points of the CUDA epilogue kernels, compiled by nvcc in epilogue_cuda.cu: plain pointers and a
// dtype tag, no torch header on either side. The ATen binding (csrc/epilogue_cuda_ops.cpp) is compiled by the
// C++ compiler, with the CPU ops' input checks (csrc/ops.h), and calls these only once every input is checked.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace grpo_fast {
namespace cuda {

enum class TileDtype : int { kFloat32, kFloat16, kBFloat16 };

// logits [rows, vocab] of `dtype`, row-major; targets [rows]; logp, entropy, lse [rows] fp32; all on the device
// of `stream`; rows in [0, 2^31 − 1], vocab >= 1; softcap κ >= 0 (0 = off). Stream-ordered, no synchronisation.
cudaError_t logprob_stats(TileDtype dtype, const void* logits, const int64_t* targets, float* logp, float* entropy,
                          float* lse, int64_t rows, int64_t vocab, float softcap, cudaStream_t stream);

// logits overwritten with ∂L/∂logits; lse, entropy, grad_logp [rows] fp32; grad_entropy [rows] fp32 or nullptr.
cudaError_t logprob_grad(TileDtype dtype, void* logits, const int64_t* targets, const float* lse,
                         const float* entropy, const float* grad_logp, const float* grad_entropy, int64_t rows,
                         int64_t vocab, float softcap, cudaStream_t stream);

}  // namespace cuda
}  // namespace grpo_fast
