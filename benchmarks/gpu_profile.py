"""Where the GRPO loss's time goes on a GPU: the "why" behind benchmarks/bench_loss.py's ratios.

Parts (--parts, in this order; each one's results go to the JSON as soon as it is measured):
  bandwidth   device-to-device copy of a --copy-gib buffer (bytes read + written over the time) and a read-only sum
              over it: the rate every memory-bound pass of the epilogues can reach
  gemm3 | triton | torch | cuda | cpu | trl   one variant of benchmarks/bench_loss.py (grpo_fast/bench/loss.py: the
              same batch, loss and step) at the shape: its time (median of --repeats after a warm-up), then one step
              under torch.profiler: every kernel's count and total time, the kernels' time by kind (GEMM, grpo_fast's
              CUDA epilogue, grpo_fast's Triton layer 1, its Triton token loss, TRL's Triton folds, other Triton,
              elementwise / copy / reduction, other) and the share of the step's time with a kernel running (below 1:
              the GPU waited for the host). On CPU (the dry run) the table holds the aten ops by self CPU time.
  triton metadata (after every part) registers, spill bytes, shared memory, warps and stages of each compiled Triton
              kernel of grpo_fast (and of TRL's, when it ran), read from the compiled kernels; none under
              TRITON_INTERPRET=1

    python benchmarks/gpu_profile.py --device cuda --out profile_cuda.json          # Qwen2.5-7B's head, N=16384, bf16
    python benchmarks/gpu_profile.py --device cuda --parts cuda --out profile_cuda.json --update
    python benchmarks/gpu_profile.py --device cpu --shape 256,32,512 --out /tmp/profile_cpu.json   # a CPU dry run
    python benchmarks/gpu_profile.py --show profile_cuda.json                        # the headline of a JSON

The headline (every part's numbers in a few lines) is printed last.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_fast import GRPOLossConfig  # noqa: E402
from grpo_fast.bench.common import environment_stamp, synchronize, time_call, write_json  # noqa: E402
from grpo_fast.bench.loss import MODELS, make_batch, make_step  # noqa: E402

VARIANTS = ("gemm3", "triton", "torch", "cuda", "cpu", "trl")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
KINDS = (  # (kind, regular expression on a kernel's name), the first match wins
    ("grpo_fast CUDA epilogue", r"logprob_stats_kernel|logprob_grad_kernel"),
    ("grpo_fast Triton layer 1", r"_linear_logprobs"),
    ("grpo_fast Triton token loss", r"_grpo_token_loss"),
    ("TRL Triton folds", r"_forward_kernel|_backward_kernel"),
    ("GEMM", r"gemm|gemv|cutlass|xmma|nvjet|wgmma|cublas|(^|[_:])mm(_|$)|addmm|matmul|bmm"),
    ("other Triton", r"^triton_|_kernel$"),
    ("elementwise / copy / reduction", r"elementwise|vectorized|unrolled|copy|memcpy|memset|fill|reduce|scatter"),
)
TRITON_MODULES = (
    "grpo_fast.kernels.linear_logprobs",
    "grpo_fast.kernels.grpo_token_loss",
    "trl.kernels.chunked_logprob",
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, name, re.I)), "other")


def bandwidth(device: torch.device, nbytes: int, repeats: int) -> dict:
    """Copy and read rates over a buffer of `nbytes` (GB/s: 1e9 bytes per second)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy = time_call(lambda: dst.copy_(src), device, warmup=2, repeats=repeats)
    read = time_call(lambda: src.sum(), device, warmup=2, repeats=repeats)
    return {
        "buffer_bytes": nbytes,
        "copy_median_s": copy["median_s"],
        "copy_gb_per_s": 2 * nbytes / copy["median_s"] / 1e9,  # read + write
        "read_median_s": read["median_s"],
        "read_gb_per_s": nbytes / read["median_s"] / 1e9,
    }


