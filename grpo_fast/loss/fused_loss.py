"""`grpo_loss` / `GRPOLoss`: the GRPO-family policy loss from last hidden states and the lm_head
weight, without materialising logits. Layer 1 (a backend of grpo_fast.backends) gives per-token
logprobs and entropies; layer 2 (grpo_fast.loss.token_math, or the backend's own kernel) gives the loss,
metrics and the per-token upstream gradients (gℓ, gH) that layer 1 turns into dh, dW, db.
"""

from __future__ import annotations

import torch
from torch import nn

from ..backends import LogprobStats, get_backend
from ..backends.chunked import accumulation_dtype
from .batch import PerTokenArguments, PreparedBatch, prepare_batch
from .head import LogitHead
from .logprobs import backend_name, check_linear_inputs, linear_logprobs_op
from .options import GRPOLossConfig
from .token_loss import KernelTokenLoss, select_token_loss
from .token_math import SUM_NAMES, finalize_metrics, token_terms


def _sequence_aligned_chunks(layout, rows_per_chunk: int) -> list[slice] | None:
    """Row chunks made of whole sequences, each at most rows_per_chunk rows; None if a sequence is longer."""
    starts = layout.seq_starts.tolist()
    chunks, begin = [], 0
    for start, stop in zip(starts[:-1], starts[1:], strict=True):
        if stop - start > rows_per_chunk:
            return None
        if stop - begin > rows_per_chunk:
            chunks.append(slice(begin, start))
            begin = start
    if starts[-1] > begin:
        chunks.append(slice(begin, starts[-1]))
    return chunks


class _GRPOLossFunction(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], bias [V] | None) -> (loss [], metric sums [K]).

    Chunked backends form the gradient during the forward pass when each chunk's (gℓ, gH) depend on
    its own rows only (token-level terms, or whole sequences per chunk: GSPO's ratio, vespo's weight):
    backward then only scales.
    Otherwise forward keeps O(N) state and backward recomputes the logits tiles.
    `logprobs_out` ([N] or None) receives each active row's logprob from the same forward (0 elsewhere).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, batch: PreparedBatch, config, backend, logprobs_out):
        needs_grad = any(ctx.needs_input_grad[:3])
        token_loss = select_token_loss(backend, config)
        head = LogitHead(config.logit_scale, config.final_logit_softcapping)
        inv_temperature, softcap = head.tile(config.temperature)
        ctx.inv_temperature, ctx.softcap, ctx.backend, ctx.workspace_bytes = (
            inv_temperature,
            softcap,
            backend,
            config.workspace_bytes,
        )
        ctx.weight_dtype = weight.dtype

        chunks = None
        if backend.capabilities.fused_gradients and not config.needs_all_rows:  # entropy quantile: recompute
            rows = backend.rows_per_chunk(weight.shape[0], hidden.device, config.workspace_bytes)
            if not config.needs_whole_sequences:
                chunks = backend.row_chunks(hidden.shape[0], weight.shape[0], hidden.device, config.workspace_bytes)
            else:
                chunks = _sequence_aligned_chunks(batch.layout, rows)

        if chunks is not None:
            partial_sums = []

            def token_grads(rows, logp, entropy):
                if logprobs_out is not None:
                    logprobs_out[rows] = torch.where(batch.layout.mask[rows] > 0, logp.detach(), 0.0)
                out = token_loss(logp, entropy, batch.inputs, batch.layout, config, rows)
                partial_sums.append(out.sums)
                return out.grad_logprobs, out.grad_entropy

            _, grads = backend.forward_backward(
                hidden,
                weight,
                bias,
                batch.targets,
                inv_temperature,
                token_grads,
                chunks,
                need_grads=needs_grad,
                softcap=softcap,
            )
            if partial_sums:
                sums = torch.stack(partial_sums).sum(0)
            else:  # no rows at all
                sums = torch.zeros(len(SUM_NAMES), dtype=accumulation_dtype(hidden.dtype), device=hidden.device)
            ctx.mode = "precomputed"
            ctx.save_for_backward(*(grads if grads is not None else ()))
        else:
            stats = backend.forward(
                hidden, weight, bias, batch.targets, inv_temperature, config.workspace_bytes, softcap=softcap
            )
            if logprobs_out is not None:
                logprobs_out.copy_(torch.where(batch.layout.mask > 0, stats.logprobs, 0.0))
            out = token_loss(stats.logprobs, stats.entropy, batch.inputs, batch.layout, config)
            sums = out.sums
            ctx.mode = "recompute"
            grad_entropy = out.grad_entropy
            extra = (grad_entropy,) if grad_entropy is not None else ()
            ctx.save_for_backward(
                hidden, weight, bias, batch.targets, stats.lse, stats.entropy, out.grad_logprobs, *extra
            )
        ctx.mark_non_differentiable(sums)
        return sums[0].clone(), sums

    @staticmethod
    def backward(ctx, grad_loss, _grad_sums):
        if ctx.mode == "precomputed":
            if not ctx.saved_tensors:
                return None, None, None, None, None, None, None
            grad_h, grad_w, grad_b = ctx.saved_tensors
            # loss.backward() passes 1: hand the buffers over as they are, so autograd can adopt them as
            # .grad without a copy (the saved references are released before the gradient is accumulated).
            # Asking whether grad_loss is 1 reads it: free on the host, a synchronisation on an accelerator,
            # where scaling in place is cheaper (a second backward through this graph then fails autograd's
            # saved-tensor version check instead of scaling twice).
            if grad_loss.device.type != "cpu":
                grad_h.mul_(grad_loss.to(grad_h.dtype))
                grad_w.mul_(grad_loss)
                if grad_b is not None:
                    grad_b.mul_(grad_loss)
            elif not bool(grad_loss == 1):
                grad_h, grad_w = grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss
                grad_b = None if grad_b is None else grad_b * grad_loss
        else:
            hidden, weight, bias, targets, lse, entropy, grad_logp, *rest = ctx.saved_tensors
            grad_entropy = rest[0] * grad_loss if rest else None
            grad_h, grad_w, grad_b = ctx.backend.backward(
                hidden,
                weight,
                bias,
                targets,
                ctx.inv_temperature,
                LogprobStats(None, entropy, lse),
                grad_logp * grad_loss,
                grad_entropy,
                ctx.workspace_bytes,
                softcap=ctx.softcap,
            )
        dtype = ctx.weight_dtype
        return grad_h, grad_w.to(dtype), None if grad_b is None else grad_b.to(dtype), None, None, None, None


def grpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    config: GRPOLossConfig = GRPOLossConfig(),
    *,
    bias: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    validate: bool = True,
    logprobs_out: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO-family policy loss (TRL semantics, see GRPOLossConfig) and its metrics.

    Padded layout: hidden [B, T, H] (position t predicts completion_ids[:, t]), completion_ids,
    completion_mask [B, T]; advantages [B] or [B, T]; old_logprobs, ref_logprobs [B, T];
    is_weights [B] or [B, T]; rollout_logprobs [B, T], the inference engine's logprobs of the sampled tokens, read
    by the objectives that declare `needs_rollout_logprobs` (icepop, kpop, ipo; an error naming it when such an
    objective runs without them). Packed layout (cu_seqlens [B+1] given): hidden [N, H] and the
    per-token arguments [N]. weight [V, H] and bias [V] share hidden's dtype and device.

    old_logprobs=None is on-policy (ratio 1, gradient of the ratio kept). num_items_in_batch is the
    dapo/cispo normaliser (active tokens of the whole accumulated batch; divide by the data-parallel
    world size if your optimizer averages gradients across ranks, as TRL does).

    Returns (loss [] fp32, metrics: dict of detached 0-dim fp32 tensors — kl (beta > 0),
    clip_ratio/low_mean, clip_ratio/high_mean, clip_ratio/region_mean, entropy, logprob_mean,
    is_weight_mean (is_weights given), trust_region/masked_mean (an objective that drops tokens)).

    validate=False skips the checks of values (token ids in range, finite per-token inputs, mask values),
    each a device-to-host synchronisation on a GPU, for callers that checked them already (the trainer
    checks each step's batch once on the host); shapes, dtypes and devices are always checked.

    logprobs_out: a floating tensor of hidden's leading shape ([B, T], or [N] packed) on its device that
    receives each completion token's logprob under the current weights, detached, from the loss's own forward
    (what `fused_logprobs` gives, without a second lm_head pass; 0 outside completion_mask).

    Under torch.compile(fullgraph=True) the loss traces without a graph break (see `_traced_grpo_loss`).
    """
    per_token = (completion_ids, completion_mask, advantages, old_logprobs, ref_logprobs, is_weights, rollout_logprobs)
    out = _flat_logprobs_out(logprobs_out, hidden)
    if torch.compiler.is_compiling():
        return _traced_grpo_loss(hidden, weight, bias, per_token, num_items_in_batch, cu_seqlens, config, validate, out)
    inputs, batch, backend = _prepare(hidden, weight, bias, per_token, num_items_in_batch, cu_seqlens, config, validate)
    loss, sums = _GRPOLossFunction.apply(*inputs, batch, config, backend, out)
    return loss, finalize_metrics(sums.detach(), batch.layout, config, is_weights is not None)


def _flat_logprobs_out(out: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor | None:
    """`logprobs_out` checked against hidden [..., H] and viewed as [N] (writes reach the caller's tensor)."""
    if out is None:
        return None
    if out.shape != hidden.shape[:-1] or not out.is_floating_point() or out.device != hidden.device:
        raise ValueError(
            f"logprobs_out: expected a floating tensor of shape {tuple(hidden.shape[:-1])} on {hidden.device} "
            f"(hidden's leading dims), got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    if not out.is_contiguous():
        raise ValueError("logprobs_out: expected a contiguous tensor (it is written through a flat view)")
    return out.view(-1)


def _checked_batch(hidden, weight, bias, per_token, num_items_in_batch, cu_seqlens, config, validate):
    """(hidden flattened to [N, H], the PreparedBatch of the per-token arguments), every input checked."""
    flat_hidden, _ = check_linear_inputs(hidden, weight, bias)
    batch = prepare_batch(
        PerTokenArguments(*per_token),
        num_items_in_batch=num_items_in_batch,
        cu_seqlens=cu_seqlens,
        config=config,
        vocab=weight.shape[0],
        source_name="hidden",
        source=hidden,
        dtype=accumulation_dtype(flat_hidden.dtype),
        validate=validate,
    )
    return flat_hidden, batch


def _prepare(hidden, weight, bias, per_token, num_items_in_batch, cu_seqlens, config, validate):
    """Checked inputs of _GRPOLossFunction: ((hidden [N, H], weight, bias), PreparedBatch, backend)."""
    flat_hidden, batch = _checked_batch(
        hidden, weight, bias, per_token, num_items_in_batch, cu_seqlens, config, validate
    )
    backend = get_backend(config.backend, flat_hidden.device)
    if config.deterministic:
        backend = backend.deterministic_variant()
    inputs = (flat_hidden, weight.contiguous(), None if bias is None else bias.contiguous())
    return inputs, batch, backend


# -- torch.compile ---------------------------------------------------------------------------------------
# Under dynamo the loss is built the way flash-attention and quack build theirs: each kernel is a torch.library
# custom op with a fake implementation (layer 1: grpo_fast::linear_logprobs and its backward; a backend's layer-2
# kernel: grpo_fast::token_loss_kernel; the value checks: grpo_fast::checked_targets), autograd is registered on
# top of them, and the O(N) token math between them is traced PyTorch, the objective's definition itself. Layer 1
# recomputes the logits tiles in its backward (4 GEMMs, where the eager chunked path forms dz in its forward).


def _traced_grpo_loss(hidden, weight, bias, per_token, num_items_in_batch, cu_seqlens, config, validate, out):
    flat_hidden, batch = _checked_batch(
        hidden, weight, bias, per_token, num_items_in_batch, cu_seqlens, config, validate
    )
    inv_temperature, softcap = LogitHead(config.logit_scale, config.final_logit_softcapping).tile(config.temperature)
    backend = backend_name(config.backend, flat_hidden.device.type)
    logp, entropy, _ = linear_logprobs_op(
        flat_hidden,
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        batch.targets,
        inv_temperature,
        softcap,
        backend,
        config.deterministic,
        config.workspace_bytes or 0,
    )
    if out is not None:
        out.copy_(torch.where(batch.layout.mask > 0, logp.detach(), 0.0))
    kernel = select_token_loss(get_backend(backend, flat_hidden.device), config)
    if isinstance(kernel, KernelTokenLoss) and kernel.applies(logp, batch.layout):
        loss, sums = kernel.differentiable(logp, entropy, batch.inputs, batch.layout, config)
    else:
        loss, sums = token_terms(logp, entropy, batch.inputs, batch.layout, config)
    return loss, finalize_metrics(sums, batch.layout, config, per_token[5] is not None)


class GRPOLoss(nn.Module):
    """`grpo_loss` with its config fixed at construction; metrics as a dict keyed by TRL's names.
    Liger-Kernel's `LigerFusedLinearGRPOLoss` interface (arguments, defaults, metrics tuple) is
    grpo_fast.integrations.liger."""

    def __init__(self, config: GRPOLossConfig | None = None, **options):
        super().__init__()
        if config is not None and options:
            raise ValueError("GRPOLoss: give either config or keyword options, not both")
        self.config = config if config is not None else GRPOLossConfig(**options)

    def forward(
        self,
        hidden,
        weight,
        completion_ids,
        completion_mask,
        advantages,
        bias=None,
        ref_logprobs=None,
        old_logprobs=None,
        is_weights=None,
        num_items_in_batch=None,
        cu_seqlens=None,
        rollout_logprobs=None,
    ):
        return grpo_loss(
            hidden,
            weight,
            completion_ids,
            completion_mask,
            advantages,
            old_logprobs=old_logprobs,
            ref_logprobs=ref_logprobs,
            is_weights=is_weights,
            num_items_in_batch=num_items_in_batch,
            config=self.config,
            bias=bias,
            cu_seqlens=cu_seqlens,
            rollout_logprobs=rollout_logprobs,
        )

    def extra_repr(self) -> str:
        return repr(self.config)
