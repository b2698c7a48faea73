// Input checks shared by the CPU and CUDA implementations of the grpo_fast epilogue ops (grpo_fast.cpp,
// epilogue_cuda_ops.cpp: both compiled by the C++ compiler, never by nvcc). Every violation raises a Python
// exception (TORCH_CHECK* -> RuntimeError / ValueError / TypeError) naming the op and the argument.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

namespace grpo_fast {

// logits [R, V] (fp32 | fp64 on CPU; fp32 | fp16 | bf16 on CUDA), contiguous; targets [R] int64 on the same device.
inline void check_tile(const char* op, const at::Tensor& logits, const at::Tensor& targets) {
  TORCH_CHECK_VALUE(logits.dim() == 2, op, ": logits: expected a 2-d tile [R, V], got shape ", logits.sizes());
  TORCH_CHECK_VALUE(logits.size(1) > 0, op, ": logits: expected a vocabulary of at least 1, got shape ",
                    logits.sizes());
  TORCH_CHECK(logits.is_contiguous(), op, ": logits: expected a contiguous tensor (strides ", logits.strides(),
              " for shape ", logits.sizes(), ")");
  TORCH_CHECK_VALUE(targets.dim() == 1 && targets.size(0) == logits.size(0), op,
                    ": targets: expected shape [R=", logits.size(0), "], got ", targets.sizes());
  TORCH_CHECK_TYPE(targets.scalar_type() == at::kLong, op, ": targets: expected dtype torch.int64, got ",
                   targets.scalar_type());
  TORCH_CHECK(targets.device() == logits.device(), op, ": targets: expected device ", logits.device(), ", got ",
              targets.device());
  TORCH_CHECK(targets.is_contiguous(), op, ": targets: expected a contiguous tensor");
}

// A per-row vector [R] in the statistics' dtype (fp32 for low-precision tiles) on the tile's device.
inline void check_row_vector(const char* op, const char* name, const at::Tensor& v, const at::Tensor& logits,
                             at::ScalarType dtype) {
  TORCH_CHECK_VALUE(v.dim() == 1 && v.size(0) == logits.size(0), op, ": ", name, ": expected shape [R=",
                    logits.size(0), "], got ", v.sizes());
  TORCH_CHECK_TYPE(v.scalar_type() == dtype, op, ": ", name, ": expected dtype ", dtype, ", got ", v.scalar_type());
  TORCH_CHECK(v.device() == logits.device(), op, ": ", name, ": expected device ", logits.device(), ", got ",
              v.device());
  TORCH_CHECK(v.is_contiguous(), op, ": ", name, ": expected a contiguous tensor");
}

// fp64 tiles keep fp64 statistics; fp32 / fp16 / bf16 tiles give fp32 statistics.
inline at::ScalarType stats_dtype(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The soft cap κ of the tile (0 = off): a normal fp32 value, since the fp32 kernels (CPU and CUDA) read it as one:
// a κ past FLT_MAX would round to inf (NaN logits) and one below FLT_MIN to 0 or a denormal (no cap at all, or an
// overflowing 1 / κ). fp64 tiles get the same range.
inline void check_softcap(const char* op, double softcap) {
  constexpr double lowest = std::numeric_limits<float>::min(), highest = std::numeric_limits<float>::max();
  TORCH_CHECK_VALUE(softcap == 0.0 || (softcap >= lowest && softcap <= highest), op,
                    ": softcap: expected 0 (off) or a value in [", lowest, ", ", highest,
                    "] (the kernels' fp32 range), got ", softcap);
}

inline void check_grad_inputs(const char* op, const at::Tensor& logits, const at::Tensor& targets,
                              const at::Tensor& lse, const at::Tensor& entropy, const at::Tensor& grad_logp,
                              const std::optional<at::Tensor>& grad_entropy) {
  check_tile(op, logits, targets);
  const auto dtype = stats_dtype(logits);
  check_row_vector(op, "lse", lse, logits, dtype);
  check_row_vector(op, "entropy", entropy, logits, dtype);
  check_row_vector(op, "grad_logp", grad_logp, logits, dtype);
  if (grad_entropy.has_value()) check_row_vector(op, "grad_entropy", *grad_entropy, logits, dtype);
}

}  // namespace grpo_fast
