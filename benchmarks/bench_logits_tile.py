"""The chunked backends' logits GEMM on CPU: a tile computed into a new tensor and copied into the workspace
(the sequence the CUDA bf16 path ran before it wrote into the workspace with `out=`) against one GEMM that
writes the tempered tile straight into the workspace (`ChunkedBackend._logits`).

    before  t = h Wᵀ (a new [R, V] fp32 tensor); workspace.copy_(t); workspace.mul_(1/τ)
    after   torch.addmm(workspace, h, Wᵀ, beta=0, alpha=1/τ, out=workspace)

R x H x V fp32 (default: the `cpu` backend's chunk at bench_loss's CPU shape, N=2048 split into 6 chunks of
342 rows, H=512, V=32768). The two run alternately, `--repeats` times each, after one warm-up each, so that
a busy machine slows both alike; the JSON records the load average before and after.

    python benchmarks/bench_logits_tile.py [--rows 342] [--hidden 512] [--vocab 32768] [--repeats 20]
        [--out benchmarks/results/logits_tile_cpu.json]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from grpo_fast.backends.chunked import ChunkedBackend
from grpo_fast.bench.common import environment_stamp, timing_summary, write_json

INV_TEMPERATURE = 1 / 0.9


def before(hidden: torch.Tensor, weight: torch.Tensor, workspace: torch.Tensor) -> None:
    """hidden [R, H], weight [V, H] -> workspace [R, V]: GEMM into a temporary, copy, scale."""
    tile = torch.mm(hidden, weight.t())
    workspace.copy_(tile).mul_(INV_TEMPERATURE)


def after(hidden: torch.Tensor, weight: torch.Tensor, workspace: torch.Tensor) -> None:
    """hidden [R, H], weight [V, H] -> workspace [R, V]: the backend's own call (one GEMM, α = 1/τ)."""
    ChunkedBackend._logits(hidden, weight, None, INV_TEMPERATURE, workspace)


def measure(rows: int, hidden_size: int, vocab: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, hidden_size, generator=gen)
    weight = torch.randn(vocab, hidden_size, generator=gen) / hidden_size**0.5
    workspace = torch.empty(rows, vocab)
    samples = {"before": [], "after": []}
    variants = {"before": before, "after": after}
    for fn in variants.values():
        fn(hidden, weight, workspace)  # warm-up
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn(hidden, weight, workspace)
            samples[name].append(time.perf_counter() - start)
    before(hidden, weight, workspace)
    want = workspace.clone()
    after(hidden, weight, workspace)
    torch.testing.assert_close(workspace, want, rtol=1e-5, atol=1e-5)  # the same tile either way
    out = {name: timing_summary(values) for name, values in samples.items()}
    out["after_over_before"] = out["after"]["median_s"] / out["before"]["median_s"]
    out["tile_bytes_saved"] = rows * vocab * 4
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=342)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None, help="write the JSON results here")
    args = parser.parse_args()
    for name in ("rows", "hidden", "vocab", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive integer, got {getattr(args, name)}")
    load_before = os.getloadavg()
    result = measure(args.rows, args.hidden, args.vocab, args.repeats)
    load = {"before": load_before, "after": os.getloadavg()}
    for name in ("before", "after"):
        ms = {key: result[name][key] * 1e3 for key in ("median_s", "p20_s", "p80_s")}
        print(f"{name:6s} median {ms['median_s']:8.2f} ms  (p20 {ms['p20_s']:.2f}, p80 {ms['p80_s']:.2f})")
    print(f"after / before {result['after_over_before']:.3f}; load average {load}")
    if args.out:
        shape = {"rows": args.rows, "hidden": args.hidden, "vocab": args.vocab, "dtype": "fp32"}
        payload = {"benchmark": "logits_tile", "environment": environment_stamp(torch.device("cpu")),
                   "load_average_1_5_15": load, "shape": shape, **result}  # fmt: skip
        write_json(args.out, payload)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
