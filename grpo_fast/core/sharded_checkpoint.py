"""Sharded checkpoints of the policy and its optimizer with `torch.distributed.checkpoint` (DCP).

Each rank writes its own shards (`__<rank>_0.distcp`) and rank 0 the global metadata (`.metadata`); a
checkpoint loads on any world size, one process included: DCP reshards on load. The state is taken and
given back with `get_state_dict` / `set_state_dict`, which key the optimizer state by parameter name, so it
does not depend on how parameters were grouped or sharded.

DCP reads its metadata with `pickle`; here it is read with an unpickler that builds only the metadata
classes DCP writes (`SafeMetadataReader`). The shards hold tensors, which DCP reads with
`torch.load(weights_only=True)`, and non-tensor values (the optimizer's hyperparameters), which DCP's default
planner would read with `weights_only=False`: here they are read with `weights_only=True`
(`_PlainValuesLoadPlanner`). Loading a checkpoint never runs code from it: anything else is refused with
`UnsafeCheckpointError`.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path

import torch
from torch import nn

from grpo_fast.core.checkpoint import UnsafeCheckpointError, refusal_reason

SHARDED_DIR = "sharded"
"""The DCP directory inside a checkpoint (model and optimizer)."""

_METADATA_CLASSES = {
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_CLASSES or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"sharded checkpoint metadata: {module}.{name} is not a DCP metadata class")


def _reader(path: str | Path):
    from torch.distributed.checkpoint import FileSystemReader

    class SafeMetadataReader(FileSystemReader):
        """FileSystemReader whose metadata is unpickled with the DCP metadata classes only."""

        def read_metadata(self, *args, **kwargs):
            with (Path(self.path) / ".metadata").open("rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is not None:
                metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeMetadataReader(str(path))


def _plain_values_planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class _PlainValuesLoadPlanner(DefaultLoadPlanner):
        """DefaultLoadPlanner whose non-tensor entries are read with `weights_only=True`."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            key = read_item.dest_index.fqn
            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as exc:
                raise UnsafeCheckpointError(
                    f"entry {key!r} refused, it holds objects other than tensors and plain Python values "
                    f"({refusal_reason(exc)}); a grpo_fast checkpoint never does, so it was not written by this "
                    "trainer or was altered"
                ) from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[key], obj)
            else:
                self.state_dict[key] = obj

    return _PlainValuesLoadPlanner()


def save_sharded(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Writes the model's and optimizer's state (this rank's shards) under `path`; every rank must call it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(path))


def load_sharded(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Loads the state `save_sharded` wrote (by any number of ranks) into `model` and `optimizer` (sharded
    over this run's ranks, or whole in a single process); every rank must call it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    reader = _reader(path)
    try:  # refused here, with a clear error, rather than inside DCP's planner
        reader.read_metadata()
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"{path}/.metadata: refused ({exc}); a grpo_fast checkpoint never holds anything else, so it was not "
            "written by this trainer or was altered"
        ) from None
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    with warnings.catch_warnings():  # in a single process DCP warns that it loads without a process group
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.load(state, storage_reader=reader, planner=_plain_values_planner())
        except dcp.CheckpointException as exc:  # every rank gets every rank's failures: all refuse alike
            refusals = [e for e, _ in exc.failures.values() if isinstance(e, UnsafeCheckpointError)]
            if refusals:
                raise UnsafeCheckpointError(f"{path}: {refusals[0]}") from None
            raise
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0's CPU (gathered parameter by parameter; other ranks get an
    empty dict); every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, path: str | Path, optimizer_state: dict):
    """A checkpoint written by one process (the model's safetensors, the optimizer's own `state_dict`) into a
    sharded model and its optimizer; every rank must call it. The optimizer state is re-keyed by parameter
    name: torch numbers the parameters in `param_groups` order, and this run's optimizer groups them as the
    writer's did (the same build from the same model)."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        weights.update(load_file(file))
    options = StateDictOptions(full_state_dict=True, strict=False)
    missing, unexpected = set_model_state_dict(model, weights, options=options)
    tied = {k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"checkpoint {path}: missing {sorted(set(missing) - tied)}, unexpected {unexpected}")
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    if len(order) != sum(len(g["params"]) for g in optimizer_state["param_groups"]):
        raise ValueError(f"checkpoint {path}: its optimizer state is for another set of parameters")
    by_name = {
        "state": {order[i]: s for i, s in optimizer_state["state"].items()},
        "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in optimizer_state["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
