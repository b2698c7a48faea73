"""One contender in a fresh interpreter of its own (so its peak RSS is its own, and TRL's process never imports our
trainer nor ours TRL): `run_contender` starts it, `worker_main` runs it there."""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from grpo_fast.bench.common import REPO_ROOT
from grpo_fast.bench.step.configs import GRPO_FAST_VARIANTS

CONTENDER_RUNNERS = {
    **{name: ("grpo_fast.bench.step.ours", "run_grpo_fast") for name in GRPO_FAST_VARIANTS},
    "trl": ("grpo_fast.bench.step.trl_contender", "run_trl"),
}


def worker_main(argv: list[str]) -> int:
    """`python -c ... worker_main([job.json, result.json])`: runs one contender, writes its JSON result."""
    job_path, result_path = argv
    job = json.loads(Path(job_path).read_text())
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    start = time.perf_counter()
    module, function = CONTENDER_RUNNERS[job["contender"]]
    result = getattr(importlib.import_module(module), function)(job)
    warmup = job["warmup"]
    result.update(
        {
            "contender": job["contender"],
            "config": job["config"]["name"],
            "warmup_records": result["records"][:warmup],
            "records": result["records"][warmup:],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "process_seconds": time.perf_counter() - start,
            "pid": os.getpid(),
        }
    )
    vllm = sys.modules.get("vllm")  # the vLLM this process ran, if it imported one
    result["vllm_version_imported"] = getattr(vllm, "__version__", None)
    Path(result_path).write_text(json.dumps(result, indent=1, default=str))
    return 0


def run_contender(job: dict, work: Path, timeout: float) -> dict:
    """Runs `job` in a fresh interpreter (its log in work/) and returns its result."""
    work.mkdir(parents=True, exist_ok=True)
    job_path, result_path, log_path = work / "job.json", work / "result.json", work / "log.txt"
    job_path.write_text(json.dumps(job, indent=1))
    result_path.unlink(missing_ok=True)
    code = "import sys; from grpo_fast.bench.step.worker import worker_main; sys.exit(worker_main(sys.argv[1:]))"
    env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code, str(job_path), str(result_path)],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"{job['config']['name']}/{job['contender']} ran past --timeout {timeout:g} s; its log: {log_path}"
            ) from None
    if proc.returncode != 0 or not result_path.exists():
        tail = log_path.read_text()[-4000:]
        raise RuntimeError(
            f"{job['config']['name']}/{job['contender']} failed (exit {proc.returncode}); {log_path}:\n{tail}"
        )
    return json.loads(result_path.read_text())
