"""`GRPOTrainer`: the training loop around colocated rollouts and the fused GRPO loss.

One step: the rollout phase (rollout_phase.py: sample prompts, generate G completions each with the engine
awake, score, DAPO dynamic sampling) -> the engine sleeps, trainer state comes back to the device -> the
loss step (loss_step.py: num_iterations optimizer steps over micro-batches of backbone forward ->
`grpo_loss`) -> trainer state offloaded -> weights pushed to the engine. This module runs the steps, the
held-out evaluation, checkpoints and metrics.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import math
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from grpo_fast.core import checkpoint as ckpt
from grpo_fast.core.metrics import MetricsLogger
from grpo_fast.core.optim import apply_hyperparameters, build_optimizer, build_scheduler
from grpo_fast.core.plots import PANELS, TOOL_PANELS, save_plots
from grpo_fast.core.policy import check_model_path, load_policy
from grpo_fast.core.scoring import submit_completions
from grpo_fast.core.seeding import set_rng_state, set_seed
from grpo_fast.core.sharded_checkpoint import (
    SHARDED_DIR,
    full_model_state,
    load_full_checkpoint,
    load_sharded,
    save_sharded,
)
from grpo_fast.core.trackers import open_trackers
from grpo_fast.data.loading import validate_prompt_rows
from grpo_fast.data.tokenizer import load_tokenizer
from grpo_fast.distributed.context import init_distributed
from grpo_fast.distributed.fsdp import shard_policy
from grpo_fast.rewards.reward_set import RewardSet, TrainerState
from grpo_fast.rewards.tasks import environment_reward
from grpo_fast.rollout.async_rollouts import EngineSpec
from grpo_fast.rollout.base import RolloutEngine, SamplingSpec
from grpo_fast.rollout.contract import check_plan, engine_capabilities, import_path
from grpo_fast.rollout.environments import with_placeholder_prompts
from grpo_fast.rollout.prompts import PromptEncoder, stop_token_ids
from grpo_fast.rollout.registry import ROLLOUT_ENGINES, choose_engine, create_engine, engine_options
from grpo_fast.rollout.rollouts import build_rollouts
from grpo_fast.rollout.weight_sync import trainer_weights
from grpo_fast.trainer.audit import AuditTrail
from grpo_fast.trainer.best_model import BestEvaluation, BestModel
from grpo_fast.trainer.config import TrainConfig, check_distributed_config
from grpo_fast.trainer.curriculum import PassRateCurriculum
from grpo_fast.trainer.data_sampler import PromptSampler
from grpo_fast.trainer.health import HealthMonitor
from grpo_fast.trainer.loss_step import LossStep
from grpo_fast.trainer.metrics import step_metrics
from grpo_fast.trainer.offload import TrainerStateOffloader, memory_snapshot
from grpo_fast.trainer.preflight import PreflightReport, run_preflight, verifier_checks
from grpo_fast.trainer.report import write_report
from grpo_fast.trainer.rollout_phase import RolloutPhase
from grpo_fast.trainer.trl_args import trainer_arguments

logger = logging.getLogger(__name__)


SUMMED_METRICS = (
    "loss",
    "train_tokens",
    "rollout/trained_samples",
    "rollout/generated_samples",
    "rollout/trained_tokens",
    "train/micro_batches",
    "train/backbone_tokens",
    "tokens_per_second/*",
    "reward/*/failures",
    "reward/*/program_failures",
    "reward/*/infra_failures",
    "tools/*/failures",
)
"""The step metrics that add up over ranks (the others are averaged, times and memory the slowest rank's)."""
PER_COMPLETION_METRICS = dict.fromkeys(
    ("reward/mean", "reward/*/mean", "completion/length_mean", "completion/truncated_frac")
    + ("frac_zero_var_groups", "frac_stuck_groups"),
    "rollout/generated_samples",
)
"""The step metrics that are shares or means over the completions a rank generated, weighted over ranks by how many
it generated (DAPO's dynamic sampling tops each rank up with its own number of groups)."""


class NonFiniteTrainingError(RuntimeError):
    """run.max_bad_steps steps in a row had a non-finite loss or gradient norm."""


class GRPOTrainer:
    """The GRPO-family trainer: every loss type and objective of the loss's registries (grpo_fast.loss.LOSS_TYPES,
    OBJECTIVES; docs/config.md lists them), GSPO's sequence-level ratios, and the options of the `grpo` section.

    model: a transformers CausalLM or a path/hub name. reward_funcs: reward specs (callables with TRL's
    signature `fn(prompts, completions, **columns) -> list[float | None]`, names or {name: ..., options}; see
    grpo_fast.rewards.registry). train_dataset / eval_dataset: `datasets.Dataset` or list of dicts with a
    "prompt" column (str or chat messages); other columns are passed to the reward functions. engine: an
    existing RolloutEngine to reuse (its weights are overwritten with the model's at the start of `train`).
    callbacks: callables `(trainer, rollout, metrics)` run after each training step with the step's
    RolloutBatch and metrics (inspect samples, extra logging, alarms).

    Multi-turn rollouts, TRL 1.16's arguments (grpo_fast.rollout.multi_turn; they replace the config's
    rollout.tools / environment_factory / rollout_func): tools, callables the model may call; environment_factory,
    a callable giving one environment per rollout, or {name: factory} routed by the rows' `environment` column;
    rollout_func(prompts, trainer), a custom agent that returns the completions itself.

    TRL's GRPOTrainer call works as it is written (grpo_fast.trainer.trl_args): `args` takes TRL's GRPOConfig
    (each field honoured or refused by name; docs/trl.md) or a TrainConfig (`config`'s other name);
    `processing_class` is `tokenizer`'s; reward_funcs may be None when the environments score the rollouts
    (get_reward); without train_dataset, or for rows without a prompt, an environment's reset() supplies the
    prompt. reward_processing_classes, optimizers, quantization_config and peft_config are refused when given.
    """

    def __init__(
        self,
        model,
        reward_funcs=None,
        train_dataset=None,
        config: TrainConfig | None = None,
        eval_dataset=None,
        tokenizer=None,
        engine: RolloutEngine | None = None,
        callbacks: Sequence[Callable] = (),
        *,
        args=None,
        processing_class=None,
        tools: Sequence[Callable] | None = None,
        environment_factory=None,
        rollout_func: Callable | None = None,
        reward_processing_classes=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
    ) -> None:
        _check_arguments(train_dataset, eval_dataset, callbacks)
        refused = {"reward_processing_classes": reward_processing_classes, "optimizers": optimizers}
        refused.update(quantization_config=quantization_config, peft_config=peft_config)
        rows = None if train_dataset is None else len(train_dataset)
        cfg, tokenizer, weights = trainer_arguments(model, config, args, tokenizer, processing_class, rows, **refused)
        self.config = cfg
        self.dist = init_distributed()
        check_distributed_config(cfg, self.dist.world_size)
        set_seed(cfg.run.seed)
        model, ref_model = self._load_model(model)
        self.model = model
        self.tokenizer = tokenizer or load_tokenizer(cfg.model.path or model.name_or_path)
        if self.tokenizer.pad_token_id is None:  # a tokenizer passed in
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._set_up_rollouts(tools, environment_factory, rollout_func)
        self.rewards = self._reward_set(reward_funcs, weights)
        self.train_rows, self.eval_rows = self._datasets(train_dataset, eval_dataset)
        if rollout_func is None:  # a rollout_func's own fields are columns too, known when it returns
            self._check_reward_columns(environment_factory is not None or cfg.rollout.environment_factory is not None)
        self.output_dir = Path(cfg.run.output_dir)
        self.engine = engine
        self._owns_engine = engine is None
        if engine is None:  # a name that cannot load fails here, not after the model, the data and the checklist
            ROLLOUT_ENGINES.get(choose_engine(cfg.rollout.engine).name, "rollout.engine")
        self.callbacks = list(callbacks)

        self.optimizer = build_optimizer(model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, cfg.run.max_steps * cfg.grpo.num_iterations)
        self.loss_step = LossStep(
            cfg, model, self.optimizer, self.scheduler, self.tokenizer.pad_token_id, self.dist, ref_model
        )
        offload = (cfg.run.offload_optimizer, cfg.run.offload_params)
        self.offloader = TrainerStateOffloader(model, self.optimizer, *offload, ref_model=self.loss_step.ref_model)
        self.sampler = PromptSampler(len(self.train_rows), cfg.run.seed)
        self.curriculum = PassRateCurriculum(cfg.curriculum, len(self.train_rows), cfg.run.seed)
        self.rollout = RolloutPhase(
            cfg, self.train_rows, self.prompts, self.rewards, self.sampler, self.stop_ids, self.dist, self.rollouts
        )
        self.step = 0
        self.timers: dict[str, float] = defaultdict(float)
        self.metrics: MetricsLogger | None = None
        self.last_eval: dict = {}
        self.last_rollout = None
        fill = cfg.rollout.max_staleness if cfg.rollout.scheduler.rounds else 0
        truncated = cfg.rollout.top_p < 1.0 or cfg.rollout.top_k > 0  # the engine's logprobs renormalised
        self.health = HealthMonitor(cfg.health, self.rewards.names, fill_steps=fill, truncated=truncated)
        self.best_model = BestModel(self.output_dir) if cfg.run.save_best else None
        self.audit: AuditTrail | None = None
        self.preflight_report: PreflightReport | None = None
        self.resumed_from: Path | None = None  # the checkpoint resumed from: never pruned by run.keep_checkpoints
        self.skipped_steps = 0  # steps whose loss or gradient was non-finite (their update skipped)
        self.stopped_by: list[str] = []  # the health alarms of health.stop_on that stopped the run
        self.bad_steps_in_row = 0

    def _load_model(self, model) -> tuple:
        """(policy, frozen reference or None) from `model` (an object, or a path loaded with the model section):
        gradient checkpointing on when configured; sharded with FSDP2 under torchrun (the reference too)."""
        cfg = self.config
        if isinstance(model, str):
            cfg.model.path = cfg.model.path or model
            check_model_path(model)
            model = load_policy(cfg.model, model)
        if cfg.model.gradient_checkpointing:  # before sharding: FSDP wraps the checkpointed layers
            model.config.use_cache = False
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ref_model = None
        if self.dist.enabled:
            device = torch.device("cuda", self.dist.local_rank) if torch.cuda.is_available() else torch.device("cpu")
            if cfg.loss.beta > 0:  # the frozen reference, sharded like the policy
                ref_model = shard_policy(copy.deepcopy(model).eval().requires_grad_(False), device)
            model = shard_policy(model, device)
        return model, ref_model

    @property
    def processing_class(self):
        """The tokenizer, under TRL's name (a rollout_func reads trainer.processing_class)."""
        return self.tokenizer

    def _rows(self, dataset, argument: str = "eval_dataset") -> list[dict]:
        """The rows of a dataset; with environments, rows without a prompt get TRL's placeholder (reset() supplies
        the prompt), and without a train_dataset one step's worth of placeholder rows drive the loop."""
        environments = self.rollouts.environments
        if dataset is None and environments is None:
            raise ValueError(f"{argument}: required unless an environment_factory supplies the prompts (reset())")
        if dataset is None:
            if environments.routed:
                raise ValueError(
                    f"{argument}: several environments ({{name: factory}}) need rows whose `environment` column "
                    "routes each to its own; pass a dataset, or a single factory"
                )
            dataset = [{} for _ in range(self.config.run.prompts_per_step)]
        rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
        if environments is not None:
            rows = with_placeholder_prompts(rows)
        return _as_rows(rows)

    def _datasets(self, train_dataset, eval_dataset) -> tuple[list[dict], list[dict] | None]:
        """(training rows, held-out rows or None: the first run.eval_max_prompts)."""
        train = self._rows(train_dataset, "train_dataset")
        held_out = self._rows(eval_dataset) if eval_dataset is not None else None
        limit = self.config.run.eval_max_prompts
        return train, held_out[:limit] if limit and held_out else held_out

    def _check_reward_columns(self, environments: bool) -> None:
        """ValueError before the run starts when the training or held-out rows lack a column a reward needs
        (`RewardSet.check_columns`)."""
        for rows, name in ((self.train_rows, "the training dataset"), (self.eval_rows, "the held-out dataset")):
            if rows:
                self.rewards.check_columns(rows[0], name, environments)

    def _set_up_rollouts(self, tools, environment_factory, rollout_func) -> None:
        """The prompt encoder, the stop tokens, and how a step's completions are produced (`rollouts`: one engine
        call per prompt, multi-turn with tools and environments, or a rollout function)."""
        cfg = self.config
        self.prompts = PromptEncoder(
            self.tokenizer, cfg.data, max_tokens=cfg.rollout.max_model_len - cfg.rollout.max_completion_length
        )
        self.stop_ids = stop_token_ids(self.tokenizer, cfg.rollout.stop)
        self.rollouts = build_rollouts(
            cfg.rollout,
            self.prompts,
            self.tokenizer,
            self.stop_ids,
            tools=tools,
            environment_factory=environment_factory,
            rollout_func=rollout_func,
            trainer=self,
        )
        scheduler, engine = cfg.rollout.scheduler, None
        if scheduler.engine_process:  # the engine the engine process builds (grpo_fast.rollout.contract)
            name = choose_engine(cfg.rollout.engine).name
            engine = engine_capabilities(name, ROLLOUT_ENGINES.get(name))
        check_plan(scheduler, self.rollouts.capabilities, engine, world_size=self.dist.world_size)

    def _reward_set(self, reward_funcs, weights: list | None = None) -> RewardSet:
        """The run's rewards: `reward_funcs` (None: none of its own), and the environments' own reward (weight 1, as
        TRL adds it) when they define get_reward; `weights`: TRL's reward_weights, else the config's."""
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs] * bool(reward_funcs)
        weights = self.config.reward.weights if weights is None else list(weights)
        if weights is not None and reward_funcs is not None and len(weights) != len(funcs):
            raise ValueError(f"reward_weights: {len(weights)} weights for {len(funcs)} reward functions")
        if self.rollouts.has_environment_reward():
            funcs, weights = funcs + [environment_reward], None if weights is None else [*weights, 1.0]
        if not funcs:
            raise ValueError(
                "reward_funcs: no reward source; pass reward functions, or an environment_factory whose "
                "environments define get_reward()"
            )
        if self.config.rollout.scheduler.engine_process and self.rollouts.calls_tools:
            live = [fn.__name__ if hasattr(fn, "__name__") else repr(fn) for fn in funcs if _takes_environments(fn)]
            if live:
                raise ValueError(
                    f"rollout.mode async: reward function(s) {live} take `environments`, the environment instances, "
                    "which live in the engine process with their rollouts (a group brings its conversations and "
                    "environment_reward, not the instances); use rollout.mode partial, or score from the conversations"
                )
        return RewardSet.from_config(self.config, funcs, weights)

    def save_model(self, output_dir: str | None = None) -> None:
        """The model and its tokenizer in Hugging Face format under `output_dir` (default run.output_dir), as
        transformers' Trainer.save_model writes them. Every rank must call it."""
        directory = Path(output_dir or self.config.run.output_dir)
        self._write_hf_model(directory)
        if self.dist.is_main:
            self.tokenizer.save_pretrained(directory)

    # -- the rollout engine -----------------------------------------------------------------------------

    def _ensure_engine(self) -> None:
        if self.engine is None:
            self.engine = self._make_engine()
        if self.engine.lockstep:
            check_plan(self.config.rollout.scheduler, self.rollouts.capabilities, lockstep=True)
        if self.engine.shares_trainer_model and self.offloader.offload_params:
            logger.warning(
                "run.offload_params ignored: the %s engine generates with the trainer's model", self.engine.name
            )
            self.offloader.offload_params = False

    def _make_engine(self) -> RolloutEngine:
        # async: training rollouts come from the engine process; this one evaluates
        own_process = self.config.rollout.scheduler.engine_process
        return create_engine(
            "hf" if own_process else self.config.rollout.engine,
            self.config,
            model=self.model,
            tokenizer=self.tokenizer,
            export_model=self._export_model,
        )

    def _export_model(self) -> str:
        """The policy as a Hugging Face directory: model.path, or the current weights saved under the run."""
        if self.config.model.path:
            return self.config.model.path
        path = self.output_dir / "rollout_init"
        self._write_model_and_tokenizer(path)
        self.dist.barrier()
        return str(path)

    def _write_model_and_tokenizer(self, directory: Path) -> None:
        """The whole model and the tokenizer in Hugging Face format under `directory`. Every rank must call it."""
        self._write_hf_model(directory)
        if self.dist.is_main:
            self.tokenizer.save_pretrained(directory)

    def _write_weights(self, directory: Path) -> None:
        """A checkpoint's weights under `directory`: the model in Hugging Face format; with several ranks, also
        the model and optimizer shards (grpo_fast.core.sharded_checkpoint). Every rank must call it."""
        if self.dist.enabled:
            save_sharded(directory / SHARDED_DIR, self.model, self.optimizer)
        self._write_hf_model(directory)

    def _write_hf_model(self, directory: Path) -> None:
        """The whole model in Hugging Face format under `directory` (a sharded one gathered parameter by
        parameter onto rank 0's CPU, which writes it). Every rank must call it."""
        if not self.dist.enabled:
            self.model.save_pretrained(directory, safe_serialization=True)
            return
        full = full_model_state(self.model)
        if self.dist.is_main:
            self.model.save_pretrained(directory, state_dict=full, safe_serialization=True)

    def close(self) -> None:
        """Stop the reward worker processes, the engine process (rollout.mode async), and the rollout engine when
        the trainer built it."""
        self.rewards.close()
        self.rollout.close()
        self.rollouts.close()
        if self.engine is not None and self._owns_engine:
            self.engine.close()
            self.engine = None

    def _start_engine_process(self) -> None:
        """rollout.mode async: the engine process, from the current weights (grpo_fast.rollout.async_rollouts)."""
        r = self.config.rollout
        name = choose_engine(r.engine).name
        engine_cls = ROLLOUT_ENGINES.get(name)
        options = engine_options(r, name, engine_cls)
        spec = EngineSpec(
            import_path(engine_cls),
            self._export_model(),
            {} if options is None else dataclasses.asdict(options),
            {"rollout": dataclasses.asdict(r), "run": {"seed": self.config.run.seed}},
            self.rollouts.recipe(),
        )
        self.rollout.start_async(spec, trainer_weights(self.model), self.step)

    def sync_weights(self) -> dict:
        t0 = time.perf_counter()
        if self.rollout.async_started:  # the weights after this step's update go to the engine process
            out = self.rollout.push_weights(trainer_weights(self.model), self.step + 1)
        else:
            out = self._load_engine_weights()
        dt = time.perf_counter() - t0
        self.timers["sync"] += dt
        return {**out, "time/sync": dt}

    def _load_engine_weights(self) -> dict:
        """The trainer's weights into the colocated engine, which wakes up for them (an OOM there names the knobs)."""
        try:
            return self.engine.load_weights(trainer_weights(self.model))
        except torch.OutOfMemoryError as exc:
            raise torch.OutOfMemoryError(
                f"the {self.engine.name} rollout engine ran out of accelerator memory waking up for the weight "
                f"sync ({exc}). Give it less: lower rollout.vllm.gpu_memory_utilization (now "
                f"{self.config.rollout.vllm.gpu_memory_utilization}) or set rollout.vllm.kv_cache_memory_bytes, lower "
                "rollout.max_model_len; or free the trainer's share: run.offload_optimizer: true, "
                "run.offload_params: true, a smaller run.micro_batch_size."
            ) from exc

    # -- evaluation -------------------------------------------------------------------------------------

    def evaluate(self) -> dict:
        """Held-out accuracy with greedy decoding: fraction of prompts whose reward reaches the maximum
        (every weighted reward function that applies to the row at 1), and the mean reward."""
        if not self.eval_rows:
            return {}
        self._ensure_engine()
        rows = self.eval_rows[self.dist.rank :: self.dist.world_size]  # this rank's share
        correct, total, calling = self.dist.sum(torch.stack(self._score_greedy(rows)).cpu())
        n = len(self.eval_rows)
        out = {"eval/accuracy": float(correct) / n, "eval/reward_mean": float(total) / n}
        if self.rollouts.calls_tools:
            out["eval/tool_call_rate"] = float(calling) / n
        return out

    def _score_greedy(self, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(how many of `rows` reach their full reward, the sum of their rewards, how many called a tool), greedy
        decoding."""
        spec = SamplingSpec(
            n=1,
            max_tokens=self.config.rollout.max_completion_length,
            temperature=0.0,
            stop_token_ids=self.stop_ids,
            seed=0,
        )
        t0 = time.perf_counter()
        if rows or self.engine.lockstep:  # a tensor-parallel engine's ranks generate together, rows or not
            outs = self.rollouts.generate(self.engine, rows, spec).completions
        if not rows:
            return torch.zeros(()), torch.zeros(()), torch.zeros(())
        state = TrainerState(global_step=self.step, max_steps=self.config.run.max_steps)
        scored = submit_completions(self.rewards, rows, outs, state)
        rewards = self.rewards.combine(scored.result().per_func)
        self.timers["eval"] += time.perf_counter() - t0
        solved = (rewards >= self.rewards.full_rewards(rows) - 1e-6).float().sum()
        calling = torch.tensor(float(sum(c.episode is not None and c.episode.calls > 0 for c in outs)))
        return solved, torch.nan_to_num(rewards, nan=0.0).float().sum(), calling

    # -- checks before, during and after the run -------------------------------------------------------

    def preflight(self, sft_control_rows: list[dict] | None = None) -> PreflightReport:
        """The checks before a run (grpo_fast.trainer.preflight); raises PreflightError when the verifier
        self-test fails. The report is kept for the run report."""
        self.preflight_report = run_preflight(self, sft_control_rows)
        return self.preflight_report

    def _watch(self, metrics: dict) -> bool:
        """Alarms and the audit trail after a step (metrics gains health/...); True when an alarm asks to stop."""
        cfg = self.config.health
        alarms = self.health.observe(self.step, metrics)
        if "eval/accuracy" in metrics:
            alarms += self._observe_eval(metrics["eval/accuracy"])
        for alarm in alarms:
            metrics[f"health/{alarm.name}"] = 1.0
        metrics["health/alarms_total"] = float(len(self.health.alarms))
        metrics.update({f"health/reading/{k}": v for k, v in self.health.readings.items() if math.isfinite(v)})
        if self.audit and cfg.audit_every and self.step % cfg.audit_every == 0 and self.last_rollout is not None:
            self.audit.record(self.step, self.last_rollout, self.train_rows, self.rewards.names)
        self.stopped_by = [alarm.name for alarm in alarms if alarm.name in cfg.stop_on]
        return bool(self.stopped_by)

    def _observe_eval(self, accuracy: float) -> list:
        """A held-out evaluation of this step: the best model kept when it beats the earlier ones, then the alarms
        that read evaluations."""
        if self.best_model is not None:
            evaluation = BestEvaluation(self.step, accuracy, len(self.eval_rows))
            self.best_model.offer(evaluation, self._write_model_and_tokenizer, self.dist.is_main)
        best = self.best_model.directory if self.best_model is not None and self.best_model.best else None
        saved = ckpt.saved_steps(self.output_dir / "checkpoints")
        return self.health.observe_eval(
            self.step, accuracy, saved, prompts=len(self.eval_rows), best_model=None if best is None else str(best)
        )

    # -- checkpoints ------------------------------------------------------------------------------------

    def save(self) -> Path:
        """Writes the checkpoint of the current step (run.keep_checkpoints prunes older ones).

        Every tensor is written from where it is: between steps on a GPU the optimizer state (and with
        run.offload_params the parameters) are the offloader's pinned CPU copies, so saving needs no GPU
        memory; `resume` puts each tensor back on its parameter's device."""
        state = {
            "step": self.step,
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "curriculum": self.curriculum.state_dict(),
            "timers": dict(self.timers),
            "skipped_steps": self.skipped_steps,
            "health": self.health.state_dict(),  # the alarms' memory: a resumed run compares with the steps before
        }
        if not self.dist.enabled:  # with several ranks, the optimizer is in the sharded state
            state["optimizer"] = self.optimizer.state_dict()
        if self.loss_step.entropy_control is not None:  # grpo.use_adaptive_entropy's coefficient (TRL saves it too)
            state["entropy_control"] = self.loss_step.entropy_control.state_dict()
        if self.rollout.partial is not None:  # the completions under way continue after a resume
            state["partial_rollouts"] = self.rollout.partial.state_dict()
        return ckpt.save_checkpoint(
            self.output_dir / "checkpoints",
            self.step,
            self.model,
            self.tokenizer,
            state,
            self.config.run.keep_checkpoints,
            protect=self._protected_checkpoints(),
            run_config=self.run_signature(),
            write_weights=self._write_weights,
            dist=self.dist,
        )

    def _protected_checkpoints(self) -> list[Path]:
        """What run.keep_checkpoints never prunes: the checkpoint resumed from, and those an alarm named."""
        named = [ckpt.checkpoint_dir(self.output_dir / "checkpoints", s) for s in sorted(self.health.named_checkpoints)]
        return [*named, *([self.resumed_from] if self.resumed_from else [])]

    def run_signature(self) -> dict:
        """The config and LoRA settings a checkpoint keeps (train_config.json) and a resume is checked against."""
        return ckpt.run_signature(self.config.to_dict(), self.model)

    def resume(self, path: str | Path | None = None) -> bool:
        """Continues from checkpoint `path` (default: the latest under run.output_dir): weights, optimizer,
        schedule, data position, curriculum, RNG states. Raises ValueError when the config differs from the
        checkpoint's in the model, loss or batch shape (checkpoint.INCOMPATIBLE), UnsafeCheckpointError for a
        trainer state that is not plain data. False when there is no checkpoint."""
        path = Path(path) if path else ckpt.latest_checkpoint(self.output_dir / "checkpoints")
        if path is None:
            logger.warning("resume requested but no checkpoint under %s: starting fresh", self.output_dir)
            return False
        ckpt.check_resume_config(path, self.run_signature())
        self._load_checkpoint(path)
        return True

    def _load_checkpoint(self, path: Path) -> None:
        """The loading half of `resume` (its config already checked)."""
        state = ckpt.load_trainer_state(path)  # before the weights: a refused checkpoint changes nothing
        if "optimizer" not in state:  # written by several ranks: model and optimizer in its shards, any world size
            load_sharded(path / SHARDED_DIR, self.model, self.optimizer)
        elif (path / SHARDED_DIR).exists():
            raise ckpt.UnsafeCheckpointError(
                f"checkpoint {path}: refused, one process wrote it (its trainer state holds the optimizer) but it "
                f"has a {SHARDED_DIR}/ directory, which only several ranks write: it was altered"
            )
        elif self.dist.enabled:
            load_full_checkpoint(self.model, self.optimizer, path, state["optimizer"])
        else:
            ckpt.load_model_weights(self.model, path)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        apply_hyperparameters(self.optimizer, self.scheduler, self.config.optim)  # a resume's new lr takes effect
        self.sampler.load_state_dict(state["sampler"])
        self.curriculum.load_state_dict(state.get("curriculum", {"pass_rates": {}}))
        self.step = state["step"]
        self.timers.update(state.get("timers", {}))
        self.skipped_steps = state.get("skipped_steps", 0)
        if "health" in state:
            self.health.load_state_dict(state["health"])
        if self.loss_step.entropy_control is not None and "entropy_control" in state:
            self.loss_step.entropy_control.load_state_dict(state["entropy_control"])
        if self.rollout.partial is not None and "partial_rollouts" in state:
            self.rollout.partial.load_state_dict(state["partial_rollouts"])
        set_rng_state(ckpt.rank_rng_state(state, self.dist.rank, self.dist.world_size))
        self.resumed_from = path
        logger.info("resumed from %s (step %d)", path, self.step)

    def _prepare_output_dir(self) -> Path | None:
        """Before the engine starts: the checkpoint to resume from (run.resume), its config checked; or, for
        a fresh start, the output directory cleared of an earlier run (run.overwrite) or refused. The run
        signature is written to the directory either way. Decided and done by rank 0."""
        return self.dist.run_on_main(self._prepare_output_dir_here)

    def _prepare_output_dir_here(self) -> Path | None:
        run = self.config.run
        signature = self.run_signature()
        self._check_output_dir_is_a_directory()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = ckpt.latest_checkpoint(self.output_dir / "checkpoints") if run.resume else None
        if path is not None:
            ckpt.check_resume_config(path, signature)
            if self.best_model is not None:
                self.best_model.recover()
        else:
            self._clear_for_a_fresh_start(signature)
        ckpt.write_run_signature(self.output_dir, signature)
        return path

    def check_output_dir(self) -> None:
        """The refusals of run.output_dir (an earlier run a fresh start would replace, a checkpoint another run
        saved), as ValueError before anything starts; nothing is written or deleted. train() checks again."""
        self.dist.run_on_main(self._check_output_dir_here)

    def _check_output_dir_is_a_directory(self) -> None:
        if self.output_dir.exists() and not self.output_dir.is_dir():
            raise ValueError(f"run.output_dir: {self.output_dir} is a file, not a directory; name a directory")

    def _check_output_dir_here(self) -> None:
        self._check_output_dir_is_a_directory()
        signature = self.run_signature()
        path = ckpt.latest_checkpoint(self.output_dir / "checkpoints") if self.config.run.resume else None
        if path is not None:
            ckpt.check_resume_config(path, signature)
        elif problem := self._fresh_start_problem(signature, ckpt.earlier_run_files(self.output_dir)):
            raise ValueError(problem)

    def _fresh_start_problem(self, signature: dict, earlier: list[str]) -> str | None:
        """Why a start from step 0 may not replace `earlier` (an earlier run's files in run.output_dir), or None:
        run.overwrite deletes them, and so does run.resume when they are this same run's progress, never
        checkpointed (killed before its first save: verl's resume_mode auto)."""
        run = self.config.run
        if not earlier or run.overwrite:
            return None
        if not run.resume:
            return (
                f"run.output_dir {self.output_dir} holds an earlier run ({', '.join(earlier)}): starting afresh would "
                "replace it. Resume it (run.resume: true / --resume / train(resume_from_checkpoint=True)), choose "
                "another run.output_dir, or set run.overwrite: true (--overwrite) to delete it and start over."
            )
        if broken := ckpt.incomplete_steps(self.output_dir / "checkpoints"):
            return (
                f"run.resume: run.output_dir {self.output_dir} holds no complete checkpoint, only incomplete ones "
                f"(steps {', '.join(map(str, broken))}: files missing or cut short): nothing to resume from. Look at "
                "them, move them away, or set run.overwrite: true (--overwrite) to delete the run and start over."
            )
        if (why := ckpt.unsaved_progress_mismatch(self.output_dir, signature)) is not None:
            return (
                f"run.resume: run.output_dir {self.output_dir} holds no checkpoint, and its run ({', '.join(earlier)}) "
                f"is not this run's unsaved progress: {why}. Choose another run.output_dir, or set run.overwrite: "
                "true (--overwrite) to delete it and start over."
            )
        return None

    def _clear_for_a_fresh_start(self, signature: dict) -> None:
        """A start from step 0 in run.output_dir: what an earlier run left there is deleted where
        `_fresh_start_problem` allows it; otherwise ValueError."""
        run = self.config.run
        earlier = ckpt.earlier_run_files(self.output_dir)
        if problem := self._fresh_start_problem(signature, earlier):
            raise ValueError(problem)
        if not earlier:
            if run.resume:
                logger.warning("resume requested but no checkpoint under %s: starting fresh", self.output_dir)
            return
        if run.overwrite:
            logger.warning("run.overwrite: deleting the earlier run in %s (%s)", self.output_dir, ", ".join(earlier))
        else:
            logger.warning(
                "resume requested but no checkpoint under %s: it holds this run's progress from before its first "
                "checkpoint (%s), started again from step 0 and replaced",
                self.output_dir,
                ", ".join(earlier),
            )
        ckpt.clear_earlier_run(self.output_dir)

    # -- the loop ---------------------------------------------------------------------------------------

    def _launch_checklist(self, resumed: bool) -> None:
        """The launch checklist before the first step unless it ran already (`preflight()`, `grpo-fast check`) or
        health.preflight is false: all of it for a fresh run, the verifiers' checks for a resumed one."""
        if self.preflight_report is not None or not self.config.health.preflight:
            return
        self.preflight_report = verifier_checks(self.rewards) if resumed else run_preflight(self, synced=True)

    def train(self, resume_from_checkpoint: bool | str | None = None) -> dict:
        """Runs `run.max_steps` steps (continuing a checkpoint with run.resume) after the launch checklist
        (grpo_fast.trainer.preflight); returns the final metrics. `resume_from_checkpoint` (TRL's argument): True
        or the path of the run's latest checkpoint resumes it, as run.resume; None or False: as the config says."""
        cfg = self.config
        if resume_from_checkpoint:
            self._check_resume_path(resume_from_checkpoint)
            cfg.run.resume = True
        self._start_run()
        main = self.dist.is_main  # rank 0 writes the run's files; the others keep the metrics in memory
        trackers = open_trackers(cfg.run, cfg.to_dict()) if main else []
        self.metrics = MetricsLogger(self.output_dir if main else None, trackers)
        self.metrics.truncate_after(self.step)
        self.audit = AuditTrail(self.output_dir, cfg.health.audit_samples) if main else None
        if self.audit:
            self.audit.truncate_after(self.step)
        bar = _progress(cfg.run.max_steps, self.step, cfg.run.progress and main)
        last: dict = {}
        stop = False
        if self.eval_rows and self.step == 0 and cfg.run.eval_every > 0:
            self.last_eval = self.evaluate()
            self._observe_eval(self.last_eval["eval/accuracy"])
            self.metrics.log(0, dict(self.last_eval))
        while self.step < cfg.run.max_steps:
            last = self.training_step()
            self.step += 1
            bad = self._count_bad_step(last)
            if (
                self.eval_rows
                and cfg.run.eval_every > 0
                and (self.step % cfg.run.eval_every == 0 or self.step == cfg.run.max_steps)
            ):
                self.last_eval = self.evaluate()
                last.update(self.last_eval)
            stop = self._watch(last)
            if self.step % cfg.run.log_every == 0 or self.step == cfg.run.max_steps or stop or bad:
                self.metrics.log(self.step, last)
            if bad and cfg.run.max_bad_steps and self.bad_steps_in_row >= cfg.run.max_bad_steps:
                self._stop_on_bad_steps()
            if stop:
                logger.error("stopping at step %d on a health alarm (health.stop_on); checkpoint saved", self.step)
                self.save()
                break
            if cfg.run.save_every and self.step % cfg.run.save_every == 0 and not bad:
                self.save()  # a skipped step changed nothing worth a checkpoint: the last good one stays latest
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    reward=f"{last['reward/mean']:.3f}",
                    acc=f"{self.last_eval.get('eval/accuracy', float('nan')):.2f}",
                )
        if bar is not None:
            bar.close()
        self._finish_run(stop)
        return last

    def _check_resume_path(self, path: bool | str) -> None:
        """ValueError unless `path` is True or names the latest checkpoint under run.output_dir (the one run.resume
        continues)."""
        if path is True:
            return
        latest = ckpt.latest_checkpoint(self.output_dir / "checkpoints")
        if latest is None or Path(path).resolve() != latest.resolve():
            raise ValueError(
                f"resume_from_checkpoint: {path!r} is not the latest checkpoint of run.output_dir {self.output_dir} "
                f"({latest or 'none'}); a run resumes from its latest: pass True"
            )

    def _start_run(self) -> None:
        """The output directory checked (refusals come before the engine starts), the engine started, a checkpoint
        loaded (run.resume), the weights synced, the engine process started (async), the launch checklist run; a
        start that fails leaves no outputs."""
        fresh_dir = self.dist.run_on_main(lambda: not self.output_dir.exists())
        resume_from = self._prepare_output_dir()
        try:
            # The engine first: starting vLLM reseeds the global RNGs (set_random_seed), which would overwrite
            # the RNG states a resume restores.
            self._ensure_engine()
            if resume_from is not None:
                self._load_checkpoint(resume_from)
                if self.best_model is not None:
                    self.best_model.restore()
            self.sync_weights()  # the engine may hold other weights (reused engine, resumed run)
            if self.config.rollout.scheduler.engine_process:
                self._start_engine_process()
            self._launch_checklist(resumed=resume_from is not None)
        except BaseException:
            self._remove_unstarted_outputs(fresh_dir)
            raise

    def _finish_run(self, stopped: bool) -> None:
        """The final checkpoint (unless a health alarm stopped the run, which saved its own), the plots, the run
        report, the metrics closed."""
        cfg, main = self.config, self.dist.is_main
        if cfg.run.save_final and not stopped:
            self.save()
        if cfg.run.plots and main:
            calls_tools = any("tools/rollouts_calling_frac" in r for r in self.metrics.history)
            save_plots(self.metrics.history, self.output_dir / "plots", PANELS + TOOL_PANELS * calls_tools)
        if main:
            write_report(
                self.output_dir,
                self.metrics.history,
                self.health.alarms,
                self.audit.records,
                self.preflight_report,
                best_model=self.best_model,
            )
        self.metrics.close([self.output_dir / "report.md", self.output_dir / "report.html"])

    def _remove_unstarted_outputs(self, fresh_dir: bool) -> None:
        """A run whose engine failed to start leaves no outputs: the exported rollout_init/ and the run signature
        go, and so does run.output_dir when this run created it and nothing else is in it."""
        if not fresh_dir or not self.dist.is_main:
            return
        shutil.rmtree(self.output_dir / "rollout_init", ignore_errors=True)
        (self.output_dir / ckpt.RUN_CONFIG).unlink(missing_ok=True)
        try:
            self.output_dir.rmdir()  # only when empty
        except OSError:
            pass

    def _count_bad_step(self, metrics: dict) -> bool:
        """Counts the step just finished as bad when the loss step skipped an update (non-finite loss or
        gradient); adds train/skipped_steps to its metrics."""
        bad = metrics.get("train/nonfinite", 0.0) > 0
        self.skipped_steps += bad
        self.bad_steps_in_row = self.bad_steps_in_row + 1 if bad else 0
        metrics["train/skipped_steps"] = float(self.skipped_steps)
        if bad:
            logger.warning(
                "step %d: non-finite loss or gradient, update skipped (%d in a row, run.max_bad_steps=%d)",
                self.step,
                self.bad_steps_in_row,
                self.config.run.max_bad_steps,
            )
        return bad

    def _stop_on_bad_steps(self) -> None:
        latest = ckpt.latest_checkpoint(self.output_dir / "checkpoints")
        kept = f"the last good checkpoint is {latest}" if latest else "no checkpoint was written before them"
        self.metrics.close()
        raise NonFiniteTrainingError(
            f"stopping at step {self.step}: {self.bad_steps_in_row} steps in a row had a non-finite (NaN/inf) loss "
            f"or gradient norm, their updates skipped (run.max_bad_steps={self.config.run.max_bad_steps}); "
            f"{kept}. Look for the cause (optim.lr, optim.max_grad_norm, the rewards, the data, model.dtype), "
            "then resume; raise run.max_bad_steps (0: never stop) to ride out longer stretches."
        )

    def training_step(self) -> dict:
        t_step = time.perf_counter()
        mem = memory_snapshot("generate")
        curriculum = self.curriculum.update(self, self.step) if self.curriculum.due(self.step) else {}
        self.timers["curriculum"] += curriculum.get("time/curriculum", 0.0)
        if self.config.rollout.scheduler.engine_process and not self.rollout.async_started:
            self._start_engine_process()
        rollout = self.last_rollout = self.rollout.collect(self.engine, self.step)
        self.engine.sleep()
        self.offloader.reload()
        mem.update(memory_snapshot("train_start"))
        t0 = time.perf_counter()
        stats = self.loss_step.train_on_batch(rollout)
        t_train = time.perf_counter() - t0
        mem.update(memory_snapshot("train_end"))
        self.offloader.offload()
        mem.update(memory_snapshot("offloaded"))
        sync = self.sync_weights()
        self.timers["generate"] += rollout.time_generate
        self.timers["score"] += rollout.time_score
        self.timers["train"] += t_train
        times = {"train": t_train, "sync": sync["time/sync"], "step": time.perf_counter() - t_step}
        out = step_metrics(rollout, self.rewards.names, times)
        out.update(stats)
        out.update(curriculum)
        out.update(mem)
        out["sync/bytes"] = sync.get("sync/bytes", 0.0)
        out["tokens_per_second/train"] = stats["train_tokens"] / max(t_train, 1e-9)
        if self.preflight_report is not None:  # what the verifiers' start-up checks found (the sandbox backend)
            out.update(self.preflight_report.startup_metrics)
        out = self.dist.reduce_metrics(
            out,
            sums=SUMMED_METRICS,
            maxes=("time/*", "mem/*", "rollout/staleness_max"),
            # each rank logs the ages its own tokens have, and the tools that failed in its own rollouts
            zero_filled=("rollout/token_share_staleness_*", "tools/*/failures"),
            # a reward's log_metric, where its function logged it this step (TRL averages what was logged)
            present_only=("mismatch/abs_logprob_diff_staleness_*", "reward_log/*"),
            weighted=PER_COMPLETION_METRICS,
        )
        for callback in self.callbacks:
            callback(self, rollout, out)
        return out


