"""One GRPO training step of grpo_fast's GRPOTrainer (its defaults, and one layout forced) side by side with Hugging
Face TRL's trl.GRPOTrainer (pinned trl==1.16.0, use_vllm=False on CPU), in the same run, on the same weights,
prompts, batch shape and generation settings. See grpo_fast/bench/step/__init__.py for the method.

    python benchmarks/bench_step.py [--configs tiny prompt_heavy large_mb64 large_mb16 large_mb8]
        [--contenders grpo_fast grpo_fast_padded grpo_fast_block_mask grpo_fast_vllm grpo_fast_hf trl]
        [--steps 3] [--warmup 1] [--rounds 1] [--kv-cache-bytes 268435456] [--quick]
        [--out benchmarks/results/bench_step_cpu.json]

Writes the stamped JSON (commit and uncommitted files, versions of torch / transformers / trl / vllm / grpo_fast,
CPU model and cores, load average at the start and the end, date, every setting of both trainers), a PNG beside it
(stacked bars of the per-phase medians per config and contender) and prints a markdown table (the attention each
row ran, step time median, phases generate / score / old-logprob / train / sync / other, completions per step,
completion tokens/s, peak RSS, ratio ours / TRL). Each (config, contender, round) runs in its own interpreter, so
its peak RSS is its own; with --rounds R a config's contenders run R times in turn (A B C A B C). Logs and trainer
outputs go under --work (runs/bench_step); benchmarks/tables.py renders the table in docs/benchmarks.md.

Configs: tiny (the demo's tiny Qwen2 + character tokenizer, modular-arithmetic prompts, 16 prompts x 8, 4-token
completions, exact-match reward, one micro-batch); prompt_heavy (random-init Qwen2: 4 layers, hidden 512,
intermediate 1408, 8 heads of 64, 2 KV heads, a 32k-word WordLevel tokenizer built in code; 512-token prompts,
2 prompts x 8, 64-token completions); large_mb64 / large_mb16 / large_mb8 (the same model; 64-token prompts,
8 prompts x 8, completions of 32-128 tokens, micro-batches of 64 / 16 / 8 sequences; each with grpo_fast,
grpo_fast_padded, grpo_fast_block_mask and trl). The reward is trivial and the same function for both trainers
(exact match for tiny, length / 100 otherwise); it counts the completions and tokens it is given, so the
completions per step in the JSON are measured in each contender's process.

How the completion lengths are made mixed (large, prompt_heavy): a random-init model gives EOS ~1/V per token, so
completions would all run to the maximum. The policy is engineered before it is saved (tune_eos): a shared
component a*u (u a random unit vector, a = 4x the mean embedding-row norm) is added to every embedding row; it
survives the 4 random decoder layers and the final RMSNorm as a near-constant component of every position's last
hidden state, and the lm_head's EOS row gets c*u, with c found by bisection so that the mean EOS probability over
random contexts is the config's eos_prob (large: 1/64; the tuning and the measured probabilities, p10 and p90
included, are in the JSON under configs.<name>.policy.eos_tuning). The minimum length is applied equally to all
contenders: transformers' min_new_tokens (TRL via GRPOConfig.generation_kwargs; grpo_fast's hf engine via the
policy's generation_config) and vLLM's min_tokens (grpo_fast's SamplingSpec has no min-length field, so where
vLLM generates the trainer runs grpo_fast.bench.step.ours:MinTokensVLLMEngine, our VLLMEngine whose
SamplingParams carry min_tokens, as a plug-in engine). Lengths are then min + Geometric(eos_prob) tokens,
truncated at the maximum; the JSON has the measured min / mean / max per contender.

--quick shrinks every config (few prompts, short prompts and completions, 1 warm-up + 2 timed steps); it is a
smoke run for tests (tests/bench/test_bench_step.py), its numbers mean nothing.
"""

import argparse

from grpo_fast.bench import step

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    step.add_arguments(parser)
    raise SystemExit(step.main(parser.parse_args()))
