"""AOT-compile the layer-1 Triton kernels for sm_90 on a CPU machine and report their resource usage.

Compile-time evidence only (no GPU, no timing): for each kernel and block configuration it prints the
registers per thread, spill stores / loads (bytes per thread, from `ptxas -v`), the shared memory Triton
allocates (dynamic, from the kernel metadata) and whether the dots became Hopper `wgmma` (PTX
`wgmma.mma_async`, and the count of `HGMMA` instructions in the SASS when `cuobjdump` is available).

    .venv/bin/python benchmarks/aot_triton_sweep.py --defaults            # the default_blocks() configs
    .venv/bin/python benchmarks/aot_triton_sweep.py --kernels bwd --block-n 64,128 --block-v 64,128 \\
        --block-h 32,64 --warps 4,8 --stages 2,3 --jobs 2 --markdown

Integer arguments that Triton would specialise at run time on the real shapes (H, V, strides, split
sizes, all multiples of 16 for Qwen / Llama) get `tt.divisibility = 16`, as the JIT would give them;
`do_not_specialize` arguments (the row count N and its derived counts) get nothing;
`--no-int-divisibility` compiles what the JIT builds when H or a stride is not a multiple of 16 (no
vectorised or pipelined loads: many more registers). The kernels are compiled with bias off (`--bias`),
without a logit soft cap (`--softcap`) and, for the backward kernels, with the entropy gradient on
(`--no-grad-entropy`), GROUP_N = 16 for the atomic backward. Registers come from the ptxas Triton compiles
with (triton 3.9: its bundled `ptxas-blackwell`, CUDA 13.4); `--ptxas` runs another one on the same PTX
instead (`--ptx-version 9.0` for CUDA 13.0, which rejects triton 3.9's `.version 9.4`). Compiled kernels are
cached in TRITON_CACHE_DIR as usual; on a cache hit ptxas is re-run on the cached PTX for the log.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import itertools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

# Kernel short names -> (attribute in kernels.linear_logprobs, default_blocks kind).
KERNELS = {
    "fwd": ("_linear_logprobs_fwd_kernel", "forward"),
    "bwd": ("_linear_logprobs_bwd_kernel", "backward"),
    "dh": ("_linear_logprobs_bwd_dh_kernel", "deterministic"),
    "dw": ("_linear_logprobs_bwd_dw_kernel", "deterministic"),
}
_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
_FP32_POINTERS = {"part_ptr", "zy_ptr", "lse_ptr", "ent_ptr", "gl_ptr", "gh_ptr", "dh_ptr", "dw_ptr", "db_ptr"}
_FLOAT_SCALARS = {"inv_temperature", "softcap"}
# sm_90: 227 KiB of shared memory per block (opt-in maximum).
SM90_SHARED_LIMIT = 232448


@dataclass(frozen=True)
class Job:
    kernel: str
    dtype: str
    block_n: int
    block_v: int
    block_h: int
    num_warps: int
    num_stages: int
    has_bias: bool = False
    grad_entropy: bool = True
    int_divisibility: bool = True
    has_softcap: bool = False

    def variant(self) -> str:
        flags = ["bias"] if self.has_bias else []
        flags += ["softcap"] if self.has_softcap else []
        flags += [] if self.grad_entropy or self.kernel == "fwd" else ["no-gH"]
        flags += [] if self.int_divisibility else ["no-div16"]
        return ",".join(flags) or "-"


@dataclass
class Result:
    job: Job
    shared: int | None = None
    regs: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack: int | None = None
    wgmma_ptx: bool | None = None
    hgmma_sass: int | None = None
    seconds: float | None = None
    error: str | None = None


def _signature(fn, dtype: str, constexprs: dict, int_divisibility: bool = True) -> tuple[dict, dict]:
    do_not_specialize = {fn.arg_names[i] if isinstance(i, int) else i for i in fn.do_not_specialize}
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "y_ptr":
            sig[name] = "*i64"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in _FP32_POINTERS:
            sig[name] = "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.endswith("_ptr"):
            sig[name] = "*" + dtype
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in _FLOAT_SCALARS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if int_divisibility and name not in do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def _parse_ptxas_log(log: str, result: Result) -> None:
    if m := re.search(r"Used (\d+) registers", log):
        result.regs = int(m.group(1))
    if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log):
        result.stack, result.spill_stores, result.spill_loads = (int(g) for g in m.groups())


def _ptxas_log(ptx: str, ptxas: str, ptx_version: str | None) -> str:
    if ptx_version:
        ptx = re.sub(r"\.version \d+\.\d+", f".version {ptx_version}", ptx)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [ptxas, "-lineinfo", "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a", src, "-o", src + ".o"]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stderr


def _triton_ptxas() -> str:
    """The ptxas Triton itself runs for sm_90 (triton 3.9: the bundled `ptxas-blackwell`, CUDA 13.x)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return get_ptxas(90).path
    except (ImportError, TypeError):  # older Triton: one bundled ptxas
        from triton import knobs

        return knobs.nvidia.ptxas.path


