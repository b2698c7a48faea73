"""The SFT run: it learns, resumes exactly, runs from the command line, and names the key of a bad config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from grpo_fast.cli import main
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model, save_tiny
from grpo_fast.sft.config import load_sft_config
from grpo_fast.sft.in_memory import sft_train
from grpo_fast.sft.trainer import SFTTrainer, run_sft

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ROWS = [{"prompt": f"({a}*7)%10=", "completion": str(a * 7 % 10), "reward": 1.0} for a in range(40)]


def config(output_dir, **run):
    return load_sft_config(
        {
            "data": {"max_length": 32},
            "optim": {"lr": 3e-3, "lr_scheduler": "cosine", "warmup_steps": 2},
            "run": {
                "output_dir": str(output_dir),
                "micro_batch_tokens": 64,
                "grad_accum": 2,
                "tensorboard": False,
                "progress": False,
                "plots": False,
                **run,
            },
        }
    )


def test_a_few_steps_reduce_the_loss(model, tok):
    losses = sft_train(model, tok, [(r["prompt"], r["completion"]) for r in ROWS], steps=30, batch_size=16, lr=3e-3)
    assert len(losses) == 30 and sum(losses[-5:]) < 0.5 * sum(losses[:5]), losses


def with_dropout(model):
    """Attention dropout on, so that an exact resume also needs the RNG states back."""
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    return model


def test_resume_from_a_checkpoint_gives_the_weights_of_an_uninterrupted_run(tok, tmp_path):
    steps = 8
    run_sft(config(tmp_path / "full", max_steps=steps), with_dropout(build_tiny_model(tok, seed=0)), tok, ROWS)

    part = config(tmp_path / "part", max_steps=steps, save_every=4)
    model = with_dropout(build_tiny_model(tok, seed=0))
    torch.manual_seed(part.run.seed)  # as run_sft does, after the model is built
    killed = SFTTrainer(part, model, tok, ROWS)
    assert killed.packing and killed.plan.steps_for_epochs(1) < 6  # resumes in the second epoch
    for _ in range(6):  # checkpoint at step 4; steps 5 and 6 are lost
        killed.train_step()
        if killed.step % 4 == 0:
            killed.save()
    other_weights = with_dropout(build_tiny_model(tok, seed=5))  # everything must come from the checkpoint
    summary = run_sft(config(tmp_path / "part", max_steps=steps, resume=True), other_weights, tok, ROWS)

    assert summary["steps"] == steps and summary["steps_this_run"] == steps - 4
    full = load_file(tmp_path / "full" / "final" / "model.safetensors")
    resumed = load_file(tmp_path / "part" / "final" / "model.safetensors")
    assert full.keys() == resumed.keys()
    for name, tensor in full.items():
        assert torch.equal(tensor, resumed[name]), name
    logged = [json.loads(line)["step"] for line in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(5, steps + 1))


def test_a_resume_with_another_seed_data_or_batch_shape_is_refused(tok, tmp_path):
    """It continued silently: the new seed replaced by the saved RNG states, other data or lengths trained on from
    the saved data position."""
    run_sft(config(tmp_path, max_steps=2, save_every=2), build_tiny_model(tok, seed=0), tok, ROWS)
    for change, key in (({"seed": 7}, "run.seed"), ({"micro_batch_tokens": 48}, "run.micro_batch_tokens")):
        cfg = config(tmp_path, max_steps=4, resume=True, **change)
        with pytest.raises(ValueError, match=rf"cannot resume from .*step-000002.*\n  {key}: saved"):
            run_sft(cfg, build_tiny_model(tok, seed=0), tok, ROWS)
    cfg = config(tmp_path, max_steps=4, resume=True)
    cfg.data.max_length = 24
    with pytest.raises(ValueError, match=r"\n  data.max_length: saved 32, now 24"):
        run_sft(cfg, build_tiny_model(tok, seed=0), tok, ROWS)
    # A longer run resumes (max_steps moves the cosine schedule: warned, allowed).
    assert run_sft(config(tmp_path, max_steps=4, resume=True), build_tiny_model(tok, seed=0), tok, ROWS)["steps"] == 4


def test_cli_trains_a_local_model_on_a_jsonl_file(tok, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    model_dir = save_tiny(build_tiny_model(tok, seed=0), tok, tmp_path / "model")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(model_dir)},
                "data": {"source": str(data), "max_length": 32},
                "optim": {"lr": 3e-3},
                "run": {"output_dir": str(tmp_path / "run"), "micro_batch_tokens": 128, "progress": False},
            }
        )
    )
    assert main(["sft", "--config", str(cfg), "--set", "run.epochs=2", "--set", "run.tensorboard=false"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["packing"] and printed["final_loss"] < printed["first_loss"]
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == printed["steps"] > 2
    assert {"loss", "lr", "grad_norm", "tokens_per_second", "epoch"} <= records[-1].keys()
    assert (run / "plots" / "training_curves.png").stat().st_size > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["data"]["examples"] == len(ROWS) and summary["final_model"] == str(run / "final")
    final = AutoModelForCausalLM.from_pretrained(run / "final")  # the next stage loads it
    assert final.config.vocab_size == len(tok)

    assert main(["sft", "--config", str(cfg), "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["source"] == str(data)


def test_a_fresh_run_never_replaces_an_earlier_one_unasked(tok, tmp_path):
    """A second run into the same output_dir is refused (its final model and checkpoints are the user's), as is a
    resume with no checkpoint to resume; run.overwrite deletes the earlier run first, old checkpoints included."""
    out = tmp_path / "run"
    run_sft(config(out, max_steps=2, save_every=2), build_tiny_model(tok, seed=0), tok, ROWS)
    saved = (out / "final" / "model.safetensors").read_bytes()
    for resume, refusal in ((False, "resume it"), (True, None)):
        again = config(out, max_steps=1, resume=resume)
        if resume:  # a checkpoint exists: resumed, not refused; beyond max_steps, it trains nothing new
            assert run_sft(again, build_tiny_model(tok, seed=1), tok, ROWS)["steps_this_run"] == 0
            continue
        with pytest.raises(ValueError, match=rf"run.output_dir {out} holds an earlier run .*final/.*{refusal}"):
            run_sft(again, build_tiny_model(tok, seed=1), tok, ROWS)
    assert (out / "final" / "model.safetensors").read_bytes() == saved
    (out / "checkpoints").rename(tmp_path / "elsewhere")  # a finished run without checkpoints
    with pytest.raises(ValueError, match="it has no checkpoint to resume"):
        run_sft(config(out, max_steps=1, resume=True), build_tiny_model(tok, seed=1), tok, ROWS)
    (tmp_path / "elsewhere").rename(out / "checkpoints")
    summary = run_sft(config(out, max_steps=1, overwrite=True), build_tiny_model(tok, seed=1), tok, ROWS)
    assert summary["steps"] == 1 and not (out / "checkpoints").exists()
    assert (out / "final" / "model.safetensors").read_bytes() != saved


def test_retention_never_prunes_the_checkpoint_a_run_resumed_from(tok, tmp_path):
    out = tmp_path / "run"
    run_sft(config(out, max_steps=2, save_every=2), build_tiny_model(tok, seed=0), tok, ROWS)
    resumed = config(out, max_steps=4, save_every=1, keep_checkpoints=1, resume=True)
    run_sft(resumed, build_tiny_model(tok, seed=0), tok, ROWS)
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step-000002", "step-000004"]


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"data": {"max_length": 0}}, "data.max_length: expected a value >= 1"),
        ({"data": {"format": "chat"}}, "data.format: expected one of"),
        ({"data": {"packing": True, "max_length": None}}, "data.max_length: packing needs a row length"),
        ({"run": {"micro_batch_tokens": 512}}, "run.micro_batch_tokens: 512 cannot hold one example"),
        ({"run": {"micro_batch_tokens": None}}, "run.micro_batch_tokens: set it or run.micro_batch_size"),
        ({"run": {"grad_accum": "2"}}, "run.grad_accum: expected int, got str"),
        ({"run": {"epoch": 2}}, r"run: unknown key\(s\) \['epoch'\]"),
        ({"optim": {"lr_scheduler": "step"}}, "optim.lr_scheduler: expected one of"),
        ({"sft": {}}, r"config: unknown key\(s\) \['sft'\]"),
    ],
)
def test_config_errors_name_the_key(tree, message):
    with pytest.raises(ValueError, match=message):
        load_sft_config(tree)


def test_cli_reports_an_invalid_config_and_a_missing_model(tmp_path):
    with pytest.raises(SystemExit, match="invalid config: run.max_steps: expected a value >= 1"):
        main(["sft", "--set", "run.max_steps=0"])
    with pytest.raises(SystemExit, match="model.path is required"):
        main(["sft", "--set", "data.source=x.jsonl"])
    with pytest.raises(SystemExit, match=r"^grpo-fast sft: model.path: /tmp/no-such-model does not exist"):
        main(["sft", "--set", "data.source=x.jsonl", "--set", "model.path=/tmp/no-such-model"])
    tok = build_char_tokenizer()
    model_dir = save_tiny(build_tiny_model(tok, seed=0), tok, tmp_path / "model")
    with pytest.raises(SystemExit, match=rf"^grpo-fast sft: data.source: dataset file not found: {tmp_path}/x.jsonl"):
        main(["sft", "--set", f"data.source={tmp_path}/x.jsonl", "--set", f"model.path={model_dir}"])


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("sft_*.yaml")), ids=lambda p: p.name)
def test_shipped_sft_configs_load(path):
    assert load_sft_config(path).data.source


def test_accumulated_micro_batches_give_the_loss_and_gradient_of_the_whole_batch(tok, tmp_path):
    """One step over the whole data: one micro-batch, or many small ones accumulated (the loss is the mean
    over the step's loss tokens either way)."""
    stats = []
    for tokens, accum in ((4096, 1), (32, 100)):
        cfg = config(tmp_path, micro_batch_tokens=tokens, grad_accum=accum, max_steps=1)
        trainer = SFTTrainer(cfg, build_tiny_model(tok, seed=0), tok, ROWS)
        assert len(trainer.plan.epoch_steps(0)) == 1
        stats.append(trainer.train_step())
    whole, accumulated = stats
    assert whole["loss_tokens"] == accumulated["loss_tokens"] == 2 * len(ROWS)
    assert whole["loss"] == pytest.approx(accumulated["loss"], rel=1e-6)
    assert whole["grad_norm"] == pytest.approx(accumulated["grad_norm"], rel=1e-5)
