"""`grpo-fast demo`: the R1 recipe in miniature, entirely local.

1. Build a tiny Qwen2 model and a character tokenizer from the seed (nothing downloaded).
2. Cold-start SFT on *noisy* demonstrations: a weak teacher that is right only `sft_correct_fraction` of
   the time and otherwise makes one systematic mistake. SFT seeds the output format and puts real
   probability on the right answer, but greedy decoding follows the teacher's majority, so held-out
   accuracy starts low.
3. GRPO with real rollouts (vLLM when installed, else transformers) and a verifiable reward sharpens the
   policy towards the verifiably correct answers; held-out accuracy (greedy) is measured before and after
   RL on prompts never seen in training.

Tasks (`DemoConfig.task`):
- "modular": "(a*7)%10=" -> the digit; reward: exact match.
- "tools": "1234*5678=" -> "7006652", with a `multiply(a, b)` tool (multi-turn rollouts, grpo_fast.rollout.multi_turn)
  and a chat tokenizer whose template renders tool calls. The tiny model cannot multiply; with the tool it
  only has to copy the factors into a call and the result into its answer. The teacher calls the tool
  `sft_correct_fraction` of the time and otherwise answers at once with the factors' digits side by side.
  Reward: exact match of the final answer. The summary adds the tool-call rate over training and held out.
- "code": "mul 7 mod 10:" -> a program "def f(x):return x*7%10"; reward: `code_tests`, the hidden assert
  tests run in the code sandbox through the trainer's reward pool; the teacher's mistake is multiplier
  + 1. With `forge_fraction` > 0 a rollout engine wrapper replaces that share of the completions with
  programs that try to forge the sandbox's answers, find the expected values, pass with objects of
  their own, or break the verifier (`FORGED_PROGRAMS`): the summary reports the reward they earned next
  to the reward of the same wrong function written honestly (an unscored forgery counts as above it).

Before RL the checks of grpo_fast.trainer.preflight run (verifier self-test, reward scale, prompt difficulty,
the held-out baseline); during RL the health alarms watch the run. Writes DIR/summary.json,
DIR/metrics.jsonl, DIR/plots/*.png, DIR/audit.html and the run report DIR/report.md (and .html).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from grpo_fast.core.optim import OptimConfig
from grpo_fast.core.policy import ModelConfig
from grpo_fast.core.seeding import set_seed
from grpo_fast.core.tiny_models import (
    TinyModelSpec,
    build_char_tokenizer,
    build_chat_tokenizer,
    build_tiny_model,
    save_tiny,
)
from grpo_fast.data.tasks import code_functions_dataset, modular_arithmetic_dataset, products_dataset
from grpo_fast.loss import GRPOLossConfig
from grpo_fast.rewards import code_tests
from grpo_fast.rollout.base import Completion, RolloutEngine
from grpo_fast.rollout.rollouts import TOOLS
from grpo_fast.rollout.tools import Tool
from grpo_fast.rollout.vllm_engine import VLLMOptions
from grpo_fast.sft.in_memory import sft_train
from grpo_fast.trainer.config import AlgorithmConfig, RewardConfig, RolloutConfig, RunConfig, TrainConfig
from grpo_fast.trainer.trainer import GRPOTrainer

logger = logging.getLogger(__name__)

# Programs that compute the wrong function f(x) = 0 and try to make the harness accept other answers:
# forged answer lines on every open file descriptor at import time; a patched interpreter; expected
# values looked for in the program's own process (the test's source and values, anywhere in memory);
# an object that equals everything, is false and subtracts to 0; answers that break the caller (nested
# too deep to read) or the sandbox (the runner killed mid-answer), so that the completion is skipped.
HONEST_WRONG_PROGRAM = "f=lambda x:0"
FORGED_PROGRAMS = (
    "import os\nf=lambda x:0\nfor fd in range(3, 1024):\n    try:\n"
    '        os.write(fd, b\'{"loaded": true}\\n\' + b\'{"ok": true, "value": "True"}\\n\' * 64)\n'
    "    except OSError:\n        pass\n",
    "import builtins, math, operator\nf=lambda x:0\nbuiltins.abs = lambda x: 0\n"
    "builtins.all = lambda x: True\nmath.isclose = lambda *a, **k: True\noperator.eq = lambda a, b: True\n",
    "import gc, re\ndef f(x):\n    for o in gc.get_objects():\n        if isinstance(o, str):\n"
    "            m = re.search(r'f\\(%d\\) == (\\d+)' % x, o)\n"
    "            if m:\n                return int(m.group(1))\n    return 0\n",
    "class Y:\n    __hash__ = None\n    def __eq__(s, o): return True\n    def __sub__(s, o): return 0\n"
    "    def __bool__(s): return False\n    __abs__ = __sub__\nf = lambda x: Y()\n",
    "def f(x):\n    v = 0\n    for _ in range(100000):\n        v = [v]\n    return v\n",
    "import os\ndef f(x):\n    os._exit(0)\n",
)


@dataclass
class DemoConfig:
    output_dir: str = "runs/demo"
    task: str = "modular"
    seed: int = 0
    engine: str = "vllm"  # the demo shows colocated vLLM rollouts ("auto" would pick transformers at this size)
    num_train: int = 800
    num_eval: int = 200
    sft_steps: int | None = None  # None: the task's (TASK_RECIPES)
    sft_lr: float = 3e-3
    sft_warmup_steps: int | None = None  # None: the task's
    sft_lr_scheduler: str | None = None  # None: the task's
    sft_correct_fraction: float = 0.3
    rl_steps: int | None = None  # None: the task's
    dynamic_sampling: bool | None = None  # None: the task's
    prompts_per_step: int = 16
    num_generations: int = 8
    rl_lr: float = 1e-3
    eval_every: int = 10
    forge_fraction: float = 0.0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.task not in TASK_RECIPES:
            raise ValueError(f"task: expected one of {sorted(TASK_RECIPES)}, got {self.task!r}")
        for name, value in asdict(TASK_RECIPES[self.task]).items():
            if getattr(self, name) is None:
                setattr(self, name, value)


@dataclass(frozen=True)
class TaskRecipe:
    """A task's default schedule: SFT steps with their warmup and lr schedule, then GRPO steps (with DAPO's
    dynamic sampling or not)."""

    sft_steps: int
    rl_steps: int
    sft_warmup_steps: int = 0
    sft_lr_scheduler: str = "constant"
    dynamic_sampling: bool = False


TASK_RECIPES = {
    "modular": TaskRecipe(sft_steps=150, rl_steps=40, sft_warmup_steps=15, sft_lr_scheduler="cosine"),
    "code": TaskRecipe(sft_steps=60, rl_steps=100),
    "tools": TaskRecipe(
        sft_steps=300, rl_steps=60, sft_warmup_steps=30, sft_lr_scheduler="cosine", dynamic_sampling=True
    ),
}
"""task -> its default schedule. modular: the SFT runs to the noisy teacher's distribution on every seed (warmup and
cosine decay; loss ~0.30 per token, the teacher's entropy H(0.3) / 2 = 0.31), so RL starts with the right answer at
~30% on every prompt and finds it in one group in ~94% of the groups. 60 constant steps stopped at a loss of 0.44 to
1.13 depending on the seed, leaving some last digits with the right answer never sampled (seed 4: 69% of the probe's
groups without a reward) and the held-out accuracy after RL anywhere from 28% to 100% by seed and CPU. tools: its
longer demonstrations (copying two factors into a call and its result into the answer) need more SFT before sampling
finds the tool often enough, and both fixes of benchmarks/NOTES.md's five-seed runs: 300 constant-lr SFT steps
plateaued at a loss of 0.14-0.17 on seeds 3 and 4 (0.06 on seeds 0-2), which then never earned a reward (0% held
out), and the same warmup and cosine decay as modular bring every seed to ~0.036; with it alone two other seeds'
early rewards were too rare to hold (0.21 and 0.00 held out), and dynamic sampling (groups that all scored alike
replaced, up to two extra rounds a step) gives every seed's RL enough groups to learn from (0.52-0.83 held out on
seeds 0-4, RL ~1.7x as long)."""


@dataclass(frozen=True)
class DemoTask:
    """Rows to train and evaluate on, the noisy teacher's (prompt, completion) pairs (a completion: text, or chat
    messages with tool calls), the reward specs, the tools (registered names) the model may call."""

    train_rows: list[dict]
    eval_rows: list[dict]
    teacher_pairs: list[tuple[str, str | list[dict]]]
    rewards: list
    max_completion_length: int
    tools: tuple[str, ...] = ()


def build_task(cfg: DemoConfig) -> DemoTask:
    rng = random.Random(cfg.seed)
    if cfg.task == "modular":
        task = dict(modulus=10, max_operand=1000, ops="*", fixed_b=7)
        eval_rows = modular_arithmetic_dataset(cfg.num_eval, seed=cfg.seed + 1, **task)
        train_rows = modular_arithmetic_dataset(
            cfg.num_train, seed=cfg.seed + 2, exclude={r["prompt"] for r in eval_rows}, **task
        )
        pairs = [
            (r["prompt"], r["answer"] if rng.random() < cfg.sft_correct_fraction else str((int(r["answer"]) + 1) % 10))
            for r in train_rows
        ]
        return DemoTask(train_rows, eval_rows, pairs, ["exact_match"], max_completion_length=4)
    if cfg.task == "code":
        rows = code_functions_dataset(seed=cfg.seed)
        eval_rows, train_rows = rows[: len(rows) // 4], rows[len(rows) // 4 :]
        pairs = []
        for r in train_rows:
            _, k, _, m = r["prompt"].rstrip(":").split()
            wrong = f"def f(x):return x*{int(k) + 1}%{m}"
            pairs.append((r["prompt"], r["answer"] if rng.random() < cfg.sft_correct_fraction else wrong))
        return DemoTask(train_rows, eval_rows, pairs, ["code_tests"], max_completion_length=28)
    if cfg.task == "tools":
        eval_rows = products_dataset(cfg.num_eval, seed=cfg.seed + 1)
        train_rows = products_dataset(cfg.num_train, seed=cfg.seed + 2, exclude={r["prompt"] for r in eval_rows})
        pairs = [(r["prompt"], tool_demonstration(r, rng.random() < cfg.sft_correct_fraction)) for r in train_rows]
        return DemoTask(train_rows, eval_rows, pairs, ["exact_match"], max_completion_length=64, tools=("multiply",))
    raise ValueError(f"task: expected 'modular', 'code' or 'tools', got {cfg.task!r}")


def tool_demonstration(row: dict, calls_tool: bool) -> list[dict]:
    """The tool task teacher's completion of `row`: the multiply call, its result and the answer; or (its mistake)
    an immediate answer writing the two factors side by side."""
    a, b = (int(x) for x in row["prompt"].rstrip("=").split("*"))
    if not calls_tool:
        return [{"role": "assistant", "content": f"{a}{b}"}]
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "multiply", "content": str(a * b)},
        {"role": "assistant", "content": str(a * b)},
    ]


class ForgingEngine(RolloutEngine):
    """A rollout engine that passes through `inner`'s completions but replaces a `fraction` of them (chosen
    at random) with one of FORGED_PROGRAMS; `is_forged(completion)` tells them apart."""

    name = "forging"

    def __init__(self, inner: RolloutEngine, fraction: float, seed: int) -> None:
        self.inner, self.fraction, self.rng = inner, fraction, random.Random(seed)
        self.shares_trainer_model = inner.shares_trainer_model
        self._forged: dict[int, Completion] = {}  # by id; holding them keeps their ids from being reused

    @classmethod
    def from_config(cls, config, *, options, model, tokenizer, export_model):
        raise NotImplementedError("ForgingEngine wraps an engine built elsewhere")

    def generate(self, prompt_token_ids, sampling):
        groups = self.inner.generate(prompt_token_ids, sampling)
        if sampling.temperature == 0:  # held-out evaluation stays honest
            return groups
        out = []
        for group in groups:
            out.append([self._maybe_forge(c) for c in group])
        return out

    def _maybe_forge(self, completion: Completion) -> Completion:
        if self.rng.random() >= self.fraction:
            return completion
        # The trainer trains on the token ids; the reward sees the forged text.
        forged = Completion(completion.token_ids, completion.logprobs, self.rng.choice(FORGED_PROGRAMS), "stop")
        self._forged[id(forged)] = forged
        return forged

    def is_forged(self, completion: Completion) -> bool:
        return self._forged.get(id(completion)) is completion

    def load_weights(self, weights):
        return self.inner.load_weights(weights)

    def sleep(self) -> None:
        self.inner.sleep()

    def wake_up(self) -> None:
        self.inner.wake_up()

    def close(self) -> None:
        self.inner.close()


def run_demo(cfg: DemoConfig | None = None, engine=None) -> dict:
    """Runs the demo; `engine` reuses an existing rollout engine of the same tiny architecture (tests)."""
    cfg = cfg or DemoConfig()
    t_start = time.perf_counter()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics.jsonl", "summary.json"):
        (out / stale).unlink(missing_ok=True)
    set_seed(cfg.seed)

    task = build_task(cfg)
    tokenizer = build_chat_tokenizer() if task.tools else build_char_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelSpec(), seed=cfg.seed)
    schemas = [Tool.of(TOOLS.get(name)).schema for name in task.tools] or None
    t0 = time.perf_counter()
    sft_losses = sft_train(
        model,
        tokenizer,
        task.teacher_pairs,
        steps=cfg.sft_steps,
        batch_size=64,
        lr=cfg.sft_lr,
        seed=cfg.seed,
        tools=schemas,
        warmup_steps=cfg.sft_warmup_steps,
        lr_scheduler=cfg.sft_lr_scheduler,
    )
    seconds_sft = time.perf_counter() - t0
    model_dir = save_tiny(model, tokenizer, out / "sft_model")

    ledger = ForgeryLedger()
    trainer = GRPOTrainer(
        model,
        task.rewards,
        task.train_rows,
        config=demo_train_config(cfg, task, model_dir),
        eval_dataset=task.eval_rows,
        tokenizer=tokenizer,
        engine=engine,
        callbacks=[ledger.record] if cfg.forge_fraction > 0 else (),
    )
    trainer._ensure_engine()
    if cfg.forge_fraction > 0:
        trainer.engine = ForgingEngine(trainer.engine, cfg.forge_fraction, cfg.seed)
    preflight = trainer.preflight()  # verifier self-test, reward scale, difficulty, held-out baseline
    before = {k.replace("start/", "eval/"): v for k, v in preflight.baselines.items()}
    t_rl = time.perf_counter()
    trainer.train()
    seconds_rl = time.perf_counter() - t_rl
    after = trainer.evaluate()
    summary = {
        "task": cfg.task,
        "accuracy_before_rl": before["eval/accuracy"],
        "accuracy_after_rl": after["eval/accuracy"],
        **{
            f"tool_call_rate_{when}_rl": r["eval/tool_call_rate"]
            for when, r in (("before", before), ("after", after))
            if "eval/tool_call_rate" in r
        },
        "improvement_pp": 100.0 * (after["eval/accuracy"] - before["eval/accuracy"]),
        "reward_before_rl": before["eval/reward_mean"],
        "reward_after_rl": after["eval/reward_mean"],
        "preflight": preflight.to_dict(),
        "seconds_total": time.perf_counter() - t_start,
        "seconds_sft": seconds_sft,
        "seconds_rl": seconds_rl,
        "sft_final_loss": sft_losses[-1] if sft_losses else None,
        **_run_summary(trainer),
        "config": asdict(cfg),
        "plots_dir": str(out / "plots"),
    }
    if cfg.forge_fraction > 0:
        rows = {tuple(trainer.prompts.encode(r["prompt"])): r for r in task.train_rows}
        summary |= _forging_summary([(rows[ids], reward) for ids, reward in ledger.forged], ledger.others)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    trainer.close()  # the reward workers, and the engine unless the caller passed one
    return summary


def demo_train_config(cfg: DemoConfig, task: DemoTask, model_dir: Path) -> TrainConfig:
    """The GRPO run of the demo: dapo with clip-higher (and the task's dynamic sampling), the tiny model's engine
    settings, no checkpoints."""
    return TrainConfig(
        model=ModelConfig(path=str(model_dir)),
        reward=RewardConfig(funcs=task.rewards),
        rollout=RolloutConfig(
            engine=cfg.engine,
            num_generations=cfg.num_generations,
            max_completion_length=task.max_completion_length,
            temperature=1.0,
            max_model_len=128 if task.tools else 64,
            tools=list(task.tools),
            max_tool_calling_iterations=2 if task.tools else None,
            vllm=VLLMOptions(dtype="float32", kv_cache_memory_bytes=64 << 20),
        ),
        loss=GRPOLossConfig(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28),
        grpo=AlgorithmConfig(dynamic_sampling=cfg.dynamic_sampling),
        optim=OptimConfig(lr=cfg.rl_lr, max_grad_norm=1.0),
        run=RunConfig(
            output_dir=str(Path(cfg.output_dir)),
            max_steps=cfg.rl_steps,
            prompts_per_step=cfg.prompts_per_step,
            micro_batch_size=128,
            seed=cfg.seed,
            eval_every=cfg.eval_every,
            save_final=False,
            report_to=[],
            progress=cfg.progress,
        ),
    )


class ForgeryLedger:
    """A step callback that sorts the step's completions: (prompt token ids, reward) of the forged ones, and the
    rewards of the others."""

    def __init__(self) -> None:
        self.forged: list[tuple[tuple[int, ...], float]] = []
        self.others: list[float] = []

    def record(self, trainer, rollout, metrics) -> None:
        batch = zip(rollout.prompt_ids, rollout.completions, rollout.rewards.tolist(), strict=True)
        for prompt_ids, completion, reward in batch:
            if trainer.engine.is_forged(completion):
                self.forged.append((tuple(prompt_ids), reward))
            else:
                self.others.append(reward)


def _run_summary(trainer: GRPOTrainer) -> dict:
    """The trained run's steps, alarms, phase times, engine, reward curve and held-out accuracy curve."""
    history = trainer.metrics.history
    engine = getattr(trainer.engine, "inner", trainer.engine)
    best = trainer.best_model.best if trainer.best_model is not None else None
    return {
        "alarms": [a.line() for a in trainer.health.alarms],
        "best_heldout": None if best is None else asdict(best) | {"model": str(trainer.best_model.directory)},
        "steps": trainer.step,
        **{f"seconds_{phase}": trainer.timers[phase] for phase in ("generate", "score", "train", "sync", "eval")},
        "rollout_engine": engine.name,
        "engine_startup_seconds": getattr(engine, "startup_seconds", 0.0),
        "reward_first_step": history[1]["reward/mean"] if len(history) > 1 else None,
        "reward_last_step": history[-1].get("reward/mean"),
        "eval_accuracy_curve": [(r["step"], r["eval/accuracy"]) for r in history if "eval/accuracy" in r],
        "tool_call_rate_curve": [
            (r["step"], r["tools/rollouts_calling_frac"]) for r in history if "tools/calls_per_rollout" in r
        ],
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "metrics_jsonl": str(trainer.metrics.path),
    }


def _forging_summary(forged: list[tuple[dict, float]], others: list[float]) -> dict:
    """Each forged completion's reward against the reward of the same wrong function, written honestly,
    on the same row (the forgery is worth something only where it earns more)."""

    rows = {r["prompt"]: r for r, _ in forged}
    honest = dict(
        zip(
            rows,
            code_tests(list(rows), [HONEST_WRONG_PROGRAM] * len(rows), [r["tests"] for r in rows.values()]),
            strict=True,
        )
    )
    gains = [reward - honest[row["prompt"]] for row, reward in forged]
    return {
        "forged_completions": len(forged),
        "forged_reward_mean": sum(r for _, r in forged) / max(len(forged), 1),
        "honest_wrong_reward_mean": sum(honest[row["prompt"]] for row, _ in forged) / max(len(forged), 1),
        # An unscored forgery (NaN: skipped, advantage 0) counts as above its honest twin: skipping pays.
        "forged_above_honest": sum(not gain <= 1e-9 for gain in gains),
        "forged_unscored": sum(math.isnan(reward) for _, reward in forged),
        "forged_gain_max": max(gains, default=0.0),
        "other_completions_reward_mean": sum(others) / max(len(others), 1),
    }


def main(cfg: DemoConfig) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    summary = run_demo(cfg)
    print(
        f"held-out accuracy: {summary['accuracy_before_rl']:.1%} before RL -> {summary['accuracy_after_rl']:.1%} "
        f"after {summary['steps']} GRPO steps ({summary['rollout_engine']} rollouts); "
        f"{summary['seconds_total']:.0f} s total. Summary: {cfg.output_dir}/summary.json"
    )
    if summary["best_heldout"] is not None:
        best = summary["best_heldout"]
        print(f"best held-out model: {best['accuracy']:.1%} at step {best['step']}, in {best['model']}")
    if "forged_reward_mean" in summary:
        print(
            f"forged-answer programs: {summary['forged_completions']} completions, mean reward "
            f"{summary['forged_reward_mean']:.3f}; the same wrong function written honestly on the same rows: "
            f"{summary['honest_wrong_reward_mean']:.3f}; forged completions above their honest reward: "
            f"{summary['forged_above_honest']} (unscored: {summary['forged_unscored']})"
        )
    return summary
