"""Datasets: built-in tasks, local JSONL / Parquet / CSV files, or hub datasets by name."""

from __future__ import annotations

from pathlib import Path

from grpo_fast.data.tasks import TASKS

_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_table(source: str, split: str = "train", key: str = "data.source"):
    """A `datasets.Dataset` with whatever columns `source` has: a local .jsonl/.json/.parquet/.csv path (the
    whole file; `split` is ignored) or a hub dataset name (its `split`; needs a network or the cache). ValueError
    naming the config `key` that gave `source` when it cannot be read."""
    import datasets

    suffix = Path(source).suffix.lower()
    if suffix in _LOCAL_FORMATS:
        if not Path(source).is_file():
            raise ValueError(f"{key}: dataset file not found: {source}")
        if Path(source).stat().st_size == 0:
            raise ValueError(f"{key}: dataset file {source} is empty")
        if suffix in (".jsonl", ".json", ".csv"):
            _check_utf8(source, key)
        try:
            return datasets.load_dataset(_LOCAL_FORMATS[suffix], data_files=source, split="train")
        except Exception as exc:  # datasets' own errors (parser, schema) are raised from deep inside it
            reason = " ".join(str(exc).split())[:300]
            raise ValueError(f"{key}: dataset file {source}: cannot be read as {suffix[1:]} ({reason})") from exc
    try:
        return datasets.load_dataset(source, split=split)
    except Exception as exc:  # the hub unreachable, no such dataset or split: datasets' errors of every kind
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise ValueError(
            f"{key}: the hub dataset {source!r} (split {split!r}) could not be loaded ({reason}); check the name, or "
            "use a local .jsonl/.parquet/.csv file (offline: one already in the datasets cache, HF_DATASETS_OFFLINE=1)"
        ) from exc


def _check_utf8(source: str, key: str) -> None:
    """ValueError naming the file and line where a text dataset file is not UTF-8."""
    with open(source, "rb") as f:
        for line_no, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{key}: dataset file {source}, line {line_no}: not UTF-8 text ({exc.reason} at byte {exc.start} "
                    "of the line); re-encode the file as UTF-8 or drop the row"
                ) from None


def validate_prompt_rows(rows, source: str = "dataset") -> list[dict]:
    """`rows` (dicts of columns) checked for what the trainer needs of each: a "prompt" that is non-empty text
    or a non-empty list of chat messages ({"role": str, "content": str}) in valid Unicode. ValueError naming
    the row and what is wrong with it; returns the rows."""
    rows = list(rows)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{source} row {i}: expected a mapping of columns, got {type(row).__name__}")
        if "prompt" not in row:
            raise ValueError(f"{source} row {i}: no 'prompt' column (columns: {sorted(map(str, row))})")
        problem = _prompt_problem(row["prompt"])
        if problem:
            raise ValueError(f"{source} row {i}: 'prompt' {problem}")
    return rows


def _prompt_problem(prompt) -> str | None:
    if prompt is None:
        return "is missing (None)"
    if isinstance(prompt, (bytes, bytearray)):
        return "is bytes, expected text (decode it as UTF-8)"
    if isinstance(prompt, str):
        if not prompt.strip():
            return "is empty"
        return _text_problem(prompt)
    if isinstance(prompt, list):
        if not prompt:
            return "is an empty list of chat messages"
        for j, message in enumerate(prompt):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return f"message {j}: expected {{'role': str, 'content': str}}, got {message!r:.80}"
            if not isinstance(message.get("content"), str):
                return f"message {j}: 'content' must be text, got {type(message.get('content')).__name__}"
            problem = _text_problem(message["content"])
            if problem:
                return f"message {j}: {problem}"
        return None
    return f"must be text or a list of chat messages, got {type(prompt).__name__}"


def _text_problem(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8, decoded with surrogateescape
        return "is not valid Unicode text (bytes that were not UTF-8?)"
    return None


def load_prompt_dataset(
    source: str, split: str = "train", prompt_column: str = "prompt", key: str = "data.source", **task_kwargs
):
    """A `datasets.Dataset` with a `prompt` column (renamed from `prompt_column` when different); ValueError
    naming the config `key` that gave `source` when it cannot be used.

    source: "task:<name>" for a built-in task (kwargs go to its builder, e.g. n=, seed=), or what
        `load_table` reads.
    """
    import datasets

    if source.startswith("task:"):
        name = source.removeprefix("task:")
        if name not in TASKS:
            raise ValueError(f"{key}: unknown built-in task {name!r}; available: {sorted(TASKS)}")
        try:
            rows = TASKS[name][0](**task_kwargs)
        except TypeError as exc:  # a missing or unknown keyword of the builder
            raise ValueError(f"data.task_kwargs of task {name!r}: {exc}") from None
        return datasets.Dataset.from_list(rows)
    ds = load_table(source, split, key)
    if prompt_column not in ds.column_names:
        raise ValueError(f"{key}: dataset {source!r} has no {prompt_column!r} column (columns: {ds.column_names})")
    if prompt_column != "prompt":
        ds = ds.rename_column(prompt_column, "prompt")
    validate_prompt_rows(({"prompt": p} for p in ds["prompt"]), f"{key}: dataset {source}")
    return ds
