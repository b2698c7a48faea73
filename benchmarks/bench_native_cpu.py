"""The C++ backend "cpu" against its speed of light on CPU: fwd+bwd of grpo_loss (fp32) next to the
three plain GEMMs of the same shapes (z = h Wᵀ [N, V], dh = z W, dW = zᵀ h), the torch backend and the
naive loss, all measured in the same run in interleaved rounds; and the peak extra memory of each,
each in its own subprocess (peak RSS over the inputs' RSS, Linux /proc; no tracemalloc).

    python benchmarks/bench_native_cpu.py                      # N=2048 H=512 V=32768, the issue's goal shape
    python benchmarks/bench_native_cpu.py --workspace-mb 8 16 32 64 --rounds 5 --json out.json

Goal (issue 3): cpu fwd+bwd <= 1.15x the three GEMMs, faster than the torch backend, peak extra
memory <= 5% of naive. Results are written to benchmarks/NOTES.md by hand ("C++/CUDA backend").
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

import torch

from grpo_fast import grpo_loss
from grpo_fast.config import GRPOLossConfig
from grpo_fast.reference import naive_grpo_loss


def make_inputs(n, h, v, seed=0):
    """Padded batch of 8 sequences x n/8 tokens: hidden [8, n/8, H], weight [V, H], GRPO per-token inputs."""
    g = torch.Generator().manual_seed(seed)
    b = 8
    t = n // b
    hidden = torch.randn(b, t, h, generator=g)
    weight = torch.randn(v, h, generator=g) / h**0.5
    ids = torch.randint(0, v, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    adv = torch.randn(b, generator=g)
    old = -torch.rand(b, t, generator=g) * 3
    return hidden, weight, ids, mask, adv, old


def variant_fn(name, inputs, workspace_bytes):
    """A zero-argument callable doing one fwd+bwd of `name` on `inputs`."""
    hidden, weight, ids, mask, adv, old = inputs
    if name == "gemms":
        h2 = hidden.reshape(-1, hidden.shape[-1])
        z = torch.empty(h2.shape[0], weight.shape[0])
        dh, dw = torch.empty_like(h2), torch.empty_like(weight)

        def run():
            torch.mm(h2, weight.t(), out=z)
            torch.mm(z, weight, out=dh)
            torch.mm(z.t(), h2, out=dw)

        run.release = lambda: None
        return run
    hh, ww = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)

    def release():
        hh.grad = ww.grad = None

    def run():
        release()
        if name == "naive":
            loss, _ = naive_grpo_loss(hh, ww, ids, mask, adv, old)
        else:
            cfg = GRPOLossConfig(backend=name, workspace_bytes=workspace_bytes)
            loss, _ = grpo_loss(hh, ww, ids, mask, adv, old, config=cfg)
        loss.backward()

    run.release = release
    return run


def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory_child(name, n, h, v, workspace_bytes):
    """In a fresh process: peak RSS during one fwd+bwd over the RSS with the inputs resident, less the
    gradients every implementation must return (dh, dW): the memory a method needs beyond its inputs
    and outputs. A warm-up call first, so one-time library buffers do not count."""
    inputs = make_inputs(n, h, v)
    fn = variant_fn(name, inputs, workspace_bytes)
    fn()
    fn.release()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM (peak RSS) to the current RSS
    before = _rss_kib("VmRSS")
    fn()
    outputs = 4 * (inputs[0].numel() + inputs[1].numel())
    return (_rss_kib("VmHWM") - before) * 1024 - (outputs if name != "gemms" else 0)


def measure_memory(name, n, h, v, workspace_bytes):
    code = (
        "import sys; sys.path.insert(0, {root!r}); import bench_native_cpu as b; "
        "print(b.measure_memory_child({name!r}, {n}, {h}, {v}, {ws}))"
    ).format(root=str(__import__("pathlib").Path(__file__).parent), name=name, n=n, h=h, v=v, ws=workspace_bytes)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--h", type=int, default=512)
    parser.add_argument("--v", type=int, default=32768)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workspace-mb", type=int, nargs="+", default=[None], help="cpu backend workspace budgets")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive loss (slow, ~1 GB)")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    inputs = make_inputs(args.n, args.h, args.v)
    variants = [("gemms", None)]
    variants += [(f"cpu[{mb}MB]" if mb else "cpu", None if mb is None else mb << 20) for mb in args.workspace_mb]
    variants += [("torch", None)] + ([] if args.no_naive else [("naive", None)])
    fns = {label: variant_fn(label.split("[")[0], inputs, ws) for label, ws in variants}
    for fn in fns.values():
        fn()  # warm-up
    times = {label: [] for label in fns}
    for _ in range(args.rounds):  # interleaved: machine noise hits every variant alike
        for label, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)

    gemm = statistics.median(times["gemms"])
    flops = 3 * 2 * args.n * args.h * args.v
    print(f"N={args.n} H={args.h} V={args.v} fp32, threads={torch.get_num_threads()}, rounds={args.rounds}")
    print(f"three GEMMs: {flops / 1e9:.1f} GFLOP, {flops / gemm / 1e9:.1f} GFLOP/s")
    results = {}
    for label, ws in variants:
        ts = sorted(times[label])
        med = statistics.median(ts)
        row = {"median_s": med, "p20_s": ts[int(0.2 * (len(ts) - 1))], "p80_s": ts[int(0.8 * (len(ts) - 1))]}
        row["vs_gemms"] = med / gemm
        if not args.no_memory and label != "gemms":
            row["peak_extra_bytes"] = measure_memory(label.split("[")[0], args.n, args.h, args.v, ws)
        results[label] = row
    naive_mem = results.get("naive", {}).get("peak_extra_bytes")
    for label, row in results.items():
        mem = row.get("peak_extra_bytes")
        mem_s = "" if mem is None else f"  peak extra {mem / 2**20:7.1f} MiB"
        if mem is not None and naive_mem:
            row["memory_vs_naive"] = mem / naive_mem
            mem_s += f" ({100 * mem / naive_mem:.1f}% of naive)"
        print(
            f"{label:>12}: median {row['median_s']:.3f} s  (p20 {row['p20_s']:.3f}, p80 {row['p80_s']:.3f})"
            f"  {row['vs_gemms']:.3f}x GEMMs{mem_s}"
        )
    if args.json:
        stamp = {"torch": torch.__version__, "machine": platform.processor() or platform.machine()}
        from grpo_fast.backends import native

        stamp["cpu_kernel_isa"] = native.cpu_kernel_isa()
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "env": stamp, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
