"""Cold-start supervised fine-tuning on (prompt, completion) pairs — the R1 recipe's first stage, which
seeds the output format before RL. The loss is the mean negative logprob of the completion tokens from
`fused_logprobs` (no full logits)."""

from __future__ import annotations

import torch

from grpo_fast.trainer.policy import build_sequence_batch, completion_logprobs


def sft_train(
    model,
    tokenizer,
    pairs: list[tuple[str, str]],
    steps: int,
    batch_size: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
    add_eos: bool = True,
) -> list[float]:
    """Trains `model` in place for `steps` AdamW steps on random mini-batches of `pairs`; returns losses."""
    if steps <= 0 or not pairs:
        return []
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    enc_p = [tokenizer(p)["input_ids"] for p, _ in pairs]
    eos = [tokenizer.eos_token_id] if add_eos else []
    enc_c = [tokenizer(c, add_special_tokens=False)["input_ids"] + eos for _, c in pairs]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(pairs), (batch_size,), generator=g).tolist()
        batch = build_sequence_batch([enc_p[i] for i in idx], [enc_c[i] for i in idx], tokenizer.pad_token_id)
        batch = batch.to(device)
        lp = completion_logprobs(model, batch)
        mask = batch.completion_mask.float()
        loss = -(lp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    opt.zero_grad(set_to_none=True)
    return losses
