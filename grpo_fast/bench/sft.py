"""One SFT forward+backward on the same batch and the same Qwen2 model, two ways:

  fused         grpo_fast.sft.loss: backbone -> the hidden rows that predict a loss token -> fused_logprobs
                (the logits never exist)
  transformers  `model(input_ids, labels=labels)` (-100 outside the loss mask): the lm_head writes the
                [B, L, V] logits of every token, and the cross-entropy and its backward go through them

The two losses (and gradients) are compared before anything is timed. Step time: median of `repeats` steps
after warm-up. Peak extra memory: the peak above what is allocated before the step (weights, inputs, and the
parameter gradients, kept allocated from the warm-up step); on CPU each contender runs in a fresh interpreter
(peak RSS, with glibc returning freed blocks at once), on CUDA with the caching allocator's peak counter.

    python benchmarks/bench_sft.py                   # CPU: 4 layers, hidden 512, vocab 32000, 8 x 256 tokens
    python benchmarks/bench_sft.py --device cuda --layers 28 --hidden 3584 --heads 28 --kv-heads 4 \\
        --intermediate 18944 --vocab 152064 --batch 4 --seq-len 4096
"""

from __future__ import annotations

import argparse
import gc
import json
from collections.abc import Callable

import torch

from grpo_fast.sft.batching import TokenBatch
from grpo_fast.sft.loss import sft_loss

from .common import (
    environment_stamp,
    run_json_subprocess,
    text_table,
    time_call,
    write_json,
)
from .memory import peak_extra_bytes
from .models import add_model_shape_arguments, model_from_shape_arguments

CONTENDERS = ("fused", "transformers")
SHAPE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "batch", "seq_len", "loss_frac")


def build(args: argparse.Namespace, device: torch.device):
    """(model, batch): a random-init Qwen2ForCausalLM and a TokenBatch of random tokens whose last
    `loss_frac` of each row are the loss tokens (a prompt, then its completion)."""

    model = model_from_shape_arguments(args, max(args.seq_len, 128), device)
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, args.vocab, (args.batch, args.seq_len), generator=g)
    loss_mask = torch.zeros_like(input_ids, dtype=torch.bool)
    loss_mask[:, args.seq_len - int(args.loss_frac * args.seq_len) :] = True
    loss_mask[:, 0] = False
    positions = torch.arange(args.seq_len).expand(args.batch, -1).contiguous()
    batch = TokenBatch(input_ids, positions, loss_mask, input_ids.numel()).to(device)
    return model, batch


def loss_of(name: str, model, batch, autocast: bool) -> torch.Tensor:
    """The mean negative logprob of the batch's loss tokens, computed by contender `name`."""
    if name == "fused":
        return sft_loss(model, batch, batch.num_loss_tokens, autocast)
    labels = torch.where(batch.loss_mask, batch.input_ids, -100)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        return model(input_ids=batch.input_ids, labels=labels).loss


def make_step(name: str, model, batch, autocast: bool) -> Callable[[], None]:
    """One forward+backward; the parameter gradients stay allocated (zeroed) between steps."""

    def step():
        model.zero_grad(set_to_none=False)
        loss_of(name, model, batch, autocast).backward()

    return step


