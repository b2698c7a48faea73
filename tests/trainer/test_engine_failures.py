"""The rollout engine failing to start: a model path that is not there, vLLM asked for where it does not
import, the engine running out of memory when it wakes up for the weight sync. Each ends in an error that
says what to change, and leaves nothing half-written in run.output_dir."""

from __future__ import annotations

import sys

import pytest
import torch

from grpo_fast.cli import main
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.text import completion_text
from grpo_fast.rollout.hf_engine import HFEngine
from grpo_fast.trainer import GRPOTrainer, load_config


def char_code_reward(prompts, completions, **_):
    return [sum(map(ord, completion_text(c))) % 7 / 6 for c in completions]


def _opts(out, *overrides):
    opts = ["rollout.num_generations=4", "rollout.max_completion_length=3", "run.prompts_per_step=2"]
    opts += ["run.micro_batch_size=4", "run.eval_every=0", "reward.workers=0", "run.max_steps=1"]
    opts += ["run.tensorboard=false", "run.progress=false", "run.plots=false", f"run.output_dir={out}"]
    return [*opts, *overrides]


def _trainer(out, *overrides, engine=None):
    tok = build_char_tokenizer()
    return GRPOTrainer(
        build_tiny_model(tok),
        [char_code_reward],
        modular_arithmetic_dataset(8, seed=0),
        config=load_config(None, _opts(out, *overrides)),
        tokenizer=tok,
        engine=engine,
    )


@pytest.mark.parametrize("path", ["/nonexistent/model", "./no/such/model", "EMPTY_DIR"])
def test_bad_model_path_is_a_clear_error(tmp_path, path):
    if path == "EMPTY_DIR":
        path = str(tmp_path / "empty")
        (tmp_path / "empty").mkdir()
    out = tmp_path / "run"
    args = ["train", "--skip-checks", "--set", f"model.path={path}", "--set", "rollout.engine=hf"]
    args += ["--set", "data.task_kwargs={n: 8}"]
    for opt in _opts(out):
        args += ["--set", opt]
    with pytest.raises(SystemExit) as info:
        main(args)
    message = str(info.value.code)
    assert "model.path" in message and path in message, message
    assert not out.exists()


def test_vllm_requested_where_it_does_not_import(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    out = tmp_path / "run"
    t = _trainer(out, "rollout.engine=vllm")
    with pytest.raises(RuntimeError, match="rollout.engine") as info:
        t.train()
    t.close()
    assert "vllm" in str(info.value).lower() and "rollout.engine: hf" in str(info.value)
    assert not out.exists()  # no exported rollout_init/, no empty output directory


class _OutOfMemoryAtWake(HFEngine):
    """An engine whose wake-up for the weight sync runs out of accelerator memory."""

    def load_weights(self, weights):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_out_of_memory_at_wake_up_says_what_to_change(tmp_path):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    out = tmp_path / "run"
    t = GRPOTrainer(
        model,
        [char_code_reward],
        modular_arithmetic_dataset(8, seed=0),
        config=load_config(None, _opts(out, "rollout.engine=hf")),
        tokenizer=tok,
        engine=_OutOfMemoryAtWake(model, tok),
    )
    with pytest.raises(torch.OutOfMemoryError) as info:
        t.train()
    t.close()
    message = str(info.value)
    assert "out of memory" in message and "rollout.vllm.gpu_memory_utilization" in message, message
    assert "CUDA out of memory. Tried to allocate 2.00 GiB" in message  # the original error is kept
    assert not out.exists()  # a fresh run that could not start leaves no metrics, audit or checkpoint files
