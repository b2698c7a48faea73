"""The prefix-sharing benchmark's quick mode runs and writes its JSON, and its two contenders compute the same
loss and gradients (a benchmark that timed different work would compare nothing)."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("benchmarks/bench_prefix_sharing.py", "bench_prefix_sharing")


def test_quick_mode_writes_agreeing_results(tmp_path, bench):
    out = tmp_path / "prefix_sharing.json"
    assert bench.main(bench.parse(["--quick", "--device", "cpu", "--out", str(out)])) == 0
    payload = json.loads(out.read_text())
    assert payload["benchmark"] == "prefix_sharing"
    assert {"commit", "date", "cpu", "torch", "transformers"} <= payload["environment"].keys()
    assert [r["prompt_len"] for r in payload["results"]] == [8, 32]
    for r in payload["results"]:
        assert r["backbone_tokens_shared"] < r["backbone_tokens_unshared"]
        check = r["agreement"]
        assert check["loss_abs_diff"] <= 1e-5 * abs(check["loss_unshared"]) + 1e-7, check
        assert check["grad_max_rel_diff"] < 1e-4, check
        for name in ("shared", "unshared"):
            assert r[name]["median_s"] > 0 and r[name]["cpu_median_s"] > 0 and len(r[name]["samples_s"]) == 1
        assert r["speedup"] > 0 and r["speedup_cpu_time"] > 0
        assert r["shared"]["peak_extra_bytes"] is None  # quick mode measures no memory


def test_memory_measurement_runs_in_process(bench):
    args = bench.parse(["--quick", "--device", "cpu"])
    cpu = torch.device("cpu")
    model = bench.build_model(args, cpu)
    batch, advantages = bench.build_batch(args, 8, cpu)
    assert isinstance(bench.measure_memory("shared", model, batch, advantages, cpu, autocast=False), int)
