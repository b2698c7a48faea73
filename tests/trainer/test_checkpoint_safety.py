"""A checkpoint's files are checked against its manifest before any is read, and `trainer_state.pt` is read with
`weights_only=True`: a checkpoint that carries a pickle payload, or files its writer did not write, is refused
before any of it runs or is loaded, and the states a checkpoint needs (RNGs included) survive the restricted
loader."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from tiny_trainer import tiny_trainer

from grpo_fast.core import checkpoint as ckpt
from grpo_fast.core.seeding import set_rng_state


def _trainer(out, *overrides):
    return tiny_trainer(out, *overrides)


class _CreatesAFile:
    """Unpickling this opens (creates) `path`: what a malicious checkpoint would do, harmlessly."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_with_a_pickle_payload_is_refused_on_resume(tmp_path):
    out, marker = tmp_path / "run", tmp_path / "pwned"
    trainer = _trainer(out, "run.max_steps=1")
    path = trainer.save()
    state_file = path / "trainer_state.pt"
    state = ckpt.load_trainer_state(path)
    torch.save({**state, "extra": _CreatesAFile(marker)}, state_file)
    _match_the_manifest(path)  # so that what refuses it is the weights_only load, not the manifest

    resumed = _trainer(out, "run.max_steps=1", "run.resume=true")
    with pytest.raises(ckpt.UnsafeCheckpointError, match="trainer_state.pt"):
        resumed.resume()
    assert not marker.exists()
    with pytest.raises(ckpt.UnsafeCheckpointError):
        resumed.train()  # the loop refuses the same way
    assert not marker.exists()


def _match_the_manifest(path):
    sizes = {str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*") if p.name != ckpt.MANIFEST}
    (path / ckpt.MANIFEST).write_text(json.dumps(sizes))


@pytest.mark.parametrize("change", ["weights added", "state grown", "config edited"])
def test_a_checkpoint_whose_files_differ_from_its_manifest_is_refused_unread(tmp_path, change):
    out = tmp_path / "run"
    path = _trainer(out, "run.max_steps=1").save()
    if change == "weights added":  # would be loaded with the model's own: load_model_weights reads every *.safetensors
        (path / "extra.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    elif change == "state grown":
        with open(path / "trainer_state.pt", "ab") as f:
            f.write(b"\0" * 8)
    else:  # the config a resume is checked against
        config = path / "train_config.json"
        config.write_text(config.read_text().replace('"max_steps": 1', '"max_steps": 10'))
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    resumed = _trainer(out, "run.max_steps=2", "run.resume=true")
    weights = {k: v.clone() for k, v in resumed.model.state_dict().items()}
    with pytest.raises(ckpt.UnsafeCheckpointError, match="differ from the manifest"):
        resumed.train()
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # nothing of the user's checkpoint changed
    assert all(torch.equal(weights[k], v) for k, v in resumed.model.state_dict().items())  # nothing loaded
    with pytest.raises(ckpt.UnsafeCheckpointError):
        ckpt.load_model_weights(resumed.model, path)  # each reader checks on its own


def test_the_trainer_state_loads_with_weights_only_and_restores_the_rngs(tmp_path):
    trainer = _trainer(tmp_path / "run")
    random.seed(1), np.random.seed(2), torch.manual_seed(3)  # noqa: NPY002 (the global RNGs are what is saved)
    path = trainer.save()
    expected = (random.random(), np.random.random(), torch.rand(1))  # noqa: NPY002
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)
    random.seed(9), np.random.seed(9), torch.manual_seed(9)  # noqa: NPY002
    set_rng_state(state["rng"])
    assert (random.random(), np.random.random()) == expected[:2]  # noqa: NPY002
    assert torch.equal(torch.rand(1), expected[2])


def test_a_checkpoint_of_the_earlier_format_still_loads(tmp_path):
    """Before, the numpy RNG state was pickled as an ndarray: that one array type is still accepted."""
    path = tmp_path / "step-000001"
    path.mkdir()
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}  # noqa: NPY002
    torch.save({"step": 1, "rng": rng}, path / "trainer_state.pt")
    expected = np.random.random()  # noqa: NPY002
    state = ckpt.load_trainer_state(path)
    set_rng_state(state["rng"])
    assert np.random.random() == expected  # noqa: NPY002


def test_json_files_nested_past_the_parser_are_refused_not_raised(tmp_path):
    """The manifest, the checkpoint's run signature and the output directory's: each read without a RecursionError
    (a checkpoint with an unreadable manifest is skipped as incomplete, and kept; a signature that is no signature is
    refused, naming the file)."""
    out = tmp_path / "run"
    path = _trainer(out, "run.max_steps=1").save()
    deep = "[" * 100_000
    (path / "train_config.json").write_text(deep)
    _match_the_manifest(path)
    with pytest.raises(ckpt.UnsafeCheckpointError, match="train_config.json: refused"):
        _trainer(out, "run.max_steps=2", "run.resume=true").train()
    (path / ckpt.MANIFEST).write_text(deep)
    assert ckpt.list_checkpoints(out / "checkpoints") == [] and path.is_dir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "train_config.json").write_text(deep)
    assert "cannot be read (RecursionError" in ckpt.unsaved_progress_mismatch(out, {"config": {}})