def _takes_environments(fn) -> bool:
    """Whether reward function `fn` takes TRL's `environments` (the rollouts' live environment instances)."""
    try:
        return "environments" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a signature takes no such argument by name
        return False


def _as_rows(dataset) -> list[dict]:
    if dataset is None:
        return []
    return validate_prompt_rows(dataset.to_list() if hasattr(dataset, "to_list") else dataset)


def _check_arguments(train_dataset, eval_dataset, callbacks) -> None:
    """TypeError for a TRL call that passed its config third (grpo_fast's third argument is train_dataset, TRL's is
    args); ValueError for a dataset without a length (an IterableDataset) or a callback that is not a callable
    (transformers' TrainerCallback objects)."""
    if isinstance(train_dataset, TrainConfig) or hasattr(train_dataset, "generation_batch_size"):
        raise TypeError("train_dataset: got a config; pass it by name, args=... (TRL's third argument is args)")
    for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        if dataset is not None and not hasattr(dataset, "__len__"):
            raise ValueError(
                f"{name}: a dataset without a length ({type(dataset).__name__}, e.g. streaming=True); the trainer "
                "draws each step's prompts from the whole dataset: load it without streaming, or pass a list of "
                "the rows to train on"
            )
    for i, callback in enumerate(callbacks or ()):
        if not callable(callback):
            raise ValueError(
                f"callbacks[{i}]: expected a callable (trainer, rollout, metrics), got {type(callback).__name__} "
                "(transformers' TrainerCallback objects are not supported)"
            )


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="grpo", dynamic_ncols=True)
