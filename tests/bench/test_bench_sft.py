"""The SFT benchmark's two contenders do the same work: same loss, same gradients, and a step of each runs
(a benchmark that timed different work would compare nothing)."""

from __future__ import annotations

import argparse

import torch

from grpo_fast.bench.sft import add_arguments, agreement, build, make_step, measure_memory

CPU = torch.device("cpu")


def test_fused_and_transformers_contenders_agree_and_step():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        "--layers 1 --hidden 64 --heads 2 --kv-heads 2 --intermediate 128 --vocab 300 --batch 2 --seq-len 16".split()
    )
    model, batch = build(args, CPU)
    assert batch.num_loss_tokens == 2 * 8
    check = agreement(model, batch, autocast=False)
    assert check["loss_abs_diff"] < 1e-5 and check["grad_max_rel_diff"] < 1e-4, check
    for name in ("fused", "transformers"):
        make_step(name, model, batch, autocast=False)()
        assert isinstance(measure_memory(name, model, batch, CPU, autocast=False), int)
