"""The loss's fuzz campaign (grpo_fast.testing.fuzz): random cases over every argument of the public loss API on
every backend that runs here, against the fp64 reference under the tolerance rule, and invalid inputs that must be
refused with an error naming the argument.

Default run (`pytest -m "not slow and not gpu"`): a CI-sized subset, the first SUBSET[backend] valid cases and
INVALID_SUBSET invalid-input cases of each backend (seeds 0, 1, ...), about a minute on a 2-core CPU.

The full campaign (10,000 valid cases, 1,500 invalid ones), either of:

    pytest -m slow tests/loss/test_fuzz.py
    python -m grpo_fast.testing.fuzz --cases 10000 --invalid 1500 --out benchmarks/results/loss_fuzz_cpu.json

or in shards run side by side, merged into the same report (see python -m grpo_fast.testing.fuzz --help).

One case again (a failure message names its command):

    python -m grpo_fast.testing.fuzz --backend cpu --seed 1234 [--invalid]

The fuzz can fail: the test_fuzz_detects_* tests break a backend's gradient, or a validation, and expect failures.
"""

from __future__ import annotations

import json
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined

import pytest  # noqa: E402

from grpo_fast.backends import available_backends  # noqa: E402
from grpo_fast.backends.chunked import TorchEpilogue  # noqa: E402
from grpo_fast.loss import checks  # noqa: E402
from grpo_fast.testing.fuzz.campaign import merge_reports, reproduce_command, run_campaign, shard, split  # noqa: E402
from grpo_fast.testing.fuzz.cases import LOSS_TYPE_NAMES, draw_params  # noqa: E402
from grpo_fast.testing.fuzz.check import run_case  # noqa: E402
from grpo_fast.testing.fuzz.invalid import run_invalid_case  # noqa: E402

BACKENDS = tuple(b for b in ("torch", "cpu", "triton") if b in available_backends(torch.device("cpu")))
SUBSET = {"torch": 60, "cpu": 60, "triton": 25}
INVALID_SUBSET = 30
FULL_CASES, FULL_INVALID = 10_000, 1_500


def _failures(backend: str, results, invalid: bool = False) -> list[str]:
    lines = []
    for result in results:
        problems = ([result.failure] if result.failure else []) if invalid else result.failures()
        if problems:
            lines.append(f"{reproduce_command(backend, result.params['seed'], invalid)}: {'; '.join(problems)}")
    return lines


@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_subset(backend):
    results = [run_case(backend, seed) for seed in range(SUBSET[backend])]
    failures = _failures(backend, results)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_invalid_inputs_subset(backend):
    results = [run_invalid_case(backend, seed) for seed in range(INVALID_SUBSET)]
    failures = _failures(backend, results, invalid=True)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_fuzz_full_campaign():
    report = run_campaign(split(FULL_CASES, BACKENDS), split(FULL_INVALID, BACKENDS))
    assert sum(section["cases"] for section in report.values()) == FULL_CASES
    for backend, section in report.items():
        assert section["failed"] == 0, (backend, section["failures"])
        assert section["invalid"]["failed"] == 0, (backend, section["invalid"]["failures"])


def test_fuzz_detects_a_perturbed_gradient(monkeypatch):
    """dz off by 0.1% in the torch backend's epilogue: every fp32 / fp64 case of ordinary logits fails a gradient
    check (bf16 / fp16 gradients cannot resolve 0.1%, nor can fp32 ones of logits in the thousands)."""
    grad_ = TorchEpilogue.grad_

    def perturbed(self, z, *args, **kwargs):
        grad_(self, z, *args, **kwargs)
        z.mul_(1.001)

    monkeypatch.setattr(TorchEpilogue, "grad_", perturbed)
    seeds = [s for s in range(160) if _resolves_a_permille(draw_params("torch", s))][:8]
    caught = [any(c.category == "grad" and c.ratio > 1 for c in run_case("torch", seed).checks) for seed in seeds]
    assert len(seeds) == 8 and all(caught), dict(zip(seeds, caught, strict=True))


