"""The loss step: from a `RolloutBatch` to `num_iterations` optimizer steps.

Old-policy logprobs (when needed), reference logprobs (beta > 0), truncated importance weights against
the engine's logprobs, then per iteration: micro-batches whose accumulated gradient equals the gradient of
`grpo_loss` on the whole batch (backbone forward -> completion hidden states -> fused loss), clipping,
optimizer and scheduler steps.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict

import numpy as np
import torch

from grpo_fast.loss import fused_logprobs, grpo_loss
from grpo_fast.trainer.advantages import group_advantages
from grpo_fast.trainer.config import TrainConfig
from grpo_fast.trainer.policy import (
    SequenceBatch,
    build_sequence_batch,
    completion_hidden,
    completion_logprobs,
    lm_head_params,
)
from grpo_fast.trainer.rollout_phase import RolloutBatch


def mismatch_metrics(trainer_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the trainer's [B, T] logprobs of the sampled tokens are from the engine's, over the mask."""
    n_tok = mask.sum().clamp(min=1)
    return {
        "mismatch/abs_logprob_diff_mean": float(((trainer_lp - rollout_lp) * mask).abs().sum() / n_tok),
        "mismatch/kl_rollout_trainer": float(((rollout_lp - trainer_lp) * mask).sum() / n_tok),
    }


