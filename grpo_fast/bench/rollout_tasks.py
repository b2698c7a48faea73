"""The tasks of the rollout-mode benchmark (benchmarks/bench_async.py): each builds its cold-start model for a seed
and gives its rows, rewards and the training settings every variant of it shares.

- "long_tail": grpo_fast.bench.long_tail (a tenth of the completions think to near the 512-token limit).
- "demo": `grpo-fast demo`'s modular task ("(a*7)%10=" -> the digit, 4 tokens at most): no long tail at all.
- "tools": `grpo-fast demo --task tools`'s task ("1234*5678=" -> the product through a `multiply` tool call:
  multi-turn rollouts, at most 2 rounds of tool calls in 64 tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo_fast.core.tiny_models import save_tiny


@dataclass(frozen=True)
class RolloutTask:
    """`cold_start(seed)` -> (model, tokenizer, sft_steps) trained; `rows(seed)` -> (train rows, held-out rows);
    `rewards`; `settings`: the config overrides every variant of the task shares; `limit`: completion tokens."""

    name: str
    cold_start: Callable[[int, int | None], tuple]
    rows: Callable[[int], tuple[list[dict], list[dict]]]
    rewards: list
    settings: list[str]
    limit: int


def sft_dir(task: RolloutTask, work: Path, seed: int, sft_steps: int | None = None) -> Path:
    """The seed's cold-start model directory, trained once and reused."""
    path = work / f"{task.name}_sft_seed{seed}" if task.name != "long_tail" else work / f"sft_seed{seed}"
    if sft_steps is not None:
        path = path.with_name(f"{path.name}_sft{sft_steps}")
    if not (path / "config.json").exists():
        model, tokenizer = task.cold_start(seed, sft_steps)
        save_tiny(model, tokenizer, path)
    return path


def _long_tail(limit: int = 512) -> RolloutTask:
    from grpo_fast.bench.long_tail import cold_start_model, final_digit_reward, long_tail_task

    def cold_start(seed: int, steps: int | None):
        return cold_start_model(long_tail_task(seed, limit), seed, **({} if steps is None else {"steps": steps}))

    def rows(seed: int):
        task = long_tail_task(seed, limit)
        return task.train_rows, task.eval_rows

    settings = [
        "rollout.num_generations=8",
        f"rollout.max_completion_length={limit}",
        f"rollout.max_model_len={limit + 64}",
        f"rollout.vllm.kv_cache_memory_bytes={256 << 20}",
        "loss.loss_type=grpo",
        "loss.beta=0.1",  # the KL anchor to the SFT policy keeps the length distribution where SFT put it
        "optim.lr=1e-3",
        "run.micro_batch_size=64",
    ]
    return RolloutTask("long_tail", cold_start, rows, [final_digit_reward], settings, limit)


def _demo(name: str, task_name: str) -> RolloutTask:
    """`grpo-fast demo --task <task_name>`'s data, SFT steps and loss settings (grpo_fast.demo.driver), with a
    constant-lr SFT and without dynamic sampling: the settings the tables of docs/benchmarks.md were measured with,
    before the demo's recipes took an lr schedule (modular, tools) and dynamic sampling (tools). Resampling rounds
    would also make the modes' step times depend on how many groups each happens to replace."""
    from grpo_fast.core.tiny_models import build_char_tokenizer, build_chat_tokenizer, build_tiny_model
    from grpo_fast.demo.driver import DemoConfig, build_task
    from grpo_fast.rollout.rollouts import TOOLS
    from grpo_fast.rollout.tools import Tool
    from grpo_fast.sft.in_memory import sft_train

    def cold_start(seed: int, steps: int | None):
        cfg = DemoConfig(task=task_name, seed=seed, sft_steps=steps)
        task = build_task(cfg)
        tokenizer = build_chat_tokenizer() if task.tools else build_char_tokenizer()
        model = build_tiny_model(tokenizer, seed=seed)
        schemas = [Tool.of(TOOLS.get(name)).schema for name in task.tools] or None
        sft_train(
            model, tokenizer, task.teacher_pairs, steps=cfg.sft_steps, batch_size=64, lr=cfg.sft_lr, seed=seed,
            tools=schemas,
        )  # fmt: skip
        return model, tokenizer

    def rows(seed: int):
        task = build_task(DemoConfig(task=task_name, seed=seed))
        return task.train_rows, task.eval_rows

    task = build_task(DemoConfig(task=task_name, num_train=1, num_eval=1))
    settings = [
        "rollout.num_generations=8",
        f"rollout.max_completion_length={task.max_completion_length}",
        f"rollout.max_model_len={128 if task.tools else 64}",
        f"rollout.vllm.kv_cache_memory_bytes={64 << 20}",
        "loss.loss_type=dapo",
        "loss.epsilon_low=0.2",
        "loss.epsilon_high=0.28",
        "optim.lr=1e-3",
        "optim.max_grad_norm=1.0",
        "run.micro_batch_size=128",
    ]
    if task.tools:
        settings += [f"rollout.tools=[{','.join(task.tools)}]", "rollout.max_tool_calling_iterations=2"]
    return RolloutTask(name, cold_start, rows, list(task.rewards), settings, task.max_completion_length)


TASKS: dict[str, Callable[[], RolloutTask]] = {
    "long_tail": _long_tail,
    "demo": lambda: _demo("demo", "modular"),
    "tools": lambda: _demo("tools", "tools"),
}
