"""The pipeline runner: references between stages, the latest model as the default, finished stages
skipped when started again, skipped stages standing in with their outputs, errors naming the stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_fast.pipeline import load_pipeline_config, run_pipeline
from grpo_fast.pipeline.stages import STAGE_KINDS, StageResult

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CALLS: list[tuple[str, dict, str | None]] = []


def record_stage(config: dict, stage_dir, model):
    """A stage kind for these tests: records its call, outputs a model named after its directory."""
    CALLS.append((stage_dir.name, config, model))
    if config.get("fail"):
        raise ValueError("fail: asked to")
    return StageResult({"model": f"model-of-{stage_dir.name}", "data": f"data-of-{stage_dir.name}"}, {"n": 1.5})


STAGE_KINDS.register("record_test_only", record_stage)


def _config(tmp_path, stages):
    return load_pipeline_config({"output_dir": str(tmp_path / "run"), "stages": stages})


def test_references_defaults_and_restart(tmp_path):
    CALLS.clear()
    stages = [
        {"name": "a", "kind": "record_test_only"},
        {"name": "b", "kind": "record_test_only", "config": {"source": "${a.data}", "nested": ["${model}"]}},
        {"name": "c", "kind": "record_test_only", "skip": True, "outputs": {"model": "given"}},
        {"name": "d", "kind": "record_test_only"},
    ]
    table = run_pipeline(_config(tmp_path, stages))
    assert CALLS == [
        ("a", {}, None),
        ("b", {"source": "data-of-a", "nested": ["model-of-a"]}, "model-of-a"),
        ("d", {}, "given"),
    ]
    assert [r["status"] for r in table] == ["ran", "ran", "skipped", "ran"]
    assert "| b | record_test_only | ran |" in (tmp_path / "run" / "summary.md").read_text()
    # Started again: nothing reruns, the outputs come from each stage's stage.json.
    CALLS.clear()
    (tmp_path / "run" / "d" / "stage.json").unlink()  # d was interrupted
    table = run_pipeline(_config(tmp_path, stages))
    assert CALLS == [("d", {}, "given")]
    assert [r["status"] for r in table] == ["done earlier", "done earlier", "skipped", "ran"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())[0]["n"] == 1.5


def test_errors_name_the_stage(tmp_path):
    with pytest.raises(ValueError, match=r"stages\[1\].kind"):
        _config(tmp_path, [{"name": "a", "kind": "record_test_only"}, {"name": "b", "kind": "nope"}])
    with pytest.raises(ValueError, match=r"stages\[1\].name"):
        _config(tmp_path, [{"name": "a", "kind": "record_test_only"}, {"name": "a", "kind": "record_test_only"}])
    with pytest.raises(ValueError, match="unknown key"):
        _config(tmp_path, [{"name": "a", "kind": "record_test_only", "confg": {}}])
    bad_ref = [{"name": "a", "kind": "record_test_only", "config": {"x": "${later.model}"}}]
    with pytest.raises(ValueError, match=r"\(a\).config: \$\{later.model\}: names no earlier stage"):
        _config(tmp_path, bad_ref)
    with pytest.raises(ValueError, match="stage f .record_test_only.: fail"):
        run_pipeline(_config(tmp_path, [{"name": "f", "kind": "record_test_only", "config": {"fail": True}}]))
    assert not (tmp_path / "run" / "f" / "stage.json").exists()  # a failed stage is not marked done


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("r1_*.yaml")), ids=lambda p: p.name)
def test_shipped_pipelines_load(path):
    config = load_pipeline_config(path)
    assert config.stages[0].kind == "tiny_models"  # they run without a hub


def test_a_bad_stage_config_fails_before_anything_runs(tmp_path):
    stages = [
        {"name": "a", "kind": "record_test_only"},
        {"name": "rl", "kind": "train", "config": {"run": {"max_stpes": 3}}},
    ]
    with pytest.raises(ValueError, match=r"stages\[1\] \(rl\).config: run: unknown key"):
        _config(tmp_path, stages)
    sft = [{"name": "s", "kind": "sft", "config": {"optim": {"lr": -1}}}]
    with pytest.raises(ValueError, match=r"\(s\).config: optim.lr"):
        _config(tmp_path, sft)


def test_a_train_stage_stopped_by_a_health_alarm_is_not_done_and_passes_no_model(tmp_path, tiny_dir):
    """It was marked done (stage.json) and its last checkpoint fed the next stage, on every later run too."""
    from grpo_fast.testing.configs import quiet_run_config

    train = quiet_run_config(
        tiny_dir,
        run={"max_steps": 6, "prompts_per_step": 2},
        rollout={"engine": "hf", "num_generations": 2, "max_completion_length": 2},
        reward={"funcs": ["exact_match"], "workers": 0},  # the random model never answers: every group stuck
    )
    train["health"] = {"audit_every": 0, "window": 2, "stop_on": ["no_signal"], "preflight": False}
    stages = [{"name": "rl", "kind": "train", "config": train}, {"name": "next", "kind": "record_test_only"}]
    CALLS.clear()
    with pytest.raises(ValueError, match=r"stage rl \(train\): .*stopped at step 2 on the health alarm\(s\) no_signal"):
        run_pipeline(_config(tmp_path, stages))
    assert CALLS == [] and not (tmp_path / "run" / "rl" / "stage.json").exists()


def test_a_finished_stage_whose_configuration_changed_is_refused_not_reused(tmp_path):
    """It was reused silently: an edited stage config (or an earlier stage run again differently) gave the old
    stage's outputs as if they came from the new config."""
    CALLS.clear()
    stages = [
        {"name": "a", "kind": "record_test_only", "config": {"steps": 2}},
        {"name": "b", "kind": "record_test_only", "config": {"source": "${a.data}"}},
    ]
    run_pipeline(_config(tmp_path, stages))
    stages[0]["config"]["steps"] = 3
    with pytest.raises(
        ValueError, match=r"stage a finished earlier from another configuration \(config\.steps: 2 -> 3\)"
    ):
        run_pipeline(_config(tmp_path, stages))
    assert (tmp_path / "run" / "a" / "stage.json").exists()  # kept: the user decides
    # a, moved away, runs again as configured now; b, made from the old a, is refused in turn.
    (tmp_path / "run" / "a").rename(tmp_path / "old_a")
    CALLS.clear()
    with pytest.raises(ValueError, match=r"stage b finished earlier .*stage a before it ran from something else"):
        run_pipeline(_config(tmp_path, stages))
    assert [c[0] for c in CALLS] == ["a"]
    # Unchanged: both reused as before.
    (tmp_path / "run" / "b" / "stage.json").unlink()
    run_pipeline(_config(tmp_path, stages))
    CALLS.clear()
    table = run_pipeline(_config(tmp_path, stages))
    assert CALLS == [] and [r["status"] for r in table] == ["done earlier", "done earlier"]


