"""`grpo-fast demo`: the R1 recipe in miniature, entirely local.

1. Build a tiny Qwen2 model and a character tokenizer from the seed (nothing downloaded).
2. Cold-start SFT on *noisy* demonstrations of the task "(a*7)%10=" — a weak teacher that is right only
   `sft_correct_fraction` of the time and otherwise makes one systematic mistake (answer + 1 mod 10).
   SFT seeds the output format and puts real probability on the right answer, but greedy decoding
   follows the teacher's majority, so held-out accuracy starts low.
3. GRPO with real rollouts (vLLM when installed, else transformers) and the exact-match reward sharpens
   the policy towards the verifiably correct answers; held-out accuracy (greedy) is measured before and
   after RL on prompts never seen in training.

Writes DIR/summary.json, DIR/metrics.jsonl and DIR/plots/*.png.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from grpo_fast.data.tasks import exact_match_reward, modular_arithmetic_dataset
from grpo_fast.demo.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, save_tiny

logger = logging.getLogger(__name__)


@dataclass
class DemoConfig:
    output_dir: str = "runs/demo"
    seed: int = 0
    engine: str = "auto"
    multiplier: int = 7
    modulus: int = 10
    max_operand: int = 1000
    num_train: int = 800
    num_eval: int = 200
    sft_steps: int = 60
    sft_lr: float = 3e-3
    sft_correct_fraction: float = 0.3
    rl_steps: int = 100
    prompts_per_step: int = 16
    num_generations: int = 8
    rl_lr: float = 1e-3
    eval_every: int = 10
    progress: bool = True


def _noisy_teacher(rows: list[dict], fraction: float, modulus: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for r in rows:
        ans = int(r["answer"])
        pairs.append((r["prompt"], str(ans if rng.random() < fraction else (ans + 1) % modulus)))
    return pairs


def run_demo(cfg: DemoConfig | None = None, engine=None) -> dict:
    """Runs the demo; `engine` reuses an existing rollout engine of the same tiny architecture (tests)."""
    from grpo_fast.loss import GRPOLossConfig
    from grpo_fast.trainer.config import (
        ModelConfig,
        OptimConfig,
        RewardConfig,
        RolloutConfig,
        RunConfig,
        TrainConfig,
    )
    from grpo_fast.trainer.sft import sft_train
    from grpo_fast.trainer.trainer import GRPOTrainer, set_seed

    cfg = cfg or DemoConfig()
    t_start = time.perf_counter()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics.jsonl", "summary.json"):
        (out / stale).unlink(missing_ok=True)
    set_seed(cfg.seed)

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelSpec(), seed=cfg.seed)
    task = dict(modulus=cfg.modulus, max_operand=cfg.max_operand, ops="*", fixed_b=cfg.multiplier)
    eval_rows = modular_arithmetic_dataset(cfg.num_eval, seed=cfg.seed + 1, **task)
    train_rows = modular_arithmetic_dataset(
        cfg.num_train, seed=cfg.seed + 2, exclude={r["prompt"] for r in eval_rows}, **task
    )

    t0 = time.perf_counter()
    sft_losses = sft_train(
        model,
        tokenizer,
        _noisy_teacher(train_rows, cfg.sft_correct_fraction, cfg.modulus, cfg.seed),
        steps=cfg.sft_steps,
        batch_size=64,
        lr=cfg.sft_lr,
        seed=cfg.seed,
    )
    seconds_sft = time.perf_counter() - t0
    model_dir = save_tiny(model, tokenizer, out / "sft_model")

    config = TrainConfig(
        model=ModelConfig(path=str(model_dir)),
        reward=RewardConfig(funcs=["exact_match"]),
        rollout=RolloutConfig(
            engine=cfg.engine,
            num_generations=cfg.num_generations,
            max_completion_length=4,
            temperature=1.0,
            dtype="float32",
            max_model_len=64,
            kv_cache_memory_bytes=64 << 20,
        ),
        loss=GRPOLossConfig(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28),
        optim=OptimConfig(lr=cfg.rl_lr, max_grad_norm=1.0),
        run=RunConfig(
            output_dir=str(out),
            max_steps=cfg.rl_steps,
            prompts_per_step=cfg.prompts_per_step,
            micro_batch_size=128,
            seed=cfg.seed,
            eval_every=cfg.eval_every,
            save_final=False,
            tensorboard=False,
            progress=cfg.progress,
        ),
    )
    trainer = GRPOTrainer(
        model,
        [exact_match_reward],
        train_rows,
        config=config,
        eval_dataset=eval_rows,
        tokenizer=tokenizer,
        engine=engine,
    )
    trainer._ensure_engine()
    trainer.sync_weights()
    before = trainer.evaluate()
    t_rl = time.perf_counter()
    trainer.train()
    seconds_rl = time.perf_counter() - t_rl
    after = trainer.evaluate()
    history = trainer.metrics.history
    summary = {
        "accuracy_before_rl": before["eval/accuracy"],
        "accuracy_after_rl": after["eval/accuracy"],
        "improvement_pp": 100.0 * (after["eval/accuracy"] - before["eval/accuracy"]),
        "steps": trainer.step,
        "seconds_total": time.perf_counter() - t_start,
        "seconds_sft": seconds_sft,
        "seconds_rl": seconds_rl,
        "seconds_generate": trainer.timers["generate"],
        "seconds_score": trainer.timers["score"],
        "seconds_train": trainer.timers["train"],
        "seconds_sync": trainer.timers["sync"],
        "seconds_eval": trainer.timers["eval"],
        "rollout_engine": trainer.engine.name,
        "engine_startup_seconds": getattr(trainer.engine, "startup_seconds", 0.0),
        "sft_final_loss": sft_losses[-1] if sft_losses else None,
        "reward_first_step": history[1]["reward/mean"] if len(history) > 1 else None,
        "reward_last_step": history[-1].get("reward/mean"),
        "eval_accuracy_curve": [(r["step"], r["eval/accuracy"]) for r in history if "eval/accuracy" in r],
        "torch_threads": torch.get_num_threads(),
        "config": asdict(cfg),
        "metrics_jsonl": str(trainer.metrics.path),
        "plots_dir": str(out / "plots"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    trainer.close()  # the reward workers, and the engine unless the caller passed one
    return summary


def main(cfg: DemoConfig) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    summary = run_demo(cfg)
    print(
        f"held-out accuracy: {summary['accuracy_before_rl']:.1%} before RL -> {summary['accuracy_after_rl']:.1%} "
        f"after {summary['steps']} GRPO steps ({summary['rollout_engine']} rollouts); "
        f"{summary['seconds_total']:.0f} s total. Summary: {cfg.output_dir}/summary.json"
    )
    return summary
