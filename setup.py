"""Build script: packages (with `kernels/` shipped as `grpo_fast.kernels`) and the optional
C++/CUDA extension `grpo_fast._C` compiled from `csrc/` through torch's cpp_extension.

Environment:
  GRPO_FAST_SKIP_EXT=1   do not build the extension (pure-Python install).
  MAX_JOBS=N             parallel compile jobs (honoured by torch's ninja builder).
"""

import os
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
PACKAGES = find_packages(include=["grpo_fast", "grpo_fast.*"]) + ["grpo_fast.kernels"]
PACKAGE_DIR = {"grpo_fast.kernels": "kernels"}


def extension_modules():
    """The `grpo_fast._C` extension, or nothing when csrc/ has no sources or the build is skipped."""
    if os.environ.get("GRPO_FAST_SKIP_EXT") == "1":
        return [], {}
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.cpp"))
    if not sources:
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    ext = CppExtension("grpo_fast._C", sources, extra_compile_args=["-O3", "-fopenmp"], extra_link_args=["-fopenmp"])
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = extension_modules()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR, ext_modules=ext_modules, cmdclass=cmdclass)
