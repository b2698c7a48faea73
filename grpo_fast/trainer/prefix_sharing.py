"""Prompt sharing: each distinct prompt of a micro-batch goes through the backbone once, and its keys/values
serve every completion of its group.

The unshared forward (`policy.completion_hidden`) runs prompt + completion for each of the B rows, so a
prompt shared by the G completions of a group is computed G times. Here:

  1. the k distinct prompts [k, P] (left-padded, as in the batch) -> hidden [k, P, H] and a KV cache;
  2. the cache is gathered to the B rows (index on the batch dimension: autograd sums the G rows'
     gradients back into the one prompt computation, which is the gradient of the unshared forward);
  3. the completions [B, T - 1] run against that cache, position_ids continuing each prompt.

The hidden state predicting completion token 0 is the prompt's last position (step 1), token t > 0 is
predicted by completion position t - 1 (step 3); the completion's last token predicts nothing, so step 3
stops one position short of the unshared forward. Dropout, if any, is drawn once per prompt instead of
once per row: exactness is for dropout 0 (eval mode, or RL fine-tuning's usual dropout-free configs).

Cost model (`worth_sharing`): backbone tokens B * (P + T) unshared, k * P + B * (T - 1) shared, plus a
second pass through the layers and the gather of the prompt's keys/values to the B rows (and its
backward). Gradient checkpointing is incompatible: transformers' checkpointed decoder layers drop the
cache in training mode (`GradientCheckpointingLayer`), and the completions would not see their prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from grpo_fast.core.policy import SequenceBatch, backbone, build_sequence_batch, completion_hidden

# Share when the backbone tokens saved are at least this fraction of the unshared forward's tokens. Measured
# (benchmarks/results/prefix_sharing_cpu.json: Qwen2 4 layers, hidden 512, vocab 32k, G = 8, completions of
# 64 tokens, fp32, 1 CPU thread), forward+backward with grpo_loss, paired speedup unshared / shared: prompt
# 16 tokens (19% saved) 1.04x, 64 (45%) 1.36x, 256 (70%) 2.2x, 1024 (82%) 4.6x; peak extra memory 0.90x,
# 0.74x, 0.49x, 0.31x. Below ~20% the gain is within the noise while the fixed costs of sharing (a second
# pass through the layers, the key/value gather and its backward) weigh more on a GPU, where kernel launches
# are the cost of small passes.
MIN_SAVED_FRACTION = 0.2

# The probe: two groups of two completions, prompts of different lengths, completions of lengths 1..4.
PROBE_PROMPTS = (5, 3)
PROBE_COMPLETIONS = (4, 1, 3, 2)
PROBE_GRAD_ELEMENTS = 1 << 20


def shared_completion_hidden(model: nn.Module, batch: SequenceBatch) -> torch.Tensor:
    """[B, T, H] hidden states at the positions that predict completion_ids[:, t]: what
    `completion_hidden(model, batch)` returns (at every position, padding included), with each distinct
    prompt of the batch (its rows of input_ids / attention_mask [:, :P]) through the backbone once.

    Rows with the same prompt need not be adjacent; a group may be split across micro-batches (its prompt
    is then computed once per micro-batch). Every prompt must have at least one token."""
    decoder = backbone(model)
    p, t = batch.prompt_width, batch.completion_ids.shape[1]
    first, index = distinct_prompts(batch)
    prompt = decoder(
        input_ids=batch.input_ids[first, :p],
        attention_mask=batch.attention_mask[first, :p],
        position_ids=batch.position_ids[first, :p],
        use_cache=True,
    )
    last = _last_hidden(prompt)[index, p - 1 :]  # [B, 1, H]: predicts completion token 0
    if t == 1:
        return last
    cache = prompt.past_key_values
    cache.batch_select_indices(index)  # [k, ...] -> [B, ...] per layer, keeps the autograd graph
    completion = decoder(
        input_ids=batch.input_ids[:, p : p + t - 1],
        attention_mask=batch.attention_mask[:, : p + t - 1],
        position_ids=batch.position_ids[:, p : p + t - 1],
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([last, _last_hidden(completion)], dim=1)


def distinct_prompts(batch: SequenceBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(first [k], index [B]): the k distinct prompts of the batch, each as the lowest row that holds it,
    and for every row the number of its prompt in 0..k-1. Two rows share a prompt when their prompt
    columns agree on the attention mask and on the ids under it."""
    p = batch.prompt_width
    mask = batch.attention_mask[:, :p].bool()
    key = torch.where(mask, batch.input_ids[:, :p], -1)  # padding ids never decide
    _, index = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(key.shape[0], device=key.device)
    k = int(index.max()) + 1
    first = torch.full((k,), key.shape[0], device=key.device).scatter_reduce(0, index, rows, "amin")
    return first, index


