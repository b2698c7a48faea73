"""Every file grpo_fast loads, given what an attacker would put in it: a pickle payload (which would create a marker
file), code the directory names for transformers to import, a YAML tag that calls a function, JSON that is not what
the reader expects or nests past the parser's recursion. None of it runs, and each is refused with an error naming
the file and what was expected, or read only as the data it is. The GRPO checkpoints' own attacks are in
tests/trainer/test_checkpoint_crafted.py and test_checkpoint_safety.py; the reward model's in
tests/rewards/test_reward_model.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from grpo_fast.cli import main
from grpo_fast.core import checkpoint as ckpt
from grpo_fast.core.config_tree import load_tree
from grpo_fast.core.metrics import read_jsonl
from grpo_fast.core.policy import load_policy
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model, save_tiny
from grpo_fast.curate.filtering import filter_pass_rates
from grpo_fast.curate.journal import read_complete_chunks
from grpo_fast.data.tokenizer import load_tokenizer
from grpo_fast.pipeline.runner import load_pipeline_config
from grpo_fast.sft.config import load_sft_config
from grpo_fast.sft.trainer import SFTTrainer
from grpo_fast.trainer.config import TrainConfig, load_config

ROWS = [{"prompt": f"({a}*7)%10=", "completion": str(a * 7 % 10)} for a in range(8)]


class _TouchesAFile:
    """Unpickled, creates `marker` and returns `value`."""

    def __init__(self, marker: Path, value=0) -> None:
        self.marker, self.value = str(marker), value

    def __reduce__(self):
        return eval, (f"__import__('pathlib').Path({self.marker!r}).touch() or {self.value!r}",)


def _match_the_manifest(path: Path) -> None:
    """The manifest an attacker writes after altering a checkpoint (so that the loader itself must refuse)."""
    sizes = {str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*") if p.name != ckpt.MANIFEST}
    (path / ckpt.MANIFEST).write_text(json.dumps(sizes))


def _sft(tmp_path: Path, **run) -> SFTTrainer:
    tok = build_char_tokenizer()
    config = load_sft_config(
        {
            "data": {"max_length": 32},
            "run": {"output_dir": str(tmp_path), "micro_batch_tokens": 64, "tensorboard": False, "plots": False}
            | {"progress": False, **run},
        }
    )
    return SFTTrainer(config, build_tiny_model(tok, seed=0), tok, ROWS)


def test_an_sft_checkpoint_with_a_pickle_payload_is_refused_before_its_weights_load(tmp_path):
    trainer = _sft(tmp_path)
    trainer.train_step()
    path = trainer.save()
    marker = tmp_path / "payload-ran"
    state = ckpt.load_trainer_state(path)
    torch.save({**state, "step": _TouchesAFile(marker, 1)}, path / ckpt.TRAINER_STATE)
    _match_the_manifest(path)
    resumed = _sft(tmp_path, resume=True)
    weights = {k: v.clone() for k, v in resumed.model.state_dict().items()}
    with pytest.raises(ckpt.UnsafeCheckpointError, match="trainer_state.pt: refused"):
        resumed.resume()
    assert not marker.exists()
    assert all(torch.equal(weights[k], v) for k, v in resumed.model.state_dict().items())  # nothing loaded


def test_an_sft_checkpoint_with_files_added_is_refused(tmp_path):
    trainer = _sft(tmp_path)
    trainer.train_step()
    path = trainer.save()
    (path / "extra.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    with pytest.raises(ckpt.UnsafeCheckpointError, match="extra.safetensors: not written by the trainer"):
        _sft(tmp_path, resume=True).resume()


@pytest.fixture
def hostile_model_dir(tmp_path):
    """A tiny model directory whose weights are a pickle with a payload, and whose config.json and
    tokenizer_config.json name a module of the directory in `auto_map`."""
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=0)
    path = save_tiny(model, tok, tmp_path / "model")
    marker = tmp_path / "payload-ran"
    (path / "custom.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    for name, key in (("config.json", "AutoModelForCausalLM"), ("tokenizer_config.json", "AutoTokenizer")):
        file = path / name
        file.write_text(json.dumps({**json.loads(file.read_text()), "auto_map": {key: "custom.Custom"}}))
    return path, model, marker


def test_a_model_directory_never_runs_its_own_code(hostile_model_dir):
    path, model, marker = hostile_model_dir
    loaded = load_policy(load_config(None, [f"model.path={path}", "model.dtype=float32"]).model)
    tokenizer = load_tokenizer(str(path))
    assert not marker.exists()
    assert type(loaded).__module__.startswith("transformers.") and tokenizer("1+2")["input_ids"]
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())


def test_model_weights_that_carry_a_payload_are_refused(hostile_model_dir):
    path, model, marker = hostile_model_dir
    (path / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "extra": _TouchesAFile(marker)}, path / "pytorch_model.bin")
    with pytest.raises(Exception, match="Weights only load failed"):
        load_policy(load_config(None, [f"model.path={path}", "model.dtype=float32"]).model)
    assert not marker.exists()


def _yaml_that_runs_a_command(tmp_path, name: str, key: str) -> tuple[Path, Path]:
    """(a YAML file whose `key` ("a:\n  b" nests) is a python/object/apply tag that would touch a marker file,
    that marker)."""
    marker, path = tmp_path / "payload-ran", tmp_path / name
    path.write_text(f"{key}: !!python/object/apply:os.system ['touch {marker}']\n")
    return path, marker


def test_a_yaml_config_cannot_call_a_function(tmp_path):
    config, marker = _yaml_that_runs_a_command(tmp_path, "train.yaml", "run:\n  max_steps")
    with pytest.raises(ValueError, match=f"config file {config}: not valid YAML"):
        load_tree(TrainConfig, config)
    with pytest.raises(SystemExit, match="invalid config"):
        main(["train", "--config", str(config)])
    assert not marker.exists()


def test_a_pipeline_file_is_read_as_the_config_files_are(tmp_path):
    pipeline, marker = _yaml_that_runs_a_command(tmp_path, "pipeline.yaml", "output_dir")
    with pytest.raises(ValueError, match=f"config file {pipeline}: not valid YAML"):
        load_pipeline_config(pipeline)
    pipeline.write_text("stages: " + "[" * 100_000)
    with pytest.raises(ValueError, match="nested deeper than the YAML parser goes"):
        load_pipeline_config(pipeline)
    assert not marker.exists()


def test_a_yaml_config_whose_aliases_expand_past_the_bound_is_refused_before_it_is_walked(tmp_path):
    """Nine levels of nine aliases each: 387 million values once expanded (the run's config is copied, compared and
    written as JSON), from a file of 400 bytes."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)]
    config = tmp_path / "train.yaml"
    config.write_text("data:\n  task_kwargs:\n" + "".join(f"    {line}\n" for line in lines))
    with pytest.raises(ValueError, match="aliases expand to more than"):
        load_tree(TrainConfig, config)
    small = tmp_path / "small.yaml"  # aliases are fine within the bound
    small.write_text("run:\n  max_steps: &n 3\n  save_every: *n\n")
    assert load_tree(TrainConfig, small).run.save_every == 3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1, 2]", "expected a record with 'pass_rate' and 'row', got list"),
        ("[" * 100_000, "not JSON"),
        ('{"pass_rate": "high", "row": {}}', "pass_rate: expected a number in \\[0, 1\\], got 'high'"),
        ('{"pass_rate": NaN, "row": {}}', "pass_rate: expected a number in \\[0, 1\\], got nan"),
        ('{"pass_rate": 0.5, "row": 3}', "row: expected a dataset row"),
    ],
)
def test_filter_names_the_line_of_a_pass_rates_file_it_cannot_use(tmp_path, line, message):
    good = json.dumps({"row_index": 0, "pass_rate": 0.5, "num_samples": 2, "row": {"prompt": "p"}})
    path = tmp_path / "pass_rates.jsonl"
    path.write_text(f"{good}\n{line}\n")
    with pytest.raises(ValueError, match=f"{path}, line 2: {message}"):
        filter_pass_rates(path, tmp_path / "kept.jsonl")
    with pytest.raises(SystemExit, match=f"grpo-fast filter: {path}, line 2"):
        main(["filter", "--pass-rates", str(path), "--output", str(tmp_path / "kept.jsonl")])
    assert not (tmp_path / "kept.jsonl").exists()