def _count_hgmma(cubin: bytes) -> int | None:
    from triton import knobs

    try:
        cuobjdump = knobs.nvidia.cuobjdump.path
    except Exception:  # noqa: BLE001 - tool missing: report no SASS
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return len(re.findall(r"\bHGMMA\.", out.stdout))


def compile_job(job: Job, ptxas: str | None = None, ptx_version: str | None = None) -> Result:
    import time

    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import kernels.linear_logprobs as L

    result = Result(job)
    start = time.perf_counter()
    try:
        fn = getattr(L, KERNELS[job.kernel][0])
        constexprs = dict(
            HAS_BIAS=job.has_bias,
            HAS_SOFTCAP=job.has_softcap,
            BLOCK_N=job.block_n,
            BLOCK_V=job.block_v,
            BLOCK_H=job.block_h,
            DOT_UPCAST=False,
            DOT_PRECISION="ieee" if job.dtype == "fp32" else "tf32",
        )
        if job.kernel != "fwd":
            constexprs["HAS_GRAD_ENTROPY"] = job.grad_entropy
        if job.kernel == "bwd":
            constexprs["GROUP_N"] = 16
        sig, attrs = _signature(fn, job.dtype, constexprs, job.int_divisibility)
        src = ASTSource(fn, sig, constexprs, attrs)
        log = io.StringIO()
        knobs.nvidia.dump_ptxas_log = ptxas is None
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(
                src,
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": job.num_warps, "num_stages": job.num_stages},
            )
        ptx = compiled.asm["ptx"]
        text = log.getvalue()
        if ptxas is not None or "Used" not in text:  # another ptxas, or a cache hit (no log printed)
            text = _ptxas_log(ptx, ptxas or _triton_ptxas(), ptx_version)
        _parse_ptxas_log(text, result)
        result.shared = compiled.metadata.shared
        result.wgmma_ptx = "wgmma.mma_async" in ptx
        result.hgmma_sass = _count_hgmma(compiled.asm["cubin"])
    except Exception as e:  # noqa: BLE001 - report the failure in the table
        result.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
    result.seconds = time.perf_counter() - start
    return result


def default_jobs(kernels: list[str], dtypes: list[str], **variant) -> list[Job]:
    import torch

    import kernels.linear_logprobs as L

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    jobs = []
    for dtype in dtypes:
        for kernel in kernels:
            b = L.default_blocks(KERNELS[kernel][1], torch_dtype[dtype])
            jobs.append(Job(kernel, dtype, b.block_n, b.block_v, b.block_h, b.num_warps, b.num_stages, **variant))
    return jobs


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _fmt(value, suffix: str = "") -> str:
    return "–" if value is None else f"{value}{suffix}"


