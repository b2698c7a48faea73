"""The loss step's micro-batches: packed ones are padding-free, within the token budget, give every
completion the hidden states it has padded, and fall back to padding (with a reason) when the model cannot
keep packed sequences apart; the micro-batch loop reads nothing back from the device."""

from __future__ import annotations

import logging
import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch

import grpo_fast.trainer.loss_step as loss_step_module
from grpo_fast.core.policy import build_sequence_batch, completion_hidden
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.trainer.config import load_config
from grpo_fast.trainer.loss_step import LossStep
from grpo_fast.trainer.micro_batches import Packing, packed_micro_batches

TOK = build_char_tokenizer()
PROMPTS = (3, 5, 2, 4, 3, 6, 2, 3)
COMPLETIONS = (6, 1, 4, 6, 2, 5, 5, 1)


def _batch():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, len(TOK), (n,), generator=g).tolist() for n in PROMPTS]
    completions = [torch.randint(3, len(TOK), (n,), generator=g).tolist() for n in COMPLETIONS]
    batch = build_sequence_batch(prompts, completions, TOK.pad_token_id)
    batch.completion_mask[3] = False  # a truncated completion the loss ignores
    return batch


def _loss_step(*overrides) -> LossStep:
    model = build_tiny_model(TOK, seed=0)
    cfg = load_config(None, ["rollout.num_generations=2", "run.micro_batch_size=2", *overrides])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return LossStep(cfg, model, optimizer, scheduler, TOK.pad_token_id)


