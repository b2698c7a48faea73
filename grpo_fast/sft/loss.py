"""The SFT loss on the fused path: the backbone's hidden states at the positions that predict a loss token,
gathered into [N, H], then `fused_logprobs` against the lm_head weight. The [tokens x vocab] logits never
exist (transformers' `model(input_ids, labels=...)` materialises them for every token, loss or not)."""

from __future__ import annotations

from dataclasses import asdict

import torch

from grpo_fast.core.policy import backbone, lm_head_params
from grpo_fast.loss.head import logit_head
from grpo_fast.loss.logprobs import fused_logprobs
from grpo_fast.sft.batching import TokenBatch


def loss_token_logprobs(model: torch.nn.Module, batch: TokenBatch, autocast: bool = False) -> torch.Tensor:
    """[N] fp32 log p(token) of the batch's N loss tokens, row-major. autocast: bf16 on CUDA (the backbone
    under autocast, the hidden rows and lm_head weight in bf16; fused_logprobs accumulates in fp32)."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        out = backbone(model)(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]  # [B, W, H]
    predicts = batch.loss_mask[:, 1:]  # hidden[:, t] predicts token t + 1
    rows = hidden[:, :-1][predicts]  # [N, H]
    targets = batch.input_ids[:, 1:][predicts]  # [N]
    if autocast:
        rows = rows.to(torch.bfloat16)
    weight, bias = lm_head_params(model)
    if weight.dtype != rows.dtype:
        weight = weight.to(rows.dtype)
        bias = None if bias is None else bias.to(rows.dtype)
    return fused_logprobs(rows, weight, targets, bias=bias, **asdict(logit_head(model)))  # the model's scale / cap


def sft_loss(model: torch.nn.Module, batch: TokenBatch, num_loss_tokens: int, autocast: bool = False) -> torch.Tensor:
    """-sum(log p) over the batch's loss tokens / num_loss_tokens: the batch's share of the mean negative
    logprob over `num_loss_tokens` tokens (those of every micro-batch of an optimizer step)."""
    return -loss_token_logprobs(model, batch, autocast).sum() / num_loss_tokens
