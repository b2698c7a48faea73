"""run.packing auto never packs where the packed micro-batches run more attention work than the padded ones on
this machine's attention path.

The work is counted from what actually runs: every call of torch's scaled_dot_product_attention during the
micro-batches' forward (4·b·heads·L_q·L_k·d FLOPs each) and the tokens that enter the backbone, for the plan
`auto` picks and for the padded plan of the same batch. A packed row whose attention spans the whole row (sdpa
with a block-diagonal mask) runs ~L_row² scores where the padded rows run b·W²: with 64 sequences in a row that
is tens of times the attention work, the regression this test guards against. Also: which attention path each
implementation gets, and what the per-sequence path refuses."""

from __future__ import annotations

import logging

import pytest
import torch

from grpo_fast.core.packed_attention import PackedLayout, attention_path, per_sequence_attention
from grpo_fast.core.policy import build_sequence_batch
from grpo_fast.core.tiny_models import TinyModelSpec, random_causal_lm
from grpo_fast.trainer.config import load_config
from grpo_fast.trainer.loss_step import LossStep

VOCAB = 512
SPEC = TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256,
                     max_position_embeddings=256)  # fmt: skip


def _batch(rows: int = 64, prompt: int = 16, shortest: int = 8, longest: int = 96):
    """`rows` sequences of `prompt` prompt tokens and completions of mixed lengths (as a policy's are)."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(shortest, longest + 1, (rows,), generator=g).tolist()
    prompts = [torch.randint(3, VOCAB, (prompt,), generator=g).tolist() for _ in range(rows)]
    completions = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]
    return build_sequence_batch(prompts, completions, 0)


def _loss_step(model, *overrides) -> LossStep:
    cfg = load_config(None, ["rollout.num_generations=8", *overrides])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return LossStep(cfg, model, optimizer, scheduler, 0)


def _work(model, plan, monkeypatch) -> tuple[float, int]:
    """(attention FLOPs, backbone tokens) of one forward of every micro-batch of `plan`, as they run."""
    flops, tokens = [0.0], [0]
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(query, key, *args, **kwargs):
        b, heads, lq, d = query.shape
        flops[0] += 4.0 * b * heads * lq * key.shape[-2] * d
        return sdpa(query, key, *args, **kwargs)

    def count_tokens(_embeddings, args):
        tokens[0] += args[0].numel()

    hook = model.get_input_embeddings().register_forward_pre_hook(count_tokens)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    try:
        with torch.no_grad():
            for mb in plan:
                mb.hidden(model)
    finally:
        monkeypatch.undo()
        hook.remove()
    return flops[0], tokens[0]


@pytest.mark.parametrize("micro_batch_size", [64, 8])
def test_auto_packs_only_where_the_packed_layout_runs_less_work(micro_batch_size, monkeypatch, caplog):
    model = random_causal_lm(VOCAB, SPEC, seed=0).eval()
    batch = _batch()
    size = f"run.micro_batch_size={micro_batch_size}"
    with caplog.at_level(logging.INFO, logger="grpo_fast.trainer.loss_step"):
        chosen = _loss_step(model, size).micro_batches(batch)  # run.packing: auto, the default
    padded = _loss_step(model, size, "run.packing=false").micro_batches(batch)
    chosen_flops, chosen_tokens = _work(model, chosen, monkeypatch)
    padded_flops, padded_tokens = _work(model, padded, monkeypatch)
    assert chosen_flops <= padded_flops, f"auto's attention: {chosen_flops:.3g} FLOPs against {padded_flops:.3g} padded"
    assert chosen_tokens <= padded_tokens
    assert "run.packing auto" in caplog.text  # the choice and its reason are logged


def test_auto_pads_where_packing_saves_nothing(caplog):
    """Sequences of one length leave no padding to remove: the padded layout is no dearer, and auto keeps it."""
    model = random_causal_lm(VOCAB, SPEC, seed=0).eval()
    step = _loss_step(model, "run.micro_batch_size=8")
    with caplog.at_level(logging.INFO, logger="grpo_fast.trainer.loss_step"):
        plan = step.micro_batches(_batch(rows=16, shortest=24, longest=24))
    assert step.layout == "padded" and all(mb.cu_seqlens is None for mb in plan)
    assert "run.packing auto: padded micro-batches" in caplog.text


@pytest.mark.parametrize(
    ("implementation", "requested", "path"),
    [
        ("sdpa", "auto", "per_sequence"),
        ("eager", "auto", "per_sequence"),
        ("flash_attention_2", "auto", "varlen"),
        ("flex_attention", "auto", "block_mask"),
        ("sdpa", "model", "block_mask"),
        ("flash_attention_2", "model", "varlen"),
        ("flash_attention_2", "per_sequence", "per_sequence"),
    ],
)
def test_attention_path_of_each_implementation(implementation, requested, path):
    model = random_causal_lm(VOCAB, SPEC, seed=0)
    model.config._attn_implementation_internal = implementation  # the name only: no kernel is loaded
    assert attention_path(model, requested) == path


def test_per_sequence_attention_refuses_what_it_does_not_reproduce():
    layout = PackedLayout.from_lengths([3, 2])
    q = torch.randn(1, 2, 5, 8)
    module = torch.nn.Module()
    with pytest.raises(RuntimeError, match="sliding windows"):
        per_sequence_attention(module, q, q, q, None, packed_layout=layout, sliding_window=4)
    with pytest.raises(RuntimeError, match="packed_layout"):
        per_sequence_attention(module, q, q, q, None)
    with pytest.raises(ValueError, match="run.packed_attention"):
        attention_path(random_causal_lm(VOCAB, SPEC), "varlen")
