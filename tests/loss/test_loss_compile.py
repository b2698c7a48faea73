"""`grpo_loss` inside `torch.compile(fullgraph=True)`: dynamo traces it as one custom op (grpo_fast::grpo_loss,
with a fake implementation and an autograd formula) and the compiled call gives the eager loss, metrics and
gradients; bad input still raises the eager path's error."""

from __future__ import annotations

import pytest
import torch

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.testing.synthetic import make_loss_batch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _run(fn, batch, bias, config, packed):
    h = batch.hidden.clone().requires_grad_()
    w = batch.weight.clone().requires_grad_()
    b = bias.clone().requires_grad_()
    args = batch.token_arguments()
    kwargs = {}
    if packed:  # the same sequences, padding removed: hidden [N, H], per-token [N], cu_seqlens [B + 1]
        mask = args["completion_mask"].bool()
        lengths = mask.sum(1)
        kwargs["cu_seqlens"] = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))
        h_in = h[mask]
        args = {k: (v[mask] if v.dim() == 2 else v) for k, v in args.items()}
        args["completion_mask"] = torch.ones_like(args["completion_ids"], dtype=torch.bool)
    else:
        h_in = h
    loss, metrics = fn(h_in, w, config=config, bias=b, num_items_in_batch=50, **args, **kwargs)
    (2.0 * loss).backward()  # an upstream gradient other than 1
    return loss.detach(), metrics, h.grad, w.grad, b.grad


# (loss type, importance-sampling level, workspace bytes): token level forms the gradient in the forward pass;
# GSPO with a tile of 2 rows (shorter than a sequence) takes the recompute path.
CASES = [("grpo", "token", None), ("dapo", "token", None), ("grpo", "sequence", 2 * 4 * 97)]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize(("loss_type", "level", "workspace"), CASES)
def test_compiled_fullgraph_equals_eager(loss_type, level, workspace, packed):
    batch = make_loss_batch(3, 9, 32, 97, seed=11)
    bias = torch.randn(97, generator=torch.Generator().manual_seed(2)) * 0.1
    config = GRPOLossConfig(
        loss_type=loss_type,
        beta=0.04,
        epsilon_high=0.28,
        entropy_coef=0.01,
        importance_sampling_level=level,
        workspace_bytes=workspace,
        backend="torch",
    )
    eager = _run(grpo_loss, batch, bias, config, packed)
    compiled = _run(torch.compile(grpo_loss, fullgraph=True, backend="aot_eager"), batch, bias, config, packed)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-6, atol=1e-7)
    assert compiled[1].keys() == eager[1].keys()
    for key in eager[1]:
        torch.testing.assert_close(compiled[1][key], eager[1][key], rtol=1e-6, atol=1e-7, msg=key)
    for got, want in zip(compiled[2:], eager[2:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_compiled_call_still_rejects_bad_input():
    batch = make_loss_batch(2, 5, 16, 31, seed=3)
    ids = batch.completion_ids.clone()
    ids[0, 0] = 31  # out of the vocabulary
    compiled = torch.compile(grpo_loss, fullgraph=True, backend="aot_eager")
    with pytest.raises(ValueError, match="completion_ids"):
        compiled(batch.hidden, batch.weight, ids, batch.completion_mask, batch.advantages)
