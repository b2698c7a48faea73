"""Forward+backward time and peak extra memory of the GRPO loss at model shapes: grpo_fast's backends, the naive
path, Liger-Kernel's LigerFusedLinearGRPOLoss, TRL 1.16's fused LM head with TRL's loss, and three plain GEMMs,
each variant in its own process, in one run. See grpo_fast/bench/loss.py for the variants and the method.

    python benchmarks/bench_loss.py [--device cuda] [--models qwen2.5-7b llama-3.1-8b] [--tokens 4096 16384]
        [--shapes N,H,V ...] [--variants ...] [--out FILE.json [--update]]
"""

import argparse

from grpo_fast.bench import loss

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=loss.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    loss.add_arguments(parser)
    raise SystemExit(loss.main(parser.parse_args()))
