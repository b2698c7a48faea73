"""The weight sync is real: after an optimizer step and a sync, vLLM's sampled-token logprobs match a
trainer forward on the same tokens within 1e-4 (fp32), and before the sync they do not."""

from __future__ import annotations

import torch

from grpo_fast.core.policy import build_sequence_batch, completion_logprobs
from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.weight_sync import iter_weight_buckets, trainer_weights


def _engine_vs_trainer(engine, model, tok, prompts):
    spec = SamplingSpec(n=4, max_tokens=6, temperature=1.0, stop_token_ids=(tok.eos_token_id,), seed=123)
    groups = engine.generate(prompts, spec)
    flat = [c for g in groups for c in g]
    batch = build_sequence_batch([p for p in prompts for _ in range(4)], [c.token_ids for c in flat], tok.pad_token_id)
    with torch.no_grad():
        trainer_lp = completion_logprobs(model, batch, backend="torch")
    diffs = []
    for i, c in enumerate(flat):
        assert len(c.logprobs) == len(c.token_ids) > 0
        diffs.append((trainer_lp[i, : len(c.token_ids)] - torch.tensor(c.logprobs)).abs().max())
    return float(torch.stack(diffs).max())


def test_sync_makes_vllm_logprobs_match_the_trainer(vllm_engine, tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    prompts = [tok(p)["input_ids"] for p in ["(12*7)%10=", "(5*7)%10=", "(431*7)%10="]]

    vllm_engine.load_weights(trainer_weights(model))  # the session engine may hold another test's weights
    assert _engine_vs_trainer(vllm_engine, model, tok, prompts) < 1e-4

    # One optimizer step that moves the policy visibly (push up the logprob of a fixed completion).
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batch = build_sequence_batch(prompts, [tok("3")["input_ids"] + [tok.eos_token_id]] * 3, tok.pad_token_id)
    (-completion_logprobs(model, batch, backend="torch").sum()).backward()
    opt.step()

    assert _engine_vs_trainer(vllm_engine, model, tok, prompts) > 1e-2  # stale engine: mismatch
    stats = vllm_engine.load_weights(trainer_weights(model))
    assert stats["sync/bytes"] > 0 and stats["sync/seconds"] > 0
    assert _engine_vs_trainer(vllm_engine, model, tok, prompts) < 1e-4


def test_weight_buckets_are_bounded_and_complete():
    weights = [(f"w{i}", torch.full((256,), float(i))) for i in range(10)]  # 1 KiB each in fp32
    stats = {}
    out = list(iter_weight_buckets(iter(weights), bucket_bytes=2048, dtype=torch.float16, stats=stats))
    assert [n for n, _ in out] == [n for n, _ in weights]
    assert all(t.dtype == torch.float16 for _, t in out)
    assert stats == {"bytes": 10 * 512, "tensors": 10, "buckets": 3}  # 512 B each in fp16, 4 per 2 KiB
