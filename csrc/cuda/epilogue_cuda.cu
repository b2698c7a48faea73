// The host entry points of epilogue_launch.h: the dtype tag picks the kernels' template instance. No torch
// header here: the ATen binding and every input check are in ../epilogue_cuda_ops.cpp, compiled by the C++
// compiler as the CPU ops are (one definition of each check, one compiler for every exception it throws).
#include "epilogue_kernels.cuh"
#include "epilogue_launch.h"

namespace grpo_fast {
namespace cuda {

cudaError_t logprob_stats(TileDtype dtype, const void* logits, const int64_t* targets, float* logp, float* entropy,
                          float* lse, int64_t rows, int64_t vocab, float softcap, cudaStream_t stream) {
  switch (dtype) {
    case TileDtype::kFloat32:
      return launch_logprob_stats(static_cast<const float*>(logits), targets, logp, entropy, lse, rows, vocab,
                                  softcap, stream);
    case TileDtype::kFloat16:
      return launch_logprob_stats(static_cast<const __half*>(logits), targets, logp, entropy, lse, rows, vocab,
                                  softcap, stream);
    case TileDtype::kBFloat16:
      return launch_logprob_stats(static_cast<const __nv_bfloat16*>(logits), targets, logp, entropy, lse, rows,
                                  vocab, softcap, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t logprob_grad(TileDtype dtype, void* logits, const int64_t* targets, const float* lse,
                         const float* entropy, const float* grad_logp, const float* grad_entropy, int64_t rows,
                         int64_t vocab, float softcap, cudaStream_t stream) {
  switch (dtype) {
    case TileDtype::kFloat32:
      return launch_logprob_grad(static_cast<float*>(logits), targets, lse, entropy, grad_logp, grad_entropy, rows,
                                 vocab, softcap, stream);
    case TileDtype::kFloat16:
      return launch_logprob_grad(static_cast<__half*>(logits), targets, lse, entropy, grad_logp, grad_entropy, rows,
                                 vocab, softcap, stream);
    case TileDtype::kBFloat16:
      return launch_logprob_grad(static_cast<__nv_bfloat16*>(logits), targets, lse, entropy, grad_logp,
                                 grad_entropy, rows, vocab, softcap, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace grpo_fast
