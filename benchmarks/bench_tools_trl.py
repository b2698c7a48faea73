"""TRL 1.16's GRPOTrainer against grpo_fast's on the demo's tool task, side by side on CPU: the same SFT checkpoint,
prompts, reward, batch and settings, the same wall-clock training budget; then the held-out accuracy and tool-call
rate of each one's final weights, measured by one evaluator.

    python benchmarks/bench_tools_trl.py [--seeds 0] [--budget-seconds 150] [--work /tmp/grpo_fast_bench_tools_trl]
        [--out benchmarks/results/tools_trl_cpu.json] [--merge]

The task is `grpo-fast demo --task tools` (grpo_fast.demo.driver): "1234*5678=" -> "7006652" with the tool
`multiply(a, b)` (grpo_fast.rollout.builtin_tools), the tiny Qwen2 and its chat tokenizer after the demo's
cold-start SFT on noisy tool-call demonstrations. One SFT checkpoint per seed, built once under --work and loaded
by both contenders and by the evaluator.

Held equal: the prompts, chat messages [{"role": "user", "content": "1234*5678="}] rendered with the tool by the
tokenizer's chat template; the reward, `final_answer_reward` below (exact match of the last assistant message's
content); 16 prompts x 8 completions per step, all of them in one optimizer step and one forward + backward (TRL:
per_device_train_batch_size 128, gradient_accumulation_steps 1, so that its generation batch is the same 128
completions); max_completion_length 64 tokens, sampled and tool-result tokens together, with at most 2 rounds of
tool calls; temperature 1.0; TRL 1.16's default loss, dapo, clipping the ratio at [0.8, 1.2], beta 0, one policy
update per generation; AdamW with lr 1e-3 constant, betas (0.9, 0.999) (TRL's defaults; grpo_fast's beta2 default
0.99 is set to 0.999), eps 1e-8, no weight decay, max_grad_norm 1.0; fp32; no evaluation, checkpoint or logging
during training. Generation: TRL's transformers `generate` (use_vllm=False), grpo_fast's transformers engine
(rollout.engine=hf). Rewards are scored in the trainer's process on both sides (grpo_fast: reward.workers=0).
Left to each: the order of the training prompts (each shuffles with the seed), grpo_fast's packing and its launch
checklist (off: health.preflight false, as TRL has none).

Measured, per seed and contender, each run in its own interpreter (TRL's imports neither grpo_fast's trainer nor
its loss): the steps done within --budget-seconds of training time (the clock starts when the first step starts;
training stops after the first step that ends past the budget), each step's seconds (from the previous step's end,
the first from its start: TRL's on_step_begin / on_step_end, grpo_fast's step callback and the step's own
time/step), their mean, and the training seconds. Held-out accuracy and tool-call rate before (the SFT checkpoint)
and after (each contender's final weights, saved at the end: TRL's `trainer.save_model`): grpo_fast's
`GRPOTrainer.evaluate()` in a process of its own, on the demo's 200 held-out rows, greedy, multi-turn with the
same tool and limits, with the SFT checkpoint's tokenizer. Within a seed the contenders alternate which trains
first (even seeds grpo_fast, odd seeds TRL). The JSON is rewritten after every run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from grpo_fast.bench.common import environment_stamp, run_json_subprocess, write_json

CONTENDERS = ("grpo_fast", "trl")
MAX_STEPS = 100_000  # a cap never reached: the budget stops training (the learning rate is constant)
SETTINGS = {
    "prompts_per_step": 16,
    "num_generations": 8,
    "max_completion_length": 64,
    "max_model_len": 128,  # grpo_fast's prompt + completion limit (the tiny model's positions)
    "max_tool_calling_iterations": 2,
    "temperature": 1.0,
    "loss_type": "dapo",
    "epsilon": 0.2,
    "beta": 0.0,
    "learning_rate": 1e-3,
    "adam_betas": (0.9, 0.999),
    "max_grad_norm": 1.0,
    "eval_prompts": 200,  # the demo's held-out rows
}
"""The settings both contenders train with (see the module doc)."""


def final_answer_reward(completions, answer, **kwargs) -> list[float]:
    """TRL's reward signature: 1.0 where the content of a completion's last assistant message, stripped, is the
    answer, else 0.0 (completions are message lists: assistant turns with their tool calls, tool results)."""
    return [float(final_content(c).strip() == a.strip()) for c, a in zip(completions, answer, strict=True)]


def final_content(messages: list[dict]) -> str:
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    return (last or {}).get("content") or ""


class BudgetClock:
    """Step ends on one clock that starts when the first step starts; whether the training budget is spent."""

    def __init__(self, budget_seconds: float) -> None:
        self.budget_seconds = budget_seconds
        self.start: float | None = None
        self.ends: list[float] = []

    def step_started(self, at: float) -> None:
        if self.start is None:
            self.start = at

    def step_ended(self) -> bool:
        """Records the end of a step; True when the budget is spent."""
        self.ends.append(time.perf_counter() - self.start)
        return self.ends[-1] >= self.budget_seconds

    def summary(self) -> dict:
        seconds = [end - before for before, end in itertools.pairwise([0.0, *self.ends])]
        return {
            "steps": len(seconds),
            "step_seconds": seconds,
            "step_seconds_mean": sum(seconds) / max(len(seconds), 1),
            "seconds_train": self.ends[-1] if self.ends else 0.0,
        }


# -- the shared inputs: rows and the SFT checkpoint -------------------------------------------------------------


def prepare_seed(seed_dir: Path, seed: int) -> None:
    """The seed's rows (chat prompts, answers) in seed_dir/rows.json and its SFT checkpoint in seed_dir/sft, built
    as the demo builds them, once."""
    if (seed_dir / "rows.json").exists() and (seed_dir / "sft" / "config.json").exists():
        return
    from grpo_fast.core.seeding import set_seed
    from grpo_fast.core.tiny_models import TinyModelSpec, build_chat_tokenizer, build_tiny_model, save_tiny
    from grpo_fast.demo.driver import TASK_RECIPES, DemoConfig, build_task
    from grpo_fast.rollout.builtin_tools import multiply
    from grpo_fast.rollout.tools import Tool
    from grpo_fast.sft.in_memory import sft_train

    set_seed(seed)
    task = build_task(DemoConfig(task="tools", seed=seed, num_eval=SETTINGS["eval_prompts"]))
    tokenizer = build_chat_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelSpec(), seed=seed)
    schema = Tool.of(multiply).schema
    steps = TASK_RECIPES["tools"].sft_steps
    sft_train(model, tokenizer, task.teacher_pairs, steps=steps, batch_size=64, lr=3e-3, seed=seed, tools=[schema])
    save_tiny(model, tokenizer, seed_dir / "sft")
    rows = {"train": chat_rows(task.train_rows), "eval": chat_rows(task.eval_rows)}
    (seed_dir / "rows.json").write_text(json.dumps(rows))


def chat_rows(rows: list[dict]) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows]


def load_rows(seed_dir: Path, split: str) -> list[dict]:
    return json.loads((seed_dir / "rows.json").read_text())[split]


# -- grpo_fast: training and the evaluator ----------------------------------------------------------------------


def grpo_fast_config(seed: int, output_dir: Path):
    """grpo_fast's side of SETTINGS (also the evaluator's: the same tool, limits and greedy decoding)."""
    from grpo_fast.core.optim import OptimConfig
    from grpo_fast.core.policy import ModelConfig
    from grpo_fast.loss import GRPOLossConfig
    from grpo_fast.trainer.config import HealthConfig, RewardConfig, RolloutConfig, RunConfig, TrainConfig

    s = SETTINGS
    return TrainConfig(
        model=ModelConfig(dtype="float32"),
        reward=RewardConfig(workers=0),
        rollout=RolloutConfig(
            engine="hf",
            num_generations=s["num_generations"],
            max_completion_length=s["max_completion_length"],
            max_model_len=s["max_model_len"],
            temperature=s["temperature"],
            tools=["multiply"],
            max_tool_calling_iterations=s["max_tool_calling_iterations"],
        ),
        loss=GRPOLossConfig(
            loss_type=s["loss_type"], epsilon_low=s["epsilon"], epsilon_high=s["epsilon"], beta=s["beta"]
        ),
        optim=OptimConfig(
            lr=s["learning_rate"],
            beta1=s["adam_betas"][0],
            beta2=s["adam_betas"][1],
            eps=1e-8,
            weight_decay=0.0,
            lr_scheduler="constant",
            max_grad_norm=s["max_grad_norm"],
        ),
        run=RunConfig(
            output_dir=str(output_dir),
            max_steps=MAX_STEPS,
            prompts_per_step=s["prompts_per_step"],
            micro_batch_size=s["prompts_per_step"] * s["num_generations"],
            seed=seed,
            eval_every=0,
            save_final=False,
            overwrite=True,
            report_to=[],
            progress=False,
            plots=False,
        ),
        health=HealthConfig(preflight=False),
    )


def train_grpo_fast(seed_dir: Path, seed: int, budget_seconds: float) -> dict:
    """grpo_fast's run: train until the budget is spent, save the final weights to seed_dir/grpo_fast/final."""
    from grpo_fast.core.tiny_models import save_tiny
    from grpo_fast.trainer import GRPOTrainer

    clock = BudgetClock(budget_seconds)

    def on_step(trainer, rollout, metrics) -> None:
        # The step callback runs at the end of a step, before train() counts it: max_steps = this step ends the run.
        clock.step_started(time.perf_counter() - metrics["time/step"])
        if clock.step_ended():
            trainer.config.run.max_steps = trainer.step + 1

    out = seed_dir / "grpo_fast"
    trainer = GRPOTrainer(
        str(seed_dir / "sft"),
        [final_answer_reward],
        load_rows(seed_dir, "train"),
        config=grpo_fast_config(seed, out),
        callbacks=[on_step],
    )
    trainer.train()
    save_tiny(trainer.model, trainer.tokenizer, out / "final")
    trainer.close()
    return clock.summary()


