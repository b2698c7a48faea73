"""TRL 1.16's GRPOTrainer with its own fused LM head vs grpo_fast's path, in the same run, on the same model and
batch: step time and peak memory of one training forward + backward (`trainer.compute_loss(model, inputs)` and
`loss.backward()`), the part of a GRPO step the head and the loss decide (generation and scoring are not timed).

Variants (each in its own interpreter, so that its peak RSS is its own):
    trl             trl.GRPOTrainer as it is: add_fused_lm_head (trl.kernels.ChunkedLogProbFunction) + TRL's loss
    ours_logprobs   use_grpo_fast(trainer): grpo_fast.fused_logprobs as the head, TRL's loss in torch
    ours_loss       use_grpo_fast(trainer, loss=True): the whole objective through grpo_fast.grpo_loss

Model and batch: a random-init Qwen2 (grpo_fast.bench.models: --layers, hidden 512, vocabulary 32k,
sdpa, fp32; --preset qwen2.5-0.5b: its 24 layers, hidden 896, 14 heads, 2 KV heads, intermediate 4864, vocabulary
151936), a word-level tokenizer of the vocabulary built in code; B sequences of P prompt tokens and C completion
tokens, every one active by default (N = B x C = 2048 completion tokens; --min-length-frac f < 1 draws each length
from [f C, C]), random advantages, TRL's GRPOConfig defaults otherwise (loss_type dapo, beta 0, temperature 1,
on-policy). On CPU TRL's head scores every position (its compaction to the active ones is Triton-only), ours the
active ones: with every token active both do the same work.

On CUDA (--device cuda, --dtype bf16 for a model in bf16) TRL's head scores the active positions only, as ours.

Step time: median (p20, p80) of --repeats timed steps after --warmup. Peak memory: on CPU the process's VmHWM
during the timed steps (reset after setup and warm-up), on CUDA the allocator's peak, and that peak minus what was
resident before the first timed step. Also recorded: the loss of each variant on the identical batch (they agree
to rounding).

    python benchmarks/bench_trl_integration.py [--layers 2] [--batch 8] [--prompt-len 32] [--completion-len 256]
        [--min-length-frac 1.0] [--repeats 3] [--warmup 1] [--out benchmarks/results/trl_integration_cpu.json]
    python benchmarks/bench_trl_integration.py --device cuda --dtype bf16 --preset qwen2.5-0.5b --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grpo_fast.bench.common import command_line, environment_stamp, timing_summary, write_json  # noqa: E402
from grpo_fast.bench.models import add_model_shape_arguments, model_from_shape_arguments  # noqa: E402
from grpo_fast.core.tiny_models import build_word_tokenizer  # noqa: E402

VARIANTS = ("trl", "ours_logprobs", "ours_loss")
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "trl_integration_cpu.json"
# Qwen2.5-0.5B's decoder (the embedding untied here, as model_from_shape_arguments builds every model)
PRESETS = {"qwen2.5-0.5b": dict(layers=24, hidden=896, heads=14, kv_heads=2, intermediate=4864, vocab=151936)}
DTYPES = ("fp32", "bf16")


def build(args):
    """(trainer, inputs): a real GRPOTrainer on a random-init Qwen2 and one synthetic rollout batch."""
    import torch
    import trl
    from datasets import Dataset

    device = torch.device(args.device)
    model = model_from_shape_arguments(args, args.prompt_len + args.completion_len + 8, device)
    if args.dtype == "bf16":
        model = model.to(torch.bfloat16)
    tokenizer = build_word_tokenizer(args.vocab)
    config = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_integration_"),
        use_vllm=False,
        use_cpu=device.type == "cpu",
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=args.batch,
        num_generations=2,
        max_completion_length=args.completion_len,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    prompts = Dataset.from_list([{"prompt": "w3 w4"}] * args.batch)
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], args=config,
        train_dataset=prompts, processing_class=tokenizer,
    )  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1
    g = torch.Generator().manual_seed(0)
    b, p, c = args.batch, args.prompt_len, args.completion_len
    lengths = torch.randint(round(args.min_length_frac * c), c + 1, (b,), generator=g)
    completion_mask = (torch.arange(c) < lengths[:, None]).long()
    inputs = {
        "prompt_ids": torch.randint(3, args.vocab, (b, p), generator=g),
        "prompt_mask": torch.ones(b, p, dtype=torch.long),
        "completion_ids": torch.randint(3, args.vocab, (b, c), generator=g),
        "completion_mask": completion_mask,
        "advantages": torch.randn(b, generator=g),
        "num_items_in_batch": completion_mask.sum().float(),
    }
    return trainer, {key: value.to(device) for key, value in inputs.items()}


def worker(args) -> dict:
    """One variant in this process: setup, warm-up, timed steps, peak RSS."""
    import torch

    from grpo_fast.bench.common import reset_peak_rss, rss_bytes
    from grpo_fast.integrations.trl import use_grpo_fast

    trainer, inputs = build(args)
    if args.variant != "trl":
        use_grpo_fast(trainer, loss=args.variant == "ours_loss")
    model = trainer.model

    def step() -> float:
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return float(loss.detach())

    cuda = torch.device(args.device).type == "cuda"
    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        before = rss_bytes()
        reset_peak_rss()
    samples, losses = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        losses.append(step())  # float(loss) waits for the device
        samples.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else rss_bytes("VmHWM")
    timing = timing_summary(samples)
    return {
        "variant": args.variant,
        **{f"step_{key}": timing[key] for key in ("median_s", "p20_s", "p80_s")},
        "samples_s": timing["samples_s"],
        "memory": "cuda max_memory_allocated" if cuda else "VmHWM (peak RSS)",
        "peak_bytes": peak,
        "before_step_bytes": before,
        "peak_over_baseline_bytes": peak - before,
        "loss": losses[-1],
        "completion_tokens": int(inputs["completion_mask"].sum()),
        "completion_positions": int(inputs["completion_mask"].numel()),
        "torch_threads": torch.get_num_threads(),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_shape_arguments(parser)
    parser.set_defaults(layers=2)
    parser.add_argument("--preset", choices=list(PRESETS), default=None, help="a real model's decoder shape")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="the model's parameters")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--completion-len", type=int, default=256)
    parser.add_argument("--min-length-frac", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # worker mode


def run_variant(args, variant: str) -> dict:
    """One variant's measurements from its own interpreter, or {"variant", "status"} saying why there are none."""
    argv = [sys.executable, __file__, "--variant", variant]
    for name in ("device", "dtype", "layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "batch",
                 "prompt_len", "completion_len", "min_length_frac", "warmup", "repeats"):  # fmt: skip
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = os.environ | {"TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT, env=env)
    if out.returncode != 0:
        print(f"variant {variant} failed:\n{out.stderr[-4000:]}", file=sys.stderr)
        return {"variant": variant, "status": f"error (exit status {out.returncode}): {out.stderr.strip()[-300:]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def relate_to_trl(runs: list[dict]) -> None:
    """Each measured run's step time, peak and loss against the trl run's (when it was measured)."""
    base = next((r for r in runs if r["variant"] == "trl" and "step_median_s" in r), None)
    for r in runs:
        if base is not None and "step_median_s" in r:
            r["step_vs_trl"] = r["step_median_s"] / base["step_median_s"]
            r["peak_vs_trl"] = r["peak_bytes"] / base["peak_bytes"]
            r["loss_minus_trl"] = r["loss"] - base["loss"]


def main(args) -> int:
    for key, value in PRESETS.get(args.preset, {}).items():
        setattr(args, key, value)
    if args.variant:
        print(json.dumps(worker(args)))
        return 0
    import torch

    settings = {k: v for k, v in vars(args).items() if k not in ("variant", "out")}
    payload = {
        "benchmark": "bench_trl_integration",
        "description": __doc__.split("\n\n")[0],
        "command": command_line(),
        "environment": environment_stamp(torch.device(args.device), packages=("transformers", "trl", "peft", "triton")),
        "settings": settings,
        "load_average_1_5_15": {"before": os.getloadavg()},  # the CPUs are shared
        "runs": [],
    }
    for variant in args.variants:  # the JSON is rewritten after each variant, so a kill keeps what finished
        payload["runs"].append(run_variant(args, variant))
        relate_to_trl(payload["runs"])
        payload["load_average_1_5_15"]["after"] = os.getloadavg()
        write_json(args.out, payload)
    print("| variant | step median s (p20-p80) | vs TRL | peak MiB | peak - before MiB | loss |")
    print("|---|---|---|---|---|---|")
    for r in payload["runs"]:
        if "step_median_s" not in r:
            print(f"| {r['variant']} | {r['status']} | | | | |")
            continue
        print(
            f"| {r['variant']} | {r['step_median_s']:.3f} ({r['step_p20_s']:.3f}-{r['step_p80_s']:.3f}) | "
            f"{r.get('step_vs_trl', float('nan')):.2f}x | {r['peak_bytes'] / 2**20:.0f} | "
            f"{r['peak_over_baseline_bytes'] / 2**20:.0f} | {r['loss']:.6f} |"
        )
    print(f"wrote {args.out}")
    return 0 if all("step_median_s" in r for r in payload["runs"]) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
