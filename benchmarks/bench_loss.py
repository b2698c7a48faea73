"""Forward+backward time and peak extra memory of grpo_loss per backend vs the naive path, Liger-Kernel
and three plain GEMMs, in one run. See grpo_fast/bench/loss.py for the variants and the method.

    python benchmarks/bench_loss.py [--device cuda] [--dtype bf16] [--shapes N,H,V ...] [--out FILE.json]
"""

import argparse

from grpo_fast.bench import loss

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=loss.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    loss.add_arguments(parser)
    raise SystemExit(loss.main(parser.parse_args()))