def format_row(r: Result, markdown: bool) -> str:
    j = r.job
    cells = [
        j.kernel,
        j.dtype,
        f"{j.block_n}×{j.block_v}×{j.block_h}",
        str(j.num_warps),
        str(j.num_stages),
        j.variant(),
    ]
    if r.error:
        cells += ["FAILED: " + r.error, "", "", "", ""]
    else:
        kib = None if r.shared is None else f"{r.shared / 1024:.0f}"
        fits = "" if r.shared is None or r.shared <= SM90_SHARED_LIMIT else " (>227)"
        cells += [
            _fmt(r.regs),
            f"{_fmt(r.spill_stores)}/{_fmt(r.spill_loads)}",
            _fmt(kib) + fits,
            ("yes" if r.wgmma_ptx else "NO") + ("" if r.hgmma_sass is None else f" ({r.hgmma_sass})"),
            f"{r.seconds:.0f}s",
        ]
    if markdown:
        return "| " + " | ".join(cells) + " |"
    return "  ".join(f"{c:>{w}}" for c, w in zip(cells, _WIDTHS, strict=True))


_WIDTHS = (4, 5, 12, 5, 6, 8, 5, 13, 8, 13, 7)
HEADER = [
    "kernel",
    "dtype",
    "N×V×H",
    "warps",
    "stages",
    "variant",
    "regs",
    "spill st/ld B",
    "smem KiB",
    "wgmma (HGMMA)",
    "compile",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default="fwd,bwd,dh,dw", help="comma list of fwd,bwd,dh,dw")
    parser.add_argument("--dtypes", default="bf16", help="comma list of bf16,fp16,fp32")
    parser.add_argument("--defaults", action="store_true", help="only the default_blocks() configurations")
    parser.add_argument("--block-n", default="64,128")
    parser.add_argument("--block-v", default="64,128")
    parser.add_argument("--block-h", default="64")
    parser.add_argument("--warps", default="8")
    parser.add_argument("--stages", default="3")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles (processes)")
    parser.add_argument("--ptxas", default=None, help="run this ptxas for -v instead of Triton's bundled one")
    parser.add_argument("--ptx-version", default=None, help="rewrite the PTX .version (e.g. 9.0) for --ptxas")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--bias", action="store_true", help="compile with a bias (HAS_BIAS)")
    parser.add_argument("--no-grad-entropy", action="store_true", help="backward kernels without gH")
    parser.add_argument("--softcap", action="store_true", help="compile with a logit soft cap (HAS_SOFTCAP)")
    parser.add_argument(
        "--no-int-divisibility",
        action="store_true",
        help="no tt.divisibility on H / V / strides (what the JIT compiles when H is not a multiple of 16)",
    )
    args = parser.parse_args(argv)

    kernels = args.kernels.split(",")
    dtypes = [_DTYPES[d] for d in args.dtypes.split(",")]
    variant = dict(
        has_bias=args.bias,
        grad_entropy=not args.no_grad_entropy,
        int_divisibility=not args.no_int_divisibility,
        has_softcap=args.softcap,
    )
    if args.defaults:
        jobs = default_jobs(kernels, dtypes, **variant)
    else:
        jobs = [
            Job(k, d, n, v, h, w, s, **variant)
            for d, k, n, v, h, w, s in itertools.product(
                dtypes,
                kernels,
                _ints(args.block_n),
                _ints(args.block_v),
                _ints(args.block_h),
                _ints(args.warps),
                _ints(args.stages),
            )
        ]
    if args.markdown:
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
    else:
        print("  ".join(f"{c:>{w}}" for c, w in zip(HEADER, _WIDTHS, strict=True)))
    failed = False
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(compile_job, job, args.ptxas, args.ptx_version) for job in jobs]
        for future in futures:  # in submission order, so the table reads in grid order
            result = future.result()
            failed |= result.error is not None
            print(format_row(result, args.markdown), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
