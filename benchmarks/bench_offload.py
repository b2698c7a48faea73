"""Trainer-state offload: GPU memory at each phase boundary of a real training step, and an exact round trip.

Builds a randomly initialised Qwen2-architecture model (Qwen2.5-0.5B shapes, fp32 master weights, bf16
autocast: the trainer's defaults) on the device, takes one training step through the trainer itself
(`LossStep.train_on_batch`: backbone forward -> `grpo_loss` on the lm_head weight -> backward -> AdamW),
then measures `torch.cuda.memory_allocated` / `memory_reserved` after the step, after
`TrainerStateOffloader.offload()`, after `reload()`, checks that parameters and optimizer state are
bitwise identical after the round trip and that a second step trains. This is done twice: optimizer state
offloaded (the trainer's default) and optimizer state + parameters (`run.offload_params`).

Exits non-zero if the freed bytes fall short of the optimizer state + gradients (+ parameters) the model
holds, or if anything differs after the round trip.

    python benchmarks/bench_offload.py --out benchmarks/results/offload_h200.json   # GPU
    python benchmarks/bench_offload.py --device cpu --tiny                          # CPU smoke test

On CPU the offloader is a no-op by design (there is no device memory to free): `--device cpu` runs the same
steps and checks, and reports zero bytes freed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_fast.bench.common import environment_stamp, rss_bytes, write_json  # noqa: E402
from grpo_fast.bench.models import NAMED_SHAPES  # noqa: E402
from grpo_fast.core.tiny_models import build_char_tokenizer, random_causal_lm  # noqa: E402
from grpo_fast.rollout.base import Completion  # noqa: E402
from grpo_fast.trainer.config import TrainConfig  # noqa: E402
from grpo_fast.trainer.offload import TrainerStateOffloader  # noqa: E402
from grpo_fast.trainer.rollout_phase import RolloutBatch  # noqa: E402
from grpo_fast.trainer.trainer import GRPOTrainer  # noqa: E402

GiB = 2**30


def build_trainer(
    device: torch.device,
    shape: str,
    seed: int = 0,
    offload: bool = True,
    prompts_per_step: int = 16,
    completion_len: int = 32,
):
    """A `GRPOTrainer` around a random-init Qwen2 model on `device` with the transformers engine (not started):
    `prompts_per_step` prompts x 4 completions of at most `completion_len` tokens per step, trainer state
    offloaded during generation when `offload`; a reward that varies with the completion's length."""

    tokenizer = build_char_tokenizer()
    vocab, spec = NAMED_SHAPES[shape]
    with torch.device(device):  # fp32 master weights, as the trainer keeps them by default
        model = random_causal_lm(vocab, spec, seed=seed, tokenizer=tokenizer, attn_implementation="sdpa")
    cfg = TrainConfig()
    cfg.rollout.engine = "hf"
    cfg.rollout.num_generations = 4
    cfg.rollout.max_completion_length = completion_len
    cfg.rollout.max_model_len = max(512, completion_len + 64)
    cfg.run.prompts_per_step = prompts_per_step
    cfg.run.offload_optimizer = offload
    cfg.run.output_dir = str(Path(tempfile.gettempdir()) / "bench_offload")  # never written: no train()
    cfg.run.seed = seed
    cfg.run.report_to = []
    cfg.run.progress = cfg.run.plots = False
    cfg.optim.lr = 1e-4
    prompts = [{"prompt": f"{i} + {i} ="} for i in range(64)]
    trainer = GRPOTrainer(
        model,
        lambda prompts, completions, **_: [len(c) % 5 / 4 for c in completions],
        prompts,
        cfg,
        tokenizer=tokenizer,
    )
    return trainer


