"""setup.py's CUDA checks, without building: CUDA_HOME comes from the real path of nvcc (an nvcc reached
through a symbolic link must not give the link's directory), and GRPO_FAST_REQUIRE_CUDA=1 refuses a build
that would silently leave the CUDA kernels out."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup_py(load_script):
    return load_script("setup.py", "grpo_fast_setup")  # not __main__: defines the functions, runs no build


def test_cuda_home_is_two_levels_above_the_real_nvcc(setup_py, tmp_path):
    toolkit = tmp_path / "opt" / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (toolkit / "bin" / "nvcc").chmod(0o755)
    links = tmp_path / "usr" / "bin"
    links.mkdir(parents=True)
    (links / "nvcc").symlink_to(toolkit / "bin" / "nvcc")
    assert setup_py.cuda_home_from_nvcc(str(links)) == str(toolkit.resolve())
    assert setup_py.cuda_home_from_nvcc(str(tmp_path / "nowhere")) is None


def test_require_cuda_refuses_a_cpu_only_build(setup_py, monkeypatch):
    monkeypatch.setenv("GRPO_FAST_REQUIRE_CUDA", "1")
    monkeypatch.delenv("GRPO_FAST_SKIP_EXT", raising=False)
    monkeypatch.delenv("GRPO_FAST_FORCE_CUDA", raising=False)
    monkeypatch.setattr(setup_py, "cuda_build_problem", lambda: "torch 2.13.0+cpu is a CPU-only build")
    with pytest.raises(RuntimeError, match="GRPO_FAST_REQUIRE_CUDA=1 but the CUDA kernels cannot be built: torch"):
        setup_py.extension_modules()
    monkeypatch.delenv("GRPO_FAST_REQUIRE_CUDA")
    (ext,), _ = setup_py.extension_modules()  # without the flag: the C++-only extension, announced
    assert not any(str(s).endswith(".cu") for s in ext.sources)
