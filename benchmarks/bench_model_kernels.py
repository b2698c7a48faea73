"""Forward + backward of a training step's policy pass with and without Liger-Kernel's model kernels
(`model.liger_kernels`), for each attention implementation that loads (sdpa; flash_attention_2 when
flash_attn imports), on padded and packed micro-batches.

Model: a random-init Qwen2-0.5B-shaped Qwen2 (24 layers, hidden 896, intermediate 4864, 14 heads, 2 KV
heads, vocabulary 151936, tied embeddings), bf16. Step: the trainer's path: the backbone's hidden states
-> grpo_loss on the completion half of every row (backend "auto") -> backward; no optimizer step.
Layouts: `padded` B rows of T tokens with an attention mask (the first row left-padded by T/8), and
`packed` the same tokens as one row with restarting position_ids and no attention mask (transformers
detects the packing from position_ids: a block-diagonal mask for sdpa/eager, varlen kernels for
flash_attention_2).

The same weights serve every variant: without kernels first (attention switched with
`set_attn_implementation`), then with Liger's kernels applied (irreversible). Each row reports the
median step time, the peak memory and the loss (the variants should agree to bf16 rounding).

    python benchmarks/bench_model_kernels.py --out model_kernels.json          # on a GPU
    python benchmarks/bench_model_kernels.py --device cpu --tiny                # smoke test (sdpa only; Liger raises)
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.bench.common import environment_stamp, time_call, write_json
from grpo_fast.bench.models import NAMED_SHAPES
from grpo_fast.core.model_kernels import apply_model_kernels
from grpo_fast.core.policy import ModelConfig
from grpo_fast.core.tiny_models import random_causal_lm


def attention_implementations() -> tuple[list[str], dict[str, str]]:
    names, skipped = ["sdpa"], {}
    try:
        import flash_attn  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure means "not available"
        skipped["flash_attention_2"] = f"flash_attn does not import: {err}"
    else:
        names.append("flash_attention_2")
    return names, skipped


def make_inputs(rows: int, length: int, vocab: int, device: torch.device, layout: str, seed: int = 0):
    """(model kwargs, completion ids [M], completion mask [M], advantages [B], hidden-row index [M], seq ids [M])."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=gen)
    lengths = [length - (length // 8 if r == 0 else 0) for r in range(rows)]  # row 0: a shorter sequence
    half = length // 2
    if layout == "padded":
        attn = torch.zeros(rows, length, dtype=torch.long)
        for r, n in enumerate(lengths):
            attn[r, length - n :] = 1  # left padding
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        kwargs = {"input_ids": ids, "attention_mask": attn, "position_ids": pos}
        # completion = the last `half` tokens of every row; the hidden state at t predicts token t + 1
        index = torch.arange(rows * length).view(rows, length)[:, length - half - 1 : length - 1]
        completion = ids[:, length - half :]
    else:
        flat = torch.cat([ids[r, length - n :] for r, n in enumerate(lengths)])
        pos = torch.cat([torch.arange(n) for n in lengths])
        kwargs = {"input_ids": flat[None], "position_ids": pos[None]}
        starts = torch.tensor([0, *lengths]).cumsum(0)[:-1]
        index = torch.stack([s + n - half - 1 + torch.arange(half) for s, n in zip(starts, lengths, strict=True)])
        completion = torch.stack([flat[s + n - half : s + n] for s, n in zip(starts, lengths, strict=True)])
    adv = torch.randn(rows, generator=gen)
    mask = torch.ones_like(completion, dtype=torch.bool)
    to = lambda t: t.to(device)  # noqa: E731
    return {k: to(v) for k, v in kwargs.items()}, to(completion), to(mask), to(adv), to(index)


def make_step(model, inputs):
    kwargs, completion, mask, adv, index = inputs
    config = GRPOLossConfig(loss_type="dapo", epsilon_high=0.28, entropy_coef=0.01)
    last = {}

    def step():
        model.zero_grad(set_to_none=True)
        hidden = model.model(**kwargs, use_cache=False).last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1])[index.reshape(-1)].view(*index.shape, -1)
        loss, _ = grpo_loss(hidden, model.lm_head.weight, completion, mask, adv, config=config)
        loss.backward()
        last["loss"] = loss.detach()

    return step, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and short rows (smoke test)")
    parser.add_argument("--rows", type=int, default=None, help="sequences per micro-batch (default 8; tiny 2)")
    parser.add_argument("--length", type=int, default=None, help="tokens per sequence (default 1024; tiny 64)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=None, help="JSON file")
    args = parser.parse_args()

    device = torch.device(args.device)
    rows = args.rows or (2 if args.tiny else 8)
    length = args.length or (64 if args.tiny else 1024)
    vocab, shape = NAMED_SHAPES["tiny" if args.tiny else "qwen2.5-0.5b"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    impls, skipped = attention_implementations()
    if device.type != "cuda":
        impls = ["sdpa"]
    with torch.device(device):
        model = random_causal_lm(vocab, shape, seed=0, attn_implementation="sdpa").to(dtype)
    params = sum(p.numel() for p in model.parameters())
    print(f"Qwen2 {shape.num_layers} layers, {params / 1e6:.0f} M parameters, {dtype}, {rows} x {length} "
          f"tokens on {device}; attention {impls}; skipped {skipped or 'nothing'}", flush=True)  # fmt: skip
    result = {
        "model": {"vocab_size": vocab, **dataclasses.asdict(shape)},
        "dtype": str(dtype).removeprefix("torch."),
        "rows": rows,
        "length": length,
        "env": environment_stamp(device, packages=("transformers", "liger_kernel", "flash_attn", "triton")),
        "results": [],
        "skipped": skipped,
    }
    layouts = ["padded", "packed"]
    inputs = {layout: make_inputs(rows, length, vocab, device, layout) for layout in layouts}

    def measure(liger: bool):
        for impl in impls:
            model.set_attn_implementation(impl)
            for layout in layouts:
                step, last = make_step(model, inputs[layout])
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                timing = time_call(step, device, warmup=2, repeats=args.repeats)
                peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
                row = {"attn": impl, "liger": liger, "layout": layout, "loss": last["loss"].item(), "peak_gb": peak}
                row |= {k: timing[k] for k in ("median_s", "p20_s", "p80_s")}
                result["results"].append(row)
                print(
                    f"{impl:18s} liger={'on ' if liger else 'off'} {layout:6s} {timing['median_s'] * 1e3:8.1f} ms "
                    f"(p20 {timing['p20_s'] * 1e3:.1f}, p80 {timing['p80_s'] * 1e3:.1f})  loss {row['loss']:.6f}"
                    + (f"  peak {peak:.2f} GiB" if peak is not None else ""),
                    flush=True,
                )
                if args.out:
                    write_json(args.out, result)

    measure(liger=False)
    try:
        applied = apply_model_kernels(model, ModelConfig(path="unused", liger_kernels=True))
    except (ImportError, RuntimeError, ValueError) as err:
        result["skipped"]["liger"] = f"{type(err).__name__}: {err}"
        print(f"liger skipped: {result['skipped']['liger']}", flush=True)
    else:
        result["liger_kernels"] = applied
        print(f"liger kernels applied: {applied}", flush=True)
        measure(liger=True)
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
