"""Datasets: built-in tasks, local JSONL / Parquet / CSV files, or hub datasets by name."""

from __future__ import annotations

from pathlib import Path

_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_table(source: str, split: str = "train"):
    """A `datasets.Dataset` with whatever columns `source` has: a local .jsonl/.json/.parquet/.csv path (the
    whole file; `split` is ignored) or a hub dataset name (its `split`; needs a network)."""
    import datasets

    suffix = Path(source).suffix.lower()
    if suffix in _LOCAL_FORMATS:
        if not Path(source).exists():
            raise FileNotFoundError(f"dataset file not found: {source}")
        return datasets.load_dataset(_LOCAL_FORMATS[suffix], data_files=source, split="train")
    return datasets.load_dataset(source, split=split)


def load_prompt_dataset(source: str, split: str = "train", prompt_column: str = "prompt", **task_kwargs):
    """A `datasets.Dataset` with a `prompt` column (renamed from `prompt_column` when different).

    source: "task:<name>" for a built-in task (kwargs go to its builder, e.g. n=, seed=), or what
        `load_table` reads.
    """
    import datasets

    if source.startswith("task:"):
        from grpo_fast.data.tasks import TASKS

        name = source.removeprefix("task:")
        if name not in TASKS:
            raise ValueError(f"unknown built-in task {name!r}; available: {sorted(TASKS)}")
        return datasets.Dataset.from_list(TASKS[name][0](**task_kwargs))
    ds = load_table(source, split)
    if prompt_column != "prompt":
        ds = ds.rename_column(prompt_column, "prompt")
    if "prompt" not in ds.column_names:
        raise ValueError(f"dataset {source!r} has no {prompt_column!r} column (columns: {ds.column_names})")
    return ds
