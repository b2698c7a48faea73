"""The loss variants timed in one process, in turn, round after round (grpo_fast.bench.loss.interleaved): each
round's wall and CPU time and its ratio to the first variant's. Where bench_loss.py runs each variant in its own
process (for its memory), a loaded machine's load moves between them; here the variants share it.

    python benchmarks/bench_loss_interleaved.py [--variants naive torch cpu] [--rounds 7] [--shape N,H,V]
        [--out benchmarks/results/bench_loss_interleaved_cpu.json]
"""

import argparse
import os

import torch

from grpo_fast import GRPOLossConfig
from grpo_fast.bench.common import command_line, environment_stamp, write_json
from grpo_fast.bench.loss import MODELS, Shape, check_variants, interleaved, parse_shape, positive_int

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["naive", "torch", "cpu"], help="the first is the baseline")
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--shape", type=parse_shape, default=Shape(2048, *MODELS["cpu-32k"], model="cpu-32k"))
    parser.add_argument("--loss-type", default="dapo")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cpu")
    check_variants(args.variants, device)
    before = os.getloadavg()
    result = interleaved(
        args.shape, "fp32", device, GRPOLossConfig(loss_type=args.loss_type), args.variants, args.rounds
    )
    stamp = environment_stamp(device, packages=("triton", "transformers", "liger-kernel", "trl"))
    payload = {"benchmark": "loss_interleaved", "command": command_line()}
    payload |= {"environment": stamp, "load_average_1_5_15": {"before": before, "after": os.getloadavg()}} | result
    for row in result["results"]:
        wall, cpu = row[f"wall_ratio_to_{result['baseline']}"], row[f"cpu_ratio_to_{result['baseline']}"]
        print(f"{row['variant']:>10}: wall {wall['median']:.3f}x [{wall['min']:.3f}, {wall['max']:.3f}], "
              f"cpu {cpu['median']:.3f}x [{cpu['min']:.3f}, {cpu['max']:.3f}] of {result['baseline']}")  # fmt: skip
    if args.out:
        write_json(args.out, payload)
        print(f"wrote {args.out}")
