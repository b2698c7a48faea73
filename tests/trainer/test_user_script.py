"""A reward function defined in the user's own training script, TRL's usual pattern, works as in TRL even when
the script has no `if __name__ == "__main__":` guard: the reward pool's workers never run the script (they used
to re-import it and die at start-up), and the script's own function is scored in the trainer's process with one
notice. The script runs as a real subprocess: from its file, and fed on standard input as a notebook's cells
are (no file to import at all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("trl_style_script.py")


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_an_unguarded_script_with_its_own_reward_function_trains(tmp_path, how):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if how == "file":
        cmd, stdin = [sys.executable, str(SCRIPT), str(out)], None
    else:
        cmd, stdin = [sys.executable, "-", str(out)], SCRIPT.read_text()
    proc = subprocess.run(cmd, input=stdin, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    notices = [line for line in proc.stderr.splitlines() if "reward_len is defined in __main__" in line]
    assert len(notices) == 1 and "scored in the trainer's process" in notices[0], proc.stderr[-4000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:  # both functions scored every completion, none failed
        assert step["reward/reward_len/mean"] <= 0 and "reward/exact_match_reward/mean" in step
        assert not any(v for k, v in step.items() if k.endswith("failures"))