def _resolves_a_permille(params: dict) -> bool:
    """fp32 / fp64, ordinary logits and advantages, and every token kept: no sequence masked out and no token mask
    (TRL's entropy quantile or a trust region may drop most of a small case's tokens, leaving gradients whose
    bound's absolute slack exceeds 0.1% of them)."""
    ordinary = params["dtype"] in ("float32", "float64") and params["regime"] == "normal"
    nonzero = params["adv_values"] == "normal" and params["masked_out"] == "none"
    unmasked = params["config"]["loss_type"] in LOSS_TYPE_NAMES and params["config"]["top_entropy_quantile"] == 1.0
    return ordinary and nonzero and unmasked


def test_fuzz_detects_a_missing_validation(monkeypatch):
    """NaN / inf advantages, old logprobs, ... accepted without a check: the invalid-input cases fail."""
    monkeypatch.setattr(checks, "require_finite", lambda *args, **kwargs: None)
    results = [run_invalid_case("torch", seed) for seed in range(60)]
    assert any(r.failure and r.failure.startswith("accepted") for r in results)


@pytest.mark.parametrize(("seed", "objective"), [(2528, "kpop"), (3902, "dppo_kl")])
def test_trust_region_conditioning_settles_masks_at_probability_one(seed, objective):
    """Cases whose mask compares logprobs at or near 0 (probability 1, large logits): the conditioning's walk
    pushed the moved logprobs above 0, where no move settles the mask, and the case failed in the harness
    ("mask still at a switch point") instead of checking the loss."""
    result = run_case("torch", seed)
    assert result.params["config"]["loss_type"] == objective
    assert not result.failed, result.failures()


def test_cispo_without_epsilon_high_is_the_only_invalid_option():
    """The mutation that switches a case to cispo drops the case's own objective's options: with them the config
    had two errors and the one named was not the one the mutation expects (seed 56: kpop's threshold)."""
    for backend in BACKENDS:
        result = run_invalid_case(backend, 56)
        assert result.mutation == "cispo without epsilon_high"
        assert result.failure is None, result.failure


def test_fuzz_command_line_merges_shards_of_one_commit_only(tmp_path, capsys, monkeypatch):
    """`--shard` reports merged by `--merge`: the cases of both, the one-process command they equal; shards of
    another commit, or of a tree with uncommitted changes, are refused by name."""
    from grpo_fast.testing.fuzz import __main__ as fuzz_cli
    from grpo_fast.testing.fuzz.__main__ import main

    monkeypatch.setattr(fuzz_cli, "git_commit", lambda: "abc1234")  # the stamp of a clean tree, whatever this one is
    parts = [tmp_path / f"torch_{i}.json" for i in range(2)]
    for i, part in enumerate(parts):
        code = main(["--backends", "torch", "--cases", "3", "--invalid", "0", "--shard", f"{i}/2", "--out", str(part)])
        assert code == 0
    assert main(["--merge", *map(str, parts), "--out", str(tmp_path / "merged.json")]) == 0
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["backends"]["torch"]["cases"] == 3 and len(merged["shards"]) == 2
    assert merged["equivalent_command"].endswith("--cases 3 --invalid 0 --backends torch")
    first = json.loads(parts[0].read_text())
    for commit in ("0123456", "abc1234+dirty"):
        parts[0].write_text(json.dumps(first | {"environment": first["environment"] | {"commit": commit}}))
        with pytest.raises(SystemExit):
            main(["--merge", *map(str, parts)])
        assert "different or uncommitted code" in capsys.readouterr().err


def test_fuzz_shards_merge_into_the_one_process_report():
    """The campaign cut into shards (contiguous seed ranges) and merged: the counts, failures and worst cases of
    one process running every seed (the torch backend: one process, one thread count, the same rounding)."""
    whole = run_campaign({"torch": 5}, {"torch": 2})
    parts = [run_campaign({"torch": shard(5, i, 2)}, {"torch": shard(2, i, 2)}) for i in range(2)]
    assert [list(shard(5, i, 2)) for i in range(2)] == [[0, 1], [2, 3, 4]]
    merged = merge_reports(parts)["torch"]
    for key in ("cases", "failed", "failures", "worst", "checks", "checks_with_conditioning_slack_above_rule"):
        assert merged[key] == whole["torch"][key], key
    assert merged["counts"] == whole["torch"]["counts"]
    assert merged["invalid"] | {"mutations": None} == whole["torch"]["invalid"] | {"mutations": None}
    assert merged["invalid"]["mutations"] == whole["torch"]["invalid"]["mutations"]
    with pytest.raises(ValueError, match="shard"):
        shard(5, 2, 2)