def worth_sharing(prompt_lens: Sequence[int], completion_lens: Sequence[int], group_size: int) -> bool:
    """Whether the shared forward is expected to be faster than the unshared one.

    prompt_lens, completion_lens: one per completion row (B each), group-major; group_size: rows per
    forward that share one prompt (min(num_generations, micro_batch_size) when micro-batches hold whole
    groups). The saved backbone tokens, (group_size - 1) of every group_size prompt copies, over the
    unshared forward's tokens (real tokens, padding not counted) must reach MIN_SAVED_FRACTION = 0.2: on CPU
    sharing measured 1.04x at 19% saved, 1.36x at 45%, 4.6x at 82% (see MIN_SAVED_FRACTION)."""
    if len(prompt_lens) != len(completion_lens):
        raise ValueError("one prompt length per completion expected")
    total = sum(prompt_lens) + sum(completion_lens)
    if group_size < 2 or total == 0:
        return False
    saved = sum(prompt_lens) * (group_size - 1) / group_size
    return saved / total >= MIN_SAVED_FRACTION


def prefix_sharing_error(model: nn.Module) -> str | None:
    """None when `shared_completion_hidden` gives the unshared hidden states and the unshared gradients of the
    smallest trainable parameters (relative max difference within 1e-4 for fp32 weights, 2e-2 for half
    precision) on a small probe batch; else the reason. Runs in eval mode (no dropout; the mode is
    restored) and draws no random numbers."""
    if any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        return "gradient checkpointing is on: checkpointed decoder layers drop the KV cache in training mode"
    batch = _probe_batch(model)
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            shared = _hidden_and_grad(model, batch, shared_completion_hidden)
            unshared = _hidden_and_grad(model, batch, completion_hidden)
    except Exception as exc:  # noqa: BLE001 - any failure of the shared forward means: do not share
        return f"the shared-prompt forward fails ({type(exc).__name__}: {exc})"
    finally:
        model.train(was_training)
    tolerance = 1e-4 if next(model.parameters()).dtype == torch.float32 else 2e-2
    for what, a, b in zip(("hidden states", "gradient"), shared, unshared, strict=True):
        if b is None:
            continue
        diff = float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-12))
        if not diff <= tolerance:  # also catches NaN
            implementation = getattr(model.config, "_attn_implementation", None)
            return (
                f"the shared-prompt {what} differ from the unshared ones under attn_implementation="
                f"{implementation!r} (relative difference {diff:.2e} > {tolerance:.0e})"
            )
    return None


def _probe_batch(model: nn.Module) -> SequenceBatch:
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().weight.shape[0]
    group = len(PROBE_COMPLETIONS) // len(PROBE_PROMPTS)
    prompts = [[(3 + 7 * i + j) % vocab for j in range(n)] for i, n in enumerate(PROBE_PROMPTS)]
    completions = [[(5 + 11 * i + j) % vocab for j in range(n)] for i, n in enumerate(PROBE_COMPLETIONS)]
    rows = [prompts[i // group] for i in range(len(completions))]
    return build_sequence_batch(rows, completions, pad_id=0).to(device)


def _hidden_and_grad(model, batch, forward) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Completion hidden states on the mask [N, H], and the gradient of their sum, weighted by position, w.r.t.
    the smallest trainable parameters (flattened, zeros for unused ones; None when nothing is trainable)."""
    hidden = forward(model, batch)[batch.completion_mask]
    params = _probe_params(model)
    if not params:
        return hidden.detach(), None
    weights = torch.arange(1, hidden.numel() + 1, device=hidden.device).reshape(hidden.shape) % 7 - 3.0
    grads = torch.autograd.grad((hidden.float() * weights).sum(), params, allow_unused=True, materialize_grads=True)
    return hidden.detach(), torch.cat([g.flatten() for g in grads])


def _probe_params(model: nn.Module) -> list[nn.Parameter]:
    """The smallest trainable parameters (norm weights, biases, LoRA matrices, ... in every layer), at most
    PROBE_GRAD_ELEMENTS elements together (at least one parameter): their gradients cost the probe little."""
    chosen, total = [], 0
    for param in sorted((p for p in model.parameters() if p.requires_grad), key=lambda p: p.numel()):
        if chosen and total + param.numel() > PROBE_GRAD_ELEMENTS:
            break
        chosen.append(param)
        total += param.numel()
    return chosen


def _last_hidden(out) -> torch.Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
