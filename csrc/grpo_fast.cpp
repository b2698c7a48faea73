// grpo_fast._C: the epilogue ops of the chunked layer-1 backends "cpu" and "cuda": the schemas, the CPU
// implementations and the Python module (the CUDA implementations are in epilogue_cuda_ops.cpp).
//
// Registered as torch.library custom ops (schemas below; fake implementations live in
// grpo_fast/backends/native.py so torch.compile traces through them):
//
//   grpo_fast::logprob_stats(logits [R, V], targets [R] int64, softcap=0) -> (logp [R], entropy [R], lse [R])
//       lse = log Σ_v e^{z_v}, entropy = lse − Σ_v softmax(z)_v z_v, logp = z_y − lse; logits left intact.
//   grpo_fast::logprob_grad_(logits [R, V] mutated, targets, lse, entropy, grad_logp [R], grad_entropy [R]?,
//                            softcap=0) -> ()
//       logits ← dz = gℓ (onehot(y) − p) − gH p (log p + entropy),  p = e^{z − lse}  (gH absent = 0).
//
// logits is the tempered tile x = (h Wᵀ + b) / τ written by the caller's GEMM; z = x, or with softcap
// κ > 0 (in the tile's units: the model's cap / τ) z = κ tanh(x / κ), and grad writes ∂L/∂x = dz (1 − tanh²).
// Statistics and upstream gradients are fp32 (fp64 for fp64 tiles). The CPU kernels are in cpu/epilogue_cpu.h
// (OpenMP over rows through at::parallel_for, one pass per op); the CUDA ones in cuda/. Token ids outside
// [0, V) raise on CPU (checked as each row is read); on CUDA, where checking them before the launch would cost a
// synchronisation per op, their row's logp and dz are NaN (the Python front ends check ids once per call).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/extension.h>

#include "cpu/epilogue_cpu.h"
#include "ops.h"

namespace grpo_fast {
namespace {

constexpr const char* kStatsOp = "grpo_fast.logprob_stats";
constexpr const char* kGradOp = "grpo_fast.logprob_grad_";

void check_cpu_tile(const char* op, const at::Tensor& logits) {
  GRPO_FAST_CHECK(TORCH_CHECK, logits.device().is_cpu(), op,
                  ": logits: expected a CPU tensor for the cpu kernels, got device ", logits.device());
  GRPO_FAST_CHECK(TORCH_CHECK_TYPE, logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kDouble, op,
                  ": logits: expected dtype torch.float32 or torch.float64 (the fp32 GEMM output tile), got ",
                  logits.scalar_type());
}

// Rows per parallel task: about 64 Ki elements, so short vocabularies still amortise the task.
int64_t grain_rows(int64_t vocab) { return std::max<int64_t>(1, (int64_t{1} << 16) / vocab); }

void check_target(int64_t y, int64_t vocab, int64_t row, const char* op) {
  GRPO_FAST_CHECK(TORCH_CHECK_VALUE, y >= 0 && y < vocab, op, ": targets: expected token ids in [0, ", vocab, "), got ",
                  y, " at row ", row);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> logprob_stats_cpu(const at::Tensor& logits, const at::Tensor& targets,
                                                                 double softcap) {
  check_tile(kStatsOp, logits, targets);
  check_cpu_tile(kStatsOp, logits);
  check_softcap(kStatsOp, softcap);
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  auto logp = at::empty({rows}, logits.options());
  auto entropy = at::empty({rows}, logits.options());
  auto lse = at::empty({rows}, logits.options());
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "logprob_stats_cpu", [&] {
    const scalar_t* z = logits.const_data_ptr<scalar_t>();
    const int64_t* y = targets.const_data_ptr<int64_t>();
    scalar_t* out_logp = logp.mutable_data_ptr<scalar_t>();
    scalar_t* out_entropy = entropy.mutable_data_ptr<scalar_t>();
    scalar_t* out_lse = lse.mutable_data_ptr<scalar_t>();
    const auto cap = static_cast<scalar_t>(softcap);
    at::parallel_for(0, rows, grain_rows(vocab), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        check_target(y[r], vocab, r, kStatsOp);
        const scalar_t* row = z + r * vocab;
        const auto st = cpu::row_stats(row, vocab, cap);
        const scalar_t z_y = cap > 0 ? cpu::soft_cap(row[y[r]], cap, scalar_t(1) / cap).value : row[y[r]];
        out_lse[r] = st.lse;
        out_entropy[r] = st.entropy;
        out_logp[r] = z_y - st.lse;
      }
    });
  });
  return {logp, entropy, lse};
}

