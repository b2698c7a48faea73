"""Deterministic, resumable prompt order: a fresh seeded permutation per epoch, position saved in
checkpoints."""

from __future__ import annotations

import torch


class PromptSampler:
    def __init__(self, num_rows: int, seed: int = 0) -> None:
        if num_rows < 1:
            raise ValueError("the training dataset is empty")
        self.num_rows, self.seed = num_rows, seed
        self.epoch, self.position = 0, 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_rows, generator=g).tolist()

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.position >= self.num_rows:
                self.epoch, self.position = self.epoch + 1, 0
                self._perm = self._permutation(self.epoch)
            take = min(k - len(out), self.num_rows - self.position)
            out += self._perm[self.position : self.position + take]
            self.position += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "num_rows": self.num_rows, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["num_rows"] != self.num_rows:
            raise ValueError(f"resumed dataset has {self.num_rows} rows, the checkpoint's had {state['num_rows']}")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._perm = self._permutation(self.epoch)
