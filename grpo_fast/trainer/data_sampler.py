"""Deterministic, resumable prompt order: a fresh seeded permutation per epoch, position saved in
checkpoints. `set_active` restricts the order to a subset of the rows (the pass-rate curriculum)."""

from __future__ import annotations

import torch


class PromptSampler:
    def __init__(self, num_rows: int, seed: int = 0) -> None:
        if num_rows < 1:
            raise ValueError("the training dataset is empty")
        self.num_rows, self.seed = num_rows, seed
        self.epoch, self.position = 0, 0
        self.active: list[int] | None = None  # None: every row
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        rows = self.active if self.active is not None else range(self.num_rows)
        return [rows[i] for i in torch.randperm(len(rows), generator=g).tolist()]

    def set_active(self, rows: list[int] | None) -> None:
        """Draw only from `rows` (None: all) from now on, starting a new epoch over them."""
        if rows is not None and (not rows or not all(0 <= i < self.num_rows for i in rows)):
            raise ValueError(f"active rows: expected a non-empty subset of 0..{self.num_rows - 1}")
        self.active = None if rows is None else sorted(rows)
        self.epoch, self.position = self.epoch + 1, 0
        self._perm = self._permutation(self.epoch)

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.position >= len(self._perm):
                self.epoch, self.position = self.epoch + 1, 0
                self._perm = self._permutation(self.epoch)
            take = min(k - len(out), len(self._perm) - self.position)
            out += self._perm[self.position : self.position + take]
            self.position += take
        return out

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_rows": self.num_rows,
            "seed": self.seed,
            "active": self.active,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["num_rows"] != self.num_rows:
            raise ValueError(f"resumed dataset has {self.num_rows} rows, the checkpoint's had {state['num_rows']}")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self.active = state.get("active")
        self._perm = self._permutation(self.epoch)
