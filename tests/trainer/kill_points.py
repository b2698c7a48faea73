"""Test-only plug-ins that SIGKILL the training process at a chosen point (tests/trainer/test_kill_resume.py).

The training CLI loads them by import path (this directory on PYTHONPATH): the rollout engine
"kill_points:KillingEngine" and the reward "kill_points:char_code_reward". Importing the module (the
engine is built before training starts) installs the trigger named by GRPO_TEST_KILL="<phase>:<n>": the
process kills itself at the n-th event of that phase, counted from the start of this process, so a kill
point never depends on timing. Without GRPO_TEST_KILL nothing is installed and the engine is the
transformers engine. Phases:

  generate     inside the n-th generation call (before it returns its completions)
  score        inside the n-th reward call
  optimizer    right after the n-th optimizer step updated the weights in memory (before anything is saved)
  ckpt_write   half way through writing the n-th trainer_state.pt of a checkpoint
  ckpt_rename  before the n-th rename that publishes a finished checkpoint
  ckpt_resave  between the two renames of the n-th re-save of an existing step (final save)
"""

from __future__ import annotations

import io
import os
import random
import signal
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from grpo_fast.rewards.text import completion_text
from grpo_fast.rollout.hf_engine import HFEngine

_PHASE, _, _N = os.environ.get("GRPO_TEST_KILL", "").partition(":")
_AT = int(_N) if _N else 0
_counts: dict[str, int] = {}


def _event(phase: str) -> None:
    """Counts an event of `phase`; SIGKILLs this process at the chosen one."""
    if phase != _PHASE:
        return
    _counts[phase] = _counts.get(phase, 0) + 1
    if _counts[phase] == _AT:
        os.kill(os.getpid(), signal.SIGKILL)


class KillingEngine(HFEngine):
    def generate(self, prompt_token_ids, sampling):
        out = super().generate(prompt_token_ids, sampling)
        _event("generate")
        return out


def char_code_reward(prompts, completions, **_):
    """A deterministic reward that differs between completions, so every step has a gradient."""
    _event("score")
    return [sum(map(ord, completion_text(c))) % 7 / 6 for c in completions]


def logged_on_rank_zero(prompts, completions, log_metric, **_):
    """char_code_reward, and a log_metric on rank 0 only: a function that logs on some batches of a step."""
    if os.environ.get("RANK", "0") == "0":
        log_metric("rank_zero", 1.0)
    return char_code_reward(prompts, completions)


def noisy_char_code_reward(prompts, completions, **_):
    """char_code_reward plus noise from Python's global RNG, one draw per character: ranks with other completions
    draw other amounts, so each rank's RNG state is its own."""
    return [
        r + sum(random.random() for _ in completion_text(c)) % 1 / 6
        for r, c in zip(char_code_reward(prompts, completions), completions, strict=True)
    ]


if _PHASE == "optimizer":
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _event("optimizer"))

if _PHASE == "ckpt_write":
    _save = torch.save

    def _half_written_save(obj, f, *args, **kwargs):
        if (
            isinstance(f, (str, os.PathLike))
            and Path(f).name == "trainer_state.pt"
            and _counts.get(_PHASE, 0) + 1 == _AT
        ):
            buf = io.BytesIO()
            _save(obj, buf, *args, **kwargs)
            with open(f, "wb") as out:
                out.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                out.flush()
                os.fsync(out.fileno())
        _event("ckpt_write")
        return _save(obj, f, *args, **kwargs)

    torch.save = _half_written_save

if _PHASE in ("ckpt_rename", "ckpt_resave"):
    _replace = os.replace

    def _killing_replace(src, dst):
        src, dst = Path(src), Path(dst)
        if _PHASE == "ckpt_rename" and src.name.startswith(".tmp-step-") and dst.name.startswith("step-"):
            _event("ckpt_rename")
        _replace(src, dst)
        if _PHASE == "ckpt_resave" and src.name.startswith("step-") and dst.name.startswith(".old-step-"):
            _event("ckpt_resave")

    os.replace = _killing_replace
