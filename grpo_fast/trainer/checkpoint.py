"""Atomic checkpoints: written into a temporary directory beside the target, then renamed.

A checkpoint directory `step-000010/` holds the HF model (safetensors, loadable with `from_pretrained`),
the tokenizer, and `trainer_state.pt` (optimizer, scheduler, RNG states, step, data position).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

_STEP_DIR = re.compile(r"^step-(\d+)$")
_OLD_DIR = re.compile(r"^\.old-(step-\d+)-\d+$")


def rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 (global RNG)
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002 (global RNG)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: str | Path, step: int, model, tokenizer, trainer_state: dict, keep: int | None = None
) -> Path:
    """Writes root/step-{step:06d} atomically; returns its path. `keep` prunes older checkpoints."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save({**trainer_state, "rng": rng_state()}, tmp / "trainer_state.pt")
    _fsync_tree(tmp)  # the renames below must never publish a directory whose files are not on disk
    if final.exists():  # re-saving the same step (e.g. final save right after a periodic one)
        old = root / f".old-step-{step:06d}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    _fsync(root)
    if keep is not None:
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old)
    return final


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file under `root`, then the directories themselves (so their entries are durable)."""
    for directory, _, files in os.walk(root):
        for name in files:
            _fsync(Path(directory) / name)
        _fsync(Path(directory))


def list_checkpoints(root: str | Path) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    _recover_interrupted_resaves(root)
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def _recover_interrupted_resaves(root: Path) -> None:
    """A re-save of an existing step moves step-N aside to .old-step-N-<pid> before renaming the new one in: a
    crash between the two renames leaves no step-N. Put the previous, complete one back."""
    for p in sorted(root.iterdir()):
        m = _OLD_DIR.match(p.name)
        if m and p.is_dir():
            final = root / m.group(1)
            if final.exists():
                shutil.rmtree(p)  # the new one made it: this is a leftover of the cleanup
            else:
                os.replace(p, final)


def saved_steps(root: str | Path) -> list[int]:
    """The steps that have a complete checkpoint under `root`, ascending."""
    return [int(_STEP_DIR.match(p.name).group(1)) for p in list_checkpoints(root)]


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_trainer_state(path: str | Path) -> dict:
    return torch.load(Path(path) / "trainer_state.pt", map_location="cpu", weights_only=False)


def load_model_weights(model, path: str | Path) -> None:
    """Loads the checkpoint's safetensors into an existing model in place (same architecture)."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    state = {}
    for f in files:
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"checkpoint {path}: missing {sorted(set(missing) - tied)}, unexpected {unexpected}")