void logprob_grad_cpu(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& lse,
                      const at::Tensor& entropy, const at::Tensor& grad_logp,
                      const std::optional<at::Tensor>& grad_entropy, double softcap) {
  check_grad_inputs(kGradOp, logits, targets, lse, entropy, grad_logp, grad_entropy);
  check_cpu_tile(kGradOp, logits);
  check_softcap(kGradOp, softcap);
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "logprob_grad_cpu", [&] {
    scalar_t* z = logits.mutable_data_ptr<scalar_t>();
    const int64_t* y = targets.const_data_ptr<int64_t>();
    const scalar_t* lse_p = lse.const_data_ptr<scalar_t>();
    const scalar_t* ent_p = entropy.const_data_ptr<scalar_t>();
    const scalar_t* gl_p = grad_logp.const_data_ptr<scalar_t>();
    const scalar_t* gh_p = grad_entropy.has_value() ? grad_entropy->const_data_ptr<scalar_t>() : nullptr;
    const auto cap = static_cast<scalar_t>(softcap);
    at::parallel_for(0, rows, grain_rows(vocab), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        check_target(y[r], vocab, r, kGradOp);
        scalar_t* row = z + r * vocab;
        // The one-hot term gℓ at y, times the cap's slope there (read before the row is overwritten).
        const scalar_t slope_y = cap > 0 ? cpu::soft_cap(row[y[r]], cap, scalar_t(1) / cap).slope : scalar_t(1);
        cpu::row_grad(row, vocab, lse_p[r], ent_p[r], gl_p[r], gh_p ? gh_p[r] : scalar_t(0), cap);
        row[y[r]] += gl_p[r] * slope_y;
      }
    });
  });
}

bool built_with_cuda() {
#ifdef GRPO_FAST_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// The fingerprint of csrc/ this build was compiled from (setup.py: "h" + 16 hex digits of grpo_fast.backends.sources).
#define GRPO_FAST_STRINGIFY_(x) #x
#define GRPO_FAST_STRINGIFY(x) GRPO_FAST_STRINGIFY_(x)
std::string sources_hash() {
#ifdef GRPO_FAST_SOURCES_HASH
  return std::string(GRPO_FAST_STRINGIFY(GRPO_FAST_SOURCES_HASH)).substr(1);
#else
  return "";
#endif
}

// Which vector-ISA clone of the fp32 CPU kernels the running CPU gets (see cpu/epilogue_cpu.h).
std::string cpu_kernel_isa() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 (AVX-512)";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 (AVX2+FMA)";
  return "x86-64 baseline (SSE2)";
#else
  return "compiler default";
#endif
}

}  // namespace

TORCH_LIBRARY(grpo_fast, m) {
  m.def("logprob_stats(Tensor logits, Tensor targets, float softcap=0.0) -> (Tensor, Tensor, Tensor)");
  m.def(
      "logprob_grad_(Tensor(a!) logits, Tensor targets, Tensor lse, Tensor entropy, Tensor grad_logp, "
      "Tensor? grad_entropy, float softcap=0.0) -> ()");
}

TORCH_LIBRARY_IMPL(grpo_fast, CPU, m) {
  m.impl("logprob_stats", &logprob_stats_cpu);
  m.impl("logprob_grad_", &logprob_grad_cpu);
}

}  // namespace grpo_fast

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "grpo_fast C++/CUDA epilogue ops (registered under torch.ops.grpo_fast)";
  m.def("built_with_cuda", &grpo_fast::built_with_cuda, "whether the CUDA kernels were compiled in");
  m.def("cpu_kernel_isa", &grpo_fast::cpu_kernel_isa, "the vector ISA of the CPU kernels on this machine");
  m.def("sources_hash", &grpo_fast::sources_hash, "the fingerprint of the csrc/ sources this build was compiled from");
}
