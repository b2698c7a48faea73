"""The loss step: from a `RolloutBatch` to `num_iterations` optimizer steps.

Old-policy logprobs (when needed), reference logprobs (beta > 0), importance weights against the engine's
logprobs (TRL's rollout-correction modes, grpo_fast.trainer.importance), then per iteration: micro-batches
whose accumulated gradient is TRL's (`_compute_loss` per micro-batch, summed; for the whole-batch reductions
the gradient of `grpo_loss` on the whole batch) (backbone forward -> completion hidden states -> fused
loss), clipping, optimizer and scheduler steps, and the adaptive entropy controller's update.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections import defaultdict
from dataclasses import dataclass

import torch

from grpo_fast.backends import get_backend
from grpo_fast.core.packed_attention import attention_path, implementation
from grpo_fast.core.packing import ModelFlops, packing_error
from grpo_fast.core.policy import SequenceBatch, build_sequence_batch, lm_head_params, padded_rows
from grpo_fast.distributed.context import Distributed
from grpo_fast.distributed.fsdp import full_tensor, is_sharded
from grpo_fast.loss import grpo_loss
from grpo_fast.loss.head import with_model_head
from grpo_fast.loss.logprobs import logprobs_with_config
from grpo_fast.trainer.advantages import group_advantages
from grpo_fast.trainer.config import TrainConfig
from grpo_fast.trainer.entropy_control import AdaptiveEntropy
from grpo_fast.trainer.importance import rollout_importance_weights, step_correction
from grpo_fast.trainer.micro_batches import (
    Packing,
    idle_copy,
    packed_micro_batches,
    padded_micro_batches,
    padded_work,
    sequence_lengths,
)
from grpo_fast.trainer.prefix_sharing import prefix_sharing_error, shared_completion_hidden, worth_sharing
from grpo_fast.trainer.rollout_phase import RolloutBatch
from grpo_fast.trainer.staleness import token_staleness

logger = logging.getLogger(__name__)


def mismatch_metrics(
    trainer_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor, staleness: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """How far the trainer's [B, T] logprobs of the sampled tokens are from the engine's, over the mask
    (0-dim tensors on the logprobs' device); with the tokens' staleness [B, T] (host), also
    mismatch/abs_logprob_diff_staleness_<k> over the tokens k versions old, for each k present."""
    n_tok = mask.sum().clamp(min=1)
    diff = (trainer_lp - rollout_lp) * mask
    out = {
        "mismatch/abs_logprob_diff_mean": diff.abs().sum() / n_tok,
        "mismatch/kl_rollout_trainer": -diff.sum() / n_tok,
    }
    if staleness is not None:
        present = staleness[mask.cpu().bool()].unique().tolist()
        if len(present) > 1 or present != [0]:
            on_device = staleness.to(mask.device)
            for k in present:
                bucket = mask & (on_device == k)
                out[f"mismatch/abs_logprob_diff_staleness_{k}"] = (diff * bucket).abs().sum() / bucket.sum().clamp(
                    min=1
                )
    return out


def read_metrics(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """0-dim device tensors -> floats, in one device-to-host copy."""
    values = torch.stack([v.detach().float().reshape(()) for v in metrics.values()]).tolist() if metrics else []
    return dict(zip(metrics, values, strict=True))


def check_step_inputs(batch: SequenceBatch, advantages: torch.Tensor, vocab: int) -> None:
    """The value checks `grpo_loss` would make per micro-batch, once per step on the host tensors."""
    ids = batch.input_ids[batch.attention_mask.bool()]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"completion token ids must lie in [0, {vocab}) (the policy's vocabulary size)")
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError("advantages: NaN or inf (a reward function returned a non-finite reward?)")


@dataclass
class _StepInputs:
    """What every update of one step reads: the batch [B, P+T] and its micro-batch plan, advantages [B], the
    completion mask [B, T], the old-policy, reference and engine logprobs [B, T] (None where unused), importance
    weights ([B, T] or [B], or None) or what each micro-batch computes them from (`weights_from`: the engine's
    logprobs [B, T] and the correction's (mode, clip_min, clip_max)), the engine's logprobs [B, T] for an objective
    that reads them (None otherwise), each token's staleness [B, T] (host), and the step's device metrics so far."""

    batch: SequenceBatch
    plan: list
    advantages: torch.Tensor
    mask: torch.Tensor
    old_lp: torch.Tensor | None
    ref_lp: torch.Tensor | None
    is_weights: torch.Tensor | None
    weights_from: tuple[torch.Tensor, tuple] | None
    rollout_lp: torch.Tensor | None
    measure_from: torch.Tensor | None
    staleness: torch.Tensor
    stats: dict[str, torch.Tensor]
    real_micro_batches: int


def drops_out(model: torch.nn.Module) -> bool:
    """Whether the model's training forward differs from its eval forward: a dropout module with p > 0, or an
    attention dropout in its config."""
    if getattr(getattr(model, "config", None), "attention_dropout", 0.0):
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


class LossStep:
    """Owns the policy's update: the model, its optimizer and scheduler, and the frozen reference policy
    (a copy of the model when beta > 0, none for a PEFT model, whose reference is the model without its
    adapters).

    Host synchronisation: a step's micro-batches are planned and moved to the device before the first
    forward; the micro-batch loop reads nothing back, and the metrics stay on the device until one read at
    the end of the step."""

    def __init__(
        self,
        config: TrainConfig,
        model,
        optimizer,
        scheduler,
        pad_token_id: int,
        dist: Distributed | None = None,
        ref_model=None,
    ) -> None:
        self.config, self.model, self.optimizer, self.scheduler = config, model, optimizer, scheduler
        self.dist = dist or Distributed()
        self.sharded = is_sharded(model)
        self.loss_config = with_model_head(config.loss_config(), model)  # the model's logit scale / soft cap
        self.pad_token_id = pad_token_id
        self.device = next(model.parameters()).device
        try:  # a backend that cannot run here fails before the run starts, not at its first step
            get_backend(self.loss_config.backend, self.device)
        except ValueError as exc:
            raise ValueError(f"loss.{exc}") from None
        self.autocast = self.device.type == "cuda" and config.run.bf16 in ("auto", True)
        self.head_dtype = torch.bfloat16 if self.autocast else None
        self.ref_model = ref_model
        if ref_model is None and config.loss.beta > 0 and not hasattr(model, "disable_adapter"):
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self._packing_probed = False
        self._packed_attention: str | None = None  # the packed rows' attention path; None: packing off
        self._flops: ModelFlops | None = None
        self._packing_pays: bool | None = None  # run.packing auto's last choice, logged when it changes
        self.layout = "padded"  # the last batch's micro-batch layout: padded, packed (<path>) or shared_prompt
        self._sharing_error: str | None = None
        self._sharing_probed = False
        g = config.grpo
        self.entropy_control = (
            AdaptiveEntropy(
                config.loss.entropy_coef, g.entropy_target, g.entropy_coef_delta, g.entropy_coef_min, g.entropy_coef_max
            )
            if g.use_adaptive_entropy
            else None
        )

    # -- micro-batches ----------------------------------------------------------------------------------

    @property
    def packed_attention(self) -> str | None:
        """The attention path of packed micro-batches (grpo_fast.core.packed_attention; run.packed_attention), or
        None when packing is off: run.packing false, or the packing probe (run once) finds that the model does
        not keep packed sequences apart on that path."""
        mode = self.config.run.packing
        if mode is False:
            return None
        if not self._packing_probed:
            path = attention_path(self.model, self.config.run.packed_attention)
            error = packing_error(self.model, path)
            if mode is True and error:
                raise ValueError(f"run.packing: true, but {error}; set run.packing: auto or false")
            if error:
                logger.warning("packing off, micro-batches padded: %s", error)
            self._packed_attention, self._packing_probed = (None if error else path), True
        return self._packed_attention

    def packing_for(self, batch: SequenceBatch) -> Packing | None:
        """How the batch's sequences are packed, or None to pad them: with run.packing true, or "auto" where the
        packed rows' attention is variable-length, always (when the probe passes); with "auto" otherwise, when
        the packed layout's work (`ModelFlops`: backbone tokens, attention scores, lm_head rows) is below the
        padded layout's for this batch. The choice is logged when it changes, with both costs."""
        path = self.packed_attention
        if path is None:
            return None
        run = self.config.run
        packing = Packing.of(batch, run.micro_batch_tokens or run.micro_batch_size * batch.input_ids.shape[1])
        if run.packing is True or path == "varlen":
            return packing
        if self._flops is None:
            self._flops = ModelFlops.of(self.model)
        packed, padded = packing.work(path).cost(self._flops), padded_work(batch).cost(self._flops)
        if (packed < padded) != self._packing_pays:
            self._packing_pays = packed < padded
            logger.info(
                "run.packing auto: %s micro-batches (attn_implementation=%r, packed rows' attention %s): %.3g GFLOP "
                "packed against %.3g padded",
                "packed" if packed < padded else "padded",
                implementation(self.model),
                path,
                packed / 1e9,
                padded / 1e9,
            )
        return packing if packed < padded else None

    def shares_prompts(self, batch: SequenceBatch) -> bool:
        """Whether this batch's micro-batches run each group's prompt once (run.share_prompt; "auto": when
        the prompt-sharing probe passes, asked once, and `worth_sharing` expects a saving for the batch)."""
        mode = self.config.run.share_prompt
        if mode is False or self.sharded:  # two backbone passes per micro-batch: not through FSDP's root
            return False
        if not self._sharing_probed:
            self._sharing_error, self._sharing_probed = prefix_sharing_error(self.model), True
            if mode is True and self._sharing_error:
                raise ValueError(f"run.share_prompt: true, but {self._sharing_error}; set it to auto or false")
            if self._sharing_error:
                logger.warning("prompts not shared: %s", self._sharing_error)
        if self._sharing_error:
            return False
        prompt_lens, completion_lens = sequence_lengths(batch)
        return mode is True or worth_sharing(prompt_lens, completion_lens, self.group_rows()[1])

    def group_rows(self) -> tuple[int, int]:
        """(rows per shared-prompt micro-batch: whole groups, at least one; completions per prompt in one)."""
        g, mb = self.config.rollout.num_generations, self.config.run.micro_batch_size
        return (max(g, mb // g * g), g) if mb >= g else (mb, mb)

    def micro_batches(self, batch: SequenceBatch) -> list:
        """The batch's micro-batches on the device (see grpo_fast.trainer.micro_batches): whole groups
        sharing their prompt's forward when `shares_prompts`, else packed as `packing_for` says, else padded
        (`layout` names the choice); with several ranks, topped up with idle copies to the most any rank has."""
        if self.shares_prompts(batch):
            self.layout = "shared_prompt"
            plan = padded_micro_batches(batch, self.group_rows()[0], self.device, shared_completion_hidden)
        elif (packing := self.packing_for(batch)) is not None:
            self.layout = f"packed ({self.packed_attention})"
            plan = packed_micro_batches(batch, packing, self.device, self.packed_attention)
        else:
            self.layout = "padded"
            plan = padded_micro_batches(batch, self.config.run.micro_batch_size, self.device)
        if self.dist.enabled:
            most = max(self.dist.all_gather_ints(len(plan)))
            filler = plan[0] if plan else padded_micro_batches(batch, 1, self.device)[0]
            plan += [idle_copy(filler) for _ in range(most - len(plan))]
        return plan

    # -- forward passes ---------------------------------------------------------------------------------

    def forward_hidden(self, model, micro_batch) -> torch.Tensor:
        """Completion hidden states of a micro-batch ([b, T, H] padded, [N, H] packed; bf16 under autocast)."""
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast):
            hidden = micro_batch.hidden(model)
        # With fp32 master weights the backbone's final norm returns fp32 even under autocast, and autocast
        # does not reach the fused loss: cast here so the vocab-sized GEMMs run in bf16 like an autocast
        # lm_head would (the loss accumulates in fp32).
        return hidden if self.head_dtype is None else hidden.to(self.head_dtype)

    def head(self, model) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The lm_head weight and bias in the loss's compute dtype (bf16 under autocast: cast once per call)."""
        weight, bias = lm_head_params(model)
        if self.head_dtype is None or weight.dtype == self.head_dtype:
            return weight, bias
        return weight.to(self.head_dtype), None if bias is None else bias.to(self.head_dtype)

    @torch.no_grad()
    def logprobs(self, model, batch: SequenceBatch, plan: list | None = None) -> torch.Tensor:
        """[B, T] completion logprobs in eval mode (no dropout; the model's mode is restored), on the device,
        over the micro-batches `plan` (default `micro_batches(batch)`)."""
        was_training = model.training
        model.eval()
        try:
            weight = bias = None
            out = torch.zeros(batch.completion_ids.shape, device=self.device)
            for mb in self.micro_batches(batch) if plan is None else plan:
                hidden = self.forward_hidden(model, mb)
                if weight is None or self.sharded:  # a sharded root's head exists whole after its forward
                    weight, bias = self.head(model)
                if mb.idle:
                    continue
                lp = logprobs_with_config(hidden, weight, mb.completion_ids, self.loss_config, bias)
                mb.scatter(out, lp.float())
            return out
        finally:
            model.train(was_training)

    def reference_logprobs(self, batch: SequenceBatch, plan: list | None = None) -> torch.Tensor:
        """[B, T] logprobs of the reference policy, on the device."""
        if self.ref_model is not None:
            return self.logprobs(self.ref_model, batch, plan)
        with self.model.disable_adapter():
            return self.logprobs(self.model, batch, plan)

    # -- the step ---------------------------------------------------------------------------------------

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """[B] advantages of this rank's [B] rewards (whole groups). With several ranks they are computed on
        every rank's rewards (equal shares, in rank order), so "batch" scaling sees the whole batch."""
        everyone = self.dist.all_gather_equal(rewards)
        cfg = self.config
        advantages, _ = group_advantages(everyone, cfg.rollout.num_generations, cfg.grpo.scale_rewards)
        n = rewards.numel()
        return advantages[self.dist.rank * n : (self.dist.rank + 1) * n]

    def train_on_batch(self, rollout: RolloutBatch) -> dict[str, float]:
        """num_iterations optimizer steps on the batch; returns the loss metrics (TRL's names), grad norm,
        lr, trained tokens and the rollout/trainer logprob mismatch.

        An update whose loss or gradient norm is NaN/inf is skipped (no optimizer or scheduler step: the
        parameters, optimizer state and schedule stay bit-identical); `train/nonfinite` counts the skipped
        updates. The last update's check rides on the step's one read of the metrics; with num_iterations > 1
        each earlier update reads one flag."""
        cfg = self.config
        step = self._step_inputs(rollout)
        agg: dict[str, list[torch.Tensor]] = defaultdict(list)
        grad_norms: list[torch.Tensor] = []
        skipped = 0
        for iteration in range(cfg.grpo.num_iterations):
            finite = self._update(step, iteration, agg, grad_norms)
            if iteration < cfg.grpo.num_iterations - 1:  # an extra read only when num_iterations > 1
                ok = bool(finite)
            else:  # the last update's flag comes with the step's one read of the metrics
                out = self._read_step_metrics(step, agg, grad_norms, finite)
                ok = out.pop("_finite") == 1.0
            if ok:
                self.optimizer.step()
                self.scheduler.step()
            else:  # skipped: parameters, optimizer state and schedule stay exactly as they were
                self.optimizer.zero_grad(set_to_none=True)
                skipped += 1
        if skipped:
            logger.warning(
                "non-finite loss or gradient norm: skipped %d of %d optimizer step(s) of this batch",
                skipped,
                cfg.grpo.num_iterations,
            )
        out["train/nonfinite"] = float(skipped)
        out["lr"] = self.scheduler.get_last_lr()[0]
        if self.entropy_control is not None:
            out["entropy_coef"] = self.entropy_control.coef
        batch, plan = step.batch, step.plan
        out["train_tokens"] = float(batch.attention_mask.sum()) * cfg.grpo.num_iterations
        out["completion/padded_width"] = float(batch.completion_ids.shape[1])
        out["train/micro_batches"] = float(step.real_micro_batches)
        out["train/backbone_tokens"] = float(sum(mb.input_ids.numel() for mb in plan if not mb.idle))
        return out

    def _step_inputs(self, rollout: RolloutBatch) -> _StepInputs:
        """The batch, its micro-batch plan, advantages, and the old / reference / engine logprobs the updates use."""
        cfg, device = self.config, self.device
        comps = rollout.completions
        batch = build_sequence_batch(rollout.prompt_ids, [c.token_ids for c in comps], self.pad_token_id)
        if cfg.grpo.mask_truncated_completions:
            batch.completion_mask[torch.tensor([c.truncated for c in comps])] = False
        if any(c.sampled for c in comps):  # multi-turn: inserted tokens (tool results) stay out of the loss
            width = batch.completion_ids.shape[1]
            sampled = [c.sampled or [True] * len(c.token_ids) for c in comps]
            batch.completion_mask &= padded_rows(sampled, width, False, torch.bool)
        staleness = token_staleness(comps, rollout.version, batch.completion_ids.shape[1])
        fix = step_correction(cfg)
        if fix.mask_staleness is not None:
            batch.completion_mask &= staleness <= fix.mask_staleness
        advantages = self.advantages(rollout.rewards)
        check_step_inputs(batch, advantages, lm_head_params(self.model)[0].shape[0])
        rollout_lp = padded_rows([c.logprobs for c in comps], batch.completion_ids.shape[1], 0.0, torch.float32)
        has_rollout_lp = all(len(c.logprobs) == len(c.token_ids) for c in comps) and cfg.rollout.temperature > 0
        mask = batch.completion_mask.to(device)
        rollout_lp, advantages = rollout_lp.to(device), advantages.to(device)
        plan = self.micro_batches(batch)
        stats: dict[str, torch.Tensor] = {}

        from_rollout = fix.old_from_rollout
        objective = self.loss_config.objective_spec
        if objective.needs_rollout_logprobs and not has_rollout_lp:
            raise ValueError(
                f"loss: the objective {objective.name!r} needs the engine's sampling logprobs of every completion "
                "token (rollout.temperature > 0 and an engine that returns them)"
            )
        if from_rollout and not has_rollout_lp:
            raise ValueError(
                "grpo.old_logprobs 'rollout' (or rollout.partial.correction 'coupled') needs the engine's sampling "
                "logprobs (temperature > 0)"
            )
        correction = fix.weights  # (mode, clip_min, clip_max) or None
        # One update of a dropout-free model: the old policy is the one the update's forward runs, so token-level
        # weights come from that forward's hidden states (the head again, without gradient), not a second pass.
        inline = (
            correction is not None
            and correction[0].startswith("token")
            and cfg.grpo.num_iterations == 1
            and not from_rollout
            and has_rollout_lp
            and not drops_out(self.model)
        )
        recompute = not from_rollout and (cfg.grpo.num_iterations > 1 or (correction is not None and not inline))
        old_lp = rollout_lp if from_rollout else self.logprobs(self.model, batch, plan) if recompute else None
        ref_lp = self.reference_logprobs(batch, plan) if cfg.loss.beta > 0 else None
        self.model.train()
        is_weights = None
        if recompute and has_rollout_lp:
            stats.update(mismatch_metrics(old_lp, rollout_lp, mask, staleness))
            if correction is not None:  # [B, T] (token_*) or [B] (sequence_*), TRL's importance_sampling_ratio
                is_weights = rollout_importance_weights(old_lp, rollout_lp, mask, *correction)
        return _StepInputs(
            batch=batch,
            plan=plan,
            advantages=advantages,
            mask=mask,
            old_lp=old_lp if cfg.grpo.num_iterations > 1 or from_rollout else None,
            ref_lp=ref_lp,
            is_weights=is_weights,
            weights_from=(rollout_lp, correction) if inline else None,
            rollout_lp=rollout_lp if objective.needs_rollout_logprobs else None,
            # Otherwise the first update's forward runs the policy the engine sampled from: measure there.
            measure_from=rollout_lp if has_rollout_lp and not recompute else None,
            staleness=staleness,
            stats=stats,
            real_micro_batches=sum(not mb.idle for mb in plan),
        )

    def _update(self, step: _StepInputs, iteration: int, agg: dict, grad_norms: list) -> torch.Tensor:
        """One update's gradient over the micro-batches, clipped; -> whether its loss and gradient norm are
        finite (a device flag)."""
        self.optimizer.zero_grad(set_to_none=True)
        measuring = iteration == 0 and step.measure_from is not None
        current = torch.zeros_like(step.measure_from) if measuring else None
        control = self.entropy_control
        coef = None if control is None else control.applied_coef()
        entropy_sum, entropy_tokens = self.accumulate_gradients(
            step.batch,
            step.advantages,
            step.old_lp,
            step.ref_lp,
            step.is_weights,
            agg,
            current,
            step.plan,
            coef,
            step.weights_from,
            step.rollout_lp,
        )
        if control is not None:  # TRL's update at the optimizer-step boundary (one read of the device)
            totals = torch.stack([entropy_sum.float(), torch.tensor(entropy_tokens, device=self.device).float()])
            totals = self.dist.sum(totals)
            control.update(float(totals[0]), float(totals[1]))
        if current is not None:
            step.stats.update(mismatch_metrics(current, step.measure_from, step.mask, step.staleness))
        params, max_norm = self.model.parameters(), self.config.optim.clip_norm
        norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True))  # one op, not one per tensor
        grad_norms.append(norm.to(self.device))
        losses = agg["loss"][len(agg["loss"]) - step.real_micro_batches :]  # this update's
        loss_sum = torch.stack(losses).sum() if losses else torch.zeros((), device=self.device)
        return torch.isfinite(norm) & torch.isfinite(self.dist.sum(loss_sum))

    def _read_step_metrics(self, step: _StepInputs, agg: dict, grad_norms: list, finite: torch.Tensor) -> dict:
        """The step's metrics as host numbers (its one read of the device), with the last update's `_finite` flag."""
        stats = step.stats
        losses = agg.pop("loss", [])
        loss_sum = torch.stack(losses).sum() if losses else torch.zeros((), device=self.device)
        stats["loss"] = loss_sum / self.config.grpo.num_iterations
        for k, v in agg.items():
            stats[k] = torch.stack(v).mean()
        stats["grad_norm"] = torch.stack(grad_norms).mean()
        return read_metrics({**stats, "_finite": finite})

    def accumulate_gradients(
        self,
        batch,
        advantages,
        old_lp,
        ref_lp,
        is_weights,
        agg=None,
        current_logprobs=None,
        plan=None,
        entropy_coef: float | None = None,
        weights_from: tuple[torch.Tensor, tuple] | None = None,
        rollout_lp: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, int]:
        """Backward of the loss of the whole `batch` as micro-batches (`plan`, default `micro_batches(batch)`),
        adding up to TRL 1.16's gradient (`GRPOTrainer._compute_loss` per micro-batch, summed). Per-token arguments
        are [B, T] (advantages and sequence-level is_weights [B]); `agg` (a dict of lists) gets each micro-batch's
        loss and metrics as device tensors; with `current_logprobs` ([B, T]) the micro-batches' logprobs under the
        current policy are written into it by the loss's own forward (no extra pass).

        Each micro-batch's loss is scaled by its reduction's `micro_batch_share` (rows / B for the per-sequence
        reductions and bnpo, whose token mean is the micro-batch's own as in TRL; 1 for the global ones, given the
        batch's token count). The entropy bonus is each micro-batch's own token mean weighted like a micro-batch
        (TRL: / gradient_accumulation_steps; here rows / B): its coefficient becomes coef (rows / B) / share.
        `entropy_coef` overrides the loss config's (the adaptive controller's value). `weights_from` (engine logprobs
        [B, T], (mode, clip_min, clip_max) of a token-level mode), instead of is_weights: each micro-batch's weights
        against its current logprobs, from its own hidden states. `rollout_lp` [B, T]: the engine's logprobs, for an
        objective that reads them. Returns (Σ entropy over this rank's active tokens, a device tensor; their count):
        what the adaptive-entropy controller measures."""
        plan = self.micro_batches(batch) if plan is None else plan
        agg = defaultdict(list) if agg is None else agg
        row_tokens = batch.completion_mask.sum(1).tolist()
        n_rows, num_items = len(row_tokens), sum(row_tokens)
        if self.dist.enabled:  # the whole batch's rows and tokens: every rank's (each holds an equal share)
            n_rows, num_items = self.dist.sum(torch.tensor([n_rows, num_items])).tolist()
        coef = self.loss_config.entropy_coef if entropy_coef is None else entropy_coef
        device = self.device
        weight = bias = None
        entropy_sum = torch.zeros((), device=device)
        for mb in plan:
            hidden = self.forward_hidden(self.model, mb)
            if weight is None or self.sharded:  # a sharded root's head exists whole after its forward
                weight, bias = self.head(self.model)
            if mb.idle:  # joins the ranks' collectives; contributes nothing
                (hidden.sum() * 0.0 + weight.sum() * 0.0).backward()
                continue
            tokens = sum(row_tokens[i] for i in mb.row_list)
            share, config = self._micro_batch_share(mb.num_rows, n_rows, tokens, num_items, coef)
            per_token = [None if t is None else mb.tokens(t, device) for t in (old_lp, ref_lp, is_weights, rollout_lp)]
            if weights_from is not None:
                per_token[2] = self._inline_weights(mb, hidden, weight, bias, *weights_from)
            lp = None if current_logprobs is None else hidden.new_empty(hidden.shape[:-1], dtype=torch.float32)
            loss, metrics = grpo_loss(
                hidden,
                weight,
                mb.completion_ids,
                mb.completion_mask,
                mb.tokens(advantages, device),
                *per_token[:3],
                num_items_in_batch=max(num_items, 1),  # every completion masked (all truncated): loss 0
                config=config,
                bias=bias,
                cu_seqlens=mb.cu_seqlens,
                validate=False,  # check_step_inputs checked the step's inputs once, on the host
                logprobs_out=lp,  # the current policy's logprobs from the loss's own forward
                rollout_logprobs=per_token[3],  # the engine's, for an objective that reads them
            )
            if share != 1.0:
                loss = loss * share
            if lp is not None:
                mb.scatter(current_logprobs, lp)
            # FSDP averages the ranks' gradients of their shares of the batch's loss: scale to the sum.
            (loss * self.dist.world_size if self.dist.enabled else loss).backward()
            agg["loss"].append(loss.detach())
            entropy_sum = entropy_sum + metrics["entropy"].detach().float() * tokens
            for k, v in metrics.items():
                agg[k].append(v)
        return entropy_sum, sum(row_tokens)

    def _micro_batch_share(self, rows: int, n_rows: int, tokens: int, num_items: int, coef: float):
        """(share, the loss config) of a micro-batch of `rows` sequences and `tokens` active tokens in a batch of
        `n_rows` and `num_items`: its reduction's share, and the entropy coefficient `coef` as coef (rows / B) / share
        (see accumulate_gradients)."""
        share = self.loss_config.loss_spec.reduction.micro_batch_share(rows, n_rows, tokens, num_items)
        config = self.loss_config
        if coef != 0.0 or config.entropy_coef != 0.0:
            mb_coef = coef * (rows / max(n_rows, 1)) / share if share else 0.0
            config = dataclasses.replace(config, entropy_coef=mb_coef)
        return share, config

    def _inline_weights(self, mb, hidden, weight, bias, engine_lp, correction) -> torch.Tensor:
        """A micro-batch's token-level importance weights against the current policy's logprobs, from its hidden
        states (the head without gradient): π_prox when the step makes one update."""
        with torch.no_grad():
            now = logprobs_with_config(hidden.detach(), weight.detach(), mb.completion_ids, self.loss_config, bias)
        return rollout_importance_weights(
            now.float(), mb.tokens(engine_lp, self.device), mb.completion_mask, *correction
        )
