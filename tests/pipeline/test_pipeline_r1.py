"""The R1 pipeline end to end on CPU with the tiny local models and the transformers engine: every stage
runs and feeds the next, the rejection-sampled SFT set is 100% verified-correct, the filtered prompts
all lie in the band, the final RL routes open-ended rows to the reward model, and a second run redoes
nothing."""

from __future__ import annotations

import json

from transformers import AutoModelForCausalLM

from grpo_fast.pipeline import load_pipeline_config, run_pipeline
from grpo_fast.rewards.tasks import exact_match_reward

TASK = {"ops": "+*", "fixed_b": 7, "max_operand": 500}
SMALL_RUN = {"tensorboard": False, "progress": False, "plots": False}


def _stages():
    rollout = {"engine": "hf", "num_generations": 4, "max_completion_length": 3}
    data = {"source": "task:modular_arithmetic", "task_kwargs": {"n": 24, "seed": 2, **TASK}}
    rl = {
        "data": {**data, "eval_source": "task:modular_arithmetic", "eval_task_kwargs": {"n": 8, "seed": 1, **TASK}},
        "reward": {"funcs": ["exact_match"], "workers": 0},
        "rollout": rollout,
        "optim": {"lr": 1e-3},
        "check": {"difficulty_prompts": 0},
        "run": {"max_steps": 2, "prompts_per_step": 4, "micro_batch_size": 16, "eval_every": 2, **SMALL_RUN},
    }
    sft_run = {"micro_batch_size": 32, **SMALL_RUN}
    return [
        {"name": "base", "kind": "tiny_models", "config": {"reward_model": True}},
        {"name": "seed", "kind": "mix", "config": {"sources": [{**data, "task_kwargs": {"n": 32, "seed": 3, **TASK}}]}},
        {
            "name": "cold_start",
            "kind": "sft",
            "config": {
                "data": {"source": "${seed.prompts}", "completion_column": "answer", "max_length": 24},
                "optim": {"lr": 3e-3},
                "run": {"max_steps": 15, **sft_run},
            },
        },
        {"name": "rl", "kind": "train", "config": rl},
        {
            "name": "sample",
            "kind": "sample",
            "config": {
                "data": data,
                "reward": {"funcs": ["exact_match"], "workers": 0},
                "rollout": rollout,
                "sample": {"samples_per_prompt": 6, "chunk_prompts": 10, "max_per_prompt": 2},
                "run": {"progress": False},
            },
        },
        {"name": "filter", "kind": "filter", "config": {"pass_rates": "${sample.pass_rates}", "low": 0.1, "high": 0.9}},
        {
            "name": "sft",
            "kind": "sft",
            "config": {"data": {"source": "${sample.sft_data}", "max_length": 24}, "run": {"epochs": 1, **sft_run}},
        },
        {
            "name": "final_data",
            "kind": "mix",
            "config": {
                "sources": [
                    {"source": "${filter.prompts}", "columns": {"reward_type": "verifiable"}},
                    {"source": "task:countdown", "task_kwargs": {"n": 8}, "columns": {"reward_type": "open"}},
                ]
            },
        },
        {
            "name": "final_rl",
            "kind": "train",
            "config": {
                **rl,
                "data": {"source": "${final_data.prompts}"},
                "reward": {
                    "funcs": [
                        {"name": "exact_match", "when": {"reward_type": "verifiable"}},
                        {"name": "reward_model", "path": "${base.reward_model}", "when": {"reward_type": "open"}},
                    ],
                    "weights": [1.0, 0.1],
                    "workers": 0,
                },
            },
        },
    ]


def test_r1_pipeline_end_to_end(tmp_path):
    config = load_pipeline_config({"output_dir": str(tmp_path / "r1"), "stages": _stages()})
    table = run_pipeline(config)
    assert [r["status"] for r in table] == ["ran"] * len(table)
    out = tmp_path / "r1"

    # The rejection-sampled SFT set: every completion passes the verifier, scored again from scratch.
    sft = [json.loads(line) for line in (out / "sample" / "sft.jsonl").read_text().splitlines()]
    rows = [json.loads(line)["row"] for line in (out / "sample" / "pass_rates.jsonl").read_text().splitlines()]
    assert sft, "the cold-started policy solves some prompts"
    answers = [rows[r["row_index"]]["answer"] for r in sft]
    assert exact_match_reward(None, [r["completion"] for r in sft], answers) == [1.0] * len(sft)

    # The filtered prompts: exactly those whose measured pass rate lies in the band.
    rates = {
        json.dumps(r["row"], sort_keys=True): r["pass_rate"]
        for r in map(json.loads, (out / "sample" / "pass_rates.jsonl").read_text().splitlines())
    }
    kept = [json.loads(line) for line in (out / "filter" / "prompts.jsonl").read_text().splitlines()]
    assert all(0.1 <= rates[json.dumps(r, sort_keys=True)] <= 0.9 for r in kept)
    assert len(kept) == sum(0.1 <= p <= 0.9 for p in rates.values())

    # Each stage trained the model the previous one produced; the last one is a loadable HF model.
    stage = {r["stage"]: r for r in table}
    assert stage["rl"]["steps"] == 2 and stage["final_rl"]["steps"] == 2
    final = json.loads((out / "final_rl" / "stage.json").read_text())["outputs"]["model"]
    assert AutoModelForCausalLM.from_pretrained(final) is not None
    metrics = [json.loads(line) for line in (out / "final_rl" / "metrics.jsonl").read_text().splitlines()]
    scored = [m for m in metrics if "reward/reward_model/mean" in m]
    assert scored and all(m["reward/reward_model/failures"] == 0 for m in scored)

    # Started again: every stage is done, nothing runs.
    again = run_pipeline(config)
    assert [r["status"] for r in again] == ["done earlier"] * len(again)
    assert "| final_rl | train | done earlier |" in (out / "summary.md").read_text()
