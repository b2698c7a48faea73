"""Peak memory and step time of one SFT forward+backward: the fused path (grpo_fast.sft.loss) vs
transformers' cross-entropy over materialised logits, on the same Qwen2 model and batch. See
grpo_fast/bench/sft.py for the method.

    python benchmarks/bench_sft.py [--layers 4 --hidden 512 --vocab 32000 --batch 8 --seq-len 256]
        [--device cuda] [--out benchmarks/results/bench_sft_cpu.json]
"""

import argparse

from grpo_fast.bench import sft

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=sft.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sft.add_arguments(parser)
    raise SystemExit(sft.main(parser.parse_args()))
