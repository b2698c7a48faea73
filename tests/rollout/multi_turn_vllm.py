"""Multi-turn rollouts of the tool agent on the vLLM engine, in a process of its own (vLLM keeps process-wide
state; the test session already holds an engine). Run by test_multi_turn_vllm.py as
`python multi_turn_vllm.py AGENT_DIR`; prints one JSON line of what it measured."""

from __future__ import annotations

import json
import os
import sys

import torch
from scripted_chat import multi_turn
from tool_agent import TOOLS, CounterEnv, tools_of
from transformers import AutoModelForCausalLM

from grpo_fast.data.tokenizer import load_tokenizer
from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.multi_turn import MultiTurn
from grpo_fast.rollout.vllm_engine import VLLMEngine


def rollouts(tok, environment) -> MultiTurn:
    return multi_turn(
        tok, TOOLS, environment, max_iterations=3, max_completion_length=160, max_model_len=256, timeout=0.5
    )


def template_ids(tok, prompt: str, messages, environment) -> list[int]:
    """The chat template's rendering of the reported conversation (the reference for the trained ids)."""
    user = [{"role": "user", "content": prompt + (" (start 0)" if environment else "")}]
    schemas = [t.schema for t in tools_of(CounterEnv() if environment else None)]
    out = tok.apply_chat_template(user + messages, tools=schemas, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def main(agent_dir: str) -> dict:
    tok = load_tokenizer(agent_dir)  # as saved (AutoTokenizer would give a byte-level Qwen2 tokenizer)
    engine = VLLMEngine(agent_dir, dtype="float32", max_model_len=256, kv_cache_memory_bytes=64 << 20, seed=0)
    model = AutoModelForCausalLM.from_pretrained(agent_dir, dtype=torch.float32).eval()
    result = {"template_equal": [], "calls": [], "tool_results": []}
    sampled_diffs, inserted_diffs = [], []
    for environment, prompts in ((None, ["m", "x", "a", "t"]), (CounterEnv, ["c"])):
        for temperature in (0.0, 1.0):
            spec = SamplingSpec(
                n=2, max_tokens=160, temperature=temperature, stop_token_ids=(tok.eos_token_id,), seed=3
            )
            out = rollouts(tok, environment).generate(engine, [{"prompt": p} for p in prompts], spec)
            rows = [p for p in prompts for _ in range(2)]
            for prompt, ids, c in zip(rows, out.prompt_ids, out.completions, strict=True):
                reference = template_ids(tok, prompt, c.episode.messages, environment)
                result["template_equal"].append(ids + c.token_ids == reference)
                if temperature == 0.0:
                    result["calls"].append(c.episode.calls)
                    result["tool_results"] += [m["content"] for m in c.episode.messages if m["role"] == "tool"]
                    continue
                with torch.no_grad():  # the trainer's logprobs of the whole completion, teacher-forced
                    logits = model(torch.tensor([ids + c.token_ids])).logits[0, len(ids) - 1 : -1].float()
                trainer_lp = logits.log_softmax(-1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
                for lp, engine_lp, sampled in zip(trainer_lp.tolist(), c.logprobs, c.sampled, strict=True):
                    (sampled_diffs if sampled else inserted_diffs).append(abs(lp - engine_lp))
    engine.close()
    result["sampled_abs_diff_mean"] = sum(sampled_diffs) / len(sampled_diffs)
    result["inserted_abs_diff_mean"] = sum(inserted_diffs) / max(len(inserted_diffs), 1)
    result["inserted_tokens"] = len(inserted_diffs)
    return result


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    print(json.dumps(main(sys.argv[1])))