@pytest.mark.parametrize("kind", ["train", "sft"])
def test_a_training_stage_in_a_directory_of_the_user_s_refuses_their_earlier_run(tmp_path, tiny_dir, kind):
    """The stage forced run.overwrite on whenever its output_dir held no checkpoint, so an output_dir the user
    named had their earlier run deleted (metrics, final model) although they had not set run.overwrite."""
    from grpo_fast.testing.configs import quiet_run_config

    mine = tmp_path / "my_run"
    (mine / "final").mkdir(parents=True)
    (mine / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    config = quiet_run_config(tiny_dir, run={"max_steps": 1, "prompts_per_step": 2, "output_dir": str(mine)})
    if kind == "sft":
        rows = tmp_path / "rows.jsonl"
        rows.write_text('{"prompt": "1+1=", "completion": "2"}\n' * 4)
        run = {"max_steps": 1, "output_dir": str(mine), "progress": False}
        config = {"model": {"path": str(tiny_dir)}, "data": {"source": str(rows)}, "run": run}
    with pytest.raises(ValueError, match=rf"stage mine \({kind}\): run.output_dir {mine} holds an earlier run"):
        run_pipeline(_config(tmp_path, [{"name": "mine", "kind": kind, "config": config}]))
    assert (mine / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n' and (mine / "final").is_dir()


@pytest.mark.parametrize(
    ("stages", "error"),
    [
        (  # a typo in a reference failed only when its stage came, after the stages before it had run
            [
                {"name": "seed", "kind": "mix", "config": {"sources": [{"source": "task:modular_arithmetic"}]}},
                {"name": "s", "kind": "filter", "config": {"pass_rates": "${seed_dat.prompts}"}},
            ],
            r"stages\[1\] \(s\).config: \$\{seed_dat.prompts\}: names no earlier stage \(earlier stages: \['seed'\]\)",
        ),
        (
            [
                {"name": "seed", "kind": "mix", "config": {"sources": [{"source": "task:modular_arithmetic"}]}},
                {"name": "s", "kind": "filter", "config": {"pass_rates": "${seed.pass_rates}"}},
            ],
            r"\$\{seed.pass_rates\}: stage seed gives \['prompts'\], not 'pass_rates'",
        ),
        (
            [
                {"name": "base", "kind": "tiny_models"},
                {
                    "name": "rl",
                    "kind": "train",
                    "config": {"reward": {"funcs": [{"name": "reward_model", "path": "${base.reward_model}"}]}},
                },
            ],
            r"stage base gives \['model'\], not 'reward_model'",  # tiny_models without reward_model: true
        ),
        (
            [{"name": "m", "kind": "mix", "config": {"sources": [{"source": "task:x", "colums": {"a": 1}}]}}],
            r"\(m\).config.sources\[0\]: unknown key\(s\) \['colums'\]",  # was ignored: the column silently missing
        ),
        (
            [{"name": "m", "kind": "mix", "config": {"sources": [{"source": "task:x", "max_rows": "3"}]}}],
            r"\(m\).config.sources\[0\].max_rows: expected int, got str '3'",
        ),  # a TypeError traceback
        (
            [{"name": "m", "kind": "mix", "config": {"sources": [{"source": "task:x", "task_kwargs": 5}]}}],
            r"\(m\).config.sources\[0\].task_kwargs: expected dict",
        ),
        (
            [{"name": "m", "kind": "mix", "config": {"sources": [{"source": 5}]}}],
            r"\(m\).config.sources\[0\].source: expected str",
        ),
        ([{"name": "t", "kind": "tiny_models", "config": {"seeds": 3}}], r"\(t\).config: unknown key\(s\) \['seeds'\]"),
        (
            [{"name": "f", "kind": "filter", "config": {"pass_rates": "p.jsonl", "low": "a tenth"}}],
            r"\(f\).config.low: expected float, got str 'a tenth'",
        ),
        (
            [{"name": "f", "kind": "filter", "config": {"pass_rates": "p.jsonl", "high": 1.5}}],
            r"\(f\).config.high: expected a value in \[0, 1\], got 1.5",
        ),
        (
            [{"name": "f", "kind": "filter", "config": {"pass_rates": "p.jsonl", "low": 0.8, "high": 0.2}}],
            r"\(f\).config.low/high: expected low <= high, got 0.8, 0.2",
        ),
        ([{"name": "f", "kind": "filter", "config": {"low": 0.2}}], r"\(f\).config.pass_rates: required"),
        ([{"name": "m", "kind": "mix", "config": {"sources": []}}], r"\(m\).config.sources: expected at least one"),
        (
            [{"name": "m", "kind": "mix", "config": {"sources": [{"source": "task:x", "max_rows": 0}]}}],
            r"\(m\).config.sources\[0\].max_rows: expected a value >= 1, got 0",
        ),
        ([{"name": "f", "kind": "filter", "config": [1, 2]}], r"\(f\).config: expected a mapping"),
    ],
)
def test_stage_configs_and_references_are_checked_before_anything_runs(tmp_path, stages, error):
    with pytest.raises(ValueError, match=error):
        _config(tmp_path, stages)


def test_a_missing_input_file_fails_in_one_line_naming_the_stage(tmp_path):
    """A filter stage whose pass_rates file is missing ended the pipeline in a FileNotFoundError traceback."""
    missing = tmp_path / "nope" / "pass_rates.jsonl"
    config = _config(tmp_path, [{"name": "f", "kind": "filter", "config": {"pass_rates": str(missing)}}])
    with pytest.raises(ValueError, match=r"^stage f \(filter\): .*nope/pass_rates.jsonl"):
        run_pipeline(config)
