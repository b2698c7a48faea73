"""`SFTTrainer` / `run_sft`: supervised fine-tuning on the fused path.

One optimizer step: `run.grad_accum` micro-batches (grpo_fast.sft.batching), each through the backbone ->
the hidden rows that predict a loss token -> `fused_logprobs` (grpo_fast.sft.loss). The loss is the mean
negative logprob over the loss tokens of the whole step:

    loss = -(1 / N) sum_{micro-batches m} sum_{loss tokens t in m} log p(t),  N = the step's loss tokens,

so each micro-batch backpropagates its own sum divided by N and the accumulated gradient is that of the
step's mean. Then gradient clipping, AdamW and the lr schedule (grpo_fast.core.optim).

`run_sft` adds the run around it: checkpoints (grpo_fast.core.checkpoint; `run.resume` continues the
latest), metrics.jsonl (loss, tokens/s, lr, grad norm), plots, `<output_dir>/final` (the model and tokenizer
as a Hugging Face directory) and summary.json.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import torch

from grpo_fast.core import checkpoint as ckpt
from grpo_fast.core.metrics import MetricsLogger
from grpo_fast.core.optim import apply_hyperparameters, build_optimizer, build_scheduler
from grpo_fast.core.packing import packing_error
from grpo_fast.core.plots import save_plots
from grpo_fast.core.policy import check_model_path, load_policy
from grpo_fast.core.seeding import set_rng_state, set_seed
from grpo_fast.core.trackers import open_trackers
from grpo_fast.data.tokenizer import load_tokenizer
from grpo_fast.sft.batching import BatchPlan, MicroBatch, collate
from grpo_fast.sft.config import SFTConfig
from grpo_fast.sft.data import load_sft_rows, tokenize_rows
from grpo_fast.sft.loss import sft_loss

logger = logging.getLogger(__name__)

# Resuming with another config (core.checkpoint.compare_configs): refused where the checkpoint becomes another run's
# (the model, the data and its order, the batch shape), logged where only the length, logging or output changes, and
# warned otherwise (the optimizer's settings: they take effect from the resumed step on).
RESUME_RULES = (
    ("model.path", "data", "run.seed", "run.micro_batch_tokens", "run.micro_batch_size", "run.grad_accum"),
    ("run.max_steps", "run.log_every", "run.save_every", "run.keep_checkpoints", "run.output_dir", "run.report_to")
    + ("run.project", "run.run_name", "run.progress", "run.plots"),
)

PLOT_PANELS = (
    ("loss", "loss (mean NLL of the loss tokens)"),
    ("lr", "learning rate"),
    ("grad_norm", "gradient norm (before clipping)"),
    ("tokens_per_second", "tokens / s"),
)


class SFTTrainer:
    """The model, its optimizer and schedule, the tokenised data and the step order.

    model / tokenizer: a CausalLM and its tokenizer (None: loaded from model.path; on the GPU when there is
    one). dataset: a list of dicts or a `datasets.Dataset` in place of data.source. The data order depends
    only on run.seed; dropout (if any) draws from the global torch RNG, which `run_sft` seeds."""

    def __init__(self, config: SFTConfig, model=None, tokenizer=None, dataset=None) -> None:

        self.config = cfg = config
        if model is None:
            if not cfg.model.path:
                raise ValueError("model.path: required (an HF directory or hub name) when no model is given")
            check_model_path(cfg.model.path)
            model = load_policy(cfg.model)
        self.model = model
        self.tokenizer = tokenizer or load_tokenizer(cfg.model.path or model.name_or_path)
        if self.tokenizer.pad_token_id is None:  # a tokenizer passed in
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if cfg.model.gradient_checkpointing:
            model.config.use_cache = False
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.device = next(model.parameters()).device
        self.autocast = self.device.type == "cuda" and cfg.run.bf16 in ("auto", True)

        rows = load_sft_rows(dataset if dataset is not None else cfg.data.source, cfg.data.split)
        self.examples, self.data_stats = tokenize_rows(rows, self.tokenizer, cfg.data)
        self.packing = cfg.data.packing
        if self.packing and (reason := packing_error(model)):
            logger.warning("sft: padded batches instead of packing: %s", reason)
            self.packing = False
        self.plan = BatchPlan(
            [len(e) for e in self.examples],
            self.packing,
            cfg.data.max_length,
            cfg.run.micro_batch_tokens,
            cfg.run.micro_batch_size,
            cfg.run.grad_accum,
            cfg.run.seed,
        )
        self.total_steps = cfg.run.max_steps or self.plan.steps_for_epochs(cfg.run.epochs)
        self.optimizer = build_optimizer(model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, self.total_steps)
        self.step = 0
        self.resumed_from: Path | None = None  # never pruned by run.keep_checkpoints

    def train_step(self, micro_batches: list[MicroBatch] | None = None) -> dict[str, float]:
        """One optimizer step on `micro_batches` (rows of indices into `examples`; default: the plan's next
        step, else the plan does not advance); returns its metrics."""
        t0 = time.perf_counter()
        micro_batches = self.plan.next() if micro_batches is None else micro_batches
        batches = [collate(self.examples, rows, self.tokenizer.pad_token_id) for rows in micro_batches]
        num_loss_tokens = sum(b.num_loss_tokens for b in batches)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=self.device)
        for batch in batches:
            part = sft_loss(self.model, batch.to(self.device), num_loss_tokens, self.autocast)
            part.backward()
            loss += part.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.clip_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        seconds = time.perf_counter() - t0
        tokens = sum(b.num_tokens for b in batches)
        return {
            "loss": float(loss),
            "grad_norm": float(grad_norm),
            "lr": lr,
            "epoch": self.plan.epochs_done,
            "tokens": float(tokens),
            "loss_tokens": float(num_loss_tokens),
            "tokens_per_second": tokens / max(seconds, 1e-9),
            "time/step": seconds,
        }

    def save(self) -> Path:
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "plan": self.plan.state_dict(),
            "config": self.config.to_dict(),
        }
        root, keep = Path(self.config.run.output_dir) / "checkpoints", self.config.run.keep_checkpoints
        protect = [self.resumed_from] if self.resumed_from else []
        return ckpt.save_checkpoint(root, self.step, self.model, self.tokenizer, state, keep, protect=protect)

    def resume(self) -> bool:
        """Continues from the latest checkpoint under run.output_dir (weights, optimizer, schedule, data
        position, RNG states); False when there is none."""
        path = ckpt.latest_checkpoint(Path(self.config.run.output_dir) / "checkpoints")
        if path is None:
            return False
        state = ckpt.load_trainer_state(path)  # before the weights: a refused checkpoint changes nothing
        diff = ckpt.compare_configs({"config": state["config"]}, {"config": self.config.to_dict()}, *RESUME_RULES)
        ckpt.report_config_changes(diff, path, f"the config kept in {path / ckpt.TRAINER_STATE}")
        ckpt.load_model_weights(self.model, path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        apply_hyperparameters(self.optimizer, self.scheduler, self.config.optim)  # a resume's new lr takes effect
        self.plan.load_state_dict(state["plan"])
        self.step = state["step"]
        set_rng_state(state["rng"])
        self.resumed_from = path
        logger.info("resumed from %s (step %d)", path, self.step)
        return True

    def train(self) -> dict:
        """Runs to `total_steps` with checkpoints, metrics, plots and the final model; returns the summary."""

        cfg, out = self.config.run, Path(self.config.run.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        if not (cfg.resume and self.resume()):
            self._clear_for_a_fresh_start(out)
        metrics = MetricsLogger(out, open_trackers(cfg, self.config.to_dict()))
        metrics.truncate_after(self.step)
        bar = _progress(self.total_steps, self.step, cfg.progress)
        t0, start_step, last = time.perf_counter(), self.step, {}
        while self.step < self.total_steps:
            last = self.train_step()
            if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                metrics.log(self.step, last)
            if cfg.save_every and self.step % cfg.save_every == 0:
                self.save()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{last['loss']:.4f}")
        if bar is not None:
            bar.close()
        if cfg.plots:
            save_plots(metrics.history, out / "plots", PLOT_PANELS)
        final = out / "final"
        self.model.save_pretrained(final, safe_serialization=True)
        self.tokenizer.save_pretrained(final)
        summary = {
            "steps": self.step,
            "final_loss": last.get("loss"),
            "first_loss": next((r["loss"] for r in metrics.history if "loss" in r), None),
            "packing": self.packing,
            "data": self.data_stats,
            "seconds": time.perf_counter() - t0,
            "steps_this_run": self.step - start_step,
            "final_model": str(final),
            "metrics_jsonl": str(metrics.path),
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        metrics.close([out / "summary.json"])
        return summary

    def _clear_for_a_fresh_start(self, out: Path) -> None:
        """A start from step 0 in `out`: what an earlier run left there (checkpoints, metrics, the final model) is
        deleted with run.overwrite; otherwise ValueError, so that nothing saved is replaced unasked."""
        earlier = ckpt.earlier_run_files(out)
        if (out / "final").is_dir():
            earlier.append("final/")
        if not earlier:
            if self.config.run.resume:
                logger.warning("resume requested but no checkpoint under %s: starting fresh", out)
            return
        if not self.config.run.overwrite:
            resume = "it has no checkpoint to resume" if self.config.run.resume else "resume it (--resume)"
            raise ValueError(
                f"run.output_dir {out} holds an earlier run ({', '.join(earlier)}): starting afresh would replace it; "
                f"{resume}, choose another run.output_dir, or set run.overwrite: true (--overwrite) to delete it"
            )
        logger.warning("run.overwrite: deleting the earlier run in %s (%s)", out, ", ".join(earlier))
        ckpt.clear_earlier_run(out)
        shutil.rmtree(out / "final", ignore_errors=True)
        (out / "summary.json").unlink(missing_ok=True)


def run_sft(config: SFTConfig, model=None, tokenizer=None, dataset=None) -> dict:
    """Seeds the global RNGs with run.seed, then trains (see SFTTrainer); returns the run's summary."""

    set_seed(config.run.seed)
    trainer = SFTTrainer(config, model, tokenizer, dataset)
    summary = trainer.train()
    logger.info("sft done: %s", {k: v for k, v in summary.items() if k != "data"})
    return summary


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="sft", dynamic_ncols=True)
