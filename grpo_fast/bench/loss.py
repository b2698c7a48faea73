"""Forward+backward time and peak extra memory of the GRPO loss, every variant side by side:

  naive   full logits + log_softmax + gather (TRL's path), autograd
  torch | cpu | cuda | triton   grpo_loss with that backend (whichever load on the device);
          `cpu@48` is the cpu backend with a 48 MiB logits workspace (--workspace-mb sweeps it)
  liger   Liger-Kernel's LigerFusedLinearGRPOLoss (when installed; torch.compile'd on CUDA only)
  trl     TRL's fused head (trl.kernels.ChunkedLogProbFunction with the vocabulary tile TRL's trainers use:
          cuBLAS tiles + Triton fold on CUDA, torch tiles elsewhere; the backward recomputes the tiles)
          followed by TRL's loss in torch (when TRL is installed)
  gemm3   the three plain GEMMs of the same shapes (h Wᵀ, dz W, dzᵀ h): the speed of light,
          6·N·H·V FLOPs; every variant's time is also reported as a ratio to it.

Peak extra memory = peak − (inputs, weight, and the gradients of hidden and weight). On CPU each
variant is measured in its own interpreter (peak RSS, with glibc returning freed blocks at once);
on CUDA with the caching allocator's peak counter.

    python benchmarks/bench_loss.py                     # CPU default: N=2048, H=512, V=32768, fp32
    python benchmarks/bench_loss.py --device cuda --dtype bf16 --shapes 4096,3584,152064 16384,3584,152064
"""

from __future__ import annotations

import argparse
import gc
import json
from collections.abc import Callable

import torch

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.backends import available_backends
from grpo_fast.testing.reference import loss_from_logprobs, naive_grpo_loss
from grpo_fast.testing.synthetic import LossBatch, make_loss_batch

from .common import environment_stamp, reset_peak_rss, rss_bytes, run_json_subprocess, time_call, write_json

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_SHAPES = {
    "cpu": [(2048, 512, 32768)],
    "cuda": [(4096, 3584, 152064), (16384, 3584, 152064), (65536, 3584, 152064)],
}
SEQ_LEN = 512  # tokens per sequence: N = B * SEQ_LEN (or one sequence when N < SEQ_LEN)


