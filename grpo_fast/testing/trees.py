"""Exact equality of nested states (state dicts, optimizer and scheduler states, RNG states), for tests that
compare a resumed or recovered run with an uninterrupted one bit for bit."""

from __future__ import annotations

import torch


def assert_equal_trees(a, b, path: str = "state") -> None:
    """a == b through dicts, lists and tuples, tensors by `torch.equal`; the message names the first
    differing path (e.g. "optimizer.state.3.exp_avg")."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for key in a:
            assert_equal_trees(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal_trees(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)
