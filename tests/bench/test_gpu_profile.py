"""benchmarks/gpu_profile.py's grouping of a profile's kernels by kind: each kernel name (as torch.profiler reports
CUDA kernels: cuBLAS's, ATen's templates, Triton's function names, grpo_fast's demangled CUDA kernels) lands in the
kind the NOTES' arithmetic needs it in; and the headline of a results file says what was measured."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def gpu_profile(load_script):
    return load_script("benchmarks/gpu_profile.py", "gpu_profile")


EPILOGUE, COPY = "grpo_fast CUDA epilogue", "elementwise / copy / reduction"


@pytest.mark.parametrize(
    "name, kind",
    [
        ("void grpo_fast::cuda::logprob_stats_kernel<__nv_bfloat16, true, false>(__nv_bfloat16 const*)", EPILOGUE),
        ("void grpo_fast::cuda::logprob_grad_kernel<float, false, true>(float*, long const*)", EPILOGUE),
        ("_linear_logprobs_bwd_kernel", "grpo_fast Triton layer 1"),
        ("_grpo_token_loss_kernel", "grpo_fast Triton token loss"),
        ("_backward_kernel", "TRL Triton folds"),
        ("nvjet_tst_256x128_64x4_1x2_h_bz_coopB_TNT", "GEMM"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "GEMM"),
        ("triton_poi_fused_add_0", "other Triton"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", COPY),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", COPY),
        ("Memcpy DtoD (Device -> Device)", COPY),
        ("aten::mm", "GEMM"),
    ],
)  # fmt: skip
def test_kernel_kinds(gpu_profile, name, kind):
    assert gpu_profile.kind_of(name) == kind


def test_headline_names_every_part(gpu_profile):
    profile = {"busy_share": 0.97, "by_kind_ms": {"GEMM": 100.0, "grpo_fast CUDA epilogue": 12.0}, "kernel_count": 500,
               "kernels": [{"name": "nvjet_x", "count": 114, "total_ms": 100.0}]}  # fmt: skip
    result = {
        "shape": {"N": 16384, "H": 3584, "V": 152064}, "dtype": "bf16", "environment": {"gpu": "GPU-X"},
        "bandwidth": {"copy_gb_per_s": 4100.0, "read_gb_per_s": 4300.0},
        "variants": {"gemm3": {"median_s": 0.080, "profile": profile}, "cuda": {"median_s": 0.120, "profile": profile},
                     "trl": {"variant": "trl", "status": "error: ImportError: no trl"}},
        "triton_kernels": [{"kernel": "_linear_logprobs_fwd_kernel", "registers": 255, "spills": 0,
                            "shared_bytes": 98304, "num_warps": 8, "num_stages": 3}],
    }  # fmt: skip
    text = gpu_profile.headline(result)
    assert "copy 4100 GB/s, read 4300 GB/s" in text
    assert "cuda       120.0 ms = 1.50x gemm3, busy 97%, 500 kernels: GEMM 100.0; grpo_fast CUDA epilogue 12.0" in text
    assert "trl     error: ImportError: no trl" in text
    assert "_linear_logprobs_fwd_kernel: 255 registers, 0 spill bytes, 96 KiB shared, 8 warps, 3 stages" in text


def test_triton_kernels_skips_modules_not_imported(gpu_profile, monkeypatch):
    """The second GPU check lost every kernel's registers to `vars(object())` on a module no part had imported."""
    pytest.importorskip("triton")
    monkeypatch.setattr(gpu_profile, "TRITON_MODULES", ("grpo_fast.no_such_module",))
    assert gpu_profile.triton_kernels() == []


def test_an_update_without_triton_kernels_keeps_the_earlier_rows(gpu_profile, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setattr(gpu_profile, "triton_kernels", lambda: [])
    monkeypatch.setattr(gpu_profile.torch.cuda, "is_available", lambda: True)
    result = {"triton_kernels": [{"kernel": "_linear_logprobs_bwd_kernel", "registers": 255}]}
    gpu_profile._record_triton_kernels(result)
    assert result["triton_kernels"] == [{"kernel": "_linear_logprobs_bwd_kernel", "registers": 255}]
