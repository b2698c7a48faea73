"""Is a weight sync complete? The names a rollout engine expects versus the names one sync pushed.

A sync whose names do not match the engine's loads only part of the weights: vLLM copies what it recognises,
logs the rest at most, and would go on generating from the previous step's weights for the others (a PEFT
`modules_to_save` copy under `.modules_to_save.default.`, DoRA's `lora_magnitude_vector`, a multimodal model's
`model.language_model.` prefix, a parameter left out). `WeightNameCheck` streams a sync's (name, tensor) pairs
through, records their names, and raises after the sync unless every expected name came exactly once and no
other did.

The expected names of an engine that loaded a Hugging Face checkpoint are that checkpoint's tensor names
(`checkpoint_weight_names`): the names the engine's own loader consumed at start, independent of the trainer's
naming.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

SHOWN = 5
"""Names listed per kind of mismatch in the error (with the count of the rest)."""


def checkpoint_weight_names(model_path: str, cache_dir: str | None = None) -> frozenset[str]:
    """Tensor names of the Hugging Face checkpoint at `model_path` (a directory, or a hub name already in the
    local cache, `cache_dir` or the default one), read from the index (`*.index.json` weight maps) or the file
    headers (safetensors; `.bin` files are opened memory-mapped); no tensor data is read. Safetensors first, as
    vLLM loads them when both exist. RuntimeError when no weight files are found."""
    folder = Path(model_path)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        try:
            folder = Path(snapshot_download(model_path, cache_dir=cache_dir, local_files_only=True))
        except Exception as exc:
            raise RuntimeError(
                f"no local checkpoint for {model_path!r} ({exc}): the weight sync cannot know the names the engine "
                "expects; pass them (weight_names=...)"
            ) from exc
    for index_name, pattern in (
        ("model.safetensors.index.json", "*.safetensors"),
        ("pytorch_model.bin.index.json", "*.bin"),
    ):
        index = folder / index_name
        if index.is_file():
            return frozenset(json.loads(index.read_text())["weight_map"])
        files = sorted(folder.glob(pattern))
        if files:
            return frozenset(name for file in files for name in _file_tensor_names(file))
    raise RuntimeError(
        f"no weight files (*.safetensors, *.bin) in {folder}: the weight sync cannot know the names the engine "
        "expects; pass them (weight_names=...)"
    )


def synced_names(checkpoint_names: Iterable[str], tied_embeddings: bool) -> frozenset[str]:
    """The checkpoint's tensor names that a sync of the trainer's parameters pushes: without the buffers some
    checkpoints carry (rotary `inv_freq`) and, with tied embeddings, without an `lm_head.weight` copy (the
    trainer lists the shared matrix once, as the input embedding)."""
    names = {n for n in checkpoint_names if not n.endswith(".inv_freq")}
    if tied_embeddings:
        names = {n for n in names if not n.endswith("lm_head.weight")}
    return frozenset(names)


def _file_tensor_names(file: Path) -> list[str]:
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as f:
            return list(f.keys())
    return list(torch.load(file, map_location="cpu", mmap=True, weights_only=True))


class WeightNameCheck:
    """One sync's names against the engine's `expected` names.

    `stream(weights)` re-yields the pairs whose name is expected and not yet pushed in this sync, and records
    every name; the others (unknown to the engine, or a second push of a name) are held back, so the engine
    never receives them. After the engine consumed the stream, `raise_if_incomplete()` raises RuntimeError
    naming the expected parameters that were not pushed, the unknown ones and the repeated ones (the first
    SHOWN of each); `source` (e.g. the checkpoint's path) goes into the message."""

    def __init__(self, expected: Iterable[str], source: str = "the engine's checkpoint") -> None:
        self.expected = frozenset(expected)
        self.source = source
        self.pushed: set[str] = set()
        self.unexpected: list[str] = []
        self.repeated: list[str] = []

    def stream(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            if name not in self.expected:
                self.unexpected.append(name)
            elif name in self.pushed:
                self.repeated.append(name)
            else:
                self.pushed.add(name)
                yield name, tensor

    def raise_if_incomplete(self) -> None:
        missing = sorted(self.expected - self.pushed)
        if not (missing or self.unexpected or self.repeated):
            return
        parts = []
        if missing:
            parts.append(
                f"{len(missing)} of the {len(self.expected)} parameters it expects were not pushed ({_first(missing)})"
            )
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} pushed names are unknown to it ({_first(self.unexpected)})")
        if self.repeated:
            parts.append(f"{len(self.repeated)} names were pushed more than once ({_first(self.repeated)})")
        raise RuntimeError(
            f"incomplete weight sync: {'; '.join(parts)}. The engine would generate from stale weights. The pushed "
            f"names must be exactly those of {self.source}: check the trainer's parameter names against it (a PEFT "
            "wrapper's names such as `.modules_to_save.` or `lora_magnitude_vector` instead of the merged base names, "
            "a prefix such as `base_model.model.` or a multimodal model's `model.language_model.`, a parameter left "
            "out, a model other than the one the engine was started from)"
        )


def _first(names: list[str]) -> str:
    more = f", ... {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
