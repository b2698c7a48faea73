"""Random SFT examples for the batching and loss tests (imported by name: pytest puts this directory on
sys.path)."""

from __future__ import annotations

import random

import numpy as np

from grpo_fast.sft.data import SFTExample


def random_examples(n: int, vocab: int, seed: int = 0, lengths=(3, 20)) -> list[SFTExample]:
    """n examples of random tokens in [3, vocab) with lengths in `lengths`, each a prompt of at least one
    token then a completion of at least one (the loss tokens)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(*lengths)
        prompt = rng.randint(1, length - 1)
        ids = np.array([rng.randrange(3, vocab) for _ in range(length)], dtype=np.int64)
        out.append(SFTExample(ids, np.arange(length) >= prompt))
    return out