@pytest.mark.parametrize("attention", ["per_sequence", "block_mask"])
def test_packed_micro_batches_are_padding_free_within_budget_and_exact(attention):
    model = build_tiny_model(TOK, seed=0).eval()
    batch = _batch()
    budget = 12
    plan = packed_micro_batches(batch, Packing.of(batch, budget), torch.device("cpu"), attention)
    lengths = [p + c for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    assert all(mb.input_ids.numel() <= budget for mb in plan)
    # Every sequence in exactly one micro-batch; only the masked one runs nothing through the backbone.
    assert sorted(i for mb in plan for i in mb.rows) == list(range(len(PROMPTS)))
    assert sum(mb.input_ids.numel() for mb in plan) == sum(lengths) - lengths[3]

    with torch.no_grad():
        padded = completion_hidden(model, batch)
        for mb in plan:
            hidden, cu = mb.hidden(model), mb.cu_seqlens.tolist()
            for k, i in enumerate(mb.rows):
                n = COMPLETIONS[i] if i != 3 else 0
                torch.testing.assert_close(hidden[cu[k] : cu[k + 1]], padded[i, :n], rtol=1e-5, atol=1e-5)
            assert torch.equal(mb.completion_ids, mb.tokens(batch.completion_ids, "cpu"))
            logprobs = torch.zeros(batch.completion_ids.shape)
            mb.scatter(logprobs, mb.completion_ids.float())  # scatter inverts tokens()
            assert torch.equal(mb.tokens(logprobs, "cpu"), mb.completion_ids.float())


def test_one_long_sequence_among_short_ones_pads_only_its_own_length_bucket():
    """The per-sequence path over a row of 15 short sequences and one 8x longer: the work is that of the sequences'
    own length buckets (each under twice its shortest), not every sequence padded to the longest, and the row's
    hidden states and the model's gradient equal the padded layout's (fp32 tolerance)."""
    g = torch.Generator().manual_seed(3)
    prompt_lens, completion_lens = [3] * 16, [3, 5, 4, 6, 2, 4, 5, 3, 6, 4, 3, 5, 2, 4, 6, 61]
    prompts = [torch.randint(3, len(TOK), (n,), generator=g).tolist() for n in prompt_lens]
    completions = [torch.randint(3, len(TOK), (n,), generator=g).tolist() for n in completion_lens]
    batch = build_sequence_batch(prompts, completions, TOK.pad_token_id)
    packing = Packing.of(batch, 1024)
    (mb,) = packed_micro_batches(batch, packing, torch.device("cpu"), "per_sequence")
    lengths = [p + c for p, c in zip(prompt_lens, completion_lens, strict=True)]
    assert packing.work("per_sequence").scores < 4 * sum(n * n for n in lengths) < len(lengths) * max(lengths) ** 2
    assert len(mb.layout.buckets) == 3  # lengths 5-6, 7-9 and 64

    model = build_tiny_model(TOK, seed=0)
    weights = torch.randn(sum(completion_lens), model.config.hidden_size, generator=g)
    (mb.hidden(model) * weights).sum().backward()  # hidden [N, H], mb.rows' completion tokens in turn
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert len(packed_grads) > 10  # every backbone weight (the lm_head is not in the hidden states)
    model.zero_grad(set_to_none=True)
    padded = completion_hidden(model, batch)
    (torch.cat([padded[i, : completion_lens[i]] for i in mb.rows]) * weights).sum().backward()
    for name, grad in packed_grads.items():  # fp32 sums in another order: atol relative to the largest entry
        atol = 1e-5 * float(grad.abs().max())
        torch.testing.assert_close(grad, model.get_parameter(name).grad, rtol=1e-4, atol=atol, msg=name)


def test_auto_packing_falls_back_to_padding_with_a_reason(monkeypatch, caplog):
    monkeypatch.setattr(loss_step_module, "packing_error", lambda model, path: "packed sequences see each other")
    step = _loss_step()
    with caplog.at_level(logging.WARNING):
        plan = step.micro_batches(_batch())
    assert "packed sequences see each other" in caplog.text
    assert [mb.num_rows for mb in plan] == [2, 2, 2, 2]  # micro_batch_size padded rows
    with pytest.raises(ValueError, match="run.packing"):
        _loss_step("run.packing=true").micro_batches(_batch())


def test_packing_is_on_by_default_for_a_model_that_keeps_sequences_apart():
    step = _loss_step("run.micro_batch_tokens=16")
    plan = step.micro_batches(_batch())
    assert step.layout == "packed (per_sequence)" and all(mb.cu_seqlens is not None for mb in plan)
    assert all(mb.input_ids.numel() <= 16 for mb in plan)


@pytest.mark.parametrize("packing", ["true", "false"])
def test_the_micro_batch_loop_reads_nothing_back(packing, monkeypatch):
    """Host reads (item, float, int, bool, tolist, cpu) made by grpo_fast's own code while accumulating the
    gradients of 4+ micro-batches: the per-step token counts once, and on the CPU only the fused loss's
    free check of the backward's incoming gradient (on an accelerator it scales in place instead). The
    model's forward (transformers) is not counted."""
    step = _loss_step(f"run.packing={packing}", "run.micro_batch_tokens=12", "loss.beta=0.05")
    batch = _batch()
    plan = step.micro_batches(batch)
    assert len(plan) >= 4
    advantages = torch.randn(len(PROMPTS))
    ref = torch.zeros(batch.completion_ids.shape)
    package = Path(loss_step_module.__file__).parents[1]
    sites = Counter()

    def counted(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            frame = traceback.extract_stack(limit=2)[0]
            if Path(frame.filename).is_relative_to(package):
                sites[(Path(frame.filename).name, frame.name)] += 1
            return original(self, *args, **kwargs)

        return read

    for name in ("item", "__float__", "__int__", "__bool__", "__index__", "tolist", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    step.accumulate_gradients(batch, advantages, None, ref, None, plan=plan)
    monkeypatch.undo()
    assert sites == Counter({("loss_step.py", "accumulate_gradients"): 1, ("fused_loss.py", "backward"): len(plan)})


def test_the_half_precision_lm_head_is_cast_once_per_step(monkeypatch):
    """With bf16 compute over fp32 master weights (autocast on a GPU; forced here on the CPU) the lm_head
    weight is cast once per accumulation, not once per micro-batch, and the accumulated fp32 gradient
    equals that of one bf16 loss on the whole batch (bf16 tolerance)."""
    step = _loss_step("run.packing=false")
    step.head_dtype = torch.bfloat16
    model, batch = step.model, _batch()
    weight = model.lm_head.weight
    plan = step.micro_batches(batch)
    assert len(plan) == 4
    advantages = torch.randn(len(PROMPTS), generator=torch.Generator().manual_seed(1))
    casts = []
    original_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if self is weight:
            casts.append(args)
        return original_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    step.accumulate_gradients(batch, advantages, None, None, None, plan=plan)
    monkeypatch.undo()
    assert len(casts) == 1
    accumulated = weight.grad.clone()
    assert accumulated.dtype == torch.float32

    model.zero_grad(set_to_none=True)
    loss, _ = loss_step_module.grpo_loss(
        completion_hidden(model, batch).to(torch.bfloat16),
        weight.to(torch.bfloat16),
        batch.completion_ids,
        batch.completion_mask,
        advantages,
        config=step.loss_config,
    )
    loss.backward()
    torch.testing.assert_close(accumulated, weight.grad, rtol=2e-2, atol=2e-4)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_shared_prompt_micro_batches_accumulate_to_the_full_batch_gradient(loss_type):
    """run.share_prompt: true: 3 groups of 2 completions (micro-batches of whole groups, one prompt forward
    each), prompts of different lengths; the accumulated gradient equals one grpo_loss on the batch."""
    step = _loss_step("run.share_prompt=true", "run.micro_batch_size=4", f"loss.loss_type={loss_type}")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, len(TOK), (n,), generator=g).tolist() for n in (7, 3, 5)]
    completions = [torch.randint(3, len(TOK), (n,), generator=g).tolist() for n in (4, 1, 6, 2, 3, 5)]
    batch = build_sequence_batch([p for p in prompts for _ in range(2)], completions, TOK.pad_token_id)
    plan = step.micro_batches(batch)
    assert [mb.num_rows for mb in plan] == [4, 2] and all(mb.forward is not completion_hidden for mb in plan)
    advantages = torch.randn(6, generator=g)
    model = step.model
    step.accumulate_gradients(batch, advantages, None, None, None, plan=plan)
    shared = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    loss, _ = loss_step_module.grpo_loss(
        completion_hidden(model, batch),
        model.lm_head.weight,
        batch.completion_ids,
        batch.completion_mask,
        advantages,
        config=step.loss_config,
    )
    loss.backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(shared[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
