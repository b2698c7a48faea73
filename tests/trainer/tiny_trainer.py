"""The smallest real training run the trainer tests share: the tiny model, 2 prompts x 2 completions of at most
2 tokens per step, the transformers engine, exact-match rewards in-process, no evaluation, TensorBoard, plots or
progress bar; `overrides` are `key=value` strings of the config."""

from __future__ import annotations

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.tasks import exact_match_reward
from grpo_fast.trainer import GRPOTrainer, load_config

BASE_OPTIONS = (
    "rollout.engine=hf",
    "rollout.num_generations=2",
    "rollout.max_completion_length=2",
    "run.prompts_per_step=2",
    "run.eval_every=0",
    "reward.workers=0",
    "run.report_to=[]",
    "run.progress=false",
    "run.plots=false",
)


def tiny_trainer(
    out, *overrides: str, device: str = "cpu", rewards=(exact_match_reward,), columns: dict | None = None
) -> GRPOTrainer:
    """A GRPOTrainer writing to `out`, on `device`, with the reward specs `rewards`, on modular-arithmetic rows (with
    the extra `columns`, for rewards that need them)."""
    tok = build_char_tokenizer()
    config = load_config(None, [*BASE_OPTIONS, f"run.output_dir={out}", *overrides])
    rows = [{**row, **(columns or {})} for row in modular_arithmetic_dataset(8, seed=0)]
    return GRPOTrainer(build_tiny_model(tok).to(device), list(rewards), rows, config=config, tokenizer=tok)
