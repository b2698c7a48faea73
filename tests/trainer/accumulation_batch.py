"""The setup of the gradient-accumulation tests (tests/trainer/test_loss_accumulation.py and
test_trl_accumulation.py): a GRPOTrainer on the tiny policy (micro-batches of 2 rows) and one random batch of
sequences of different lengths with a masked (truncated) completion, plus the loss's per-token arguments; and the
reference they compare with, one `grpo_loss` on a whole batch and its gradients (`loss_gradients`)."""

from __future__ import annotations

import torch

from grpo_fast import grpo_loss
from grpo_fast.core.policy import build_sequence_batch, completion_logprobs
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.trainer import GRPOTrainer, load_config


def accumulation_setup(output_dir, seed: int, prompt_lens, completion_lens, masked_row: int):
    """(trainer, batch, inputs). inputs: advantages [B], old_lp / ref_lp [B, T] (the policy's logprobs plus
    noise), is_weights [B, T] (0 on padding), seq_is_weights [B]; drawn from `seed` in that order."""
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=0).eval()
    cfg = load_config(
        None,
        [
            "rollout.engine=hf",
            "rollout.num_generations=2",
            "run.micro_batch_size=2",
            "run.tensorboard=false",
            "run.progress=false",
            f"run.output_dir={output_dir}",
        ],
    )
    trainer = GRPOTrainer(
        model, [lambda prompts, completions, **kw: [0.0] * len(prompts)], [{"prompt": "1"}], cfg, tokenizer=tok
    )
    g = torch.Generator().manual_seed(seed)
    vocab, rows = len(tok), len(prompt_lens)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in prompt_lens]
    completions = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in completion_lens]
    batch = build_sequence_batch(prompts, completions, tok.pad_token_id)
    batch.completion_mask[masked_row] = False  # a masked truncated completion
    with torch.no_grad():
        lp = completion_logprobs(model, batch, backend="torch")
    shape = batch.completion_ids.shape
    inputs = dict(
        advantages=torch.randn(rows, generator=g),
        old_lp=lp + 0.3 * torch.randn(shape, generator=g),
        ref_lp=lp + 0.2 * torch.randn(shape, generator=g),
        is_weights=(0.5 + torch.rand(shape, generator=g)) * batch.completion_mask,
        seq_is_weights=0.5 + torch.rand(rows, generator=g),
    )
    return trainer, batch, inputs


def gradients_by_name(model) -> dict[str, torch.Tensor]:
    """Copies of the parameters' gradients, by name (parameters without one left out)."""
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def loss_gradients(model, batch, hidden_of, advantages, **loss_kwargs) -> tuple[float, dict[str, torch.Tensor]]:
    """(loss, gradients by name) of one `grpo_loss` on `batch` (a SequenceBatch) over the hidden states
    `hidden_of(model, batch)` and `model.lm_head`; `loss_kwargs` go to grpo_loss. The model's gradients are cleared
    before and after."""
    model.zero_grad(set_to_none=True)
    loss, _ = grpo_loss(
        hidden_of(model, batch),
        model.lm_head.weight,
        batch.completion_ids,
        batch.completion_mask,
        advantages,
        **loss_kwargs,
    )
    loss.backward()
    grads = gradients_by_name(model)
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads
