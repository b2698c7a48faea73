"""Forward+backward time and peak extra memory of the GRPO loss at an lm_head's shape, every variant side by side:

  gemm3   the three plain GEMMs of the same shapes (h Wᵀ, dz W, dzᵀ h): the speed of light, 6·N·H·V FLOPs;
          every variant's time is also reported as a ratio to it
  torch | cpu | cuda | triton   grpo_loss with that backend (whichever load on the device);
          `cpu@48` is the cpu backend with a 48 MiB logits workspace (--workspace-mb sweeps it)
  naive   full logits + log_softmax + gather, then TRL's loss formulas, autograd
  trl     TRL 1.16's fused LM head: the kernel `trl.trainer.utils.add_fused_lm_head` installs
          (trl.kernels.ChunkedLogProbFunction, its vocabulary tile, log_probs and entropy as GRPOTrainer asks for
          them, only the completion tokens on CUDA as the patched forward scores them), with TRL's own
          GRPOTrainer._compute_loss on top
  liger   Liger-Kernel's LigerFusedLinearGRPOLoss (torch.compile'd on CUDA, as Liger's default; compiled afresh
          for each shape)

A peer that is not installed gets a row saying so, and so does `cuda` when grpo_fast._C was built without its
CUDA kernels. Shapes are N tokens times an lm_head [V, H]: --models names
real ones (qwen2.5-0.5b, qwen2.5-1.5b, qwen3-4b, qwen2.5-7b, llama-3.1-8b) or CPU-sized ones (cpu-32k, tiny),
--tokens the N; --shapes N,H,V gives any. Inputs: sequences of 512 tokens, ~80% of them completion tokens
(ragged padding), old logprobs drifting from the current ones, dapo loss (--loss-type, --beta).

Each variant runs in its own process, forked from a server process that imported this module once and has
run nothing (a variant's start costs no import, its memory and CUDA context are its own): one warm-up, --repeats
timed runs (median, p20, p80), then one run for the peak extra memory = peak - (inputs, weight and the gradients
of hidden and weight): on CUDA the caching allocator's peak counter, on CPU the peak RSS (VmHWM, with freed blocks
returned to the system at once). --variant-timeout caps each variant's process, --time-limit the run; a shape
a variant did not reach gets a row saying so. The JSON (--out) is rewritten after every measured shape, stamped
(commit, date, versions, CPU / GPU model, load average before and after), with a PNG beside it; --update merges
the rows into an existing JSON.

    python benchmarks/bench_loss.py                     # CPU: cpu-32k (H=512, V=32768), N=2048, fp32
    python benchmarks/bench_loss.py --device cuda --models qwen2.5-7b llama-3.1-8b --tokens 4096 16384
    python benchmarks/bench_loss.py --plot benchmarks/results/bench_loss_cuda.json   # the PNG of a JSON
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.backends import available_backends
from grpo_fast.testing.reference import naive_grpo_loss
from grpo_fast.testing.synthetic import LossBatch, make_loss_batch

from .common import command_line, environment_stamp, text_table, time_call, write_json
from .memory import peak_extra_bytes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# lm_head shapes (H, V) named after the models they come from; the last two are sized for CPUs.
MODELS = {
    "qwen2.5-0.5b": (896, 151936),
    "qwen2.5-1.5b": (1536, 151936),
    "qwen3-4b": (2560, 151936),
    "qwen2.5-7b": (3584, 152064),
    "llama-3.1-8b": (4096, 128256),
    "cpu-32k": (512, 32768),
    "tiny": (64, 512),
}
DEFAULT_MODELS = {"cpu": (["cpu-32k"], [2048]), "cuda": (["qwen2.5-7b", "llama-3.1-8b"], [4096, 16384])}
SEQ_LEN = 512  # tokens per sequence: N = B * SEQ_LEN (or one sequence when N < SEQ_LEN)
CHUNKED_BACKENDS = ("torch", "cpu", "cuda")
PEERS = {"liger": ("liger_kernel", "liger-kernel"), "trl": ("trl", "trl")}  # variant: (module, package)
DESCRIPTION = "forward+backward time and peak extra memory of the GRPO loss, every variant side by side"


@dataclass(frozen=True)
class Shape:
    """N tokens through an lm_head weight [V, H]; `model` names the preset it came from (None: --shapes)."""

    N: int
    H: int
    V: int
    model: str | None = None


def make_batch(num_tokens: int, hidden_size: int, vocab: int, dtype: torch.dtype, device: str) -> LossBatch:
    """hidden [B, T, H] with B·T = num_tokens (T = 512, or N when shorter), weight [V, H], per-token [B, T]."""
    length = min(SEQ_LEN, num_tokens)
    return make_loss_batch(num_tokens // length, length, hidden_size, vocab, dtype=dtype, device=device, seed=0)


def variants(device: torch.device, workspace_mib: list[int] | None = None) -> list[str]:
    """Every variant, in the order they run: gemm3, the backends that run on `device` (chunked ones once
    per workspace size when given), naive, then the peers (installed or not: a missing one gets a row)."""
    names = ["gemm3"]
    for backend in available_backends(device):
        if workspace_mib and backend in CHUNKED_BACKENDS:
            names += [f"{backend}@{mib}" for mib in workspace_mib]
        else:
            names.append(backend)
    return [*names, "naive", *PEERS]


def missing(name: str) -> str | None:
    """Why variant `name` cannot run here, as its rows' status: a peer whose package is absent, or the cuda
    backend of a grpo_fast._C built without its CUDA kernels; None when it can."""
    base = name.partition("@")[0]
    if base == "cuda" and extension_kind() != "C++ + CUDA kernels":
        return f"not built: grpo_fast._C is {extension_kind()}"
    if base not in PEERS:
        return None
    module, package = PEERS[base]
    return None if importlib.util.find_spec(module) is not None else f"not installed ({package})"


def extension_kind() -> str:
    """What grpo_fast._C holds: "C++ + CUDA kernels", "C++ kernels only" or "not built (...)"."""
    try:
        from grpo_fast.backends.native import built_with_cuda
    except ImportError as err:
        return f"not built ({err})"
    return "C++ + CUDA kernels" if built_with_cuda() else "C++ kernels only"


def make_step(name: str, batch: LossBatch, config: GRPOLossConfig) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """A closure running one forward+backward of variant `name`, and the leaves whose .grad it fills."""
    hidden = batch.hidden.detach().requires_grad_()
    weight = batch.weight.detach().requires_grad_()
    if name == "gemm3":
        return _gemm3_step(hidden.detach(), weight.detach()), []
    builders = {"naive": _naive_step, "liger": _liger_step, "trl": _trl_step}
    builder = builders.get(name, _grpo_fast_step)
    return builder(name, batch, config, hidden, weight), [hidden, weight]


def _gemm3_step(hidden: torch.Tensor, weight: torch.Tensor) -> Callable[[], None]:
    """h [N, H] Wᵀ, dz [N, V] W, dzᵀ h: the GEMMs every fused variant needs at least."""
    h2 = hidden.view(-1, hidden.shape[-1])
    dz = torch.randn(h2.shape[0], weight.shape[0], dtype=hidden.dtype, device=hidden.device)

    def step():
        torch.mm(h2, weight.t())
        torch.mm(dz, weight)
        torch.mm(dz.t(), h2)

    return step


def _loss_step(loss_fn, batch, config, hidden, weight):
    """One forward + backward of `loss_fn` (naive_grpo_loss or grpo_loss: the same signature) on the batch."""
    ref = batch.ref_logprobs if config.beta > 0 else None
    per_token = (batch.completion_ids, batch.completion_mask, batch.advantages, batch.old_logprobs)

    def step():
        loss, _ = loss_fn(hidden, weight, *per_token, ref_logprobs=ref, config=config)
        loss.backward()

    return step


def _naive_step(name, batch, config, hidden, weight):
    return _loss_step(naive_grpo_loss, batch, config, hidden, weight)


def _grpo_fast_step(name, batch, config, hidden, weight):
    """name: a backend, optionally with "@<MiB>" for its workspace."""
    backend, _, mib = name.partition("@")
    workspace = int(mib) << 20 if mib else config.workspace_bytes
    backend_config = GRPOLossConfig(**{**config.__dict__, "backend": backend, "workspace_bytes": workspace})
    return _loss_step(grpo_loss, batch, backend_config, hidden, weight)


def _liger_step(name, batch, config, hidden, weight):
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    # Each shape compiles from scratch, as in a process of its own: the recompile for a second shape (automatic
    # dynamic shapes) died in torch 2.11 creating a guard at the Qwen head, N = 16384 (N·V > 2^31; Dynamo's
    # IndexError in produce_guards_verbose), which says nothing about Liger's speed.
    torch._dynamo.reset()

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
    ids, mask, adv, old = batch.completion_ids, batch.completion_mask, batch.advantages, batch.old_logprobs
    ref = batch.ref_logprobs if config.beta > 0 else None

    def step():
        loss, _ = module(
            hidden, weight, ids, mask.to(hidden.dtype), adv, ref_per_token_logps=ref, old_per_token_logps=old
        )
        loss.backward()

    return step


def _trl_step(name, batch, config, hidden, weight):
    """TRL's head as its patched forward calls it (trl/trainer/utils.py add_fused_lm_head), then TRL's loss."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction, _use_triton
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    from grpo_fast.testing.trl_harness import bare_trl_trainer

    ids, mask = batch.completion_ids, batch.completion_mask.bool()
    trainer = bare_trl_trainer(config, ids.shape[1], use_is=False)
    inputs = {
        "prompt_ids": ids.new_zeros(ids.shape[0], 0),
        "prompt_mask": ids.new_zeros(ids.shape[0], 0),
        "completion_ids": ids,
        "completion_mask": mask.float(),
        "advantages": batch.advantages.float(),
        "old_per_token_logps": batch.old_logprobs.float(),
        "num_items_in_batch": mask.sum().float(),
    }
    if config.beta > 0:
        inputs["ref_per_token_logps"] = batch.ref_logprobs.float()
    compact = _use_triton(hidden.device)  # TRL scores only the labelled positions where it folds with Triton

    def step():
        rows = hidden[mask] if compact else hidden.reshape(-1, hidden.shape[-1])
        targets = ids[mask] if compact else ids.reshape(-1)
        logp, entropy, *_ = ChunkedLogProbFunction.apply(
            rows, weight, None, targets, config.temperature, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0,
            ("log_probs", "entropy"),
        )  # fmt: skip
        if compact:
            logp, entropy = (x.new_zeros(mask.shape).masked_scatter(mask, x) for x in (logp, entropy))
        else:
            logp, entropy = (x.view(mask.shape).masked_fill(~mask, 0) for x in (logp, entropy))
        trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp, entropy, None)
        trainer._compute_loss(None, inputs).backward()

    return step


def measure_memory(step: Callable[[], None], leaves: list[torch.Tensor], device: torch.device) -> int:
    """Peak bytes of one more step above what is resident before it, less the gradients of `leaves` (the
    variant has run before: warm-up and timing)."""
    grad_bytes = sum(t.numel() * t.element_size() for t in leaves)
    for t in leaves:
        t.grad = None
    return peak_extra_bytes(step, device, warmup=False) - grad_bytes


def measure_shape(name: str, shape: Shape, dtype_name: str, device: torch.device, config, repeats: int) -> dict:
    """One row: timing (median, p20, p80, samples) and peak extra memory of `name` at `shape`, or a status."""
    row = base_row(name, shape, dtype_name)
    step = leaves = batch = None
    try:
        batch = make_batch(shape.N, shape.H, shape.V, dtype=DTYPES[dtype_name], device=str(device))
        step, leaves = make_step(name, batch, config)
        row |= time_call(step, device, warmup=1, repeats=repeats)
        if name != "gemm3":
            row["peak_extra_bytes"] = measure_memory(step, leaves, device)
    except torch.OutOfMemoryError:
        row = base_row(name, shape, dtype_name) | {"status": "out of memory"}
    except Exception as exc:  # noqa: BLE001 - one broken variant (a peer's API, a kernel) must not end the run
        row = base_row(name, shape, dtype_name) | {"status": f"error: {type(exc).__name__}: {str(exc)[:300]}"}
    del step, leaves, batch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if name == "triton":
        from grpo_fast.kernels.linear_logprobs import launched_configs

        row["triton_launch"] = launched_configs()
    return row


