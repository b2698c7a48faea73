"""Cold-start supervised fine-tuning on (prompt, completion) pairs — the R1 recipe's first stage, which
seeds the output format before RL — in memory, for the demo and the preflight's SFT control. Each step runs
through grpo_fast.sft's trainer (the `grpo-fast sft` path): the loss is the mean negative logprob of the
completion tokens from `fused_logprobs` (no full logits)."""

from __future__ import annotations

import torch

from grpo_fast.core.optim import OptimConfig
from grpo_fast.sft.config import SFTConfig, SFTDataConfig, SFTRunConfig
from grpo_fast.sft.trainer import SFTTrainer


def sft_train(
    model,
    tokenizer,
    pairs: list[tuple],
    steps: int,
    batch_size: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
    add_eos: bool = True,
    tools: list[dict] | None = None,
    warmup_steps: int = 0,
    lr_scheduler: str = "constant",
) -> list[float]:
    """Trains `model` in place for `steps` AdamW steps, each on `batch_size` pairs drawn at random with
    replacement (a generator seeded with `seed`; one padded micro-batch, no truncation); returns the losses. A
    completion may be chat messages with tool calls and tool turns (the loss covers its assistant turns only);
    `tools`: the JSON schemas its prompt renders, or per pair as a third element (prompt, completion, tools).
    Unlike `grpo-fast sft`'s epochs, the draw keeps the noisy demo teacher's SFT loose enough that greedy
    decoding starts partly right (the demo and the health tests are calibrated on it). `warmup_steps` and
    `lr_scheduler`: the lr schedule (grpo_fast.core.optim.OptimConfig's), constant by default."""
    if steps <= 0 or not pairs:
        return []
    config = SFTConfig(
        data=SFTDataConfig(max_length=None, packing=False, add_eos=add_eos),
        optim=OptimConfig(lr=lr, warmup_steps=warmup_steps, lr_scheduler=lr_scheduler),
        run=SFTRunConfig(max_steps=steps, micro_batch_tokens=None, micro_batch_size=batch_size, seed=seed),
    )
    rows = [{"prompt": p[0], "completion": p[1], "tools": p[2] if len(p) > 2 else tools} for p in pairs]
    trainer = SFTTrainer(config, model, tokenizer, dataset=rows)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        draw = torch.randint(len(trainer.examples), (batch_size,), generator=g).tolist()
        losses.append(trainer.train_step([[[i] for i in draw]])["loss"])
    trainer.optimizer.zero_grad(set_to_none=True)
    return losses
