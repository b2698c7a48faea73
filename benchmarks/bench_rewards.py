"""Reward throughput: math answers through the process pool, and sandboxed code tests.

    python benchmarks/bench_rewards.py                      # print the table
    python benchmarks/bench_rewards.py --out benchmarks/results/bench_rewards_cpu.json

Cases:
- math / in-process: `math_accuracy` called directly on N completions (one core, no pool).
- math / pool: `RewardPool(workers).score([math_accuracy], ...)` on the same N completions, the pool
  already started (a trainer keeps one pool); pool start-up is reported on its own.
- code / sandbox: `code_tests` on small programs with 3 assert tests, one sandbox per completion, all
  completions in one call; "code sandbox x1": the same completions one per call, as a reward pool's
  worker scores them (the verifier's start-up check and first judge are warm-up, as in a run).
Completions mix right and wrong answers in boxed LaTeX: fractions, decimals, percentages, sqrt.
Each case runs `--repeats` times; the table shows median and p20/p80 seconds.
"""

from __future__ import annotations

import argparse
import time

from grpo_fast.bench.common import environment_stamp, time_call, write_json
from grpo_fast.rewards import RewardPool, code_tests, math_accuracy
from grpo_fast.sandbox import isolation


def math_batch(n: int) -> tuple[list[str], list[str], list[str]]:
    """N completions and references: a quarter each of fractions, decimals, percentages and roots,
    every third answer wrong."""
    forms = [
        lambda k: (f"\\frac{{{k}}}{{{k + 1}}}", f"{k}/{k + 1}"),
        lambda k: (f"{k / 4}", f"\\frac{{{k}}}{{4}}"),
        lambda k: (f"{k}\\%", f"{k / 100}"),
        lambda k: (f"{k}\\sqrt{{2}}", f"\\sqrt{{{2 * k * k}}}"),
    ]
    completions, answers = [], []
    for i in range(n):
        shown, ref = forms[i % 4](i + 1)
        if i % 3 == 0:
            shown = f"{shown} + 1"
        completions.append(f"<think>Working through step {i} carefully.</think> The answer is $\\boxed{{{shown}}}$.")
        answers.append(ref)
    return ["question"] * n, completions, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="math completions per batch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--code-n", type=int, default=20, help="code completions")
    parser.add_argument("--out", help="write JSON results here (e.g. benchmarks/results/bench_rewards_cpu.json)")
    args = parser.parse_args()

    prompts, completions, answers = math_batch(args.n)
    expected = [0.0 if i % 3 == 0 else 1.0 for i in range(args.n)]
    rows = {}
    assert math_accuracy(prompts, completions, answers) == expected, "math batch scored wrongly"
    rows["math in-process"] = time_call(lambda: math_accuracy(prompts, completions, answers), repeats=args.repeats)

    start = time.perf_counter()
    with RewardPool(workers=args.workers, timeout=30.0) as pool:
        pool.score([math_accuracy], prompts[:1], completions[:1], {"answer": answers[:1]})
        startup = time.perf_counter() - start
        rows["pool start-up"] = {"median_s": startup, "p20_s": startup, "p80_s": startup}
        scores = pool.score([math_accuracy], prompts, completions, {"answer": answers})
        assert scores.rewards[0] == expected and not scores.failures, "pool scored wrongly"
        rows[f"math pool x{args.workers}"] = time_call(
            lambda: pool.score([math_accuracy], prompts, completions, {"answer": answers}), repeats=args.repeats
        )

    program = "def add(a, b):\n    return a + b\n"
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]
    code_n = args.code_n
    assert code_tests(["p"], [program], [tests]) == [1.0], "code scored wrongly"
    rows["code sandbox"] = time_call(
        lambda: code_tests(["p"] * code_n, [program] * code_n, [tests] * code_n), repeats=max(1, args.repeats // 2)
    )
    rows["code sandbox x1"] = time_call(
        lambda: [code_tests(["p"], [program], [tests]) for _ in range(code_n)], repeats=max(1, args.repeats // 2)
    )

    counts = {"math in-process": args.n, f"math pool x{args.workers}": args.n}
    counts |= {"code sandbox": code_n, "code sandbox x1": code_n}
    print(f"{'case':<20} {'items':>6} {'median s':>9} {'p20 s':>8} {'p80 s':>8} {'ms/item':>8}")
    for name, row in rows.items():
        items = counts.get(name, 1)
        print(
            f"{name:<20} {items:>6} {row['median_s']:>9.3f} {row['p20_s']:>8.3f} {row['p80_s']:>8.3f}"
            f" {1000 * row['median_s'] / items:>8.2f}"
        )
    if args.out:
        environment = environment_stamp(packages=("math-verify", "sympy", "jsonschema"))
        environment["sandbox_isolation"] = isolation()
        write_json(
            args.out,
            {"environment": environment, "n": args.n, "workers": args.workers, "code_n": code_n, "cases": rows},
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
