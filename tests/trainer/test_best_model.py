"""run.save_best: the trainer keeps the model of the best held-out evaluation in output_dir/best_model (one model,
replaced whenever an evaluation beats it, never by a tie or a worse one, also not after a resume), names it in the
run report and in the collapse alarm."""

from __future__ import annotations

import json
import os
import subprocess

import torch
from safetensors.torch import load_file
from tiny_trainer import BASE_OPTIONS

from grpo_fast.bench.alarms import longer_is_better
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.trainer import GRPOTrainer, load_config
from grpo_fast.trainer.best_model import BEST_DIR, BestEvaluation, BestModel


def _trainer(out, accuracies, *overrides):
    """The tiny run (paid for length, so that every step changes the weights) with 4 held-out prompts, whose
    evaluations report `accuracies` in turn (step 0 first); the weights each step ends with, by step, in
    `trainer.weights_at`."""
    tok = build_char_tokenizer()
    options = [*BASE_OPTIONS, f"run.output_dir={out}", "run.eval_every=1", "health.preflight=false", *overrides]
    rows = modular_arithmetic_dataset(8, seed=0)
    trainer = GRPOTrainer(
        build_tiny_model(tok), [longer_is_better], rows, config=load_config(None, options), tokenizer=tok,
        eval_dataset=rows[:4],
    )  # fmt: skip
    scripted = iter(accuracies)
    trainer.evaluate = lambda: {"eval/accuracy": next(scripted), "eval/reward_mean": 0.0}
    trainer.weights_at = {0: {k: v.clone() for k, v in trainer.model.state_dict().items()}}

    def record(trainer, rollout, metrics):
        trainer.weights_at[trainer.step + 1] = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    trainer.callbacks.append(record)
    return trainer


def _kept(out) -> tuple[dict, dict]:
    directory = out / BEST_DIR
    assert sorted(p.name for p in out.iterdir() if BEST_DIR in p.name) == [BEST_DIR]  # no half-written copy left
    return json.loads((directory / "best.json").read_text()), load_file(directory / "model.safetensors")


def test_the_best_evaluation_s_model_is_kept_and_named(tmp_path):
    out = tmp_path / "run"
    trainer = _trainer(out, [0.25, 0.5, 0.25, 0.75, 0.75, 0.5], "run.max_steps=5", "run.save_final=false")
    trainer.train()
    info, weights = _kept(out)
    assert info == {"step": 3, "accuracy": 0.75, "prompts": 4}  # the tie at step 4 did not replace it
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, trainer.weights_at[3][name], rtol=0, atol=0)
    assert any(not torch.equal(w, trainer.weights_at[5][name]) for name, w in trainer.weights_at[3].items())
    assert (out / BEST_DIR / "tokenizer.json").is_file()
    report = (out / "report.md").read_text()
    assert f"- best model kept: step 3, accuracy 0.750 on 4 prompts, in `{out / BEST_DIR}`" in report
    trainer.close()


def test_a_resumed_run_keeps_the_earlier_best_until_beaten(tmp_path):
    out = tmp_path / "run"
    first = _trainer(out, [0.25, 0.75, 0.5], "run.max_steps=2", "run.save_every=2")
    first.train()
    first.close()
    assert _kept(out)[0]["step"] == 1
    again = _trainer(out, [0.5, 1.0], "run.max_steps=4", "run.save_every=2", "run.resume=true")
    again.train()
    info, weights = _kept(out)
    assert info == {"step": 4, "accuracy": 1.0, "prompts": 4} and again.best_model.best.step == 4
    torch.testing.assert_close(weights["lm_head.weight"], again.weights_at[4]["lm_head.weight"], rtol=0, atol=0)
    again.close()


def test_a_crash_inside_the_replacement_loses_no_best_model(tmp_path):
    """A crash between `offer`'s two renames left the previous best aside as .old-best_model-<pid> and no
    best_model: the resumed run forgot it (and kept a worse model as the best), and the copy stayed on disk."""
    out = tmp_path / "run"
    first = _trainer(out, [0.25, 0.75, 0.5], "run.max_steps=2", "run.save_every=2")
    first.train()
    first.close()
    dead = _exited_pid()
    os.replace(out / BEST_DIR, out / f".old-{BEST_DIR}-{dead}")  # the first rename done, the second not
    (out / f".tmp-{BEST_DIR}-{dead}").mkdir()  # the new model, half written
    again = _trainer(out, [0.5, 0.6], "run.max_steps=4", "run.save_every=2", "run.resume=true")
    again.train()
    info, weights = _kept(out)
    assert info == {"step": 1, "accuracy": 0.75, "prompts": 4}
    torch.testing.assert_close(weights["lm_head.weight"], first.weights_at[1]["lm_head.weight"], rtol=0, atol=0)
    again.close()


def _exited_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_without_save_best_nothing_is_kept(tmp_path):
    out = tmp_path / "run"
    trainer = _trainer(out, [0.25, 0.5], "run.max_steps=1", "run.save_best=false", "run.save_final=false")
    trainer.train()
    assert not (out / BEST_DIR).exists() and "best model kept" not in (out / "report.md").read_text()
    trainer.close()


def test_offer_replaces_the_directory_only_for_a_better_evaluation(tmp_path):
    best = BestModel(tmp_path)
    write = lambda d: (d / "weights").write_text(str(d))  # noqa: E731
    assert best.offer(BestEvaluation(0, 0.5, 10), write, True)
    assert not best.offer(BestEvaluation(1, 0.5, 10), write, True) and not best.offer(
        BestEvaluation(2, 0.4, 10), write, True
    )
    assert best.offer(BestEvaluation(3, 0.6, 10), write, True)
    assert json.loads((tmp_path / BEST_DIR / "best.json").read_text())["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [BEST_DIR]
    restored = BestModel(tmp_path)
    restored.restore()
    assert restored.best == BestEvaluation(3, 0.6, 10)
