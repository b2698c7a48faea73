"""Compile check of the CUDA epilogue kernels with the installed nvcc (no GPU, no CUDA torch needed):
csrc/cuda/epilogue_kernels.cuh is torch-free, so a standalone translation unit instantiating every
kernel (fp32 / fp16 / bf16, vector and scalar paths) must compile for sm_90 and sm_80.
The ATen binding (csrc/cuda/epilogue_cuda.cu) is built only by a CUDA `pip install -e .`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc"
NVCC = shutil.which("nvcc")

TU = """
#include "cuda/epilogue_kernels.cuh"
namespace gc = grpo_fast::cuda;
#define INSTANTIATE(T)                                                                                       \\
  template cudaError_t gc::launch_logprob_stats<T>(const T*, const int64_t*, float*, float*, float*, int64_t, \\
                                                   int64_t, cudaStream_t);                                   \\
  template cudaError_t gc::launch_logprob_grad<T>(T*, const int64_t*, const float*, const float*, const float*, \\
                                                  const float*, int64_t, int64_t, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
"""


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_cuda_kernels_compile(tmp_path, arch):
    source = tmp_path / "epilogue_check.cu"
    source.write_text(TU)
    cmd = [NVCC, "-std=c++17", f"-arch={arch}", "-O3", "-Werror", "all-warnings", f"-I{CSRC}", "-c"]
    cmd += [str(source), "-o", str(tmp_path / "epilogue_check.o"), "-Xptxas", "-v"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # One stats and one grad kernel per dtype and load path: 12 kernels, none spilling registers.
    assert out.stderr.count("Compiling entry function") == 12, out.stderr
    spills = re.findall(r"(\d+) bytes spill stores", out.stderr)
    assert spills and all(n == "0" for n in spills), out.stderr
