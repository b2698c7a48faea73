"""Trainer-state offload on CPU: a safe no-op (nothing moves, nothing is dropped), the trainer still logs the
memory of every phase boundary, and benchmarks/bench_offload.py runs its whole path on a tiny model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.trainer.offload import TrainerStateOffloader, memory_snapshot

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_offload.py"
PHASES = ("generate", "train_start", "train_end", "offloaded")


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_offload", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stepped_model():
    model = build_tiny_model(build_char_tokenizer(), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[1, 5, 6, 7]]), labels=torch.tensor([[1, 5, 6, 7]])).loss.backward()
    opt.step()
    return model, opt


@pytest.mark.parametrize("offload_params", [False, True])
def test_offload_is_a_noop_on_cpu(offload_params):
    model, opt = _stepped_model()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad for n, p in model.named_parameters()}
    states = {id(p): dict(s) for p, s in opt.state.items()}
    off = TrainerStateOffloader(model, opt, offload_optimizer=True, offload_params=offload_params)
    assert not off.enabled and not off.offload_optimizer and not off.offload_params
    for _ in range(2):  # repeated calls stay harmless
        off.offload()
        assert not off.offloaded
        off.reload()
        assert not off.offloaded
    for n, p in model.named_parameters():
        assert p.device.type == "cpu" and torch.equal(p, params[n])
        assert p.grad is grads[n]  # gradients are only dropped when there is device memory to free
    for p, s in opt.state.items():
        assert all(s[k] is v for k, v in states[id(p)].items())
    opt.step()  # still a working optimizer


def test_reference_model_offload_is_a_noop_on_cpu():
    """With a reference model (beta > 0) on CPU nothing moves either: its parameters stay the same objects."""
    import copy

    model, opt = _stepped_model()
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    before = {n: (p, p.data.data_ptr()) for n, p in ref.named_parameters()}
    off = TrainerStateOffloader(model, opt, offload_optimizer=True, ref_model=ref)
    assert off.ref_model is ref and not off.offload_ref_model
    off.offload()
    off.reload()
    for n, p in ref.named_parameters():
        assert p is before[n][0] and p.data_ptr() == before[n][1] and p.device.type == "cpu"
    # The constructor's positional order is unchanged (the trainer passes ref_model by keyword).
    assert TrainerStateOffloader(model, opt, True, True).ref_model is None


def test_memory_snapshot_keys_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("CPU form of the snapshot")
    snap = memory_snapshot("train_start")
    assert list(snap) == ["mem/train_start/max_rss_gb"]
    assert snap["mem/train_start/max_rss_gb"] > 0


def test_trainer_logs_phase_memory(tmp_path):
    from grpo_fast.data.tasks import modular_arithmetic_dataset
    from grpo_fast.rewards.tasks import exact_match_reward
    from grpo_fast.trainer import GRPOTrainer, load_config

    tok = build_char_tokenizer()
    cfg = load_config(
        None,
        [
            "rollout.engine=hf",
            "rollout.num_generations=2",
            "rollout.max_completion_length=2",
            "run.prompts_per_step=2",
            "run.offload_params=true",  # ignored with the transformers engine (it generates with the model)
            f"run.output_dir={tmp_path}",
        ],
    )
    rows = modular_arithmetic_dataset(8, seed=0)
    trainer = GRPOTrainer(build_tiny_model(tok, seed=0), [exact_match_reward], rows, config=cfg, tokenizer=tok)
    trainer._ensure_engine()
    out = trainer.training_step()
    suffixes = ("allocated_gb", "reserved_gb", "device_used_gb") if torch.cuda.is_available() else ("max_rss_gb",)
    for phase in PHASES:
        for suffix in suffixes:
            value = out[f"mem/{phase}/{suffix}"]
            assert isinstance(value, float) and value >= 0


def test_bench_offload_cpu_smoke(tmp_path, capsys):
    bench = load_bench()
    out = tmp_path / "offload.json"
    assert bench.main(["--device", "cpu", "--tiny", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "offload is a no-op on CPU" in text
    import json

    result = json.loads(out.read_text())
    assert result["failures"] == []
    assert result["environment"]["device"] == "cpu"
    assert result["model"]["optimizer_state_bytes_on_device"] > 0  # a real AdamW step happened
    for mode in ("optimizer", "optimizer+params"):
        assert result["modes"][mode]["round_trip_bitwise_identical"]
        assert result["modes"][mode]["expected_freed_bytes"] == 0


def test_bench_offload_without_cuda_exits_cleanly(capsys):
    if torch.cuda.is_available():
        pytest.skip("only meaningful without CUDA")
    assert load_bench().main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_completion_logprobs_in_bf16_matches_fp32():
    """The trainer's bf16 path (autocast on GPU) computes old/ref logprobs from bf16 hidden states and
    lm_head weight, like the training loss; on CPU the same call must agree with fp32 to bf16 precision."""
    from grpo_fast.core.policy import build_sequence_batch, completion_logprobs

    model = build_tiny_model(build_char_tokenizer(), seed=0)
    batch = build_sequence_batch([[1, 5, 6], [1, 7]], [[8, 9, 2], [10]], pad_id=0)
    with torch.no_grad():
        fp32 = completion_logprobs(model, batch, backend="torch")
        bf16 = completion_logprobs(model, batch, backend="torch", dtype=torch.bfloat16)
    assert bf16.dtype == torch.float32
    mask = batch.completion_mask
    torch.testing.assert_close(bf16[mask], fp32[mask], atol=5e-2, rtol=0)