def evaluate(seed_dir: Path, seed: int, model_dir: Path) -> dict:
    """Held-out accuracy and tool-call rate of `model_dir` (greedy, grpo_fast's evaluator, the SFT tokenizer)."""
    from grpo_fast.data.tokenizer import load_tokenizer
    from grpo_fast.trainer import GRPOTrainer

    eval_rows = load_rows(seed_dir, "eval")
    trainer = GRPOTrainer(
        str(model_dir),
        [final_answer_reward],
        eval_rows,
        config=grpo_fast_config(seed, seed_dir / "eval"),
        eval_dataset=eval_rows,
        tokenizer=load_tokenizer(str(seed_dir / "sft")),
    )
    result = trainer.evaluate()
    trainer.close()
    return {"accuracy": result["eval/accuracy"], "tool_call_rate": result["eval/tool_call_rate"]}


# -- TRL --------------------------------------------------------------------------------------------------------


def trl_config(seed: int, output_dir: Path):
    """TRL's side of SETTINGS: its GRPOConfig batch counts completions, so one optimizer step of 16 prompts x 8
    completions is per_device_train_batch_size 128 with no gradient accumulation (its generation batch, per device
    batch x steps_per_generation = gradient_accumulation_steps, is then the same 128)."""
    import trl

    s = SETTINGS
    return trl.GRPOConfig(
        output_dir=str(output_dir),
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=s["prompts_per_step"] * s["num_generations"],
        gradient_accumulation_steps=1,
        num_generations=s["num_generations"],
        max_completion_length=s["max_completion_length"],
        max_tool_calling_iterations=s["max_tool_calling_iterations"],
        temperature=s["temperature"],
        loss_type=s["loss_type"],
        epsilon=s["epsilon"],
        epsilon_high=s["epsilon"],
        beta=s["beta"],
        num_iterations=1,
        learning_rate=s["learning_rate"],
        lr_scheduler_type="constant",
        adam_beta1=s["adam_betas"][0],
        adam_beta2=s["adam_betas"][1],
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=s["max_grad_norm"],
        max_steps=MAX_STEPS,
        seed=seed,
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )


def trl_clock_callback(clock: BudgetClock):
    """A TrainerCallback that times TRL's optimizer steps on `clock` and stops training once the budget is spent."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.step_started(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            if clock.step_ended():
                control.should_training_stop = True

    return StepClock()


def train_trl(seed_dir: Path, seed: int, budget_seconds: float) -> dict:
    """TRL's run: train until the budget is spent, save the final weights to seed_dir/trl/final."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from grpo_fast.data.tokenizer import load_tokenizer
    from grpo_fast.rollout.builtin_tools import multiply

    sft = seed_dir / "sft"
    clock = BudgetClock(budget_seconds)
    trainer = trl.GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32),
        reward_funcs=[final_answer_reward],
        args=trl_config(seed, seed_dir / "trl"),
        train_dataset=Dataset.from_list(load_rows(seed_dir, "train")),
        processing_class=load_tokenizer(str(sft)),  # as saved (AutoTokenizer would give a byte-level Qwen2 one)
        tools=[multiply],
        callbacks=[trl_clock_callback(clock)],
    )
    trainer.train()
    trainer.save_model(str(seed_dir / "trl" / "final"))
    return clock.summary()


TRAIN = {"grpo_fast": train_grpo_fast, "trl": train_trl}


# -- the driver -------------------------------------------------------------------------------------------------


