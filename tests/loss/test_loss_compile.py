"""`grpo_loss` inside `torch.compile(fullgraph=True)`: each kernel is a torch.library custom op with a fake
implementation and autograd registered on top (layer 1: grpo_fast::linear_logprobs / _backward; the value checks:
grpo_fast::checked_targets; a backend's layer-2 kernel: grpo_fast::token_loss_kernel; the C++ epilogue:
grpo_fast::logprob_stats / logprob_grad_), the token math between them is traced PyTorch, so the whole loss traces
without a graph break and the compiled call gives the eager loss, metrics and gradients; bad input still raises the
eager path's error; `torch.library.opcheck` passes on every op (schema, fake tensor, autograd registration, AOT
dispatch)."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.backends import available_backends
from grpo_fast.loss.batch import checked_targets
from grpo_fast.loss.logprobs import linear_logprobs_op
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
    loss, metrics = fn(h_in, w, config=config, bias=b, num_items_in_batch=50, **args, **kwargs)  # rollout's included
    (2.0 * loss).backward()  # an upstream gradient other than 1
    return loss.detach(), metrics, h.grad, w.grad, b.grad


# (loss type, importance-sampling level, workspace bytes, options): eager, token level forms the gradient in the
# forward pass, GSPO with a tile of 2 rows (shorter than a sequence) takes the recompute path; the trust-region
# objectives (one reading the engine's logprobs, one of whole sequences) and TRL's entropy and off-policy masks
# trace too (the compiled path always recomputes).
CASES = [("grpo", "token", None, {}), ("dapo", "token", None, {}), ("grpo", "sequence", 2 * 4 * 97, {})]
CASES += [("icepop", "token", None, {}), ("gmpo", "token", None, {})]
CASES += [("grpo", "token", None, dict(top_entropy_quantile=0.5, off_policy_mask_threshold=0.05))]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize(("loss_type", "level", "workspace", "options"), CASES)
def test_compiled_fullgraph_equals_eager(loss_type, level, workspace, options, packed):
    if packed and (loss_type in ("icepop", "gmpo") or options):
        pytest.skip("the layouts are the same code for every objective and option")
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
        **options,
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


def test_compiled_logprobs_out_receives_the_current_logprobs():
    batch = make_loss_batch(2, 6, 16, 31, seed=5)
    config = GRPOLossConfig(backend="torch")
    outs = []
    for fn in (grpo_loss, torch.compile(grpo_loss, fullgraph=True, backend="aot_eager")):
        out = torch.full(batch.completion_ids.shape, 7.0)
        fn(batch.hidden, batch.weight, **batch.token_arguments(), config=config, logprobs_out=out)
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-6, atol=1e-7)
    assert torch.all(outs[0][~batch.completion_mask] == 0) and torch.all(outs[0][batch.completion_mask] < 0)


def _cpu_backends():
    return [b for b in ("torch", "cpu") if b in available_backends(torch.device("cpu"))]


def _layer1_inputs(bias: bool):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(11, generator=gen, dtype=torch.float64, requires_grad=True) if bias else None
    return gen, hidden, weight, b, torch.randint(0, 11, (7,), generator=gen)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("backend", _cpu_backends())
def test_opcheck_layer1_ops(backend, bias):
    gen, hidden, weight, b, targets = _layer1_inputs(bias)
    for softcap in (0.0, 2.5):
        opcheck(linear_logprobs_op, (hidden, weight, b, targets, 0.8, softcap, backend, False, 0))
        stats = [torch.randn(7, generator=gen, dtype=torch.float64) for _ in range(3)]
        detached = [None if t is None else t.detach() for t in (hidden, weight, b)]
        args = (*detached, targets, 0.8, softcap, backend, False, 0, stats[0], stats[1].abs(), stats[2], None)
        opcheck(torch.ops.grpo_fast.linear_logprobs_backward.default, args)


def test_opcheck_checked_targets():
    gen = torch.Generator().manual_seed(1)
    ids, mask = torch.randint(0, 11, (9,), generator=gen), torch.rand(9, generator=gen) > 0.3
    floats = [torch.randn(9, generator=gen) for _ in range(5)]
    for validate in (True, False):
        opcheck(checked_targets, (ids, mask, 11, floats[0], floats[1], None, floats[3], floats[4], validate))


def test_opcheck_cpu_epilogue_ops():
    if "cpu" not in available_backends(torch.device("cpu")):
        pytest.skip("grpo_fast._C not built")
    gen = torch.Generator().manual_seed(2)
    tile, targets = torch.randn(7, 11, generator=gen), torch.randint(0, 11, (7,), generator=gen)
    lse, entropy, grad = torch.randn(7, generator=gen), torch.rand(7, generator=gen), torch.randn(7, generator=gen)
    for softcap in (0.0, 3.0):
        opcheck(torch.ops.grpo_fast.logprob_stats.default, (tile, targets, softcap))
        for grad_entropy in (None, torch.randn(7, generator=gen)):
            args = (tile.clone(), targets, lse, entropy, grad, grad_entropy, softcap)
            opcheck(torch.ops.grpo_fast.logprob_grad_.default, args)


@pytest.mark.triton
def test_opcheck_layer2_kernel_op():
    if "triton" not in available_backends(torch.device("cpu")):
        pytest.skip("triton does not run here (set TRITON_INTERPRET=1 and install triton)")
    from grpo_fast.loss.batch import PerTokenArguments, prepare_batch
    from grpo_fast.loss.token_loss import KernelTokenLoss, token_loss_kernel_op

    batch = make_loss_batch(3, 5, 8, 13, seed=4)
    for level in ("token", "sequence"):
        config = GRPOLossConfig(loss_type="grpo", beta=0.04, entropy_coef=0.01, importance_sampling_level=level)
        args = batch.token_arguments()
        names = ("completion_ids", "completion_mask", "advantages", "old_logprobs", "ref_logprobs", "is_weights")
        per_token = PerTokenArguments(*(args[n] for n in names))
        prepared = prepare_batch(
            per_token, num_items_in_batch=None, cu_seqlens=None, config=config, vocab=13, source_name="hidden",
            source=batch.hidden,
        )  # fmt: skip
        n = prepared.layout.num_tokens
        logp = -torch.rand(n, generator=torch.Generator().manual_seed(int(level == "token"))).requires_grad_()
        entropy = torch.rand(n).requires_grad_()
        rest = KernelTokenLoss("triton")._arguments(prepared.inputs, prepared.layout, config)
        opcheck(token_loss_kernel_op, (logp, entropy, *rest))
