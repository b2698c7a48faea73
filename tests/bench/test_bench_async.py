"""The async benchmark's harness: a run that fails is said in the results and the exit status (it was dropped
while the table named its variant), and --merge keeps only runs of the same settings (it mixed 2-step and 4-step
runs under one table's settings)."""

from __future__ import annotations

import json

import pytest


def _run(seed: int, variant: str) -> dict:
    """A finished run as `--one` prints it, with what aggregate() and the table read."""
    return {
        "seed": seed, "variant": variant, "step_seconds_mean": 1.0, "accuracy_start": 0.1, "accuracy_final": 0.5,
        "steps": [{"seconds": 1.0}], "evaluations": [{"samples": 0, "seconds": 0.0, "accuracy": 0.1}],
        "trained_tokens_per_second": 10.0, "engine_idle_share": 0.0, "trainer_idle_share": 0.0,
        "token_share_staleness": {"0": 1.0},
    }  # fmt: skip


def test_a_failed_run_is_reported_and_merge_refuses_other_settings(tmp_path, monkeypatch, load_script):
    bench = load_script("benchmarks/bench_async.py", "bench_async_under_test")
    out, work = tmp_path / "async.json", tmp_path / "work"
    base = ["--seeds", "0", "--steps", "2", "--work", str(work), "--out", str(out)]

    def one(args, timeout):
        variant = args[args.index("--one") + 2]
        if variant == "partial_coupled":
            raise RuntimeError("subprocess failed:\nValueError: rollout.partial.correction: refused")
        return _run(int(args[args.index("--one") + 1]), variant)

    monkeypatch.setattr(bench, "run_json_subprocess", one)
    monkeypatch.setattr(bench, "aggregate", lambda runs: {})
    monkeypatch.setattr(bench, "plot", lambda runs, path: None)
    assert bench.main([*base, "--variants", "sync", "partial_coupled"]) == 1
    payload = json.loads(out.read_text())
    assert [r["variant"] for r in payload["runs"]] == ["sync"]
    assert payload["failures"] == [
        {"seed": 0, "variant": "partial_coupled", "error": "ValueError: rollout.partial.correction: refused"}
    ]
    with pytest.raises(SystemExit, match=r"--merge: .* holds runs made with other settings \(steps: 2 -> 4\)"):
        bench.main([*base[:2], "--steps", "4", *base[4:], "--variants", "partial", "--merge"])
