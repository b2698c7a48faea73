"""The disk filling up while a checkpoint is written: the error says so (ENOSPC, the step, the previous
checkpoint), the temporary directory is removed, and the previous checkpoint stays intact and resumes.

ENOSPC is raised at the OS boundary of the writer: the file writes of `torch.save` (trainer_state.pt) or of
safetensors (the weights) write their first bytes, then fail as a full disk makes them fail."""

from __future__ import annotations

import errno
import io

import pytest
import torch

from grpo_fast.core import checkpoint as ckpt
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.text import completion_text
from grpo_fast.trainer import GRPOTrainer, load_config


def char_code_reward(prompts, completions, **_):
    return [sum(map(ord, completion_text(c))) % 7 / 6 for c in completions]


def _trainer(out, *overrides):
    tok = build_char_tokenizer()
    opts = ["rollout.engine=hf", "rollout.num_generations=4", "rollout.max_completion_length=3"]
    opts += ["run.prompts_per_step=2", "run.micro_batch_size=4", "run.eval_every=0", "reward.workers=0"]
    opts += ["run.tensorboard=false", "run.progress=false", "run.plots=false", "run.save_every=1"]
    opts += ["optim.lr=1e-2", f"run.output_dir={out}", *overrides]
    return GRPOTrainer(
        build_tiny_model(tok),
        [char_code_reward],
        modular_arithmetic_dataset(16, seed=0),
        config=load_config(None, opts),
        tokenizer=tok,
    )


def _disk_full_after(nbytes: int):
    """A `write(path, data)` that fills the disk after `nbytes` bytes: they are written, then ENOSPC."""

    def failing(path, data: bytes):
        with open(path, "wb") as f:
            f.write(data[:nbytes])
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    return failing


@pytest.mark.parametrize("where", ["trainer_state", "weights"])
def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch, where):
    out = tmp_path / "run"
    t = _trainer(out, "run.max_steps=1")
    t.train()
    t.close()
    root = out / "checkpoints"
    before = {p.name: p.read_bytes() for p in (root / "step-000001").iterdir()}

    fail = _disk_full_after(1000)
    if where == "trainer_state":
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if str(f).endswith(ckpt.TRAINER_STATE):
                buf = io.BytesIO()
                real_save(obj, buf, *args, **kwargs)
                fail(f, buf.getvalue())
            return real_save(obj, f, *args, **kwargs)

        monkeypatch.setattr(torch, "save", save)
    else:
        import safetensors.torch
        import transformers.modeling_utils as mu

        def save_file(tensors, filename, metadata=None):
            fail(filename, safetensors.torch.save(tensors, metadata=metadata))

        monkeypatch.setattr(mu, "safe_save_file", save_file)

    t2 = _trainer(out, "run.max_steps=2", "run.resume=true")
    with pytest.raises(OSError, match="no space left") as info:
        t2.train()
    t2.close()
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert "step 2" in str(info.value) and "step-000001" in str(info.value)  # what failed, what is kept
    assert sorted(p.name for p in root.iterdir()) == ["step-000001"]  # the temporary directory is gone
    assert {p.name: p.read_bytes() for p in (root / "step-000001").iterdir()} == before

    t3 = _trainer(out, "run.max_steps=2", "run.resume=true")  # and the run resumes from it
    t3.train()
    t3.close()
    assert t3.resumed_from == root / "step-000001" and t3.step == 2
    assert ckpt.saved_steps(root) == [1, 2]
