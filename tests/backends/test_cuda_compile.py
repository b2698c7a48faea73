"""Compile checks of the CUDA epilogue with the installed nvcc (no GPU, no CUDA torch needed): csrc/cuda/ is
torch-free (the kernels, and their host entry points in epilogue_cuda.cu), so nvcc compiles epilogue_cuda.cu
for sm_90 and sm_80 with no torch header on its include path, instantiating every kernel (fp32 / fp16 / bf16,
vector and scalar paths, soft cap off / on). The ATen binding with the input checks (csrc/epilogue_cuda_ops.cpp)
is C++ built by the C++ compiler, as the CPU ops are: the slow test below compiles it against a CUDA torch's
headers, and a CUDA `pip install -e .` builds it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_cuda_kernels_compile_without_torch(tmp_path, arch):
    source = CSRC / "cuda" / "epilogue_cuda.cu"
    assert not re.search(r"#include\s*[<\"](ATen|torch|c10)/", source.read_text())
    cmd = [NVCC, "-std=c++17", f"-arch={arch}", "-O3", "-Werror", "all-warnings", f"-I{CSRC}", "-c"]
    cmd += [str(source), "-o", str(tmp_path / "epilogue_cuda.o"), "-Xptxas", "-v"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # One stats and one grad kernel per dtype, load path and soft cap (off / on): 24 kernels, none spilling registers.
    assert out.stderr.count("Compiling entry function") == 24, out.stderr
    spills = re.findall(r"(\d+) bytes spill stores", out.stderr)
    assert spills and all(n == "0" for n in spills), out.stderr


# Host build of the kernels' fp32 math (online_add / online_merge / grad_value are __host__ __device__):
# each of 256 "threads" streams its strided share of a row as the kernel does, the partial states are
# merged pairwise as in the shuffle tree; printed per row: lse, entropy, max |dz - reference dz|.
HOST_TU = r"""
#include <cstdio>
#include <cmath>
#include <vector>
#include "cuda/epilogue_kernels.cuh"
using namespace grpo_fast::cuda;

static void check_row(const std::vector<float>& z, int y, float gl, float gh) {
  std::vector<Online> part(kThreads, Online{-INFINITY, 0.0f, 0.0f});
  for (size_t i = 0; i < z.size(); ++i) online_add(part[i % kThreads], z[i]);
  for (int width = kThreads / 2; width > 0; width /= 2)
    for (int t = 0; t < width; ++t) part[t] = online_merge(part[t], part[t + width]);
  const Online acc = part[0];
  const float log_s = logf(acc.s), lse = acc.m + log_s, entropy = log_s - acc.t / acc.s;
  double m = -INFINITY, s = 0.0, sz = 0.0;
  for (float x : z) m = fmax(m, (double)x);
  for (float x : z) if (x != -INFINITY) { s += exp(x - m); sz += exp(x - m) * (x - m); }
  const double ref_lse = m + log(s), ref_ent = log(s) - sz / s;
  double grad_err = 0.0;
  const float c = gl + gh * entropy;
  for (size_t i = 0; i < z.size(); ++i) {
    float d = grad_value(z[i], lse, c, gh) + ((int)i == y ? gl : 0.0f);
    double p = z[i] == -INFINITY ? 0.0 : exp(z[i] - ref_lse);
    double lp = z[i] == -INFINITY ? 0.0 : z[i] - ref_lse;
    double ref = ((int)i == y ? gl : 0.0) - p * (gl + gh * (lp + ref_ent));
    grad_err = fmax(grad_err, fabs(d - ref));
  }
  printf("%.9g %.9g %.9g %.9g %.9g\n", lse, ref_lse, entropy, ref_ent, grad_err);
}

// The soft-capped kernels' math (kSoftcap): logits cap * tanh(x / cap) into the online statistics, and
// tile_grad<true> = d/dx of the loss, against fp64 tanh.
static void check_capped_row(const std::vector<float>& x, int y, float gl, float gh, float cap) {
  std::vector<Online> part(kThreads, Online{-INFINITY, 0.0f, 0.0f});
  for (size_t i = 0; i < x.size(); ++i) online_add(part[i % kThreads], soft_cap(x[i], cap, 1.0f / cap).value);
  for (int width = kThreads / 2; width > 0; width /= 2)
    for (int t = 0; t < width; ++t) part[t] = online_merge(part[t], part[t + width]);
  const Online acc = part[0];
  const float log_s = logf(acc.s), lse = acc.m + log_s, entropy = log_s - acc.t / acc.s;
  std::vector<double> z(x.size());
  for (size_t i = 0; i < x.size(); ++i) z[i] = cap * tanh((double)x[i] / cap);
  double m = -INFINITY, s = 0.0, sz = 0.0;
  for (double v : z) m = fmax(m, v);
  for (double v : z) { s += exp(v - m); sz += exp(v - m) * (v - m); }
  const double ref_lse = m + log(s), ref_ent = log(s) - sz / s;
  double grad_err = 0.0;
  const float c = gl + gh * entropy;
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = tile_grad<true>(x[i], (int)i == y, lse, c, gl, gh, cap, 1.0f / cap);
    const double t = tanh((double)x[i] / cap), p = exp(z[i] - ref_lse);
    const double ref = (((int)i == y ? gl : 0.0) - p * (gl + gh * (z[i] - ref_lse + ref_ent))) * (1.0 - t * t);
    grad_err = fmax(grad_err, fabs(d - ref));
  }
  printf("%.9g %.9g %.9g %.9g %.9g\n", lse, ref_lse, entropy, ref_ent, grad_err);
}

