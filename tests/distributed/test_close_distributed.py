"""The command line's last act, `close_distributed`, outside a torchrun launch."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from grpo_fast.rollout.base import SamplingSpec


def test_a_command_run_beside_a_vllm_engine_leaves_its_groups_alone(vllm_engine, tiny_dir, monkeypatch):
    """A single-process vLLM engine makes a process group of its own. A command run in the same interpreter (a
    notebook, a test) must not destroy it: the engine would then fail its shutdown ("Invalid process group
    specified") and any collective of its."""
    from grpo_fast.cli import main

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert dist.is_initialized()
    with pytest.raises(SystemExit, match="invalid config"):
        main(["train", "--config", str(tiny_dir / "no_such_config.yaml")])
    assert dist.is_initialized()
    [[completion]] = vllm_engine.generate([[5, 6, 7]], SamplingSpec(max_tokens=3))
    assert 1 <= len(completion.token_ids) <= 3