@pytest.mark.parametrize(
    ("line", "message"), [("[1, 2]", "expected a JSON object, got list"), ("[" * 100_000, "not JSON")]
)
def test_a_metrics_journal_names_the_line_it_cannot_use(tmp_path, line, message):
    path = tmp_path / "metrics.jsonl"
    path.write_text(f'{{"step": 1}}\n{line}\n{{"step": 2}}\n')
    with pytest.raises(ValueError, match=f"{path}:2: {re.escape(message)}"):
        read_jsonl(path)


def test_the_sampling_journal_drops_lines_that_are_no_record_of_a_chunk(tmp_path):
    records = [{"chunk": 0, "row_index": i} for i in range(2)]
    junk = ["[" * 100_000, "[1, 2]", '{"chunk": "0"}', '{"row_index": 5}']
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "\n".join(junk) + "\n")
    assert read_complete_chunks(path, lambda chunk: 2) == records
    assert [json.loads(line) for line in path.read_text().splitlines()] == records


def test_a_set_value_is_read_with_the_config_files_protections(tmp_path):
    """--set used yaml.safe_load alone: an alias bomb ran until it was killed (3.5 GB), deep nesting was a
    RecursionError traceback, and ' #...' was cut off as a comment: `run.output_dir=runs/exp #2` became runs/exp,
    which --overwrite then deleted."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)]
    bomb = "{" + ", ".join(levels) + "}"
    with pytest.raises(ValueError, match=r"^--set data.task_kwargs: the value .*: its aliases expand to more than"):
        load_tree(TrainConfig, None, [f"data.task_kwargs={bomb}"])
    with pytest.raises(ValueError, match="nested deeper than the YAML parser goes"):
        load_tree(TrainConfig, None, ["data.task_kwargs={a: " + "[" * 5000 + "]" * 5000 + "}"])
    config = load_tree(TrainConfig, None, ["run.output_dir=runs/exp #2", "data.system_prompt=Answer after ####"])
    assert (config.run.output_dir, config.data.system_prompt) == ("runs/exp #2", "Answer after ####")
    with pytest.raises(ValueError, match=r"--set run.max_steps: .* ' #\.\.\.' as a comment and drops it; quote"):
        load_tree(TrainConfig, None, ["run.max_steps=3 # three"])


@pytest.mark.parametrize("path", ["", "dir", "file/inside", "x" * 300 + ".yaml"])
def test_a_config_path_that_cannot_be_read_is_one_line(tmp_path, path):
    """A directory, a path through a file or a name too long were OSError tracebacks."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("run: {}\n")
    with pytest.raises(SystemExit, match=r"grpo-fast train: invalid config: config file .*: cannot be read \("):
        main(["train", "--config", str(tmp_path / path)])