int main() {
  unsigned state = 12345u;
  auto uniform = [&]() { state = state * 1664525u + 1013904223u; return (state >> 8) / 16777216.0f; };
  for (int v : {1, 7, 1001, 4096}) {  // fewer, as many and more values than threads
    std::vector<float> z(v);
    for (float& x : z) x = 8.0f * uniform() - 4.0f;
    check_row(z, v / 2, 0.7f, -0.3f);
  }
  std::vector<float> big(1001);  // |z| ~ 1e4: lse − Σ p z would cancel
  for (float& x : big) x = 1.0e4f + 4.0f * uniform();
  check_row(big, 3, 1.0f, 0.5f);
  std::vector<float> banned(1001, -INFINITY);  // banned tokens (−inf) everywhere but a few
  banned[5] = 1.0f; banned[700] = 2.0f; banned[1000] = -3.0f;
  check_row(banned, 700, -0.2f, 0.1f);
  std::vector<float> wide(1001);  // |x| up to 120 against caps of 30 (Gemma-2) and 3: saturated and linear parts
  for (float& x : wide) x = 240.0f * uniform() - 120.0f;
  check_capped_row(wide, 11, 0.7f, -0.3f, 30.0f);
  check_capped_row(wide, 500, -1.0f, 0.4f, 3.0f);
  return 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_cuda_kernel_math_on_host(tmp_path):
    """The kernels' online softmax statistics and dz (plain and soft-capped), run on the CPU: finite and equal
    to an fp64 reference."""
    source = tmp_path / "epilogue_host.cu"
    source.write_text(HOST_TU)
    exe = tmp_path / "epilogue_host"
    cmd = [NVCC, "-std=c++17", "-arch=sm_90", "-O2", f"-I{CSRC}", str(source), "-o", str(exe)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    rows = [[float(x) for x in line.split()] for line in run.stdout.splitlines()]
    assert len(rows) == 8, run.stdout
    for lse, ref_lse, ent, ref_ent, grad_err in rows:
        assert abs(lse - ref_lse) <= 1e-6 * max(1.0, abs(ref_lse)), rows
        assert abs(ent - ref_ent) <= 1e-5 * max(1.0, abs(ref_ent)), rows
        assert grad_err <= 1e-5, rows  # fp32 rounding of lse at |z| ~ 1e4


def _cuda_torch_include(cache: Path) -> Path | None:
    """Include directory of a CUDA build of torch: the installed one when it is a CUDA build, else the
    headers of the newest torch wheel pip can fetch (a CUDA build on Linux), unpacked once into `cache`."""
    import torch
    from torch.utils.cpp_extension import include_paths

    if torch.version.cuda is not None:
        return Path(include_paths()[0])
    include = cache / "torch" / "include"
    if not (include / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists():
        import sys
        import zipfile

        wheels = cache / "wheel"
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "torch>=2.11"]
        if subprocess.run([*cmd, "-d", str(wheels)], capture_output=True, timeout=1800).returncode != 0:
            return None
        for wheel in wheels.glob("torch-*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(cache, [n for n in archive.namelist() if n.startswith("torch/include/")])
            wheel.unlink()
    return include if (include / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists() else None


def _toolkit_includes() -> list[str]:
    """The -I flags nvcc itself compiles with (the toolkit's headers, wherever nvcc lives or whatever wraps it)."""
    dry = subprocess.run([NVCC, "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    found = re.search(r'INCLUDES="([^"]*)"', dry.stderr + dry.stdout)
    return found.group(1).split() if found else []


@pytest.fixture(scope="module")
def cuda_torch_include(tmp_path_factory):
    include = _cuda_torch_include(Path.home() / ".cache" / "grpo_fast" / "cuda-torch-headers")
    if include is None:
        pytest.skip("no CUDA build of torch (installed, or fetchable by pip) to take headers from")
    return include


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("source", sorted(p.name for p in CSRC.rglob("*.c*") if p.suffix in (".cpp", ".cu")))
def test_cuda_compile_binding_objects(tmp_path, cuda_torch_include, source):
    """Every .cpp and .cu of csrc/, with GRPO_FAST_WITH_CUDA, compiles to an object file for sm_90 against
    a CUDA torch's real headers and the toolkit's (nothing stubbed): what a CUDA `pip install -e .` builds."""
    import sysconfig

    path = next(CSRC.rglob(source))
    std = "c++20" if "C++20" in (cuda_torch_include / "ATen" / "ATen.h").read_text() else "c++17"
    includes = [f"-I{cuda_torch_include}", f"-I{cuda_torch_include / 'torch/csrc/api/include'}", f"-I{CSRC}"]
    includes += [f"-I{sysconfig.get_paths()['include']}", *_toolkit_includes()]
    defines = ["-DGRPO_FAST_WITH_CUDA", "-DTORCH_EXTENSION_NAME=_C", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    if path.suffix == ".cu":
        cmd = [NVCC, f"-std={std}", "-arch=sm_90", "-O1", "--expt-relaxed-constexpr"]
    else:
        cmd = ["g++", f"-std={std}", "-O1", "-fopenmp", "-fPIC"]
    cmd += [*includes, *defines, "-c", str(path), "-o", str(tmp_path / f"{path.stem}.o")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
