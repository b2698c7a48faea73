"""Seeding and the global RNG states a checkpoint saves and a resumed run restores."""

from __future__ import annotations

import random

import numpy as np
import torch


def set_seed(seed: int) -> None:
    """Seeds python's, numpy's and torch's global RNGs."""
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (global RNG)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """The global RNG states (python, numpy, torch, CUDA) as tensors and plain Python values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002 (global RNG)
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restores what `rng_state` saved (also the numpy tuple of checkpoints written before)."""
    random.setstate(_as_tuples(state["python"]))
    np.random.set_state(_numpy_state(state["numpy"]))  # noqa: NPY002 (global RNG)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy_state(saved) -> tuple:
    if not isinstance(saved, dict):  # written before: numpy's own tuple
        return saved
    keys = np.asarray(saved["keys"].numpy(), dtype=np.uint32)
    return (saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])


def _as_tuples(value):
    """random.setstate wants the nested tuples random.getstate gave."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