def agreement(model, batch, autocast: bool) -> dict:
    """Both losses and gradients on the batch: |loss difference| and max |gradient difference| / max |gradient|."""
    losses, grads = {}, {}
    for name in CONTENDERS:
        model.zero_grad(set_to_none=True)
        loss = loss_of(name, model, batch, autocast)
        loss.backward()
        losses[name] = float(loss.detach())
        grads[name] = [p.grad.detach().float().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    scale = max(float(g.abs().max()) for g in grads["transformers"])
    diff = max(float((a - b).abs().max()) for a, b in zip(grads["fused"], grads["transformers"], strict=True))
    return {
        "loss_fused": losses["fused"],
        "loss_transformers": losses["transformers"],
        "loss_abs_diff": abs(losses["fused"] - losses["transformers"]),
        "grad_max_rel_diff": diff / scale,
    }


def measure_memory(name: str, model, batch, device: torch.device, autocast: bool) -> int:
    """Peak bytes above the allocations before one step (after a warm-up step)."""
    return peak_extra_bytes(make_step(name, model, batch, autocast), device)


def memory_of(name: str, args: argparse.Namespace, model, batch, device: torch.device, autocast: bool) -> int:
    if device.type == "cuda":
        return measure_memory(name, model, batch, device, autocast)
    flags = [f"--{flag.replace('_', '-')}={getattr(args, flag)}" for flag in SHAPE_FLAGS]
    # Every block above 64 KiB is mmap'd, so a freed block leaves the RSS at once.
    out = run_json_subprocess(
        ["grpo_fast.bench.sft", "--measure-memory", name, "--device", "cpu", *flags],
        env={"MALLOC_MMAP_THRESHOLD_": "65536"},
    )
    return out["peak_extra_bytes"]


SFT_COLUMNS = (
    ("contender", 13),
    ("median ms", 10),
    ("p20-p80 ms", 11),
    ("tokens/s", 9),
    ("extra MiB", 10),
    ("time vs tf", 11),
    ("mem vs tf", 10),
)


def format_table(rows: list[dict]) -> str:
    """Time and peak extra memory per contender, and both as a share of transformers'."""
    cells = (
        (
            r["contender"],
            f"{r['median_s'] * 1e3:.1f}",
            f"{r['p20_s'] * 1e3:.0f}-{r['p80_s'] * 1e3:.0f}",
            f"{r['tokens_per_second']:.0f}",
            f"{r['peak_extra_bytes'] / 2**20:.1f}",
            f"{r['time_vs_transformers']:.2f}x",
            f"{r['memory_vs_transformers']:.1%}",
        )
        for r in rows
    )
    return text_table(SFT_COLUMNS, cells)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_shape_arguments(parser)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--loss-frac", type=float, default=0.5, help="share of each row that is loss tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the JSON results here")
    parser.add_argument("--measure-memory", choices=CONTENDERS, default=None, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    autocast = device.type == "cuda"  # bf16 autocast on GPU, fp32 on CPU
    model, batch = build(args, device)
    if args.measure_memory:
        print(json.dumps({"peak_extra_bytes": measure_memory(args.measure_memory, model, batch, device, autocast)}))
        return 0
    check = agreement(model, batch, autocast)
    print(
        f"loss: fused {check['loss_fused']:.6f}, transformers {check['loss_transformers']:.6f} "
        f"(|diff| {check['loss_abs_diff']:.2e}); gradients: max |diff| / max |grad| {check['grad_max_rel_diff']:.2e}"
    )
    rows = []
    for name in CONTENDERS:
        timing = time_call(make_step(name, model, batch, autocast), device, warmup=2, repeats=args.repeats)
        gc.collect()
        rows.append({"contender": name, **timing, "tokens_per_second": batch.num_tokens / timing["median_s"]})
    for row in rows:
        row["peak_extra_bytes"] = memory_of(row["contender"], args, model, batch, device, autocast)
    base = rows[-1]
    for row in rows:
        row["time_vs_transformers"] = row["median_s"] / base["median_s"]
        row["memory_vs_transformers"] = row["peak_extra_bytes"] / base["peak_extra_bytes"]
    print(format_table(rows))
    if args.out:
        shape = {flag: getattr(args, flag) for flag in SHAPE_FLAGS}
        shape["loss_tokens"] = batch.num_loss_tokens
        payload = {
            "benchmark": "sft",
            "environment": environment_stamp(device),
            "shape": shape,
            "precision": "bf16 autocast" if autocast else "fp32",
            "agreement": check,
            "results": rows,
        }
        write_json(args.out, payload)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