def profile_step(step, device: torch.device) -> dict:
    """One step under torch.profiler: its kernels (on CPU: aten ops) by total time, their kinds, the busy share."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        step()
        synchronize(device)
    wall_us = (time.perf_counter() - start) * 1e6
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if device.type == "cuda":
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            duration = event.time_range.elapsed_us()
        else:
            if not event.name.startswith("aten::"):
                continue
            duration = event.self_cpu_time_total
        count_time = totals.setdefault(event.name, [0, 0.0])
        count_time[0] += 1
        count_time[1] += duration
    busy_us = sum(t for _, t in totals.values())
    kernels = sorted(({"name": n, "kind": kind_of(n), "count": c, "total_ms": t / 1e3} for n, (c, t) in totals.items()),
                     key=lambda k: -k["total_ms"])  # fmt: skip
    by_kind: dict[str, float] = {}
    for k in kernels:
        by_kind[k["kind"]] = by_kind.get(k["kind"], 0.0) + k["total_ms"]
    return {
        "what": "CUDA kernels" if device.type == "cuda" else "aten ops, self CPU time",
        "profiled_step_ms": wall_us / 1e3,
        "busy_ms": busy_us / 1e3,
        "busy_share": busy_us / wall_us if device.type == "cuda" else None,
        "by_kind_ms": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "kernels": kernels[:25],
        "kernel_count": sum(k["count"] for k in kernels),
    }


def measure_variant(name: str, shape: dict, dtype: torch.dtype, device: torch.device, repeats: int) -> dict:
    """Time, then profile, one variant's forward+backward at `shape` (bench_loss's batch and dapo loss)."""
    batch = make_batch(shape["N"], shape["H"], shape["V"], dtype=dtype, device=str(device))
    step, _ = make_step(name, batch, GRPOLossConfig(loss_type="dapo"))
    row = {"variant": name} | time_call(step, device, warmup=1, repeats=repeats)
    row["profile"] = profile_step(step, device)
    del step, batch
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def triton_kernels() -> list[dict]:
    """Every compiled Triton kernel of the modules in TRITON_MODULES that ran: registers, spills, shared memory."""
    from triton.runtime.jit import JITFunction

    rows = []
    for module_name in TRITON_MODULES:
        module = sys.modules.get(module_name)
        if module is None:  # not imported by the parts that ran (TRL's without the trl part)
            continue
        for name, fn in vars(module).items():
            fn = getattr(fn, "fn", fn)  # heuristics / autotune wrappers hold the JITFunction
            if not isinstance(fn, JITFunction):
                continue
            caches = getattr(fn, "device_caches", None) or getattr(fn, "cache", {})  # triton >= 3.2 | older
            for device, cache in caches.items():
                for compiled in (cache[0] if isinstance(cache, tuple) else cache).values():
                    compiled._init_handles()  # loads the binary: fills n_regs and n_spills
                    meta = compiled.metadata
                    rows.append({
                        "module": module_name, "kernel": name, "device": str(device),
                        "registers": getattr(compiled, "n_regs", None), "spills": getattr(compiled, "n_spills", None),
                        "shared_bytes": getattr(meta, "shared", None), "num_warps": getattr(meta, "num_warps", None),
                        "num_stages": getattr(meta, "num_stages", None),
                    })  # fmt: skip
    return rows


def _record_triton_kernels(result: dict) -> None:
    """result["triton_kernels"] from the kernels compiled so far (none in the interpreter, nothing without triton)."""
    if "triton" not in sys.modules:
        return
    try:
        rows = triton_kernels() if torch.cuda.is_available() else []
        if rows or not result.get("triton_kernels"):  # an --update part that compiled none keeps the earlier rows
            result["triton_kernels"] = rows
        result.pop("triton_kernels_error", None)
    except Exception as exc:  # noqa: BLE001 - Triton's internals move between versions: say so, keep the run
        result["triton_kernels_error"] = f"{type(exc).__name__}: {exc}"


def headline(result: dict) -> str:
    """The numbers in a few lines: bandwidth, each variant's time over the GEMMs' and its kernels by kind."""
    lines = [f"gpu_profile: {result['shape']} {result['dtype']} on {result['environment'].get('gpu') or 'CPU'}"]
    if "bandwidth" in result:
        b = result["bandwidth"]
        lines.append(f"bandwidth: copy {b['copy_gb_per_s']:.0f} GB/s, read {b['read_gb_per_s']:.0f} GB/s")
    gemm = result["variants"].get("gemm3", {}).get("median_s")
    for name, row in result["variants"].items():
        if "median_s" not in row:
            lines.append(f"{name:7s} {row.get('status')}")
            continue
        p = row["profile"]
        ratio = f" = {row['median_s'] / gemm:.2f}x gemm3" if gemm else ""
        busy = "" if p["busy_share"] is None else f", busy {100 * p['busy_share']:.0f}%"
        kinds = "; ".join(f"{k} {ms:.1f}" for k, ms in p["by_kind_ms"].items() if ms >= 0.05)
        lines.append(f"{name:7s} {row['median_s'] * 1e3:8.1f} ms{ratio}{busy}, {p['kernel_count']} kernels: {kinds}")
        top = ", ".join(f"{k['name'][:60]} x{k['count']} {k['total_ms']:.1f} ms" for k in p["kernels"][:3])
        lines.append(f"        top: {top}")
    for k in result.get("triton_kernels", []):
        lines.append(
            f"triton  {k['kernel']}: {k['registers']} registers, {k['spills']} spill bytes, "
            f"{(k['shared_bytes'] or 0) / 1024:.0f} KiB shared, {k['num_warps']} warps, {k['num_stages']} stages"
        )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", choices=list(MODELS), default="qwen2.5-7b", help="the lm_head's shape")
    ap.add_argument("--tokens", type=int, default=16384, help="N")
    ap.add_argument("--shape", default=None, help="N,H,V instead of --model / --tokens")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--parts", nargs="+", choices=["bandwidth", *VARIANTS], default=None,
                    help="default: bandwidth gemm3 triton torch cuda trl (cpu instead of cuda on CPU)")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--copy-gib", type=float, default=2.0, help="bandwidth buffer (GiB; 1/32 of it on CPU)")
    ap.add_argument("--out", default=None, help="JSON results")
    ap.add_argument("--update", action="store_true", help="add to --out's parts instead of starting afresh")
    ap.add_argument("--show", default=None, metavar="JSON", help="only print the headline of a results JSON")
    args = ap.parse_args(argv)
    if args.update and not args.out:
        ap.error("--update adds to --out: give --out")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.show:
        print(headline(json.loads(Path(args.show).read_text())))
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_profile: --device cuda, but torch sees no CUDA device")
    n, h, v = (int(x) for x in args.shape.split(",")) if args.shape else (args.tokens, *MODELS[args.model])
    shape = {"N": n, "H": h, "V": v, "model": None if args.shape else args.model}
    parts = args.parts or ["bandwidth", "gemm3", "triton", "torch", "cuda" if device.type == "cuda" else "cpu", "trl"]
    result = {"benchmark": "gpu_profile", "variants": {}}
    if args.update and Path(args.out).exists():
        result = json.loads(Path(args.out).read_text())
    result |= {"environment": environment_stamp(device, packages=("triton", "trl")), "shape": shape,
               "dtype": args.dtype}  # fmt: skip
    result.setdefault("commands", []).append(" ".join([Path(sys.executable).name, *sys.argv]))
    for part in parts:
        started = time.perf_counter()
        try:
            if part == "bandwidth":
                nbytes = int(args.copy_gib * 2**30) // (1 if device.type == "cuda" else 32)
                result["bandwidth"] = bandwidth(device, nbytes, args.repeats)
            else:
                result["variants"][part] = measure_variant(part, shape, DTYPES[args.dtype], device, args.repeats)
        except Exception as exc:  # noqa: BLE001 - one broken part (a peer missing, a kernel failing) must not end the run
            result["variants"][part] = {"variant": part, "status": f"error: {type(exc).__name__}: {str(exc)[:300]}"}
        _record_triton_kernels(result)
        print(f"gpu_profile: {part} in {time.perf_counter() - started:.1f} s", flush=True)
        if args.out:
            write_json(args.out, result)
    print(headline(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
