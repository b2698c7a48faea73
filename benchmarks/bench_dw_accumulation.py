"""How the chunked backends (torch, cpu, cuda) accumulate dW for bf16/fp16 weights, variant by variant.

dW = Σ_chunks dzᵀ h τ⁻¹ is kept in fp32 while dz [R, V] is the fp32 tile in the workspace and h [R, H]
is in the weight's dtype. Variants (`_GradAccumulator.weight_mode` in grpo_fast/backends/chunked.py):

  slices            the old path: per vocabulary slice of 2^20 / H rows, a GEMM in the input dtype
                    (bf16 out on CPU; fp32 out via out_dtype on CUDA), then dW[slice] += that temporary
  fp32_addmm        (CPU default) dW.addmm_(dzᵀ, h.float()): one fp32 GEMM straight into dW, from the
                    unrounded fp32 dz; h's chunk upcast ([R, H], small)
  out_dtype_addmm   (CUDA default on torch >= 2.10) torch.addmm(dW, dz_bf16ᵀ, h, out_dtype=fp32, out=dW):
                    one cuBLAS GEMM with bf16 A/B and fp32 C, β = 1
  whole_then_add    (reference point, isolated timing only) one GEMM over the whole vocabulary in the
                    input dtype, converted and added: one dW-sized temporary

Measurements, in one run:
  gemm       one dW-shaped GEMM [V, N] x [N, H] in the input dtype and in fp32 (the vendor GEMM's speed)
  isolated   the dW accumulation alone over N rows in the chunk sizes each backend uses, and each mode's
             max |dW − dW_fp64| / max |dW_fp64| for the same dz tiles
  step       grpo_loss forward + backward (dapo, entropy bonus) per backend x variant, interleaved rounds
             (--step-shape), and each variant's end-to-end dW against the old path's

    python benchmarks/bench_dw_accumulation.py                       # CPU: N=2048, H=512, V=32768, bf16
    python benchmarks/bench_dw_accumulation.py --device cuda --shape 16384,3584,152064 --out results.json
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.backends import available_backends, chunked, get_backend
from grpo_fast.bench.common import environment_stamp, time_call, write_json
from grpo_fast.bench.loss import make_batch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def step_variants(device: torch.device) -> list[str]:
    if device.type == "cuda":
        modes = ["slices"]
        if chunked._cuda_addmm_accumulates_in_fp32(device):
            modes.append("out_dtype_addmm")
        return modes
    return ["slices", "fp32_addmm"]


@contextlib.contextmanager
def forced_mode(mode: str | None):
    """Make every _GradAccumulator use `mode` for low-precision dW (None: the library's choice)."""
    original = chunked._GradAccumulator.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if mode is not None and not self.full_precision:
            self.weight_mode = mode

    chunked._GradAccumulator.__init__ = init
    try:
        yield
    finally:
        chunked._GradAccumulator.__init__ = original


def isolated(backend, n, h, v, dtype, device, repeats, warmup, extra_modes) -> list[dict]:
    """The dW accumulation of one fwd+bwd alone: dz tiles [R, V] fp32 for every chunk of `backend` (one
    tile reused for every chunk); each mode's dW against fp64 Σ dzᵀh (dz as the mode consumes it)."""
    chunks = backend.row_chunks(n, v, device, None)
    rows = chunks[0].stop - chunks[0].start
    gen = torch.Generator(device=device).manual_seed(0)
    dz = torch.randn(rows, v, generator=gen, device=device) * 1e-3
    hidden = torch.randn(n, h, generator=gen, device=device).to(dtype)
    weight = torch.empty(v, h, dtype=dtype, device=device)
    modes = [*step_variants(device), *extra_modes]
    refs = {}
    out = []
    for mode in modes:
        acc = chunked._GradAccumulator(hidden, weight, None, 1.0)

        def run(acc=acc, mode=mode):
            acc.grad_weight.zero_()
            for c in chunks:
                r = c.stop - c.start
                tile = dz[:r]
                hc = hidden[c]
                if mode == "whole_then_add":
                    acc.grad_weight.add_(chunked._mm_acc(tile.to(dtype).t(), hc))
                    continue
                # the dW part of _GradAccumulator.add (dh excluded), with the tile's conversion where used
                dz_in = tile.to(dtype) if mode != "fp32_addmm" else None
                if mode == "fp32_addmm":
                    acc.grad_weight.addmm_(tile.t(), hc.float())
                elif mode == "out_dtype_addmm":
                    torch.addmm(acc.grad_weight, dz_in.t(), hc, out_dtype=torch.float32, out=acc.grad_weight)
                else:
                    for start in range(0, v, acc.vocab_slice):
                        cols = slice(start, start + acc.vocab_slice)
                        acc.grad_weight[cols].add_(chunked._mm_acc(dz_in[:, cols].t(), hc))

        timing = time_call(run, device, warmup=warmup, repeats=repeats)
        rounded = mode != "fp32_addmm"  # every other mode multiplies the dz tile rounded to the input dtype
        if rounded not in refs:
            tile = (dz.to(dtype) if rounded else dz).double()
            refs[rounded] = sum(tile[: c.stop - c.start].t() @ hidden[c].double() for c in chunks)
        ref = refs[rounded]
        err = ((acc.grad_weight.double() - ref).abs().max() / ref.abs().max()).item()
        row = {"backend": backend.name, "chunks": len(chunks), "rows_per_chunk": rows, "mode": mode, **timing}
        out.append(row | {"dW_max_rel_error_vs_fp64": err})
        print(
            f"isolated {backend.name:6s} {len(chunks):3d} chunks x {rows:5d} rows  {mode:16s} "
            f"{timing['median_s'] * 1e3:9.2f} ms (p20 {timing['p20_s'] * 1e3:.2f}, p80 {timing['p80_s'] * 1e3:.2f})"
            f"  max|dW - fp64| / max|fp64| {err:.2e}",
            flush=True,
        )
    return out


def gemm_baseline(n, h, v, dtype, device, repeats, warmup) -> list[dict]:
    """One dW-shaped GEMM [V, N] x [N, H] in `dtype` and in fp32, into a preallocated output."""
    gen = torch.Generator(device=device).manual_seed(1)
    out = []
    for name, dt in ((str(dtype).removeprefix("torch."), dtype), ("float32", torch.float32)):
        a = torch.randn(n, v, generator=gen, device=device).to(dt)
        b = torch.randn(n, h, generator=gen, device=device).to(dt)
        c = torch.empty(v, h, dtype=dt, device=device)
        timing = time_call(lambda a=a, b=b, c=c: torch.mm(a.t(), b, out=c), device, warmup=warmup, repeats=repeats)
        flops = 2 * n * h * v
        out.append({"gemm": f"dW-shaped {name}", **timing, "tflops": flops / timing["median_s"] / 1e12})
        print(
            f"gemm     dW-shaped {name:9s} one call {timing['median_s'] * 1e3:9.2f} ms "
            f"({flops / timing['median_s'] / 1e9:.1f} GFLOP/s)",
            flush=True,
        )
    return out


def steps(names, batch, config, device, repeats, warmup, rounds) -> tuple[list[dict], dict]:
    """grpo_loss fwd+bwd per (backend, mode), in `rounds` interleaved rounds; also each variant's last dW."""
    hidden = batch.hidden.detach().requires_grad_()
    weight = batch.weight.detach().requires_grad_()
    per_token = (batch.completion_ids, batch.completion_mask, batch.advantages, batch.old_logprobs)
    samples: dict[tuple[str, str], list[float]] = {}
    grads: dict[tuple[str, str], torch.Tensor] = {}
    for _ in range(rounds):
        for backend in names:
            cfg = GRPOLossConfig(**{**config.__dict__, "backend": backend})
            for mode in step_variants(device):

                def step(cfg=cfg):
                    hidden.grad = weight.grad = None
                    loss, _ = grpo_loss(hidden, weight, *per_token, config=cfg)
                    loss.backward()

                with forced_mode(mode):
                    timing = time_call(step, device, warmup=warmup, repeats=repeats)
                samples.setdefault((backend, mode), []).extend(timing["samples_s"])
                grads[(backend, mode)] = weight.grad.float()
    out = []
    for (backend, mode), times in samples.items():
        times.sort()
        median = times[len(times) // 2]
        out.append({"backend": backend, "mode": mode, "median_s": median, "samples_s": times})
        print(f"step     {backend:6s} {mode:16s} median {median * 1e3:9.1f} ms over {len(times)} runs", flush=True)
    return out, grads


def agreement(grads) -> list[dict]:
    """max |dW_mode − dW_slices| / max |dW_slices| per backend: the end-to-end dW (returned in the weight's
    dtype) of each mode against the old path on the same inputs. (Against an fp64 loss the end-to-end error
    is dominated by the bf16 logits, shared by every mode, so it says nothing about the accumulation: see
    the isolated errors.)"""
    out = []
    for (backend, mode), grad in grads.items():
        base = grads[(backend, "slices")].double()
        diff = ((grad.double() - base).abs().max() / base.abs().max()).item()
        out.append({"backend": backend, "mode": mode, "dW_max_rel_diff_vs_slices": diff})
        print(f"agree    {backend:6s} {mode:16s} max|dW - dW_slices| / max|dW_slices| = {diff:.3e}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--shape", default=None, help="N,H,V (CPU default 2048,512,32768; CUDA 16384,3584,152064)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--isolated-extra", nargs="*", default=["whole_then_add"], help="extra isolated modes")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the fwd+bwd timings")
    parser.add_argument("--skip", nargs="*", default=[], choices=["isolated", "gemm", "step"])
    parser.add_argument("--step-shape", default=None, help="N,H,V of the fwd+bwd timings (default: --shape)")
    parser.add_argument("--out", default=None, help="JSON file")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    default = "2048,512,32768" if device.type == "cpu" else "16384,3584,152064"
    n, h, v = (int(x) for x in (args.shape or default).split(","))
    names = [b for b in available_backends(device) if b in ("torch", "cpu", "cuda")]
    print(f"N={n} H={h} V={v} {args.dtype} on {device}; backends {names}", flush=True)
    result = {"shape": [n, h, v], "dtype": args.dtype, "env": environment_stamp(device)}

    def save() -> None:  # after each part, so that a kill keeps what finished
        if args.out:
            write_json(args.out, result)

    if "gemm" not in args.skip:
        result["gemm"] = gemm_baseline(n, h, v, dtype, device, args.repeats, args.warmup)
        save()
    if "isolated" not in args.skip:
        result["isolated"] = []
        for name in names:
            backend = get_backend(name, device)
            timing = (args.repeats, args.warmup, args.isolated_extra)
            result["isolated"] += isolated(backend, n, h, v, dtype, device, *timing)
            save()
    if "step" not in args.skip:
        sn, sh, sv = (int(x) for x in args.step_shape.split(",")) if args.step_shape else (n, h, v)
        result["step_shape"] = [sn, sh, sv]
        batch = make_batch(sn, sh, sv, dtype, args.device)
        config = GRPOLossConfig(loss_type="dapo", epsilon_high=0.28, entropy_coef=0.01)
        result["step"], grads = steps(names, batch, config, device, args.repeats, args.warmup, args.rounds)
        result["agreement"] = agreement(grads)
        save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