def base_row(name: str, shape: Shape, dtype_name: str) -> dict:
    return {"variant": name, "model": shape.model, "N": shape.N, "H": shape.H, "V": shape.V, "dtype": dtype_name,
            "flops_per_step": 6 * shape.N * shape.H * shape.V}  # fmt: skip


def _worker(name, shapes, dtype_name, device_name, config_fields, repeats, rows_path) -> None:
    """A variant's process: one JSON line per shape appended to `rows_path` as soon as it is measured."""
    device = torch.device(device_name)
    config = GRPOLossConfig(**config_fields)
    for shape in shapes:
        row = measure_shape(name, Shape(**shape), dtype_name, device, config, repeats)
        with open(rows_path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _process_context():
    """Each variant's process is forked from a server process that imported this module once and has run no
    torch op and created no CUDA context (a fork after either hangs OpenMP or breaks CUDA in the child)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["grpo_fast.bench.loss"])
    return context


def run_variant(context, name, shapes, dtype_name, device, config, repeats, timeout, on_row) -> list[dict]:
    """Rows of variant `name` at every shape, measured in a process of its own (`on_row(row)` as each arrives);
    a shape the process did not reach (timeout, crash) gets a row saying why."""
    why = missing(name)
    if why:
        rows = [base_row(name, shape, dtype_name) | {"status": why} for shape in shapes]
        for row in rows:
            on_row(row)
        return rows
    with tempfile.TemporaryDirectory(prefix="bench_loss_") as tmp:
        path = Path(tmp) / "rows.jsonl"
        args = (name, [asdict(s) for s in shapes], dtype_name, str(device), config.__dict__, repeats, str(path))
        process = context.Process(target=_worker, args=args, daemon=True)
        process.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        rows: list[dict] = []
        timed_out = False
        while process.is_alive() and not timed_out:
            process.join(0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic())))
            rows += _new_rows(path, len(rows), on_row)
            timed_out = process.is_alive() and deadline is not None and time.monotonic() > deadline
        if timed_out:
            process.kill()
            process.join()
        rows += _new_rows(path, len(rows), on_row)
    why = f"timed out after {timeout:.0f} s" if timed_out else f"process exit status {process.exitcode}"
    for shape in shapes[len(rows) :]:
        row = base_row(name, shape, dtype_name) | {"status": why}
        on_row(row)
        rows.append(row)
    return rows


def _new_rows(path: Path, seen: int, on_row) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()[seen:]
    rows = [json.loads(line) for line in lines]
    for row in rows:
        on_row(row)
    return rows


def derive(rows: list[dict]) -> None:
    """Add each timed row's ratio to gemm3, speedup over naive, effective TFLOP/s and memory share of naive's
    (when that shape's gemm3 / naive rows were timed)."""
    for row in rows:
        if "median_s" not in row:
            continue
        same = {r["variant"]: r for r in rows if _shape_key(r) == _shape_key(row)}
        for key, base, ratio in (
            ("ratio_to_gemm3", same.get("gemm3"), lambda r, b: r["median_s"] / b["median_s"]),
            ("speedup_vs_naive", same.get("naive"), lambda r, b: b["median_s"] / r["median_s"]),
            ("peak_extra_vs_naive", same.get("naive"), lambda r, b: r["peak_extra_bytes"] / b["peak_extra_bytes"]),
        ):
            fields = ("median_s",) if key != "peak_extra_vs_naive" else ("peak_extra_bytes",)
            if base is not None and all(base.get(f) and row.get(f) is not None for f in fields):
                row[key] = ratio(row, base)
        row["tflops_effective"] = row["flops_per_step"] / row["median_s"] / 1e12


def _shape_key(row: dict) -> tuple:
    return row["N"], row["H"], row["V"], row["dtype"]


def _row_key(row: dict) -> tuple:
    return (row["variant"], *_shape_key(row))


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """`old` with every row that `new` measures again (same variant, N, H, V, dtype) replaced, in place."""
    fresh = {_row_key(r): r for r in new}
    merged = [fresh.pop(_row_key(r), r) for r in old]
    return merged + list(fresh.values())


def run(
    shapes, dtype_name, device, config, names, repeats, timeout=None, on_update=None, time_limit=None
) -> list[dict]:
    """Every variant of `names` at every shape, each variant in its own process, in the order given, within
    `timeout` seconds per variant and `time_limit` for the run (a variant not started in time gets rows saying
    so); `on_update(rows so far)` after each measured shape."""
    context = _process_context()
    rows: list[dict] = []
    end = None if time_limit is None else time.monotonic() + time_limit

    def on_row(row):
        rows.append(row)
        derive(rows)
        if on_update is not None:
            on_update(rows)

    for name in names:
        left = None if end is None else end - time.monotonic()
        if left is not None and left < 1:
            for shape in shapes:
                on_row(base_row(name, shape, dtype_name) | {"status": f"not run (--time-limit {time_limit:g} s)"})
            continue
        limit = left if timeout is None else timeout if left is None else min(timeout, left)
        run_variant(context, name, shapes, dtype_name, device, config, repeats, limit, on_row)
    return rows


LOSS_COLUMNS = (
    ("model", 13),
    ("N", 6),
    ("H", 5),
    ("V", 6),
    ("variant", 9),
    ("median ms", 10),
    ("p20-p80 ms", 15),
    ("x gemm3", 8),
    ("vs naive", 9),
    ("extra MiB", 10),
    ("% naive", 8),
)


def format_table(rows: list[dict]) -> str:
    """A line per variant and shape: time, its spread and ratios, peak extra memory (or why it has none)."""
    return text_table(LOSS_COLUMNS, (_table_cells(r) for r in sorted(rows, key=_shape_key)))


def _table_cells(r: dict) -> list[str]:
    where = [r["model"] or "", str(r["N"]), str(r["H"]), str(r["V"]), r["variant"]]
    if "median_s" not in r:
        return [*where, r["status"]]
    extra, share = r.get("peak_extra_bytes"), r.get("peak_extra_vs_naive")
    return [
        *where,
        f"{r['median_s'] * 1e3:.1f}",
        f"{r['p20_s'] * 1e3:.1f}-{r['p80_s'] * 1e3:.1f}",
        f"{r.get('ratio_to_gemm3', float('nan')):.2f}",
        f"{r.get('speedup_vs_naive', float('nan')):.2f}x",
        "" if extra is None else f"{extra / 2**20:.1f}",
        "" if share is None else f"{100 * share:.1f}%",
    ]


def plot(payload: dict, path: str | os.PathLike) -> None:
    """PNG of a results payload: median time (p20-p80 bars) and peak extra memory per variant, one group
    per shape, log scales."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in payload["results"] if "median_s" in r]
    shapes = sorted({_shape_key(r) for r in rows})
    names = list(dict.fromkeys(r["variant"] for r in rows))
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(shapes) + 4), 4.5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        by_shape = {_shape_key(r): r for r in rows if r["variant"] == name}
        picked = [(j + i * width, by_shape[key]) for j, key in enumerate(shapes) if key in by_shape]
        xs = [x for x, _ in picked]
        median = [r["median_s"] * 1e3 for _, r in picked]
        below = [(r["median_s"] - r["p20_s"]) * 1e3 for _, r in picked]
        spread = [below, [(r["p80_s"] - r["median_s"]) * 1e3 for _, r in picked]]
        time_ax.bar(xs, median, width, yerr=spread, label=name)
        memory = [(x, r["peak_extra_bytes"] / 2**20) for x, r in picked if r.get("peak_extra_bytes")]
        memory_ax.bar([x for x, _ in memory], [m for _, m in memory], width, label=name)
    labels = [f"N={n}\nH={h} V={v}\n{d}" for n, h, v, d in shapes]
    for ax, title in ((time_ax, "forward+backward, median ms (p20-p80)"), (memory_ax, "peak extra memory, MiB")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
    time_ax.legend(fontsize=8)
    stamp = payload["runs"][0]["environment"]
    where = stamp.get("gpu") or f"{stamp.get('cpu')} x{stamp.get('cpu_count')}"
    fig.suptitle(f"GRPO loss ({payload['config']['loss_type']}), {where}, commit {stamp.get('commit')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_shape(text: str) -> Shape:
    try:
        n, h, v = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes: expected N,H,V (three integers), got {text!r}") from None
    if min(n, h, v) < 1:
        raise argparse.ArgumentTypeError(f"--shapes: N, H and V must be positive, got {text!r}")
    return Shape(n, h, v)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: fp32 on CPU, bf16 on CUDA")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=None, help="lm_head shape presets")
    parser.add_argument("--tokens", type=positive_int, nargs="+", default=None, help="N for every --models preset")
    parser.add_argument("--shapes", type=parse_shape, nargs="+", default=None, help="N,H,V triples (after --models)")
    parser.add_argument("--variants", nargs="+", default=None, help="default: every variant (see above)")
    parser.add_argument(
        "--workspace-mb", type=positive_int, nargs="+", default=None, help="sweep the chunked backends' workspace"
    )
    parser.add_argument("--loss-type", default="dapo")
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--variant-timeout", type=float, default=None, help="seconds per variant's process")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds for the whole run")
    parser.add_argument("--out", default=None, help="write the JSON results here (and a PNG beside it)")
    parser.add_argument("--update", action="store_true", help="merge into --out's rows instead of replacing them")
    parser.add_argument("--no-png", action="store_true", help="no PNG beside --out")
    parser.add_argument("--plot", default=None, metavar="JSON", help="only write the PNG of an existing results JSON")


def shapes_of(args, device: torch.device) -> list[Shape]:
    """--models x --tokens, then --shapes; the device's defaults when neither is given."""
    if args.models is None and args.tokens is None and args.shapes is None:
        args.models, args.tokens = DEFAULT_MODELS[device.type]
    if (args.models is None) != (args.tokens is None):
        raise SystemExit("bench loss: --models and --tokens go together (N for every model preset)")
    shapes = [Shape(n, *MODELS[m], model=m) for m in args.models or () for n in args.tokens or ()]
    return shapes + list(args.shapes or ())


def check_variants(names: list[str], device: torch.device) -> None:
    known = set(variants(device)) | {"gemm3", "naive", *PEERS}
    for name in names:
        base = name.partition("@")[0]
        if base not in known:
            raise SystemExit(f"bench loss: --variants: {name!r} is none of {sorted(known)} on {device.type}")
        if "@" in name and (base not in CHUNKED_BACKENDS or not name.partition("@")[2].isdigit()):
            raise SystemExit(f"bench loss: --variants: {name!r}: @MiB is for the chunked backends {CHUNKED_BACKENDS}")


def main(args: argparse.Namespace) -> int:
    if args.plot:
        png = Path(args.plot).with_suffix(".png")
        plot(json.loads(Path(args.plot).read_text()), png)
        print(f"wrote {png}")
        return 0
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench loss: --device cuda, but torch sees no CUDA device")
    if args.update and not args.out:
        raise SystemExit("bench loss: --update merges into --out; give --out")
    dtype_name = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    config = GRPOLossConfig(loss_type=args.loss_type, beta=args.beta)
    shapes = shapes_of(args, device)
    names = args.variants or variants(device, args.workspace_mb)
    check_variants(names, device)
    payload = _start_payload(args, config, device, names, shapes)

    def write(rows: list[dict]) -> None:
        if args.out:
            payload["results"] = merge_rows(payload["previous_results"], rows)
            derive(payload["results"])
            write_json(args.out, {k: v for k, v in payload.items() if k != "previous_results"})

    for name in ("variant_timeout", "time_limit"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise SystemExit(f"bench loss: --{name.replace('_', '-')}: expected seconds > 0, got {getattr(args, name)}")
    rows = run(shapes, dtype_name, device, config, names, args.repeats, args.variant_timeout, write, args.time_limit)
    payload["runs"][-1]["load_average_1_5_15"]["after"] = os.getloadavg()
    write(rows)
    print(format_table(payload["results"] if args.out else rows))
    if args.out:
        print(f"wrote {args.out}")
        if not args.no_png:
            png = Path(args.out).with_suffix(".png")
            plot(json.loads(Path(args.out).read_text()), png)
            print(f"wrote {png}")
    if failed := [r for r in rows if str(r.get("status", "")).startswith(FAILURES)]:
        print(f"bench loss: {len(failed)} row(s) failed to measure (their status says why)", file=sys.stderr)
        return 1
    return 0


FAILURES = ("error", "out of memory", "timed out", "process exit status")
"""The statuses of rows that should have measured and did not (a peer that is absent or a backend that cannot run
here is not one): the command then exits 1, so a caller (gpu_check.sh) records the phase as failed."""


def _start_payload(args, config, device, names, shapes) -> dict:
    """The JSON's header: this run's stamp appended to --out's runs with --update (same loss config)."""
    run_stamp = {
        "environment": environment_stamp(device, packages=("triton", "transformers", "liger-kernel", "trl")),
        "command": command_line(),
        "variants": names,
        "backends": available_backends(device),
        "grpo_fast_C": extension_kind(),
        "shapes": [asdict(s) for s in shapes],
        "repeats": args.repeats,
        "load_average_1_5_15": {"before": os.getloadavg()},
    }
    payload = {"benchmark": "loss", "description": DESCRIPTION, "config": config.__dict__, "runs": []}
    payload["previous_results"] = []
    if args.update and Path(args.out).exists():
        old = json.loads(Path(args.out).read_text())
        if old.get("benchmark") != "loss" or old.get("config") != config.__dict__:
            raise SystemExit(f"bench loss: --update: {args.out} holds another benchmark or loss config")
        payload["runs"], payload["previous_results"] = old["runs"], old["results"]
    payload["runs"].append(run_stamp)
    return payload


def interleaved(shape: Shape, dtype_name: str, device: torch.device, config, names: list[str], rounds: int) -> dict:
    """Every variant of `names` timed in this one process, in turn, `rounds` times after one warm-up each: wall and
    CPU (process) time per round, and each round's ratio to the first variant's. On a loaded machine the load moves
    between the separate processes of `run`; here the variants compared share it, round by round. No memory: that
    needs a process per variant (`run`)."""
    batch = make_batch(shape.N, shape.H, shape.V, dtype=DTYPES[dtype_name], device=str(device))
    steps = {name: make_step(name, batch, config)[0] for name in names}
    for step in steps.values():
        step()
    samples = {name: {"wall_s": [], "cpu_s": []} for name in names}
    for _ in range(rounds):
        for name, step in steps.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            step()
            synchronize_device(device)
            samples[name]["wall_s"].append(time.perf_counter() - start)
            samples[name]["cpu_s"].append(time.process_time() - cpu_start)
    base = samples[names[0]]
    rows = []
    for name in names:
        row = base_row(name, shape, dtype_name) | samples[name]
        for kind in ("wall_s", "cpu_s"):
            ratios = sorted(a / b for a, b in zip(row[kind], base[kind], strict=True))
            row[f"{kind[:-2]}_ratio_to_{names[0]}"] = {"median": ratios[len(ratios) // 2], "min": ratios[0],
                                                      "max": ratios[-1]}  # fmt: skip
        rows.append(row)
    return {"rounds": rounds, "baseline": names[0], "results": rows}


def synchronize_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
