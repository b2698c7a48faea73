"""Build script: packages (with `kernels/` shipped as `grpo_fast.kernels`; grpo_fast/kernels/__init__.py, which points
a source tree's package at kernels/, is not installed) and the optional C++/CUDA extension `grpo_fast._C` compiled
from `csrc/` through torch's cpp_extension.

Environment:
  GRPO_FAST_SKIP_EXT=1     do not build the extension (pure-Python install).
  MAX_JOBS=N               parallel compile jobs (honoured by torch's ninja builder).
  TORCH_CUDA_ARCH_LIST     GPU architectures of the CUDA kernels (default "8.0;9.0+PTX").
  GRPO_FAST_FORCE_CUDA=1   build the CUDA kernels even when torch cannot see a toolkit.
  GRPO_FAST_REQUIRE_CUDA=1 fail instead of building a CPU-only extension when the CUDA kernels cannot be built.
  CUDA_HOME                the CUDA toolkit; unset, it is derived from the real path of `nvcc` on PATH (torch
                           would take the directory above a symbolic link's, e.g. /usr for /usr/bin/nvcc).

The build prints one line saying which extension it builds and why (`grpo_fast._C: ...`).
"""

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
PACKAGES = find_packages(include=["grpo_fast", "grpo_fast.*"], exclude=["grpo_fast.kernels"]) + ["grpo_fast.kernels"]
PACKAGE_DIR = {"grpo_fast.kernels": "kernels"}


def cuda_home_from_nvcc(path: str | None = None) -> str | None:
    """The toolkit directory of the `nvcc` found on PATH (or `path`): two levels above its real path, symbolic
    links resolved (/usr/bin/nvcc -> /usr/local/cuda-13.0/bin/nvcc gives /usr/local/cuda-13.0); None without nvcc."""
    nvcc = shutil.which("nvcc", path=path)
    return None if nvcc is None else str(Path(nvcc).resolve().parent.parent)


def _set_cuda_home() -> None:
    """CUDA_HOME from the real nvcc unless CUDA_HOME / CUDA_PATH is set: torch.utils.cpp_extension reads it
    once, when imported."""
    if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
        home = cuda_home_from_nvcc()
        if home is not None:
            os.environ["CUDA_HOME"] = home


def cuda_build_problem() -> str | None:
    """Why the CUDA kernels cannot be built here (no CUDA build of torch, no toolkit), or None when they can;
    GRPO_FAST_FORCE_CUDA=1 insists."""
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    if os.environ.get("GRPO_FAST_FORCE_CUDA") == "1":
        return None
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if CUDA_HOME is None:
        return "no CUDA toolkit: nvcc is not on PATH and CUDA_HOME is unset"
    if not (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return f"CUDA_HOME={CUDA_HOME} has no bin/nvcc"
    return None


def sources_hash() -> str:
    """The fingerprint of csrc/ (grpo_fast/backends/sources.py, loaded by its path: the package may not import yet),
    compiled into the extension and compared with csrc/ when the native backends import it."""
    spec = importlib.util.spec_from_file_location("grpo_fast_sources", ROOT / "grpo_fast" / "backends" / "sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sources_hash(ROOT / "csrc")


def _report(message: str) -> None:
    print(f"grpo_fast._C: {message}", file=sys.stderr, flush=True)


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
    fingerprint = [("GRPO_FAST_SOURCES_HASH", "h" + sources_hash())]  # an identifier the C++ code stringifies
    cuda_sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "cuda").glob("*.cu"))
    problem = cuda_build_problem() if cuda_sources else "csrc/cuda has no sources"
    if problem is not None and os.environ.get("GRPO_FAST_REQUIRE_CUDA") == "1":
        raise RuntimeError(f"grpo_fast._C: GRPO_FAST_REQUIRE_CUDA=1 but the CUDA kernels cannot be built: {problem}")
    if problem is None:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
        from torch.utils.cpp_extension import CUDA_HOME

        arch = os.environ["TORCH_CUDA_ARCH_LIST"]
        _report(f"C++ + CUDA kernels (CUDA_HOME={CUDA_HOME}, TORCH_CUDA_ARCH_LIST={arch})")
        ext = CUDAExtension(
            "grpo_fast._C",
            sources + cuda_sources,
            include_dirs=include_dirs,
            define_macros=[("GRPO_FAST_WITH_CUDA", None), *fingerprint],
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]},
            extra_link_args=["-fopenmp"],
        )
    else:
        _report(f"C++ kernels only, no CUDA kernels: {problem}")
        ext = CppExtension(
            "grpo_fast._C",
            sources,
            include_dirs=include_dirs,
            define_macros=fingerprint,
            extra_compile_args=cxx_flags,
            extra_link_args=["-fopenmp"],
        )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import its functions
    _set_cuda_home()
    ext_modules, cmdclass = extension_modules()
    setup(packages=PACKAGES, package_dir=PACKAGE_DIR, ext_modules=ext_modules, cmdclass=cmdclass)