def make_batch(num_tokens: int, hidden_size: int, vocab: int, dtype: torch.dtype, device: str) -> LossBatch:
    length = min(SEQ_LEN, num_tokens)
    return make_loss_batch(num_tokens // length, length, hidden_size, vocab, dtype=dtype, device=device, seed=0)


def importable(module: str) -> bool:
    try:
        __import__(module)
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return True


CHUNKED_BACKENDS = ("torch", "cpu", "cuda")


def variants(device: torch.device, workspace_mib: list[int] | None = None) -> list[str]:
    """Every variant available on `device`; chunked backends once per workspace size when given."""
    names = ["naive"]
    for backend in available_backends(device):
        if workspace_mib and backend in CHUNKED_BACKENDS:
            names += [f"{backend}@{mib}" for mib in workspace_mib]
        else:
            names.append(backend)
    names += [
        name for name, module in (("liger", "liger_kernel.chunked_loss"), ("trl", "trl.kernels")) if importable(module)
    ]
    return [*names, "gemm3"]


def make_step(name: str, batch: LossBatch, config: GRPOLossConfig) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """A closure running one forward+backward of variant `name`, and the leaves whose .grad it fills."""
    hidden = batch.hidden.detach().requires_grad_()
    weight = batch.weight.detach().requires_grad_()
    per_token = (batch.completion_ids, batch.completion_mask, batch.advantages, batch.old_logprobs)
    ref = batch.ref_logprobs if config.beta > 0 else None

    if name == "gemm3":
        n, v = batch.completion_ids.numel(), weight.shape[0]
        dz = torch.randn(n, v, dtype=hidden.dtype, device=hidden.device)
        h2, w = hidden.detach().view(n, -1), weight.detach()

        def step():
            torch.mm(h2, w.t())
            torch.mm(dz, w)
            torch.mm(dz.t(), h2)

        return step, []
    if name == "naive":

        def step():
            loss, _ = naive_grpo_loss(hidden, weight, *per_token, ref_logprobs=ref, config=config)
            loss.backward()

    elif name == "liger":
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        module = LigerFusedLinearGRPOLoss(
            beta=config.beta,
            compiled=hidden.is_cuda,
            use_ref_model=config.beta > 0,
            epsilon_low=config.epsilon_low,
            epsilon_high=config.clip_high,
            loss_type=config.loss_type,
            temperature=config.temperature,
            importance_sampling_level=config.importance_sampling_level,
            use_bias_correction_kl=config.use_bias_correction_kl,  # Liger's default is False, TRL's True
        )
        ids, mask, adv, old = per_token

        def step():
            loss, _ = module(
                hidden, weight, ids, mask.to(hidden.dtype), adv, ref_per_token_logps=ref, old_per_token_logps=old
            )
            loss.backward()

    elif name == "trl":
        from trl.kernels import ChunkedLogProbFunction
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE  # the tile TRL's add_fused_lm_head uses

        ids, mask, adv, old = per_token
        outputs = ("entropy",) if config.entropy_coef else ()

        def step():
            logp, entropy, *_ = ChunkedLogProbFunction.apply(
                hidden.view(-1, hidden.shape[-1]), weight, None, ids.view(-1), config.temperature,
                _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, outputs,
            )  # fmt: skip
            entropy = torch.zeros_like(logp) if entropy is None else entropy
            loss, _ = loss_from_logprobs(
                logp.view(ids.shape), entropy.view(ids.shape), mask, adv, old, ref, config=config
            )
            loss.backward()

    else:
        backend, _, mib = name.partition("@")
        workspace = int(mib) << 20 if mib else config.workspace_bytes
        backend_config = GRPOLossConfig(**{**config.__dict__, "backend": backend, "workspace_bytes": workspace})

        def step():
            loss, _ = grpo_loss(hidden, weight, *per_token, ref_logprobs=ref, config=backend_config)
            loss.backward()

    return step, [hidden, weight]


def measure_memory(name: str, batch: LossBatch, config: GRPOLossConfig, device: torch.device) -> int:
    """Peak bytes above inputs + weight + their gradients during one forward+backward (after a warm-up)."""
    step, leaves = make_step(name, batch, config)
    step()  # warm-up: lazy initialisation, thread pools, compiled kernels
    grad_bytes = sum(t.numel() * t.element_size() for t in leaves)
    for t in leaves:
        t.grad = None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before - grad_bytes
    before = rss_bytes("VmRSS")
    reset_peak_rss()
    step()
    return rss_bytes("VmHWM") - before - grad_bytes


def run(
    shapes, dtype_name: str, device: torch.device, config: GRPOLossConfig, names, repeats: int, on_shape=None
) -> list[dict]:
    """Rows of every variant at every shape; `on_shape(rows so far)` after each shape (partial results)."""
    dtype = DTYPES[dtype_name]
    rows = []
    for shape in shapes:
        num_tokens, hidden_size, vocab = shape
        batch = make_batch(*shape, dtype=dtype, device=str(device))
        timings = {}
        for name in names:
            step = None
            try:
                step, _ = make_step(name, batch, config)
                timings[name] = time_call(step, device, warmup=1, repeats=repeats)
            except torch.OutOfMemoryError:
                timings[name] = "out of memory"
            except Exception as exc:  # noqa: BLE001 - one broken variant (e.g. Liger's API) must not end the run
                timings[name] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
                print(f"{name} at N={num_tokens}: {timings[name]}", flush=True)
            del step
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        for name in names:
            row = {"variant": name, "N": num_tokens, "H": hidden_size, "V": vocab, "dtype": dtype_name}
            row["flops_per_step"] = 6 * num_tokens * hidden_size * vocab
            timing = timings[name]
            if isinstance(timing, str):
                row["status"] = timing
            else:
                row |= timing
                if isinstance(timings.get("gemm3"), dict):
                    row["ratio_to_gemm3"] = timing["median_s"] / timings["gemm3"]["median_s"]
                if isinstance(timings.get("naive"), dict):
                    row["speedup_vs_naive"] = timings["naive"]["median_s"] / timing["median_s"]
                row["tflops_effective"] = row["flops_per_step"] / timing["median_s"] / 1e12
                if name != "gemm3":  # a variant that failed to run is not run again for its memory
                    row["peak_extra_bytes"] = memory_of(name, batch, shape, dtype_name, device, config)
            rows.append(row)
        del batch
        _relate_to_naive(rows)
        if on_shape is not None:
            on_shape(rows)
    return rows


def _relate_to_naive(rows: list[dict]) -> None:
    naive_peaks = {(r["N"], r["H"], r["V"]): r.get("peak_extra_bytes") for r in rows if r["variant"] == "naive"}
    for row in rows:
        naive_peak = naive_peaks.get((row["N"], row["H"], row["V"]))
        if naive_peak and row.get("peak_extra_bytes") is not None:
            row["peak_extra_vs_naive"] = row["peak_extra_bytes"] / naive_peak


def memory_of(name, batch, shape, dtype_name, device, config) -> int | None:
    """On CUDA: measured on the shape's batch, here. On CPU: in a fresh interpreter (peak RSS)."""
    if device.type == "cuda":
        try:
            return measure_memory(name, batch, config, device)
        except Exception:  # noqa: BLE001 - out of memory or a broken variant: no number, the run goes on
            return None
        finally:
            gc.collect()
            torch.cuda.empty_cache()
    args = ["grpo_fast.bench.loss", "--measure-memory", name, "--shapes", ",".join(map(str, shape))]
    args += ["--dtype", dtype_name, "--config", json.dumps(config.__dict__)]
    # Every block above 64 KiB is mmap'd, so a freed block leaves the RSS at once.
    return run_json_subprocess(args, env={"MALLOC_MMAP_THRESHOLD_": "65536"})["peak_extra_bytes"]


def format_table(rows: list[dict]) -> str:
    header = (
        f"{'N':>6} {'H':>5} {'V':>6} {'variant':>9} {'median ms':>10} {'p20-p80 ms':>15} {'x gemm3':>8} "
        f"{'vs naive':>9} {'extra MiB':>10} {'% naive':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        if r.get("status"):
            lines.append(f"{r['N']:>6} {r['H']:>5} {r['V']:>6} {r['variant']:>9} {r['status']:>10}")
            continue
        spread = f"{r['p20_s'] * 1e3:.0f}-{r['p80_s'] * 1e3:.0f}"
        extra = r.get("peak_extra_bytes")
        extra_mib = "" if extra is None else f"{extra / 2**20:.1f}"
        share = r.get("peak_extra_vs_naive")
        share_text = "" if share is None else f"{100 * share:.1f}%"
        lines.append(
            f"{r['N']:>6} {r['H']:>5} {r['V']:>6} {r['variant']:>9} {r['median_s'] * 1e3:>10.1f} {spread:>15} "
            f"{r.get('ratio_to_gemm3', float('nan')):>8.2f} {r.get('speedup_vs_naive', float('nan')):>8.2f}x "
            f"{extra_mib:>10} {share_text:>8}"
        )
    return "\n".join(lines)


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = tuple(int(x) for x in text.split(","))
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"shape: expected N,H,V, got {text!r}")
    return parts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: fp32 on CPU, bf16 on CUDA")
    parser.add_argument("--shapes", type=parse_shape, nargs="+", default=None, help="N,H,V triples")
    parser.add_argument("--variants", nargs="+", default=None, help="default: every available variant")
    parser.add_argument(
        "--workspace-mb", type=int, nargs="+", default=None, help="sweep the chunked backends' workspace (MiB)"
    )
    parser.add_argument("--loss-type", default="dapo")
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the JSON results here")
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure-memory", default=None, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    dtype_name = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    if args.config:
        config = GRPOLossConfig(**json.loads(args.config))
    else:
        config = GRPOLossConfig(loss_type=args.loss_type, beta=args.beta)
    if args.measure_memory:
        batch = make_batch(*args.shapes[0], dtype=DTYPES[dtype_name], device=str(device))
        print(json.dumps({"peak_extra_bytes": measure_memory(args.measure_memory, batch, config, device)}))
        return 0
    shapes = args.shapes or DEFAULT_SHAPES[device.type]
    names = args.variants or variants(device, args.workspace_mb)
    environment = environment_stamp(device)

    def write(rows: list[dict]) -> None:
        if args.out:
            write_json(
                args.out, {"benchmark": "loss", "environment": environment, "config": config.__dict__, "results": rows}
            )

    rows = run(shapes, dtype_name, device, config, names, args.repeats, on_shape=write)
    print(format_table(rows))
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
