"""Test-session setup. Never touches the GPU at import time beyond asking whether one exists.

On a machine without CUDA, Triton kernels run through the interpreter: TRITON_INTERPRET must be
set before triton is first imported, hence here.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
