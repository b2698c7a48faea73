"""`GRPOTrainer`: colocated rollouts (vLLM or transformers) + the fused GRPO loss.

One step: sample prompts -> generate G completions each (engine awake) -> score with the reward
functions -> advantages (with optional DAPO dynamic sampling) -> engine sleeps, trainer state comes back
to the GPU -> num_iterations optimizer steps over micro-batches (backbone forward -> `grpo_loss` on the
completion hidden states and the lm_head weight) -> trainer state offloaded -> weights pushed to the engine.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import random
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec, make_engine
from grpo_fast.rollout.weight_sync import trainer_weights
from grpo_fast.trainer import checkpoint as ckpt
from grpo_fast.trainer.advantages import combine_rewards, group_advantages, overlong_penalty, reward_stats
from grpo_fast.trainer.config import TrainConfig
from grpo_fast.trainer.data_sampler import PromptSampler
from grpo_fast.trainer.metrics import MetricsLogger
from grpo_fast.trainer.offload import TrainerStateOffloader, memory_snapshot
from grpo_fast.trainer.policy import build_sequence_batch, completion_hidden, completion_logprobs, lm_head_params
from grpo_fast.trainer.rewards import resolve_reward, reward_name

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (global RNG)
    torch.manual_seed(seed)


class GRPOTrainer:
    """GRPO / DAPO / Dr. GRPO trainer.

    model: a transformers CausalLM or a path/hub name. reward_funcs: callables (or names, see
    grpo_fast.trainer.rewards) with TRL's signature `fn(prompts, completions, **columns) -> list[float|None]`.
    train_dataset / eval_dataset: `datasets.Dataset` or list of dicts with a "prompt" column (str or chat
    messages); other columns are passed to the reward functions. engine: an existing RolloutEngine to
    reuse (its weights are overwritten with the model's at the start of `train`).
    """

    def __init__(
        self,
        model,
        reward_funcs,
        train_dataset,
        config: TrainConfig | None = None,
        eval_dataset=None,
        tokenizer=None,
        engine: RolloutEngine | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = cfg = config or TrainConfig()
        set_seed(cfg.run.seed)
        if isinstance(model, str):
            cfg.model.path = cfg.model.path or model
            kwargs = {"dtype": _DTYPES[cfg.model.dtype]}
            if cfg.model.attn_implementation:
                kwargs["attn_implementation"] = cfg.model.attn_implementation
            model = AutoModelForCausalLM.from_pretrained(model, **kwargs)
            if torch.cuda.is_available():
                model = model.cuda()
        self.model = model
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(cfg.model.path or model.name_or_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = next(model.parameters()).device
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        self.reward_funcs = [resolve_reward(f) for f in funcs]
        self.reward_weights = cfg.reward.weights or [1.0] * len(self.reward_funcs)
        if len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"{len(self.reward_weights)} reward weights for {len(self.reward_funcs)} functions")
        self.train_rows = _as_rows(train_dataset)
        self.eval_rows = _as_rows(eval_dataset) if eval_dataset is not None else None
        if cfg.run.eval_max_prompts and self.eval_rows:
            self.eval_rows = self.eval_rows[: cfg.run.eval_max_prompts]
        self.loss_config = cfg.loss_config()
        self.output_dir = Path(cfg.run.output_dir)
        self.engine = engine

        if cfg.model.gradient_checkpointing:
            model.config.use_cache = False
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.optim.lr,
            betas=(cfg.optim.beta1, cfg.optim.beta2),
            eps=cfg.optim.eps,
            weight_decay=cfg.optim.weight_decay,
        )
        total = cfg.run.max_steps * cfg.grpo.num_iterations
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(cfg.optim, total))
        self.ref_model = None
        if cfg.grpo.beta > 0 and not hasattr(model, "disable_adapter"):
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.offloader = TrainerStateOffloader(model, self.optimizer, cfg.run.offload_optimizer, cfg.run.offload_params)
        self.sampler = PromptSampler(len(self.train_rows), cfg.run.seed)
        self.step = 0
        self.autocast = self.device.type == "cuda" and cfg.run.bf16 in ("auto", "true")
        self.stop_token_ids = self._stop_token_ids()
        self._prompt_cache: dict[int, list[int]] = {}
        self.timers: dict[str, float] = defaultdict(float)
        self.metrics: MetricsLogger | None = None
        self.last_eval: dict = {}

    # -- setup ------------------------------------------------------------------------------------------

    def _stop_token_ids(self) -> tuple[int, ...]:
        ids = {self.tokenizer.eos_token_id} - {None}
        for s in self.config.rollout.stop:
            toks = self.tokenizer.encode(s, add_special_tokens=False)
            if len(toks) != 1:
                raise ValueError(f"rollout.stop: {s!r} is not a single token for this tokenizer")
            ids.add(toks[0])
        return tuple(sorted(ids))

    def _ensure_engine(self) -> None:
        if self.engine is None:
            self.engine = self._make_engine()
        if self.engine.name == "hf" and self.offloader.offload_params:
            # HFEngine generates with this very model: its parameters must stay on the GPU.
            logger.warning("run.offload_params ignored with the transformers rollout engine")
            self.offloader.offload_params = False

    def _make_engine(self) -> RolloutEngine:
        r = self.config.rollout
        path = self.config.model.path
        if not path:
            path = str(self.output_dir / "rollout_init")
            self.model.save_pretrained(path, safe_serialization=True)
            self.tokenizer.save_pretrained(path)
        return make_engine(
            r.engine,
            path,
            tokenizer=self.tokenizer,
            model=self.model,
            **(
                {}
                if r.engine == "hf" or (r.engine == "auto" and not _has_vllm())
                else dict(
                    dtype=r.dtype,
                    max_model_len=r.max_model_len,
                    gpu_memory_utilization=r.gpu_memory_utilization,
                    kv_cache_memory_bytes=r.kv_cache_memory_bytes,
                    sleep_level=r.sleep_level,
                    seed=self.config.run.seed,
                    sync_bucket_bytes=r.sync_bucket_mb << 20,
                )
            ),
        )

    def _use_chat_template(self) -> bool:
        mode = str(self.config.data.use_chat_template).lower()
        has = getattr(self.tokenizer, "chat_template", None) is not None
        return has if mode == "auto" else mode == "true"

    def encode_prompt(self, prompt) -> list[int]:
        """Token ids of one prompt: chat messages (or a string wrapped as a user turn) go through the
        tokenizer's chat template when it has one; plain strings are tokenized as is."""
        if isinstance(prompt, list) or self._use_chat_template():
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            if self.config.data.system_prompt and messages[0].get("role") != "system":
                messages = [{"role": "system", "content": self.config.data.system_prompt}, *messages]
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]

    def _prompt_ids(self, rows: list[dict], index: list[int], cache: bool) -> list[list[int]]:
        out = []
        for i in index:
            if cache and i in self._prompt_cache:
                out.append(self._prompt_cache[i])
                continue
            ids = self.encode_prompt(rows[i]["prompt"])
            if cache:
                self._prompt_cache[i] = ids
            out.append(ids)
        return out

    # -- scoring ----------------------------------------------------------------------------------------

    def score(self, rows: list[dict], completions: list[str]) -> torch.Tensor:
        """[N, F] rewards (NaN where a function returned None) for rows[i] / completions[i]."""
        prompts = [r["prompt"] for r in rows]
        columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
        out = torch.full((len(rows), len(self.reward_funcs)), math.nan)
        for j, fn in enumerate(self.reward_funcs):
            values = fn(prompts=prompts, completions=completions, **columns)
            if len(values) != len(rows):
                raise ValueError(f"reward function {reward_name(fn)} returned {len(values)} values for {len(rows)}")
            out[:, j] = torch.tensor([math.nan if v is None else float(v) for v in values])
        return out

    # -- rollout phase ----------------------------------------------------------------------------------

    def _generate_groups(self, index: list[int], seed: int):
        cfg = self.config
        prompt_ids = self._prompt_ids(self.train_rows, index, cache=True)
        spec = SamplingSpec(
            n=cfg.rollout.num_generations,
            max_tokens=cfg.rollout.max_completion_length,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            stop_token_ids=self.stop_token_ids,
            seed=seed,
        )
        t0 = time.perf_counter()
        groups = self.engine.generate(prompt_ids, spec)
        t_gen = time.perf_counter() - t0
        t0 = time.perf_counter()
        rows = [self.train_rows[i] for i in index for _ in range(spec.n)]
        flat = [c for g in groups for c in g]
        per_func = self.score(rows, [c.text for c in flat])
        t_score = time.perf_counter() - t0
        return prompt_ids, flat, per_func, t_gen, t_score

    def collect(self) -> dict:
        """Generates and scores one step's batch (with DAPO dynamic sampling when enabled)."""
        cfg, g = self.config, self.config.rollout.num_generations
        want = cfg.run.prompts_per_step
        kept, spare, all_rewards, all_per_func, all_flat = [], [], [], [], []
        t_gen = t_score = 0.0
        rounds = 0
        while True:
            index = self.sampler.next(want - len(kept) if rounds else want)
            seed = cfg.run.seed * 1_000_003 + self.step * 10_007 + rounds * 101
            prompt_ids, flat, per_func, tg, ts = self._generate_groups(index, seed * 1000)
            t_gen, t_score = t_gen + tg, t_score + ts
            rewards = combine_rewards(per_func, self.reward_weights)
            lengths = torch.tensor([len(c.token_ids) for c in flat])
            rewards = rewards + overlong_penalty(
                lengths, cfg.rollout.max_completion_length, cfg.grpo.overlong_buffer, cfg.grpo.overlong_penalty_factor
            )
            all_rewards.append(rewards)
            all_per_func.append(per_func)
            all_flat += flat
            for k in range(len(index)):
                sl = slice(k * g, (k + 1) * g)
                group = (prompt_ids[k], flat[sl], rewards[sl])
                if cfg.grpo.dynamic_sampling and bool(group_advantages(rewards[sl], g, "none")[1].all()):
                    spare.append(group)
                else:
                    kept.append(group)
            if not cfg.grpo.dynamic_sampling or len(kept) >= want or rounds >= cfg.grpo.max_resample_rounds:
                break
            rounds += 1
        kept = (kept + spare)[:want]
        rewards_all = torch.cat(all_rewards)
        per_func_all = torch.cat(all_per_func)
        _, zero_var_all = group_advantages(rewards_all, g, "none")
        return {
            "prompt_ids": [p for p, _, _ in kept for _ in range(g)],
            "completions": [c for _, cs, _ in kept for c in cs],
            "rewards": torch.cat([r for _, _, r in kept]),
            "rewards_all": rewards_all,
            "per_func_all": per_func_all,
            "completions_all": all_flat,
            "frac_zero_var": float(zero_var_all.float().mean()),
            "resample_rounds": rounds,
            "t_gen": t_gen,
            "t_score": t_score,
        }

    # -- training phase ---------------------------------------------------------------------------------

    def _forward_hidden(self, model, batch):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast):
            hidden = completion_hidden(model, batch)
        # With fp32 master weights the backbone's final norm returns fp32 even under autocast, and autocast
        # does not reach the fused loss: cast here so the vocab-sized GEMMs run in bf16 like an autocast
        # lm_head would (the loss casts the lm_head weight to hidden's dtype; it accumulates in fp32).
        return hidden.to(torch.bfloat16) if self.autocast else hidden

    def reference_logprobs(self, batch) -> torch.Tensor:
        """[B, T] logprobs of the reference policy: the frozen copy, or for a PEFT model the policy itself with
        its adapters disabled."""
        mb = self.config.run.micro_batch_size
        if self.ref_model is not None:
            return self._logprobs(self.ref_model, batch, mb)
        with self.model.disable_adapter():
            return self._logprobs(self.model, batch, mb)

    @torch.no_grad()
    def _logprobs(self, model, batch, mb: int) -> torch.Tensor:
        """[B, T] completion logprobs in eval mode (no dropout; the model's mode is restored)."""
        was_training = model.training
        model.eval()
        try:
            return self._logprobs_eval(model, batch, mb)
        finally:
            model.train(was_training)

    def _logprobs_eval(self, model, batch, mb: int) -> torch.Tensor:
        out = []
        for s in range(0, batch.input_ids.shape[0], mb):
            part = batch.rows(slice(s, s + mb)).to(self.device)
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

    def train_on_batch(self, data: dict) -> dict:
        cfg = self.config
        comps: list[Completion] = data["completions"]
        batch = build_sequence_batch(data["prompt_ids"], [c.token_ids for c in comps], self.tokenizer.pad_token_id)
        t = batch.completion_ids.shape[1]
        if cfg.grpo.mask_truncated_completions:
            trunc = torch.tensor([c.truncated for c in comps])
            batch.completion_mask[trunc] = False
        advantages, _ = group_advantages(data["rewards"], cfg.rollout.num_generations, cfg.grpo.scale_rewards)
        rollout_lp = torch.zeros(batch.completion_ids.shape)
        for i, c in enumerate(comps):
            if c.logprobs:
                rollout_lp[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
        has_rollout_lp = all(len(c.logprobs) == len(c.token_ids) for c in comps) and cfg.rollout.temperature > 0
        mb = cfg.run.micro_batch_size
        mask = batch.completion_mask
        stats: dict[str, float] = {}

        need_old = cfg.grpo.num_iterations > 1 or cfg.grpo.is_correction != "none" or has_rollout_lp
        old_lp = self._logprobs(self.model, batch, mb) if need_old else None
        ref_lp = self.reference_logprobs(batch) if cfg.grpo.beta > 0 else None
        self.model.train()
        is_weights = None
        if old_lp is not None and has_rollout_lp:
            diff = (old_lp - rollout_lp) * mask
            n_tok = mask.sum().clamp(min=1)
            stats["mismatch/abs_logprob_diff_mean"] = float(diff.abs().sum() / n_tok)
            stats["mismatch/kl_rollout_trainer"] = float(((rollout_lp - old_lp) * mask).sum() / n_tok)
            if cfg.grpo.is_correction == "token":
                is_weights = torch.exp(diff).clamp(max=cfg.grpo.is_cap) * mask
            elif cfg.grpo.is_correction == "sequence":
                is_weights = torch.exp(diff.sum(1)).clamp(max=cfg.grpo.is_cap)

        agg: dict[str, list[float]] = defaultdict(list)
        grad_norms = []
        for _ in range(cfg.grpo.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            self.accumulate_gradients(
                batch,
                advantages,
                old_lp if cfg.grpo.num_iterations > 1 else None,
                ref_lp,
                is_weights,
                agg,
            )
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.max_grad_norm)))
            self.optimizer.step()
            self.scheduler.step()
        stats["loss"] = float(np.sum(agg.pop("loss"))) / cfg.grpo.num_iterations
        for k, v in agg.items():
            stats[k] = float(np.mean(v))
        stats["grad_norm"] = float(np.mean(grad_norms))
        stats["lr"] = self.scheduler.get_last_lr()[0]
        stats["train_tokens"] = float(batch.attention_mask.sum()) * cfg.grpo.num_iterations
        stats["completion/padded_width"] = float(t)
        return stats

    def accumulate_gradients(self, batch, advantages, old_lp, ref_lp, is_weights, agg=None) -> None:
        """Backward of the loss of the whole `batch` as micro-batches of `run.micro_batch_size` rows, so that the
        accumulated gradient equals the gradient of `grpo_loss` on the whole batch at once.

        Each micro-batch's loss is scaled by its share s of the batch's normaliser: rows / B for grpo and
        dr_grpo (per-sequence means / a constant length per sequence), active tokens / N for bnpo (token mean of
        the micro-batch), 1 for dapo / cispo (given the batch's N as num_items_in_batch). The entropy bonus is a
        token mean over each call's own tokens: its coefficient becomes coef * tokens / (N * s) so that the
        bonus, too, is the batch's token mean."""
        mb = self.config.run.micro_batch_size
        mask = batch.completion_mask
        n_rows = batch.input_ids.shape[0]
        num_items = int(mask.sum())
        loss_type = self.loss_config.loss_type
        coef = self.loss_config.entropy_coef
        for s in range(0, n_rows, mb):
            sl = slice(s, s + mb)
            part = batch.rows(sl).to(self.device)
            rows, tokens = part.input_ids.shape[0], int(mask[sl].sum())
            if loss_type in ("dapo", "cispo"):
                scale = 1.0
            elif loss_type == "bnpo":
                scale = tokens / max(num_items, 1)
            else:
                scale = rows / n_rows
            config = self.loss_config
            if coef != 0.0:
                mb_coef = coef * tokens / (num_items * scale) if tokens and scale else 0.0
                config = dataclasses.replace(config, entropy_coef=mb_coef)
            hidden = self._forward_hidden(self.model, part)
            weight, bias = lm_head_params(self.model)
            if weight.dtype != hidden.dtype:
                weight = weight.to(hidden.dtype)
                bias = None if bias is None else bias.to(hidden.dtype)
            loss, m = _grpo_loss()(
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
            if scale != 1.0:
                loss = loss * scale
            loss.backward()
            if agg is not None:
                agg["loss"].append(float(loss.detach()))
                for k, v in m.items():
                    agg[k].append(float(v))

    # -- evaluation -------------------------------------------------------------------------------------

    def evaluate(self) -> dict:
        """Held-out accuracy with greedy decoding: fraction of prompts whose reward reaches the maximum
        (every weighted reward function at 1), and the mean reward."""
        if not self.eval_rows:
            return {}
        self._ensure_engine()
        ids = self._prompt_ids(self.eval_rows, list(range(len(self.eval_rows))), cache=False)
        spec = SamplingSpec(
            n=1,
            max_tokens=self.config.rollout.max_completion_length,
            temperature=0.0,
            stop_token_ids=self.stop_token_ids,
            seed=0,
        )
        t0 = time.perf_counter()
        outs = self.engine.generate(ids, spec)
        self.timers["eval"] += time.perf_counter() - t0
        rewards = combine_rewards(self.score(self.eval_rows, [g[0].text for g in outs]), self.reward_weights)
        full = sum(self.reward_weights)
        return {
            "eval/accuracy": float((rewards >= full - 1e-6).float().mean()),
            "eval/reward_mean": float(torch.nan_to_num(rewards, nan=0.0).mean()),
        }

    # -- checkpoints ------------------------------------------------------------------------------------

    def save(self) -> Path:
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "timers": dict(self.timers),
            "config": self.config.to_dict(),
        }
        was_offloaded = self.offloader.offloaded
        self.offloader.reload()  # optimizer state must be on its device to be saved as it will be loaded
        path = ckpt.save_checkpoint(self.output_dir / "checkpoints", self.step, self.model, self.tokenizer, state)
        if was_offloaded:
            self.offloader.offload()
        return path

    def resume(self, path: str | Path | None = None) -> bool:
        path = Path(path) if path else ckpt.latest_checkpoint(self.output_dir / "checkpoints")
        if path is None:
            logger.warning("resume requested but no checkpoint under %s: starting fresh", self.output_dir)
            return False
        ckpt.load_model_weights(self.model, path)
        state = ckpt.load_trainer_state(path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = state["step"]
        self.timers.update(state.get("timers", {}))
        ckpt.set_rng_state(state["rng"])
        logger.info("resumed from %s (step %d)", path, self.step)
        return True

    # -- the loop ---------------------------------------------------------------------------------------

    def sync_weights(self) -> dict:
        t0 = time.perf_counter()
        out = self.engine.load_weights(trainer_weights(self.model))
        dt = time.perf_counter() - t0
        self.timers["sync"] += dt
        return {**out, "time/sync": dt}

    def train(self) -> dict:
        """Runs `run.max_steps` steps (continuing a checkpoint with run.resume); returns the final metrics."""
        cfg = self.config
        self.output_dir.mkdir(parents=True, exist_ok=True)
        # The engine first: starting vLLM reseeds the global RNGs (set_random_seed), which would overwrite the
        # RNG states a resume restores.
        self._ensure_engine()
        if cfg.run.resume:
            self.resume()
        self.metrics = MetricsLogger(self.output_dir, tensorboard=cfg.run.tensorboard)
        self.metrics.truncate_after(self.step)
        self.sync_weights()  # the engine may hold other weights (reused engine, resumed run)
        bar = _progress(cfg.run.max_steps, self.step, cfg.run.progress)
        last: dict = {}
        if self.eval_rows and self.step == 0 and cfg.run.eval_every > 0:
            self.last_eval = self.evaluate()
            self.metrics.log(0, dict(self.last_eval))
        while self.step < cfg.run.max_steps:
            last = self.training_step()
            self.step += 1
            if (
                self.eval_rows
                and cfg.run.eval_every > 0
                and (self.step % cfg.run.eval_every == 0 or self.step == cfg.run.max_steps)
            ):
                self.last_eval = self.evaluate()
                last.update(self.last_eval)
            if self.step % cfg.run.log_every == 0 or self.step == cfg.run.max_steps:
                self.metrics.log(self.step, last)
            if cfg.run.save_every and self.step % cfg.run.save_every == 0:
                self.save()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    reward=f"{last['reward/mean']:.3f}",
                    acc=f"{self.last_eval.get('eval/accuracy', float('nan')):.2f}",
                )
        if bar is not None:
            bar.close()
        if cfg.run.save_final:
            self.save()
        if cfg.run.plots:
            from grpo_fast.trainer.plots import save_plots

            save_plots(self.metrics.history, self.output_dir / "plots")
        self.metrics.close()
        return last

    def training_step(self) -> dict:
        t_step = time.perf_counter()
        mem = memory_snapshot("generate")
        data = self.collect()
        self.engine.sleep()
        self.offloader.reload()
        mem.update(memory_snapshot("train_start"))
        t0 = time.perf_counter()
        stats = self.train_on_batch(data)
        t_train = time.perf_counter() - t0
        mem.update(memory_snapshot("train_end"))
        self.offloader.offload()
        mem.update(memory_snapshot("offloaded"))
        sync = self.sync_weights()
        self.timers["generate"] += data["t_gen"]
        self.timers["score"] += data["t_score"]
        self.timers["train"] += t_train

        flat = data["completions_all"]
        lengths = torch.tensor([len(c.token_ids) for c in flat], dtype=torch.float32)
        rewards = data["rewards_all"]
        out = {
            "reward/mean": reward_stats(rewards)[0],
            "reward/std": reward_stats(rewards)[1],
            "frac_zero_var_groups": data["frac_zero_var"],
            "resample_rounds": data["resample_rounds"],
            "completion/length_mean": float(lengths.mean()),
            "completion/length_p95": float(torch.quantile(lengths, 0.95)),
            "completion/truncated_frac": float(np.mean([c.truncated for c in flat])),
        }
        for j, fn in enumerate(self.reward_funcs):
            col = data["per_func_all"][:, j]
            col = col[~torch.isnan(col)]
            name = reward_name(fn)
            out[f"reward/{name}/mean"] = float(col.mean()) if col.numel() else math.nan
            out[f"reward/{name}/std"] = float(col.std()) if col.numel() > 1 else 0.0
        out.update(stats)
        out.update(mem)
        gen_tokens = float(lengths.sum())
        out.update(
            {
                "time/generate": data["t_gen"],
                "time/score": data["t_score"],
                "time/train": t_train,
                "time/sync": sync["time/sync"],
                "sync/bytes": sync.get("sync/bytes", 0.0),
                "time/step": time.perf_counter() - t_step,
                "tokens_per_second/train": stats["train_tokens"] / max(t_train, 1e-9),
                "tokens_per_second/generate": gen_tokens / max(data["t_gen"], 1e-9),
            }
        )
        return out


def _grpo_loss():
    from grpo_fast import grpo_loss

    return grpo_loss


def _has_vllm() -> bool:
    from grpo_fast.rollout.base import vllm_available

    return vllm_available()


def _as_rows(dataset) -> list[dict]:
    if dataset is None:
        return []
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    if rows and "prompt" not in rows[0]:
        raise ValueError(f"dataset rows need a 'prompt' column (got {sorted(rows[0])})")
    return rows


def _lr_lambda(optim, total_steps: int):
    warmup = optim.warmup_steps

    def fn(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if optim.lr_scheduler == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if optim.lr_scheduler == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return fn


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="grpo", dynamic_ncols=True)