class LossStep:
    """Owns the policy's update: the model, its optimizer and scheduler, and the frozen reference policy
    (a copy of the model when beta > 0, none for a PEFT model, whose reference is the model without its
    adapters)."""

    def __init__(self, config: TrainConfig, model, optimizer, scheduler, pad_token_id: int) -> None:
        self.config, self.model, self.optimizer, self.scheduler = config, model, optimizer, scheduler
        self.loss_config = config.loss_config()
        self.pad_token_id = pad_token_id
        self.device = next(model.parameters()).device
        self.autocast = self.device.type == "cuda" and config.run.bf16 in ("auto", "true")
        self.ref_model = None
        if config.loss.beta > 0 and not hasattr(model, "disable_adapter"):
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)

    # -- forward passes ---------------------------------------------------------------------------------

    def forward_hidden(self, model, batch: SequenceBatch) -> torch.Tensor:
        """[B, T, H] completion hidden states (bf16 under autocast)."""
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast):
            hidden = completion_hidden(model, batch)
        # With fp32 master weights the backbone's final norm returns fp32 even under autocast, and autocast
        # does not reach the fused loss: cast here so the vocab-sized GEMMs run in bf16 like an autocast
        # lm_head would (the loss casts the lm_head weight to hidden's dtype; it accumulates in fp32).
        return hidden.to(torch.bfloat16) if self.autocast else hidden

    @torch.no_grad()
    def logprobs(self, model, batch: SequenceBatch) -> torch.Tensor:
        """[B, T] completion logprobs in eval mode (no dropout; the model's mode is restored), on the CPU."""
        was_training = model.training
        model.eval()
        try:
            out = []
            mb = self.config.run.micro_batch_size
            for start in range(0, batch.input_ids.shape[0], mb):
                part = batch.rows(slice(start, start + mb)).to(self.device)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast):
                    lp = completion_logprobs(
                        model,
                        part,
                        self.loss_config.temperature,
                        self.loss_config.backend,
                        dtype=torch.bfloat16 if self.autocast else None,  # same precision as the training loss
                    )
                out.append(lp.float().cpu())
            return torch.cat(out)
        finally:
            model.train(was_training)

    def reference_logprobs(self, batch: SequenceBatch) -> torch.Tensor:
        """[B, T] logprobs of the reference policy."""
        if self.ref_model is not None:
            return self.logprobs(self.ref_model, batch)
        with self.model.disable_adapter():
            return self.logprobs(self.model, batch)

    # -- the step ---------------------------------------------------------------------------------------

    def train_on_batch(self, rollout: RolloutBatch) -> dict[str, float]:
        """num_iterations optimizer steps on the batch; returns the loss metrics (TRL's names), grad norm,
        lr, trained tokens and the rollout/trainer logprob mismatch."""
        cfg = self.config
        comps = rollout.completions
        batch = build_sequence_batch(rollout.prompt_ids, [c.token_ids for c in comps], self.pad_token_id)
        if cfg.grpo.mask_truncated_completions:
            batch.completion_mask[torch.tensor([c.truncated for c in comps])] = False
        advantages, _ = group_advantages(rollout.rewards, cfg.rollout.num_generations, cfg.grpo.scale_rewards)
        rollout_lp = torch.zeros(batch.completion_ids.shape)
        for i, c in enumerate(comps):
            if c.logprobs:
                rollout_lp[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
        has_rollout_lp = all(len(c.logprobs) == len(c.token_ids) for c in comps) and cfg.rollout.temperature > 0
        mask = batch.completion_mask
        stats: dict[str, float] = {}

        from_rollout = cfg.grpo.old_logprobs == "rollout"
        if from_rollout and not has_rollout_lp:
            raise ValueError("grpo.old_logprobs: 'rollout' needs the engine's sampling logprobs (temperature > 0)")
        recompute = not from_rollout and (cfg.grpo.num_iterations > 1 or cfg.grpo.is_correction != "none")
        old_lp = rollout_lp if from_rollout else self.logprobs(self.model, batch) if recompute else None
        ref_lp = self.reference_logprobs(batch) if cfg.loss.beta > 0 else None
        self.model.train()
        is_weights = None
        if recompute and has_rollout_lp:
            stats.update(mismatch_metrics(old_lp, rollout_lp, mask))
            diff = (old_lp - rollout_lp) * mask
            if cfg.grpo.is_correction == "token":
                is_weights = torch.exp(diff).clamp(max=cfg.grpo.is_cap) * mask
            elif cfg.grpo.is_correction == "sequence":
                is_weights = torch.exp(diff.sum(1)).clamp(max=cfg.grpo.is_cap)
        # Otherwise the first update's forward runs the policy the engine sampled from: measure there.
        measure_from = rollout_lp if has_rollout_lp and not recompute else None

        agg: dict[str, list[float]] = defaultdict(list)
        grad_norms = []
        for iteration in range(cfg.grpo.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            old = old_lp if cfg.grpo.num_iterations > 1 or from_rollout else None
            current = [] if iteration == 0 and measure_from is not None else None
            self.accumulate_gradients(batch, advantages, old, ref_lp, is_weights, agg, current)
            if current:
                stats.update(mismatch_metrics(torch.cat(current), measure_from, mask))
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.max_grad_norm)))
            self.optimizer.step()
            self.scheduler.step()
        stats["loss"] = float(np.sum(agg.pop("loss"))) / cfg.grpo.num_iterations
        for k, v in agg.items():
            stats[k] = float(np.mean(v))
        stats["grad_norm"] = float(np.mean(grad_norms))
        stats["lr"] = self.scheduler.get_last_lr()[0]
        stats["train_tokens"] = float(batch.attention_mask.sum()) * cfg.grpo.num_iterations
        stats["completion/padded_width"] = float(batch.completion_ids.shape[1])
        return stats

    def accumulate_gradients(
        self, batch, advantages, old_lp, ref_lp, is_weights, agg=None, current_logprobs: list | None = None
    ) -> None:
        """Backward of the loss of the whole `batch` as micro-batches of `run.micro_batch_size` rows, so that the
        accumulated gradient equals the gradient of `grpo_loss` on the whole batch at once. With
        `current_logprobs` (a list), each micro-batch's [rows, T] logprobs under the current policy are
        appended to it, on the CPU, from the same forward (an extra lm_head pass without gradient, no
        backbone pass).

        Each micro-batch's loss is scaled by its share of the batch's normaliser, which the loss type's
        reduction gives (`Reduction.micro_batch_share`; global reductions get the batch's token count as
        num_items_in_batch). The entropy bonus is a token mean over each call's own tokens: its coefficient
        becomes coef * tokens / (N * share) so that the bonus, too, is the batch's token mean."""
        mb = self.config.run.micro_batch_size
        mask = batch.completion_mask
        n_rows = batch.input_ids.shape[0]
        num_items = int(mask.sum())
        reduction = self.loss_config.loss_spec.reduction
        coef = self.loss_config.entropy_coef
        for start in range(0, n_rows, mb):
            sl = slice(start, start + mb)
            part = batch.rows(sl).to(self.device)
            rows, tokens = part.input_ids.shape[0], int(mask[sl].sum())
            share = reduction.micro_batch_share(rows, n_rows, tokens, num_items)
            config = self.loss_config
            if coef != 0.0:
                mb_coef = coef * tokens / (num_items * share) if tokens and share else 0.0
                config = dataclasses.replace(config, entropy_coef=mb_coef)
            hidden = self.forward_hidden(self.model, part)
            weight, bias = lm_head_params(self.model)
            if weight.dtype != hidden.dtype:
                weight = weight.to(hidden.dtype)
                bias = None if bias is None else bias.to(hidden.dtype)
            loss, metrics = grpo_loss(
                hidden,
                weight,
                part.completion_ids,
                part.completion_mask,
                advantages[sl].to(self.device),
                old_logprobs=None if old_lp is None else old_lp[sl].to(self.device),
                ref_logprobs=None if ref_lp is None else ref_lp[sl].to(self.device),
                is_weights=None if is_weights is None else is_weights[sl].to(self.device),
                num_items_in_batch=max(num_items, 1),  # every completion masked (all truncated): loss 0
                config=config,
                bias=bias,
            )
            if share != 1.0:
                loss = loss * share
            if current_logprobs is not None:
                with torch.no_grad():
                    lp = fused_logprobs(
                        hidden.detach(),
                        weight.detach(),
                        part.completion_ids,
                        temperature=config.temperature,
                        backend=config.backend,
                        bias=None if bias is None else bias.detach(),
                    )
                current_logprobs.append(lp.float().cpu())
            loss.backward()
            if agg is not None:
                agg["loss"].append(float(loss.detach()))
                for k, v in metrics.items():
                    agg[k].append(float(v))
