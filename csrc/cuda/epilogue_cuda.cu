// CUDA implementations of the grpo_fast epilogue ops (schemas in ../grpo_fast.cpp), compiled only when
// torch has CUDA and nvcc is found (setup.py). Checks as on CPU (ops.h) plus device / dtype checks;
// the kernels themselves are in epilogue_kernels.cuh.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops.h"
#include "epilogue_kernels.cuh"

namespace grpo_fast {
namespace {

constexpr const char* kStatsOp = "grpo_fast.logprob_stats";
constexpr const char* kGradOp = "grpo_fast.logprob_grad_";

void check_cuda_tile(const char* op, const at::Tensor& logits) {
  TORCH_CHECK(logits.is_cuda(), op, ": logits: expected a CUDA tensor for the cuda kernels, got device ",
              logits.device());
  const auto t = logits.scalar_type();
  TORCH_CHECK_TYPE(t == at::kFloat || t == at::kHalf || t == at::kBFloat16, op,
                   ": logits: expected dtype torch.float32, torch.float16 or torch.bfloat16, got ", t);
  TORCH_CHECK_VALUE(logits.size(0) <= std::numeric_limits<int32_t>::max(), op, ": logits: at most 2^31 - 1 rows, got ",
                    logits.size(0));
}

template <typename F>
void dispatch_tile(const at::Tensor& logits, F&& f) {
  switch (logits.scalar_type()) {
    case at::kFloat:
      f(float{});
      break;
    case at::kHalf:
      f(__half{});
      break;
    case at::kBFloat16:
      f(__nv_bfloat16{});
      break;
    default:
      TORCH_CHECK(false, "unreachable dtype");
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> logprob_stats_cuda(const at::Tensor& logits, const at::Tensor& targets,
                                                                  double softcap) {
  check_tile(kStatsOp, logits, targets);
  check_cuda_tile(kStatsOp, logits);
  check_softcap(kStatsOp, softcap);
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const auto opts = logits.options().dtype(at::kFloat);
  auto logp = at::empty({rows}, opts), entropy = at::empty({rows}, opts), lse = at::empty({rows}, opts);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_tile(logits, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = cuda::launch_logprob_stats<T>(
        reinterpret_cast<const T*>(logits.const_data_ptr()), targets.const_data_ptr<int64_t>(),
        logp.mutable_data_ptr<float>(), entropy.mutable_data_ptr<float>(), lse.mutable_data_ptr<float>(), rows,
        vocab, static_cast<float>(softcap), stream);
    TORCH_CHECK(err == cudaSuccess, kStatsOp, ": kernel launch failed: ", cudaGetErrorString(err));
  });
  return {logp, entropy, lse};
}

void logprob_grad_cuda(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& lse,
                       const at::Tensor& entropy, const at::Tensor& grad_logp,
                       const std::optional<at::Tensor>& grad_entropy, double softcap) {
  check_grad_inputs(kGradOp, logits, targets, lse, entropy, grad_logp, grad_entropy);
  check_cuda_tile(kGradOp, logits);
  check_softcap(kGradOp, softcap);
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_tile(logits, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = cuda::launch_logprob_grad<T>(
        reinterpret_cast<T*>(logits.mutable_data_ptr()), targets.const_data_ptr<int64_t>(),
        lse.const_data_ptr<float>(), entropy.const_data_ptr<float>(), grad_logp.const_data_ptr<float>(),
        grad_entropy.has_value() ? grad_entropy->const_data_ptr<float>() : nullptr, rows, vocab,
        static_cast<float>(softcap), stream);
    TORCH_CHECK(err == cudaSuccess, kGradOp, ": kernel launch failed: ", cudaGetErrorString(err));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(grpo_fast, CUDA, m) {
  m.impl("logprob_stats", &logprob_stats_cuda);
  m.impl("logprob_grad_", &logprob_grad_cuda);
}

}  // namespace grpo_fast
