"""The loss benchmark (grpo_fast/bench/loss.py): its variants compute the same loss (a benchmark that timed
different work would compare nothing), a peer that is not installed or a variant that runs out of time gets a
row saying so, --update merges runs, the JSON is stamped, and bad arguments name themselves."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from grpo_fast import GRPOLossConfig
from grpo_fast.bench import loss
from grpo_fast.bench.loss import make_batch, make_step, variants

CPU = torch.device("cpu")


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_every_variant_computes_the_naive_gradients(beta):
    config = GRPOLossConfig(loss_type="dapo", beta=beta, temperature=0.9)
    names = [n for n in variants(CPU) if n not in ("naive", "gemm3")]
    assert {"torch", "trl", "liger"} <= set(names)  # the peers are part of the CPU install
    batch = make_batch(96, 32, 257, dtype=torch.float32, device="cpu")
    step, (h_ref, w_ref) = make_step("naive", batch, config)
    step()
    for name in names:
        step, leaves = make_step(name, batch, config)
        step()
        hidden, weight = leaves
        torch.testing.assert_close(hidden.grad, h_ref.grad, rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(weight.grad, w_ref.grad, rtol=1e-4, atol=1e-6, msg=name)


def _args(tmp_path, *extra):
    parser = argparse.ArgumentParser()
    loss.add_arguments(parser)
    base = ["--device", "cpu", "--shapes", "64,16,64", "128,16,64", "--repeats", "1", "--no-png"]
    return parser.parse_args([*base, "--out", str(tmp_path / "loss.json"), *extra])


def test_missing_peer_and_timeout_rows_then_update(tmp_path, monkeypatch):
    real_find_spec = loss.importlib.util.find_spec
    monkeypatch.setattr(loss.importlib.util, "find_spec", lambda m: None if m == "liger_kernel" else real_find_spec(m))
    assert loss.main(_args(tmp_path, "--variants", "gemm3", "liger")) == 0
    first = json.loads((tmp_path / "loss.json").read_text())
    liger = [r for r in first["results"] if r["variant"] == "liger"]
    assert [r["status"] for r in liger] == ["not installed (liger-kernel)"] * 2
    assert all("median_s" in r for r in first["results"] if r["variant"] == "gemm3")

    # a variant that cannot finish within its limit: every shape it did not reach says so, and the command fails
    # (it exited 0: a GPU check recorded such a phase as passed)
    assert loss.main(_args(tmp_path, "--variants", "torch", "--variant-timeout", "0.01", "--update")) == 1
    second = json.loads((tmp_path / "loss.json").read_text())
    assert len(second["runs"]) == 2 and len(second["results"]) == 6
    torch_rows = [r for r in second["results"] if r["variant"] == "torch"]
    assert [r["status"] for r in torch_rows] == ["timed out after 0 s"] * 2

    assert loss.main(_args(tmp_path, "--variants", "torch", "--update")) == 0
    third = json.loads((tmp_path / "loss.json").read_text())
    assert len(third["results"]) == 6  # the torch rows replaced, not appended
    torch_rows = [r for r in third["results"] if r["variant"] == "torch"]
    assert all(r["ratio_to_gemm3"] > 0 and r["peak_extra_bytes"] > 0 for r in torch_rows)
    stamp = third["runs"][-1]["environment"]
    for key in ("commit", "date", "torch", "triton", "liger-kernel", "trl", "cpu", "load_average_1_5_15"):
        assert key in stamp, key
    assert third["runs"][-1]["load_average_1_5_15"].keys() == {"before", "after"}


def test_cuda_rows_say_when_the_extension_has_no_cuda_kernels(monkeypatch):
    monkeypatch.setattr(loss, "extension_kind", lambda: "C++ kernels only")
    assert loss.missing("cuda") == "not built: grpo_fast._C is C++ kernels only"
    assert loss.missing("cuda@64") == loss.missing("cuda") and loss.missing("torch") is None


def test_time_limit_rows_for_the_variants_it_left_out(tmp_path):
    assert loss.main(_args(tmp_path, "--variants", "gemm3", "naive", "--time-limit", "0.001")) == 0
    rows = json.loads((tmp_path / "loss.json").read_text())["results"]
    assert [(r["variant"], r["status"]) for r in rows] == [
        (name, "not run (--time-limit 0.001 s)") for name in ("gemm3", "gemm3", "naive", "naive")
    ]


def test_bad_arguments_name_themselves(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--variants: 'bogus'"):
        loss.main(_args(tmp_path, "--variants", "bogus"))
    with pytest.raises(SystemExit, match="@MiB is for the chunked backends"):
        loss.main(_args(tmp_path, "--variants", "naive@4"))
    with pytest.raises(SystemExit, match="--time-limit: expected seconds > 0"):
        loss.main(_args(tmp_path, "--time-limit", "0"))
    with pytest.raises(SystemExit):
        _args(tmp_path, "--shapes", "1,2")
    assert "--shapes: expected N,H,V" in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    loss.add_arguments(parser)
    with pytest.raises(SystemExit, match="--models and --tokens go together"):
        loss.main(parser.parse_args(["--device", "cpu", "--models", "tiny"]))


def test_model_presets_are_the_real_lm_heads():
    assert loss.MODELS["qwen2.5-7b"] == (3584, 152064) and loss.MODELS["llama-3.1-8b"] == (4096, 128256)
    parser = argparse.ArgumentParser()
    loss.add_arguments(parser)
    args = parser.parse_args(["--models", "qwen2.5-7b", "llama-3.1-8b", "--tokens", "4096", "16384"])
    shapes = loss.shapes_of(args, torch.device("cuda"))
    assert [(s.model, s.N) for s in shapes] == [
        ("qwen2.5-7b", 4096), ("qwen2.5-7b", 16384), ("llama-3.1-8b", 4096), ("llama-3.1-8b", 16384)
    ]  # fmt: skip


def test_interleaved_rounds_and_ratios():
    """The interleaved timing: every variant once per round, each round's ratio to the baseline (its own: 1)."""
    shape = loss.Shape(96, 32, 257)
    result = loss.interleaved(shape, "fp32", CPU, GRPOLossConfig(), ["naive", "torch"], rounds=3)
    assert result["baseline"] == "naive" and [r["variant"] for r in result["results"]] == ["naive", "torch"]
    for row in result["results"]:
        assert len(row["wall_s"]) == len(row["cpu_s"]) == 3 and min(row["wall_s"]) > 0
    naive = result["results"][0]["wall_ratio_to_naive"]
    assert naive["min"] == naive["median"] == naive["max"] == 1.0
    torch_row = result["results"][1]
    ratios = sorted(t / n for t, n in zip(torch_row["wall_s"], result["results"][0]["wall_s"], strict=True))
    assert torch_row["wall_ratio_to_naive"] == {"median": ratios[1], "min": ratios[0], "max": ratios[2]}
