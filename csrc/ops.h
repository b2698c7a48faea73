// Input checks shared by the CPU and CUDA implementations of the grpo_fast epilogue ops (grpo_fast.cpp,
// epilogue_cuda_ops.cpp: both compiled by the C++ compiler, never by nvcc). Every violation raises a Python
// exception (TORCH_CHECK* -> RuntimeError / ValueError / TypeError) naming the op and the argument.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

namespace grpo_fast {

// The text of an error message, one piece per argument, with the text c10::str would give ("[4, 10]" for a shape,
// "1e+39" for a double: an ostream's default %g), but formatted without an ostream: numbers by std::to_string and
// snprintf. On the GPU image of the first runs (torch 2.11 built by devtoolset's GCC 13, this extension by the
// image's g++ 13.3) every check whose message streamed an integer or a shape died of SIGSEGV instead of raising,
// on the CPU and the CUDA op alike, while those streaming only text, a Device or a ScalarType raised
// (benchmarks/NOTES.md, "The bad-input crash"; the cause is a hypothesis, not verified on that image).
namespace message_text {
inline std::string piece(const char* text) { return text; }
inline std::string piece(const std::string& text) { return text; }
inline std::string piece(int64_t value) { return std::to_string(value); }
inline std::string piece(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}
inline std::string piece(at::IntArrayRef values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}
inline std::string piece(at::ScalarType dtype) { return c10::toString(dtype); }
inline std::string piece(const at::Device& device) { return device.str(); }
}  // namespace message_text

template <typename... Pieces>
std::string message(const Pieces&... pieces) {
  std::string text;
  ((text += message_text::piece(pieces)), ...);
  return text;
}

// check(cond, message): TORCH_CHECK / TORCH_CHECK_VALUE / TORCH_CHECK_TYPE with the message's text as one C
// string, which c10 throws as it is (a std::string or several pieces would go through c10::str's ostringstream).
// The message is formed only when cond fails. tests/backends/test_native.py runs every bad input with libstdc++'s
// ostream number formatters made fatal when this extension calls them.
#define GRPO_FAST_CHECK(check, cond, ...) check(cond, ::grpo_fast::message(__VA_ARGS__).c_str())

// logits [R, V] (fp32 | fp64 on CPU; fp32 | fp16 | bf16 on CUDA), contiguous; targets [R] int64 on the same device.
inline void check_tile(const char* op, const at::Tensor& logits, const at::Tensor& targets) {
  GRPO_FAST_CHECK(TORCH_CHECK_VALUE, logits.dim() == 2, op, ": logits: expected a 2-d tile [R, V], got shape ",
                  logits.sizes());
  GRPO_FAST_CHECK(TORCH_CHECK_VALUE, logits.size(1) > 0, op,
                  ": logits: expected a vocabulary of at least 1, got shape ", logits.sizes());
  GRPO_FAST_CHECK(TORCH_CHECK, logits.is_contiguous(), op, ": logits: expected a contiguous tensor (strides ",
                  logits.strides(), " for shape ", logits.sizes(), ")");
  GRPO_FAST_CHECK(TORCH_CHECK_VALUE, targets.dim() == 1 && targets.size(0) == logits.size(0), op,
                  ": targets: expected shape [R=", logits.size(0), "], got ", targets.sizes());
  GRPO_FAST_CHECK(TORCH_CHECK_TYPE, targets.scalar_type() == at::kLong, op,
                  ": targets: expected dtype torch.int64, got ", targets.scalar_type());
  GRPO_FAST_CHECK(TORCH_CHECK, targets.device() == logits.device(), op, ": targets: expected device ", logits.device(),
                  ", got ", targets.device());
  GRPO_FAST_CHECK(TORCH_CHECK, targets.is_contiguous(), op, ": targets: expected a contiguous tensor");
}

// A per-row vector [R] in the statistics' dtype (fp32 for low-precision tiles) on the tile's device.
inline void check_row_vector(const char* op, const char* name, const at::Tensor& v, const at::Tensor& logits,
                             at::ScalarType dtype) {
  GRPO_FAST_CHECK(TORCH_CHECK_VALUE, v.dim() == 1 && v.size(0) == logits.size(0), op, ": ", name,
                  ": expected shape [R=", logits.size(0), "], got ", v.sizes());
  GRPO_FAST_CHECK(TORCH_CHECK_TYPE, v.scalar_type() == dtype, op, ": ", name, ": expected dtype ", dtype, ", got ",
                  v.scalar_type());
  GRPO_FAST_CHECK(TORCH_CHECK, v.device() == logits.device(), op, ": ", name, ": expected device ", logits.device(),
                  ", got ", v.device());
  GRPO_FAST_CHECK(TORCH_CHECK, v.is_contiguous(), op, ": ", name, ": expected a contiguous tensor");
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
  GRPO_FAST_CHECK(TORCH_CHECK_VALUE, softcap == 0.0 || (softcap >= lowest && softcap <= highest), op,
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
