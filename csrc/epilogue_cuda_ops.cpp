// The CUDA implementations of the grpo_fast epilogue ops (schemas in grpo_fast.cpp): every input checked here,
// by the C++ compiler that builds the CPU ops and with their checks (ops.h), before the kernels' host entry
// points (cuda/epilogue_launch.h, compiled by nvcc without torch headers) are called. Built only with
// GRPO_FAST_WITH_CUDA (setup.py, when torch has CUDA and nvcc is found); empty otherwise.
#ifdef GRPO_FAST_WITH_CUDA

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>

#include "cuda/epilogue_launch.h"
#include "ops.h"

namespace grpo_fast {
namespace {

constexpr const char* kStatsOp = "grpo_fast.logprob_stats";
constexpr const char* kGradOp = "grpo_fast.logprob_grad_";

// logits: a CUDA tile of fp32 / fp16 / bf16 (the kernels' math is fp32), at most 2^31 − 1 rows (one block per row).
cuda::TileDtype check_cuda_tile(const char* op, const at::Tensor& logits) {
  GRPO_FAST_CHECK(TORCH_CHECK, logits.is_cuda(), op,
                  ": logits: expected a CUDA tensor for the cuda kernels, got device ", logits.device());
  GRPO_FAST_CHECK(TORCH_CHECK_VALUE, logits.dim() < 1 || logits.size(0) <= std::numeric_limits<int32_t>::max(), op,
                  ": logits: at most 2^31 - 1 rows, got ", logits.size(0));
  const auto t = logits.scalar_type();
  GRPO_FAST_CHECK(TORCH_CHECK_TYPE, t == at::kFloat || t == at::kHalf || t == at::kBFloat16, op,
                  ": logits: expected dtype torch.float32, torch.float16 or torch.bfloat16, got ", t);
  return t == at::kFloat ? cuda::TileDtype::kFloat32
                         : t == at::kHalf ? cuda::TileDtype::kFloat16 : cuda::TileDtype::kBFloat16;
}

void check_launch(const char* op, cudaError_t err) {
  GRPO_FAST_CHECK(TORCH_CHECK, err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> logprob_stats_cuda(const at::Tensor& logits, const at::Tensor& targets,
                                                                  double softcap) {
  const auto dtype = check_cuda_tile(kStatsOp, logits);
  check_tile(kStatsOp, logits, targets);
  check_softcap(kStatsOp, softcap);
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const auto opts = logits.options().dtype(at::kFloat);
  auto logp = at::empty({rows}, opts), entropy = at::empty({rows}, opts), lse = at::empty({rows}, opts);
  check_launch(kStatsOp, cuda::logprob_stats(dtype, logits.const_data_ptr(), targets.const_data_ptr<int64_t>(),
                                             logp.mutable_data_ptr<float>(), entropy.mutable_data_ptr<float>(),
                                             lse.mutable_data_ptr<float>(), rows, vocab, static_cast<float>(softcap),
                                             c10::cuda::getCurrentCUDAStream()));
  return {logp, entropy, lse};
}

void logprob_grad_cuda(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& lse,
                       const at::Tensor& entropy, const at::Tensor& grad_logp,
                       const std::optional<at::Tensor>& grad_entropy, double softcap) {
  const auto dtype = check_cuda_tile(kGradOp, logits);
  check_grad_inputs(kGradOp, logits, targets, lse, entropy, grad_logp, grad_entropy);
  check_softcap(kGradOp, softcap);
  const c10::cuda::CUDAGuard guard(logits.device());
  check_launch(kGradOp,
               cuda::logprob_grad(dtype, logits.mutable_data_ptr(), targets.const_data_ptr<int64_t>(),
                                  lse.const_data_ptr<float>(), entropy.const_data_ptr<float>(),
                                  grad_logp.const_data_ptr<float>(),
                                  grad_entropy.has_value() ? grad_entropy->const_data_ptr<float>() : nullptr,
                                  logits.size(0), logits.size(1), static_cast<float>(softcap),
                                  c10::cuda::getCurrentCUDAStream()));
}

}  // namespace

TORCH_LIBRARY_IMPL(grpo_fast, CUDA, m) {
  m.impl("logprob_stats", &logprob_stats_cuda);
  m.impl("logprob_grad_", &logprob_grad_cuda);
}

}  // namespace grpo_fast

#endif  // GRPO_FAST_WITH_CUDA
