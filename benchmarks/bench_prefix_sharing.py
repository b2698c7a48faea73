"""Forward+backward of the GRPO loss step's model part (backbone -> completion hidden states -> grpo_loss),
with each group's prompt through the backbone once (grpo_fast.trainer.prefix_sharing) vs once per completion
(grpo_fast.core.policy.completion_hidden), on the same random-init Qwen2 and batch, at several
prompt:completion token ratios.

  shared    shared_completion_hidden: k prompts [k, P], then B completions [B, T - 1] against their cache
  unshared  completion_hidden: B rows [B, P + T]

Before timing, the two losses and the gradients of every parameter are compared. Step time: median of
`repeats` steps after a warm-up step, the contenders' steps alternating; speedup: the median of the
paired ratios (robust to a machine whose load changes during the run). Peak extra memory: the peak above
what is allocated before the step (weights, inputs, parameter gradients from the warm-up step); on CPU each
contender runs in a fresh interpreter (peak RSS, every block above 64 KiB mmap'd so that freed blocks leave
the RSS at once), on CUDA with the caching allocator's peak counter.

    python benchmarks/bench_prefix_sharing.py [--prompt-lens 16,64,256,1024 --completion-len 64 --group-size 8]
        [--device cuda] [--out benchmarks/results/prefix_sharing_cpu.json]
    python benchmarks/bench_prefix_sharing.py --quick     # a tiny model, two ratios, no memory: seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable

import torch

from grpo_fast.bench.common import (
    environment_stamp,
    run_json_subprocess,
    synchronize,
    text_table,
    timing_summary,
    write_json,
)
from grpo_fast.bench.memory import peak_extra_bytes
from grpo_fast.bench.models import add_model_shape_arguments, model_from_shape_arguments
from grpo_fast.core.policy import SequenceBatch, build_sequence_batch, completion_hidden
from grpo_fast.loss import GRPOLossConfig, grpo_loss
from grpo_fast.trainer.prefix_sharing import shared_completion_hidden, worth_sharing

CONTENDERS = {"shared": shared_completion_hidden, "unshared": completion_hidden}
MODEL_FLAGS = ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")
BATCH_FLAGS = ("groups", "group_size", "completion_len")
QUICK = dict(
    layers=1, hidden=64, heads=2, kv_heads=2, intermediate=128, vocab=300, groups=2, group_size=4, completion_len=8
)


def build_model(args: argparse.Namespace, device: torch.device):
    """Random-init Qwen2ForCausalLM (sdpa attention, no dropout) in train mode."""
    return model_from_shape_arguments(args, max(args.prompt_lens) + args.completion_len, device)


def build_batch(args: argparse.Namespace, prompt_len: int, device: torch.device):
    """(batch, advantages [B]): `groups` random prompts of `prompt_len` tokens, each with `group_size`
    random completions of `completion_len` tokens, rows group-major."""
    g = torch.Generator().manual_seed(prompt_len)
    prompts = [torch.randint(1, args.vocab, (prompt_len,), generator=g).tolist() for _ in range(args.groups)]
    rows = args.groups * args.group_size
    completions = torch.randint(1, args.vocab, (rows, args.completion_len), generator=g).tolist()
    batch = build_sequence_batch([prompts[i // args.group_size] for i in range(rows)], completions, pad_id=0)
    return batch.to(device), torch.randn(rows, generator=g).to(device)


def loss_of(name: str, model, batch: SequenceBatch, advantages: torch.Tensor, autocast: bool) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        hidden = CONTENDERS[name](model, batch)
    weight = model.lm_head.weight
    if autocast:  # as the trainer's loss step: bf16 hidden and lm_head into the fused loss
        hidden, weight = hidden.to(torch.bfloat16), weight.to(torch.bfloat16)
    loss, _ = grpo_loss(
        hidden,
        weight,
        batch.completion_ids,
        batch.completion_mask,
        advantages,
        num_items_in_batch=int(batch.completion_mask.sum()),
        config=GRPOLossConfig(loss_type="dapo"),
    )
    return loss


def make_step(name: str, model, batch, advantages, autocast: bool) -> Callable[[], None]:
    """One forward+backward; the parameter gradients stay allocated (zeroed) between steps."""

    def step():
        model.zero_grad(set_to_none=False)
        loss_of(name, model, batch, advantages, autocast).backward()

    return step


def agreement(model, batch, advantages, autocast: bool) -> dict:
    """Both losses, |loss difference|, and the max over parameters of max |gradient difference| / max |gradient|."""
    losses, grads = {}, {}
    for name in CONTENDERS:
        model.zero_grad(set_to_none=True)
        loss = loss_of(name, model, batch, advantages, autocast)
        loss.backward()
        losses[name] = float(loss.detach())
        grads[name] = [p.grad.detach().float().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    rel = max(
        float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
        for a, b in zip(grads["shared"], grads["unshared"], strict=True)
    )
    return {
        "loss_shared": losses["shared"],
        "loss_unshared": losses["unshared"],
        "loss_abs_diff": abs(losses["shared"] - losses["unshared"]),
        "grad_max_rel_diff": rel,
    }


def measure_memory(name: str, model, batch, advantages, device: torch.device, autocast: bool) -> int:
    """Peak bytes above the allocations before one step (after a warm-up step)."""
    return peak_extra_bytes(make_step(name, model, batch, advantages, autocast), device)


def memory_of(name: str, args, prompt_len: int, model, batch, advantages, device, autocast: bool) -> int:
    if device.type == "cuda":
        return measure_memory(name, model, batch, advantages, device, autocast)
    flags = [f"--{flag.replace('_', '-')}={getattr(args, flag)}" for flag in MODEL_FLAGS + BATCH_FLAGS]
    flags += [f"--threads={args.threads}"] if args.threads else []
    out = run_json_subprocess(
        ["benchmarks.bench_prefix_sharing", "--measure-memory", name, "--device", "cpu", *flags]
        + [f"--prompt-lens={prompt_len}"],
        env={"MALLOC_MMAP_THRESHOLD_": "65536"},
    )
    return out["peak_extra_bytes"]


def time_pairs(steps: dict[str, Callable[[], None]], device, repeats: int) -> dict[str, dict]:
    """{name: statistics of its wall times, and the median of its process CPU times}, plus "speedup" and
    "speedup_cpu_time": medians over the repeats of unshared / shared time of the same pair. The contenders'
    steps alternate (A B, B A, A B, ...) after a warm-up step each, so that a load change on a shared machine
    hits both; CPU time (all threads) is the steadier measure on a loaded CPU, wall time the one on CUDA."""
    for step in steps.values():
        step()
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(repeats):
        for name in list(steps)[:: 1 if i % 2 == 0 else -1]:
            synchronize(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            steps[name]()
            synchronize(device)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            gc.collect()
    out = {name: {**timing_summary(wall[name]), "cpu_median_s": statistics.median(cpu[name])} for name in steps}
    out["speedup"] = _paired_ratio(wall)
    out["speedup_cpu_time"] = _paired_ratio(cpu)
    return out


def _paired_ratio(samples: dict[str, list[float]]) -> float:
    return statistics.median(u / s for u, s in zip(samples["unshared"], samples["shared"], strict=True))


def run_ratio(args, prompt_len: int, model, device, autocast: bool) -> dict:
    """Agreement, time and memory of both contenders at one prompt length."""
    batch, advantages = build_batch(args, prompt_len, device)
    rows = args.groups * args.group_size
    result = {
        "prompt_len": prompt_len,
        "completion_len": args.completion_len,
        "ratio": f"{prompt_len / args.completion_len:g}:1",
        "backbone_tokens_unshared": rows * (prompt_len + args.completion_len),
        "backbone_tokens_shared": args.groups * prompt_len + rows * (args.completion_len - 1),
        "worth_sharing": worth_sharing([prompt_len] * rows, [args.completion_len] * rows, args.group_size),
        "agreement": agreement(model, batch, advantages, autocast),
    }
    steps = {name: make_step(name, model, batch, advantages, autocast) for name in CONTENDERS}
    timings = time_pairs(steps, device, args.repeats)
    for name in CONTENDERS:
        memory = None
        if not args.no_memory:
            memory = memory_of(name, args, prompt_len, model, batch, advantages, device, autocast)
        result[name] = {**timings.pop(name), "peak_extra_bytes": memory}
    result |= timings
    if not args.no_memory:
        result["memory_shared_vs_unshared"] = result["shared"]["peak_extra_bytes"] / max(
            result["unshared"]["peak_extra_bytes"], 1
        )
    return result


TABLE_COLUMNS = (
    ("P:T", 7),
    ("saved", 6),
    ("unshared ms", 12),
    ("shared ms", 10),
    ("speedup", 8),
    ("cpu-time speedup", 17),
    ("unshared MiB", 13),
    ("shared MiB", 11),
    ("grad rel diff", 14),
)


def format_table(results: list[dict]) -> str:
    """Per prompt length: tokens saved, wall and CPU time medians, paired speedups, peak extra memory."""

    def mib(r: dict, name: str) -> str:
        extra = r[name]["peak_extra_bytes"]
        return "-" if extra is None else f"{extra / 2**20:.0f}"

    cells = (
        (
            r["ratio"],
            f"{1 - r['backbone_tokens_shared'] / r['backbone_tokens_unshared']:.0%}",
            f"{r['unshared']['median_s'] * 1e3:.0f}",
            f"{r['shared']['median_s'] * 1e3:.0f}",
            f"{r['speedup']:.2f}x",
            f"{r['speedup_cpu_time']:.2f}x",
            mib(r, "unshared"),
            mib(r, "shared"),
            f"{r['agreement']['grad_max_rel_diff']:.1e}",
        )
        for r in results
    )
    return text_table(TABLE_COLUMNS, cells)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_shape_arguments(parser)
    parser.add_argument("--groups", type=int, default=1, help="prompts per micro-batch")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--prompt-lens", default="16,64,256,1024", help="comma-separated prompt lengths")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument(
        "--quick", action="store_true", help="a tiny model at prompts 8 and 32, one repeat, no memory measurement"
    )
    parser.add_argument("--out", default=None, help="write the JSON results here")
    parser.add_argument("--measure-memory", choices=tuple(CONTENDERS), default=None, help=argparse.SUPPRESS)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK, prompt_lens="8,32", repeats=1, no_memory=True)
    args.prompt_lens = [int(x) for x in str(args.prompt_lens).split(",")]
    return args


def main(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    autocast = device.type == "cuda"  # bf16 autocast on GPU, fp32 on CPU
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(args, device)
    if args.measure_memory:
        batch, advantages = build_batch(args, args.prompt_lens[0], device)
        peak = measure_memory(args.measure_memory, model, batch, advantages, device, autocast)
        print(json.dumps({"peak_extra_bytes": peak}))
        return 0
    results = []
    for prompt_len in args.prompt_lens:
        results.append(run_ratio(args, prompt_len, model, device, autocast))
        check = results[-1]["agreement"]
        print(
            f"P={prompt_len}: loss shared {check['loss_shared']:.6f}, unshared {check['loss_unshared']:.6f}; "
            f"gradients max |diff| / max |grad| {check['grad_max_rel_diff']:.1e}",
            flush=True,
        )
    print(format_table(results))
    if args.out:
        payload = {
            "benchmark": "prefix_sharing",
            "environment": environment_stamp(device),
            "shape": {flag: getattr(args, flag) for flag in MODEL_FLAGS + BATCH_FLAGS},
            "precision": "bf16 autocast" if autocast else "fp32",
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
            "results": results,
        }
        write_json(args.out, payload)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(parse()))