def make_batch(vocab: int, sequences: int, prompt_len: int, completion_len: int, groups: int = 4, seed: int = 0):
    """What the rollout phase hands to `train_on_batch`: random prompts/completions, group-varying rewards."""

    g = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for i in range(sequences):
        if i % groups == 0:
            prompt = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
        n = int(torch.randint(completion_len // 2, completion_len + 1, (1,), generator=g))
        prompts.append(prompt)
        completions.append(Completion(torch.randint(3, vocab, (n,), generator=g).tolist(), [], "", "stop"))
    rewards = torch.rand(sequences, generator=g)
    return RolloutBatch(
        prompt_ids=prompts,
        completions=completions,
        rewards=rewards,
        generated=completions,
        generated_rows=list(range(sequences)),
        generated_rewards=rewards,
        generated_rewards_per_func=rewards[:, None],
        frac_zero_var_groups=0.0,
        frac_stuck_groups=0.0,
        resample_rounds=0,
        time_generate=0.0,
        time_score=0.0,
        time_score_pool=0.0,
        reward_failures={},
    )


def state_snapshot(model, optimizer) -> dict[str, torch.Tensor]:
    """CPU clones of every parameter and every tensor in the optimizer state (step included)."""
    snap = {}
    index = {p: i for i, p in enumerate(model.parameters())}
    for name, p in model.named_parameters():
        snap[f"param/{name}"] = p.detach().cpu().clone()
        for key, value in optimizer.state.get(p, {}).items():
            if torch.is_tensor(value):
                snap[f"opt/{index[p]}/{key}"] = value.detach().cpu().clone()
    return snap


def optimizer_steps(optimizer) -> dict[int, float]:
    return {id(p): float(s["step"]) for p, s in optimizer.state.items() if "step" in s}


def state_devices(model, optimizer) -> dict[str, str]:
    out = {}
    for i, p in enumerate(model.parameters()):
        out[f"param/{i}"] = str(p.device)
        for key, value in optimizer.state.get(p, {}).items():
            if torch.is_tensor(value):
                out[f"opt/{i}/{key}"] = str(value.device)
    return out


def mismatches(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Keys whose tensors are not bitwise identical (dtype, shape and bytes)."""
    bad = sorted(set(a) ^ set(b))
    for k in set(a) & set(b):
        x, y = a[k], b[k]
        if (
            x.dtype != y.dtype
            or x.shape != y.shape
            or not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
        ):
            bad.append(k)
    return bad


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def memory(device: torch.device) -> dict[str, int]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        return {
            "allocated": torch.cuda.memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device),
            "device_used": total - free,
        }

    return {"rss": rss_bytes()}


class OffloadCheck:
    """One model, one batch and the record of what was measured (`phases`) and what went wrong (`failures`)."""

    def __init__(self, device: torch.device, shape: str, sequences: int, prompt_len: int, completion_len: int):
        self.device, self.shape = device, shape
        self.trainer = build_trainer(device, shape)
        self.model, self.optimizer = self.trainer.model, self.trainer.optimizer
        self.params = list(self.model.parameters())
        self.param_bytes = tensor_bytes(self.params)
        self.batch = make_batch(self.model.config.vocab_size, sequences, prompt_len, completion_len)
        self.phases: list[dict] = []
        self.failures: list[str] = []
        self.grad_bytes = self.opt_bytes = 0

    def phase(self, name: str, **extra) -> dict:
        row = {"phase": name, **memory(self.device), **extra}
        self.phases.append(row)
        return row

    def first_step(self) -> float:
        """Step 1 (gradients and optimizer state exist from here on); -> its seconds."""
        self.phase("model built")
        t0 = time.perf_counter()
        stats = self.trainer.loss_step.train_on_batch(self.batch)
        step_s = time.perf_counter() - t0
        self.phase("after step 1", seconds=step_s)
        if not all(p.grad is not None for p in self.params):
            self.failures.append("step 1 left parameters without gradients")
        self.grad_bytes = tensor_bytes(p.grad for p in self.params if p.grad is not None)
        state = self.optimizer.state.values()
        self.opt_bytes = tensor_bytes(
            v for s in state for v in s.values() if torch.is_tensor(v) and v.device == self.device
        )
        if not self.optimizer.state:
            self.failures.append("step 1 created no optimizer state")
        if not torch.isfinite(torch.tensor(stats["loss"])):
            self.failures.append(f"step 1 loss is {stats['loss']}")
        return step_s

    def round_trip(self, mode: str, offload_params: bool) -> dict:
        """Offload and reload the trainer state as the trainer does (run.offload_optimizer / run.offload_params),
        check it comes back bitwise identical and on its devices, and that the next step trains."""
        model, optimizer = self.model, self.optimizer
        offloader = TrainerStateOffloader(model, optimizer, True, offload_params)
        self.trainer.offloader = offloader
        before_snap, before_devices = state_snapshot(model, optimizer), state_devices(model, optimizer)
        before = self.phase(f"[{mode}] before offload")
        t0 = time.perf_counter()
        offloader.offload()
        offload_s = time.perf_counter() - t0
        after = self.phase(f"[{mode}] offloaded", seconds=offload_s)
        if offloader.enabled:
            self._check_offloaded(mode, offload_params)
        t0 = time.perf_counter()
        offloader.reload()
        reload_s = time.perf_counter() - t0
        reloaded = self.phase(f"[{mode}] reloaded", seconds=reload_s)
        bad = mismatches(before_snap, state_snapshot(model, optimizer))
        if bad:
            self.failures.append(f"[{mode}] not bitwise identical after the round trip: {bad[:5]} ({len(bad)} tensors)")
        if state_devices(model, optimizer) != before_devices:
            self.failures.append(f"[{mode}] tensors came back on other devices")
        del before_snap
        self._check_next_step(mode)
        expected = self.opt_bytes + self.grad_bytes + (self.param_bytes if offload_params else 0)
        result = {
            "expected_freed_bytes": expected if offloader.enabled else 0,
            "offload_seconds": offload_s,
            "reload_seconds": reload_s,
            "round_trip_bitwise_identical": not bad,
            "offloader_enabled": offloader.enabled,
        }
        if self.device.type == "cuda":
            result |= self._cuda_savings(mode, expected, before, after, reloaded, reload_s)
        return result

    def _check_offloaded(self, mode: str, offload_params: bool) -> None:
        if any(p.grad is not None for p in self.params):
            self.failures.append(f"[{mode}] gradients still held after offload")
        kinds = ("opt/", "param/") if offload_params else ("opt/",)
        devices = state_devices(self.model, self.optimizer).items()
        on_gpu = [k for k, d in devices if d != "cpu" and k.startswith(kinds)]
        if on_gpu:
            self.failures.append(f"[{mode}] left on the GPU after offload: {on_gpu[:4]} ({len(on_gpu)} tensors)")

    def _check_next_step(self, mode: str) -> None:
        step_before = optimizer_steps(self.optimizer)
        t0 = time.perf_counter()
        stats = self.trainer.loss_step.train_on_batch(self.batch)
        self.phase(f"[{mode}] after next step", seconds=time.perf_counter() - t0)
        step_after = optimizer_steps(self.optimizer)
        if not torch.isfinite(torch.tensor(stats["loss"])):
            self.failures.append(f"[{mode}] next step loss is {stats['loss']}")
        if not step_after or any(step_after[k] != step_before[k] + 1 for k in step_before):
            self.failures.append(f"[{mode}] the next optimizer step did not advance every parameter's step")

    def _cuda_savings(self, mode, expected, before, after, reloaded, reload_s) -> dict:
        """What left the GPU: every byte of the state leaves the allocator, and most of it the CUDA cache too (a
        few-MiB tensor can share a cached 20 MiB segment with a live one, which empty_cache cannot free)."""
        result = {
            "allocated_freed_bytes": before["allocated"] - after["allocated"],
            "reserved_freed_bytes": before["reserved"] - after["reserved"],
            "device_used_freed_bytes": before["device_used"] - after["device_used"],
            "allocated_after_reload_bytes": reloaded["allocated"],
            "reload_gb_per_s": (expected - self.grad_bytes) / GiB / max(reload_s, 1e-9),
        }
        for key, share in (("allocated_freed_bytes", 0.99), ("reserved_freed_bytes", 0.85)):
            if result[key] < share * expected:
                self.failures.append(
                    f"[{mode}] {key} = {result[key] / GiB:.3f} GiB < {share:.0%} of {expected / GiB:.3f} GiB"
                )
        if reloaded["allocated"] < before["allocated"] - self.grad_bytes - (1 << 20):
            self.failures.append(
                f"[{mode}] reload did not bring the state back ({reloaded['allocated'] / GiB:.3f} GiB)"
            )
        return result


def run(device: torch.device, shape: str, sequences: int, prompt_len: int, completion_len: int) -> dict:
    """Everything the script measures and checks, as one dict (`failures` lists what went wrong)."""
    t_start = time.perf_counter()
    check = OffloadCheck(device, shape, sequences, prompt_len, completion_len)
    step_s = check.first_step()
    modes = {
        mode: check.round_trip(mode, params) for mode, params in (("optimizer", False), ("optimizer+params", True))
    }
    params = check.params
    return {
        "model": {
            "shape": shape,
            "config": {"vocab_size": NAMED_SHAPES[shape][0], **dataclasses.asdict(NAMED_SHAPES[shape][1])},
            "parameters": sum(p.numel() for p in params),
            "param_dtype": str(params[0].dtype).removeprefix("torch."),
            "bf16_autocast": check.trainer.loss_step.autocast,
            "param_bytes": check.param_bytes,
            "grad_bytes": check.grad_bytes,
            "optimizer_state_bytes_on_device": check.opt_bytes,
        },
        "batch": {"sequences": sequences, "prompt_len": prompt_len, "max_completion_len": completion_len},
        "step1_seconds": step_s,
        "phases": check.phases,
        "modes": modes,
        "failures": check.failures,
        "seconds_total": time.perf_counter() - t_start,
    }


def training_steps(device: torch.device, shape: str, offload: bool, steps: int, prompts: int, completion_len: int):
    """`steps` whole GRPO steps (`GRPOTrainer.training_step`: generate with the transformers engine, score, train,
    offload, sync) of a fresh trainer: per step the trainer's own metrics (time/*, mem/<phase>/*: memory at each
    phase boundary) and the peak memory inside generation and inside training."""
    trainer = build_trainer(device, shape, offload=offload, prompts_per_step=prompts, completion_len=completion_len)
    peaks = {}
    trainer.rollout.collect = _peak_recorded(trainer.rollout.collect, "generate", peaks, device)
    trainer.loss_step.train_on_batch = _peak_recorded(trainer.loss_step.train_on_batch, "train", peaks, device)
    trainer._ensure_engine()
    out = []
    for _ in range(steps):
        metrics = trainer.training_step()
        trainer.step += 1
        kept = {k: v for k, v in metrics.items() if k.startswith(("time/", "mem/", "tokens_per_second/"))}
        out.append(kept | {f"peak/{phase}_gb": value for phase, value in peaks.items()})
    return {
        "offload_optimizer": offload,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "steps": out,
    }


def _peak_recorded(fn, phase: str, peaks: dict, device: torch.device):
    """fn, with the CUDA allocator's peak during each call stored in peaks[phase] (GiB; RSS peak on CPU)."""

    def wrapped(*args, **kwargs):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        result = fn(*args, **kwargs)
        if device.type == "cuda":
            peaks[phase] = torch.cuda.max_memory_allocated(device) / GiB
        else:
            peaks[phase] = rss_bytes("VmHWM") / GiB
        return result

    return wrapped


def print_report(result: dict, device: torch.device) -> None:
    m = result["model"]
    print(
        f"model {m['shape']}: {m['parameters'] / 1e6:.2f}M params ({m['param_dtype']}, bf16 autocast "
        f"{m['bf16_autocast']}); params {m['param_bytes'] / GiB:.2f} GiB, grads {m['grad_bytes'] / GiB:.2f} GiB, "
        f"optimizer state on device {m['optimizer_state_bytes_on_device'] / GiB:.2f} GiB"
    )
    cols = ("allocated", "reserved", "device_used") if device.type == "cuda" else ("rss",)
    print(f"{'phase':34s}" + "".join(f"{c + ' GiB':>17s}" for c in cols) + f"{'seconds':>10s}")
    for row in result["phases"]:
        secs = f"{row['seconds']:10.3f}" if "seconds" in row else " " * 10
        print(f"{row['phase']:34s}" + "".join(f"{row[c] / GiB:17.3f}" for c in cols) + secs)
    for mode, r in result["modes"].items():
        if device.type == "cuda":
            print(
                f"[{mode}] freed: allocated {r['allocated_freed_bytes'] / GiB:.3f} GiB, reserved "
                f"{r['reserved_freed_bytes'] / GiB:.3f} GiB, device {r['device_used_freed_bytes'] / GiB:.3f} GiB "
                f"(expected {r['expected_freed_bytes'] / GiB:.3f}); "
                f"offload {r['offload_seconds']:.2f} s, reload {r['reload_seconds']:.2f} s; "
                f"bitwise round trip {r['round_trip_bitwise_identical']}"
            )
        else:
            print(
                f"[{mode}] offload is a no-op on CPU (TrainerStateOffloader.enabled={r['offloader_enabled']}); "
                f"bitwise round trip {r['round_trip_bitwise_identical']}"
            )
    for run in result.get("training_steps", []):
        for i, step in enumerate(run["steps"]):
            mem = "  ".join(
                f"{k.removeprefix('mem/')} {v:.2f}" for k, v in step.items() if k.startswith(("mem/", "peak/"))
            )
            times = "  ".join(f"{k.removeprefix('time/')} {v:.2f}s" for k, v in step.items() if k.startswith("time/"))
            print(f"[training step {i + 1}, offload_optimizer={run['offload_optimizer']}] {times}\n    GiB: {mem}")
    print(f"total {result['seconds_total']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny model and batch (CPU smoke test)")
    ap.add_argument("--sequences", type=int, default=None, help="sequences per step (default 16, tiny 8)")
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 128, tiny 8)")
    ap.add_argument("--completion-len", type=int, default=None, help="max completion tokens (default 384, tiny 8)")
    ap.add_argument("--steps", type=int, default=2, help="whole GRPO steps per offload setting (0: none)")
    ap.add_argument("--step-prompts", type=int, default=None, help="prompts per whole step, x4 completions (8; tiny 2)")
    ap.add_argument("--step-completion-len", type=int, default=None, help="max new tokens per step (128; tiny 8)")
    ap.add_argument("--out", default=None, help="JSON result path")
    args = ap.parse_args(argv)
    for name, least in (("steps", 0), ("step_prompts", 1), ("step_completion_len", 1)):
        value = getattr(args, name)
        if value is not None and value < least:
            ap.error(f"--{name.replace('_', '-')}: expected an integer >= {least}, got {value}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_offload: no CUDA device, nothing to measure (use --device cpu --tiny for a CPU smoke test)")
        return 0
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    shape = "tiny" if args.tiny else "qwen2.5-0.5b"

    environment = environment_stamp(device)

    def save(result: dict) -> None:  # after each part, so that a kill keeps what finished
        if args.out:
            write_json(args.out, {"environment": environment, **result})

    result = run(
        device,
        shape,
        args.sequences or (8 if args.tiny else 16),
        args.prompt_len or (8 if args.tiny else 128),
        args.completion_len or (8 if args.tiny else 384),
    )
    result["training_steps"] = []
    save(result)
    prompts = args.step_prompts or (2 if args.tiny else 8)
    completion_len = args.step_completion_len or (8 if args.tiny else 128)
    for offload in (True, False) if args.steps else ():
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["training_steps"].append(training_steps(device, shape, offload, args.steps, prompts, completion_len))
        save(result)
    print_report(result, device)
    if args.out:
        print(f"wrote {args.out}")
    if result["failures"]:
        print("FAILED:\n  " + "\n  ".join(result["failures"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
