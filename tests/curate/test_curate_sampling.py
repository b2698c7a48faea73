"""`grpo-fast sample` end to end with the transformers engine and a tiny local model: pass rates, a
rejection-sampled SFT set that the verifier accepts in full, and a resumed run that writes what an
uninterrupted one writes."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from grpo_fast.cli import main
from grpo_fast.curate.sampling import run_sampling
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.text import completion_text
from grpo_fast.trainer.config import load_sample_config

ROWS = modular_arithmetic_dataset(10, seed=0)


def starts_low(prompts, completions, **_):
    """1 when the completion starts with a character early in the tiny vocabulary (about half of them)."""
    return [float(completion_text(c)[:1] in "0123456789+-*/%=() ,:?abcdefghi") for c in completions]


def _config(out, *extra):
    return load_sample_config(
        None,
        [
            "rollout.engine=hf",
            "rollout.max_completion_length=4",
            "reward.workers=0",
            "sample.samples_per_prompt=6",
            "sample.chunk_prompts=4",
            "sample.max_per_prompt=2",
            "run.progress=false",
            f"sample.output_dir={out}",
            *extra,
        ],
    )


def _run(out, tiny_dir, *extra):
    cfg = _config(out, f"model.path={tiny_dir}", *extra)
    cfg.reward.funcs = [starts_low]
    return run_sampling(cfg, ROWS)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sample_writes_pass_rates_and_a_verified_sft_set(tmp_path, tiny_dir):
    summary = _run(tmp_path / "a", tiny_dir)
    rates = _lines(tmp_path / "a" / "pass_rates.jsonl")
    sft = _lines(tmp_path / "a" / "sft.jsonl")
    assert [r["row_index"] for r in rates] == list(range(len(ROWS)))
    assert [r["row"] for r in rates] == ROWS
    assert 0 < summary["pass_rate_mean"] < 1 and summary["frac_sometimes"] > 0  # a spread to filter on
    # Every kept completion is verified-correct when scored again, independently of the sampler.
    assert sft and starts_low(None, [r["completion"] for r in sft]) == [1.0] * len(sft)
    per_prompt = {}
    for r in sft:
        per_prompt.setdefault(r["row_index"], []).append(r)
        assert r["prompt"] == ROWS[r["row_index"]]["prompt"]
    for i, kept in per_prompt.items():
        assert len(kept) <= 2
        assert [k["num_tokens"] for k in kept] == sorted(k["num_tokens"] for k in kept)  # shortest first
        assert len({k["completion"] for k in kept}) == len(kept)
        assert rates[i]["pass_rate"] > 0
    # Prompts with a correct sample but nothing kept would be a selection bug (no rule drops all here but
    # truncation: 4-token completions that never stop are truncated and dropped).
    assert summary["sft_rows"] == len(sft)


def test_a_killed_run_resumes_to_the_uninterrupted_output(tmp_path, tiny_dir):
    _run(tmp_path / "whole", tiny_dir)
    out = tmp_path / "killed"
    _run(out, tiny_dir)
    journal = (out / "records.jsonl").read_text().splitlines()
    # Killed during chunk 1's write: chunk 0 complete, one record of chunk 1, a torn line; no outputs yet.
    (out / "records.jsonl").write_text("\n".join(journal[:5]) + "\n" + journal[5][:20])
    for name in ("pass_rates.jsonl", "sft.jsonl"):
        (out / name).unlink()
    _run(out, tiny_dir)
    for name in ("pass_rates.jsonl", "sft.jsonl"):
        assert (out / name).read_text() == (tmp_path / "whole" / name).read_text()
    assert len((out / "records.jsonl").read_text().splitlines()) == len(ROWS)  # no duplicates


def test_other_settings_are_refused_in_the_same_directory(tmp_path, tiny_dir):
    _run(tmp_path / "a", tiny_dir)
    with pytest.raises(ValueError, match="sample.*differ.*--overwrite"):
        _run(tmp_path / "a", tiny_dir, "sample.samples_per_prompt=3")
    # Another engine or rollout kind samples other completions (both were continued silently).
    with pytest.raises(ValueError, match=r"\(rollout differ\)"):
        _run(tmp_path / "a", tiny_dir, "rollout.engine=vllm")
    with pytest.raises(ValueError, match=r"\(rollout differ\)"):
        _run(tmp_path / "a", tiny_dir, "rollout.tools=[multiply]")
    cfg = _config(tmp_path / "a", f"model.path={tiny_dir}", "sample.samples_per_prompt=3")
    cfg.reward.funcs = [starts_low]
    assert run_sampling(cfg, ROWS, overwrite=True)["samples"] == 3 * len(ROWS)


def test_changed_rows_or_weights_at_the_same_path_are_refused(tmp_path, tiny_dir):
    """Both were continued from the journal: the old model's samples, the old rows in pass_rates.jsonl."""
    _run(tmp_path / "a", tiny_dir)
    cfg = _config(tmp_path / "a", f"model.path={tiny_dir}")
    cfg.reward.funcs = [starts_low]
    with pytest.raises(ValueError, match=r"\(num_rows, rows differ\)"):
        run_sampling(cfg, ROWS[:4])
    with pytest.raises(ValueError, match=r"\(rows differ\)"):
        run_sampling(cfg, [{**row, "prompt": row["prompt"] + " "} for row in ROWS])
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    _run(tmp_path / "b", model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # the same path, written again
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    with pytest.raises(ValueError, match=r"\(weights differ\)"):
        _run(tmp_path / "b", model)


def test_a_run_that_sampled_nothing_does_not_lock_its_directory(tmp_path, tiny_dir):
    """Its settings were written before the model loaded: the corrected run was refused as 'other settings'. A
    model.path that does not exist is named (it was an OSError traceback from transformers)."""
    with pytest.raises(ValueError, match=r"model.path: .*no_such_model does not exist"):
        _run(tmp_path / "a", tmp_path / "no_such_model")
    assert _run(tmp_path / "a", tiny_dir)["samples"] == 6 * len(ROWS)


def test_files_no_sampling_run_wrote_are_not_replaced(tmp_path, tiny_dir):
    """A directory with a user's sft.jsonl and no sample_settings.json had it replaced."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sft.jsonl").write_text('{"prompt": "p", "completion": "c"}\n')
    with pytest.raises(ValueError, match=r"holds sft.jsonl that no sampling run of ours wrote there"):
        _run(mine, tiny_dir)
    assert (mine / "sft.jsonl").read_text() == '{"prompt": "p", "completion": "c"}\n'


def test_cli_sample_then_filter(tmp_path, tiny_dir):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    sample_dir = tmp_path / "s"
    args = ["--set", f"model.path={tiny_dir}", "--set", f"data.source={data}", "--set", "reward.funcs=[exact_match]"]
    args += ["--set", "rollout.engine=hf", "--set", "run.progress=false", "--set", "reward.workers=0"]
    assert main(["sample", *args, "--output-dir", str(sample_dir)]) == 0
    assert len(_lines(sample_dir / "pass_rates.jsonl")) == len(ROWS)
    out = tmp_path / "kept.jsonl"
    assert main(["filter", "--pass-rates", str(sample_dir / "pass_rates.jsonl"), "--output", str(out)]) == 0
    assert (tmp_path / "kept_pass_rates.png").exists()
    with pytest.raises(SystemExit, match="sample.max_prompts"):
        main(["sample", *args, "--set", "sample.max_prompts=0"])


def test_a_reward_needing_a_column_the_rows_lack_is_named_before_the_model_loads(tmp_path):
    """It was a KeyError traceback from inside the first chunk's scoring (train: inside the difficulty probe)."""
    from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
    from grpo_fast.trainer import GRPOTrainer, load_config

    rows = [{"prompt": "1+1="}, {"prompt": "2+2="}]
    cfg = _config(tmp_path / "a", "model.path=/nowhere/model", "reward.funcs=[exact_match]")
    with pytest.raises(ValueError, match=r"exact_match_reward needs the column\(s\) \['answer'\], which the rows of"):
        run_sampling(cfg, rows)
    tok = build_char_tokenizer()
    config = load_config(None, ["reward.funcs=[exact_match]", "rollout.engine=hf", f"run.output_dir={tmp_path / 't'}"])
    with pytest.raises(ValueError, match=r"which the rows of the held-out dataset do not have"):
        GRPOTrainer(build_tiny_model(tok), "exact_match", ROWS, eval_dataset=rows, config=config, tokenizer=tok)