def worker_argv(args, seed: int, *flags: str) -> list[str]:
    return ["benchmarks.bench_tools_trl", *flags, "--seed", str(seed), "--work", str(args.work)]


def run_seed(args, seed: int, runs: list[dict], write) -> None:
    """The seed's SFT checkpoint, its evaluation, then each contender's run and the evaluation of its weights."""
    seed_dir = args.work / f"seed{seed}"
    prepare_seed(seed_dir, seed)
    before = run_json_subprocess(worker_argv(args, seed, "--evaluate", str(seed_dir / "sft")))
    print(f"seed {seed} SFT: accuracy {before['accuracy']:.3f}, tool calls {before['tool_call_rate']:.3f}", flush=True)
    budget = ["--budget-seconds", str(args.budget_seconds)]
    for contender in CONTENDERS if seed % 2 == 0 else CONTENDERS[::-1]:
        trained = run_json_subprocess(worker_argv(args, seed, "--train", contender, *budget), timeout=3600)
        after = run_json_subprocess(worker_argv(args, seed, "--evaluate", str(seed_dir / contender / "final")))
        held_out = {f"{key}_{when}": r[key] for when, r in (("before", before), ("after", after)) for key in before}
        runs.append({"contender": contender, "seed": seed, **trained, **held_out})
        r = runs[-1]
        print(
            f"seed {seed} {contender}: {r['steps']} steps, {r['step_seconds_mean']:.2f} s/step; accuracy "
            f"{r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f}, tool calls {r['tool_call_rate_before']:.3f} "
            f"-> {r['tool_call_rate_after']:.3f}",
            flush=True,
        )
        write()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--budget-seconds", type=float, default=150.0, help="training seconds per run")
    parser.add_argument("--work", type=Path, default=Path("/tmp/grpo_fast_bench_tools_trl"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/tools_trl_cpu.json"))
    parser.add_argument("--train", choices=CONTENDERS, help=argparse.SUPPRESS)  # worker: one contender's run
    parser.add_argument("--evaluate", type=Path, help=argparse.SUPPRESS)  # worker: one model directory's evaluation
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--merge", action="store_true", help="keep --out's runs of the other seeds")
    args = parser.parse_args(argv)
    args.work = args.work.resolve()  # the workers run in the repository root
    if args.train:
        print(json.dumps(TRAIN[args.train](args.work / f"seed{args.seed}", args.seed, args.budget_seconds)))
        return 0
    if args.evaluate:
        print(json.dumps(evaluate(args.work / f"seed{args.seed}", args.seed, args.evaluate)))
        return 0
    import torch

    previous = json.loads(args.out.read_text()) if args.merge and args.out.exists() else None
    runs: list[dict] = [r for r in previous["runs"] if r["seed"] not in args.seeds] if previous else []
    payload = {
        "benchmark": "tools_trl",
        "description": __doc__.split("\n\n")[0],
        "command": "python benchmarks/bench_tools_trl.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "environment": environment_stamp(torch.device("cpu"), packages=("transformers", "trl")),
        "settings": SETTINGS
        | {"budget_seconds": args.budget_seconds, "seeds": sorted({r["seed"] for r in runs} | set(args.seeds))},
        "runs": runs,
    }
    if previous:  # the runs kept with --merge came from these (bench_async's format)
        payload["earlier"] = previous.get("earlier", []) + [
            {"command": previous["command"], "environment": previous["environment"]}
        ]
    for seed in args.seeds:
        run_seed(args, seed, runs, lambda: write_json(args.out, payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
