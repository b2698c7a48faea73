"""Build script: packages (with `kernels/` shipped as `grpo_fast.kernels`) and the optional
C++/CUDA extension `grpo_fast._C` compiled from `csrc/` through torch's cpp_extension.

Environment:
  GRPO_FAST_SKIP_EXT=1   do not build the extension (pure-Python install).
  MAX_JOBS=N             parallel compile jobs (honoured by torch's ninja builder).
  TORCH_CUDA_ARCH_LIST   GPU architectures of the CUDA kernels (default "8.0;9.0+PTX").
  GRPO_FAST_FORCE_CUDA=1 build the CUDA kernels even when torch cannot see a toolkit.
"""

import os
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
PACKAGES = find_packages(include=["grpo_fast", "grpo_fast.*"]) + ["grpo_fast.kernels"]
PACKAGE_DIR = {"grpo_fast.kernels": "kernels"}


def _cuda_toolkit_usable() -> bool:
    """A CUDA build of torch and a CUDA toolkit (nvcc) to compile csrc/cuda with; GRPO_FAST_FORCE_CUDA=1 insists."""
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    if os.environ.get("GRPO_FAST_FORCE_CUDA") == "1":
        return True
    return torch.version.cuda is not None and CUDA_HOME is not None


def extension_modules():
    """The `grpo_fast._C` extension, or nothing when csrc/ has no sources or the build is skipped.

    CPU-only torch: a CppExtension from csrc/*.cpp. CUDA torch + nvcc: a CUDAExtension that adds
    csrc/cuda/*.cu, for the architectures in TORCH_CUDA_ARCH_LIST (default "8.0;9.0+PTX": sm_80,
    sm_90 and PTX for newer GPUs). No -march flag: the CPU kernels pick their vector ISA at load time.
    """
    if os.environ.get("GRPO_FAST_SKIP_EXT") == "1":
        return [], {}
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.cpp"))
    if not sources:
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    # -fno-trapping-math lets GCC if-convert the branch-free exp so the fp32 loops vectorise at
    # every ISA level (the kernels never rely on floating-point exceptions).
    cxx_flags = ["-O3", "-fopenmp", "-fno-trapping-math"]
    include_dirs = [str(ROOT / "csrc")]
    cuda_sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "cuda").glob("*.cu"))
    if cuda_sources and _cuda_toolkit_usable():
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
        ext = CUDAExtension(
            "grpo_fast._C",
            sources + cuda_sources,
            include_dirs=include_dirs,
            define_macros=[("GRPO_FAST_WITH_CUDA", None)],
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]},
            extra_link_args=["-fopenmp"],
        )
    else:
        ext = CppExtension(
            "grpo_fast._C",
            sources,
            include_dirs=include_dirs,
            extra_compile_args=cxx_flags,
            extra_link_args=["-fopenmp"],
        )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = extension_modules()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR, ext_modules=ext_modules, cmdclass=cmdclass)
