"""Multi-turn rollouts on the vLLM engine (multi_turn_vllm.py, in a process of its own): the same token accounting
as on the transformers engine, and the engine's logprobs of its sampled tokens equal to the trainer's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.slow  # its own vLLM process (~25 s): CI stays under its 20 minutes
def test_vllm_multi_turn_rollouts_keep_exact_token_accounting(tool_agent):
    pytest.importorskip("vllm")
    _, _, agent_dir = tool_agent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(HERE / "multi_turn_vllm.py"), str(agent_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(result["template_equal"]) and len(result["template_equal"]) == 20
    assert result["calls"] == [1, 1, 1, 1, 1, 1, 0, 0, 2, 2]  # greedy: m, x, a call once, t never, c twice
    assert result["tool_results"][:2] == ["408", "408"] and result["tool_results"][-2:] == ["1", "3"]
    # vLLM's logprobs of the tokens it sampled match the trainer's forward (fp32), the inserted tool tokens
    # (masked: logprob 0.0) would not: the mask is what keeps the rollout/trainer mismatch near zero.
    assert result["sampled_abs_diff_mean"] < 1e-3, result
    assert result["inserted_tokens"] > 0 and result["inserted_abs_diff_mean"] > 0.1, result
