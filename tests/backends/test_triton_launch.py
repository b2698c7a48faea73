"""The Triton launcher's shared-memory fallback (kernels/linear_logprobs.py `_launch`): a kernel that does not
fit the device's shared memory (Triton's OutOfResources, raised at load time) is launched again with fewer
pipeline stages, the depth that ran is remembered, and every configuration that ran is reported. The GPU
raises the error itself; here a stand-in kernel raises it above a given depth."""

from __future__ import annotations

import os
import types

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined

import pytest  # noqa: E402

pytest.importorskip("triton")

from triton.runtime.errors import OutOfResources  # noqa: E402

from grpo_fast.kernels import linear_logprobs as kernels  # noqa: E402

CPU = torch.device("cpu")
BLOCKS = kernels.BlockConfig(block_n=128, block_v=128, block_h=64, num_warps=8, num_stages=3)


class FakeKernel:
    """kernel[grid](*args, **launch): raises OutOfResources while num_stages > `fits_at`, records each try."""

    def __init__(self, name: str, fits_at: int):
        self.fn = types.SimpleNamespace(__name__=name)
        self.fits_at = fits_at
        self.tries: list[int] = []

    def __getitem__(self, grid):
        def run(*args, num_stages, **launch):
            self.tries.append(num_stages)
            if num_stages > self.fits_at:
                raise OutOfResources(80 * 1024 * num_stages, 232448, "shared memory")

        return run


@pytest.fixture(autouse=True)
def _fresh_launch_table(monkeypatch):
    monkeypatch.setattr(kernels, "_LAUNCHED", {})


def test_retries_with_fewer_stages_and_remembers(caplog):
    kernel = FakeKernel("bwd", fits_at=1)
    with caplog.at_level("INFO", logger=kernels.__name__):
        kernels._launch(kernel, (4,), (), BLOCKS, CPU, HAS_BIAS=False)
    assert kernel.tries == [3, 2, 1]
    assert "retrying with num_stages=2" in caplog.text and "num_stages=1" in caplog.text
    kernels._launch(kernel, (4,), (), BLOCKS, CPU, HAS_BIAS=False)  # starts from the depth that ran
    assert kernel.tries == [3, 2, 1, 1]
    (config,) = kernels.launched_configs()
    assert config["kernel"] == "bwd" and config["num_stages"] == 1 and config["asked_num_stages"] == 3
    assert (config["block_n"], config["block_v"], config["block_h"], config["num_warps"]) == (128, 128, 64, 8)


def test_a_kernel_that_never_fits_raises():
    kernel = FakeKernel("bwd", fits_at=0)
    with pytest.raises(OutOfResources):
        kernels._launch(kernel, (4,), (), BLOCKS, CPU)
    assert kernel.tries == [3, 2, 1] and kernels.launched_configs() == []


def test_other_constexprs_are_another_configuration():
    kernel = FakeKernel("fwd", fits_at=3)
    kernels._launch(kernel, (4,), (), BLOCKS, CPU, HAS_BIAS=False)
    kernels._launch(kernel, (4,), (), BLOCKS, CPU, HAS_BIAS=True)
    assert kernel.tries == [3, 3] and len(kernels.launched_configs()) == 2


def test_real_kernels_report_what_ran():
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(20, 32, generator=gen), torch.randn(130, 32, generator=gen)
    targets = torch.randint(0, 130, (20,), generator=gen)
    logp, entropy, lse = kernels.linear_logprobs_forward(hidden, weight, None, targets, 1.0)
    kernels.linear_logprobs_backward(hidden, weight, None, targets, 1.0, lse, entropy, torch.ones(20), None)
    ran = {c["kernel"]: c for c in kernels.launched_configs()}
    assert set(ran) == {"_linear_logprobs_fwd_kernel", "_linear_logprobs_bwd_kernel"}
    blocks = kernels.default_blocks("forward", torch.float32)
    assert ran["_linear_logprobs_fwd_kernel"]["num_stages"] == blocks.num_stages
