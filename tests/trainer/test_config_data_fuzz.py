"""Hostile config values and dataset rows get clear errors, never a traceback from deep inside.

Property-style (plain `random` with fixed seeds, many cases, fast): random keys of the config tree get
wrong types, negative sizes, NaN, inf, huge ints, empty strings, unknown keys, both as a YAML tree and as
`--set key=value`; every refusal must be a ValueError or TypeError naming the key. Dataset rows with missing
columns, empty prompts, None, bytes, undecodable text or wrong types must fail in the row check with the
row's index; a non-UTF-8 config or dataset file, bad task kwargs and prompts longer than the engine allows
name the file, line, option or row."""

from __future__ import annotations

import dataclasses
import math
import random
import typing

import pytest
import yaml

from grpo_fast.core.tiny_models import build_char_tokenizer
from grpo_fast.data.loading import load_prompt_dataset, validate_prompt_rows
from grpo_fast.rollout.prompts import PromptEncoder
from grpo_fast.trainer.config import TrainConfig, load_config


def _leaf_keys(cls=TrainConfig, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _leaf_keys(hints[f.name], key + ".")
        else:
            yield key


KEYS = sorted(_leaf_keys())
SECTIONS = sorted({k.split(".")[0] for k in KEYS})
HOSTILE = [
    -1,
    -7,
    0,
    -0.5,
    float("nan"),
    float("inf"),
    float("-inf"),
    10**30,
    -(2**64),
    2**63,
    "",
    "abc",
    "-3",
    "nan",
    "ünï\u202e",
    True,
    False,
    None,
    [],
    [1, "a", None],
    {},
    {"x": 1},
    {1: 2, "a": 3},
    1.5,
    1e308,
]


def _nested(key: str, value) -> dict:
    out: dict = {}
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def _merge(a: dict, b: dict) -> dict:
    for k, v in b.items():
        a[k] = _merge(a[k], v) if isinstance(a.get(k), dict) and isinstance(v, dict) else v
    return a


def _values(cfg) -> list:
    out = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        out += _values(v) if dataclasses.is_dataclass(v) else [v]
    return out


def _check(load, names: list[str]) -> None:
    try:
        cfg = load()
    except (ValueError, TypeError) as exc:
        message = str(exc)
        assert any(name in message for name in names), (names, message)
        return
    except Exception as exc:  # noqa: BLE001 - the property: nothing else escapes
        pytest.fail(f"{names}: {type(exc).__name__} from deep inside: {exc}")
    floats = [v for v in _values(cfg) if isinstance(v, float)]
    assert not any(math.isnan(v) for v in floats), (names, "NaN accepted")


def test_hostile_config_values_fail_naming_the_key():
    rng = random.Random(0)
    for _ in range(600):
        keys = rng.sample(KEYS, rng.choice([1, 1, 2]))
        values = [rng.choice(HOSTILE) for _ in keys]
        tree: dict = {}
        for key, value in zip(keys, values, strict=True):
            _merge(tree, _nested(key, value))
        _check(lambda tree=tree: load_config(tree), keys)
        overrides = [
            f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
            for k, v in zip(keys, values, strict=True)
        ]
        _check(lambda overrides=overrides: load_config(None, overrides), keys)


def test_hostile_config_structure_fails_naming_the_key():
    rng = random.Random(1)
    for _ in range(200):
        kind = rng.choice(["section", "unknown_key", "unknown_section", "deep"])
        if kind == "section":  # a whole section replaced by a scalar or list
            section = rng.choice(SECTIONS)
            value = rng.choice([5, "x", [1, 2], True, 1.5, [{"a": 1}]])
            _check(lambda s=section, v=value: load_config({s: v}), [section])
        elif kind == "unknown_key":
            section = rng.choice(SECTIONS)
            name = rng.choice(["max_step", "lr_", "typo", "1", "ünknown"])
            _check(lambda s=section, n=name: load_config({s: {n: 1}}), [name])
        elif kind == "unknown_section":
            name = rng.choice(["runn", "optimizer", "x"])
            _check(lambda n=name: load_config({n: {"a": 1}}), [name])
        else:  # a dotted override into a value that is not a section
            key = rng.choice(KEYS)
            _check(lambda k=key: load_config(None, [f"{k}.sub=1"]), [key.split(".")[-1], key])
    _check(lambda: load_config({1: 2, "run": {}}), ["1"])  # mixed key types
    _check(lambda: load_config(None, ["run.max_steps=[1"]), ["run.max_steps"])  # not YAML


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("run.save_every", -1),
        ("run.eval_every", -2),
        ("run.log_every", 0),
        ("run.seed", -1),
        ("run.seed", 2**40),
        ("optim.max_grad_norm", -1.0),
        ("optim.eps", -1e-8),
        ("optim.weight_decay", -0.1),
        ("optim.warmup_steps", -3),
        ("optim.beta1", 1.0),
        ("optim.lr", float("nan")),
        ("rollout.top_p", 0.0),
        ("rollout.top_p", 1.5),
        ("rollout.top_k", -5),
        ("rollout.vllm.gpu_memory_utilization", 2.0),
        ("rollout.vllm.kv_cache_memory_bytes", -1),
        ("rollout.max_model_len", 8),  # not above max_completion_length (32)
        ("grpo.max_resample_rounds", -1),
        ("reward.failure_reward", float("nan")),
        ("health.audit_every", -1),
        ("run.max_steps", 10**30),
        ("data.prompt_column", ""),
        ("data.source", ""),
        ("run.output_dir", " "),
        ("rollout.stop", [1]),
        ("rollout.stop", ["ok", None]),
        ("reward.funcs", [1, "exact_match"]),
        ("reward.funcs", []),
        ("reward.funcs", [{"no_name": 1}]),
        ("reward.weights", [float("nan")]),
        ("reward.weights", ["1"]),
        # Accepted, then an OverflowError in the step (waits reach the OS in milliseconds as C ints) or, in gloo,
        # an instant timeout; or a run that trained nothing (every importance weight clipped to 0).
        ("reward.timeout", 3e6),
        ("rollout.tool_timeout_seconds", 1e10),
        ("rollout.async_engine.timeout_seconds", 1e308),
        ("reward.sandbox.timeout_s", 1e9),
        ("grpo.vllm_importance_sampling_clip_max", 0.0),
        ("loss.epsilon_high", 0.0),  # with loss_type cispo (below)
        ("rollout.temperature", 1e-45),  # 1 / T beyond float32: generation and the loss see inf logits
        ("reward.workers", 10**12),  # every worker starts at once
        ("data.eval_source", ""),  # evaluation was turned off silently
        ("data.prompt_column", "question"),  # ignored silently for the default task:modular_arithmetic source
    ],
)
def test_out_of_range_values_are_refused(key, value):
    cispo = ["loss.loss_type=cispo"] if key == "loss.epsilon_high" else []
    with pytest.raises(ValueError, match=key.removeprefix("loss.").replace(".", r"\.")):
        load_config(
            None,
            [*cispo, f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"],
        )


def test_a_bound_is_printed_as_written():
    with pytest.raises(ValueError, match=r"run.seed: expected a value in \[0, 4294967295\], got 4294967296"):
        load_config(None, ["run.seed=4294967296"])


def test_config_file_not_utf8_or_not_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"run:\n  max_steps: 3\n  output_dir: \xff\xfe\n")
    with pytest.raises(ValueError, match="bad.yaml: not UTF-8"):
        load_config(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("run: {max_steps: [\n")
    with pytest.raises(ValueError, match="broken.yaml: not valid YAML"):
        load_config(broken)
    from grpo_fast.cli import main

    with pytest.raises(SystemExit, match="invalid config: config file .*bad.yaml"):
        main(["train", "--config", str(bad)])


def test_a_key_given_twice_is_refused_not_silently_the_last(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("run:\n  max_steps: 3\n  output_dir: runs/x\n  max_steps: 4\n")
    with pytest.raises(ValueError, match=r"twice.yaml, line 4: 'max_steps' is given twice in one mapping"):
        load_config(twice)
    merged = tmp_path / "merged.yaml"  # YAML's merge key may repeat; an anchor used twice is not a repeated key
    merged.write_text("base: &b {max_steps: 3}\nrun:\n  <<: *b\n  output_dir: runs/x\noptim: {lr: 0.1}\n")
    from grpo_fast.core.config_tree import read_yaml

    assert read_yaml(merged)["run"] == {"max_steps": 3, "output_dir": "runs/x"}


# -- dataset rows ------------------------------------------------------------------------------------------

GOOD = ["what is 2+2?", [{"role": "user", "content": "hi"}], "  x  "]
BAD = [
    None,
    "",
    "   ",
    b"\xff\xfe",
    "bad \udcff byte",
    5,
    3.2,
    [],
    [{"role": "user"}],
    [{"content": "no role"}],
    [{"role": "user", "content": None}],
    [{"role": "user", "content": "ok \udcfe"}],
    ["not a message"],
    {"a": 1},
]


def test_hostile_dataset_rows_fail_naming_the_row():
    rng = random.Random(2)
    for _ in range(500):
        n = rng.randint(1, 6)
        rows, first_bad = [], None
        for i in range(n):
            kind = rng.random()
            if kind < 0.6:
                rows.append({"prompt": rng.choice(GOOD), "answer": "1"})
                continue
            first_bad = i if first_bad is None else first_bad
            if kind < 0.85:
                rows.append({"prompt": rng.choice(BAD)})
            elif kind < 0.95:
                rows.append({"question": "no prompt column"})
            else:
                rows.append(rng.choice([None, "a row that is a string", ["a", "list"], 7]))
        if first_bad is None:
            assert validate_prompt_rows(rows) == rows
            continue
        with pytest.raises(ValueError, match=rf"row {first_bad}\b"):
            validate_prompt_rows(rows)


def test_dataset_file_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl, line 2: not UTF-8"):
        load_prompt_dataset(str(path))


def test_dataset_file_with_a_bad_row_names_it(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": ""}\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl row 1: 'prompt' is empty"):
        load_prompt_dataset(str(path))
    path.write_text('{"question": "fine"}\n')
    with pytest.raises(ValueError, match="no 'prompt' column"):
        load_prompt_dataset(str(path))
    path.write_text('{"prompt": "fine"\n')  # not JSON
    with pytest.raises(ValueError, match=r"rows\.jsonl: cannot be read"):
        load_prompt_dataset(str(path))


def test_a_dataset_that_cannot_be_loaded_is_named_by_its_key(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ValueError, match=rf"^data.eval_source: dataset file not found: {missing}$"):
        load_prompt_dataset(str(missing), key="data.eval_source")
    with pytest.raises(ValueError, match=r"^data.source: unknown built-in task 'nope'"):
        load_prompt_dataset("task:nope")
    empty = tmp_path / "empty.jsonl"
    empty.touch()  # an empty output of an earlier step: it said "cannot be read as jsonl ()"
    with pytest.raises(ValueError, match=rf"^data.source: dataset file {empty} is empty$"):
        load_prompt_dataset(str(empty))


def test_tensor_parallel_vllm_in_one_process_is_refused_with_the_config():
    from grpo_fast.trainer.config import TrainConfig, check_distributed_config

    cfg = TrainConfig()
    cfg.rollout.vllm.tensor_parallel_size = 2
    with pytest.raises(ValueError, match=r"rollout.vllm.tensor_parallel_size: 2 needs a torchrun launch .* not 1"):
        check_distributed_config(cfg, 1)


def test_bad_task_kwargs_name_the_option():
    with pytest.raises(ValueError, match="data.task_kwargs"):
        load_prompt_dataset("task:modular_arithmetic")  # n missing
    with pytest.raises(ValueError, match="data.task_kwargs"):
        load_prompt_dataset("task:modular_arithmetic", n=4, no_such_option=1)


def test_prompt_beyond_the_engine_length_names_the_row():
    cfg = load_config(None, ["data.use_chat_template=false"])
    encoder = PromptEncoder(build_char_tokenizer(), cfg.data, max_tokens=8)
    rows = [{"prompt": "1+1="}, {"prompt": "1+1=" * 10}]
    assert encoder.encode_rows(rows, [0], cache=True)
    with pytest.raises(ValueError, match=r"dataset row 1: the prompt is \d+ tokens.*rollout\.max_model_len"):
        encoder.encode_rows(rows, [1], cache=True)


def test_what_the_run_cannot_use_is_named_before_it_starts(tmp_path):
    """A loss backend that cannot run here failed at the first step, after a batch was generated; an engine that
    does not load, after the model and the checklist; non-string task_kwargs names were a TypeError; an output_dir
    that is a file, a FileExistsError traceback."""
    from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
    from grpo_fast.trainer import GRPOTrainer

    tok = build_char_tokenizer()
    rows = [{"prompt": "1+1=", "answer": "2"}] * 2
    base = ["rollout.engine=hf", "reward.funcs=[exact_match]", f"run.output_dir={tmp_path / 'run'}"]

    def trainer(*overrides):
        config = load_config(None, [*base, *overrides])
        return GRPOTrainer(build_tiny_model(tok), "exact_match", rows, config=config, tokenizer=tok)

    with pytest.raises(ValueError, match=r"^loss.backend: 'cuda' does not run on cpu tensors here"):
        trainer("loss.backend=cuda")
    with pytest.raises(ValueError, match=r"^rollout.engine: rollout engine 'no_such_module:Engine': cannot load"):
        trainer("rollout.engine=no_such_module:Engine")
    with pytest.raises(ValueError, match=r"^data.task_kwargs: expected keyword names \(strings\), got 1"):
        load_config(None, ["data.task_kwargs={1: 2}"])
    file = tmp_path / "a_file"
    file.write_text("mine\n")
    with pytest.raises(ValueError, match=rf"^run.output_dir: {file} is a file, not a directory"):
        trainer(f"run.output_dir={file}").check_output_dir()
    assert file.read_text() == "mine\n"


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ("data.task_kwargs={a: 2024-01-01}", r"data.task_kwargs.a: .*got date"),
        ("data.chat_template_kwargs={a: !!set {x}}", r"data.chat_template_kwargs.a: .*got set"),
        ("rollout.plugins={e: {x: !!binary aGk=}}", r"rollout.plugins.e.x: .*got bytes"),
    ],
)
def test_a_free_form_mapping_holds_plain_values_only(override, where):
    """YAML's dates, sets and bytes were accepted, and --print-config then crashed on them (not JSON)."""
    with pytest.raises(ValueError, match=where):
        load_config(None, [override])
