"""An append-only JSONL journal of finished work, committed in whole chunks, so a killed run resumes
where it stopped without duplicates.

Each chunk's records are written in one `write` and fsynced. On reading, an unparsable line (the
partial write of a killed run, or anything that is not a record of a chunk) and every record of a chunk
that is not complete are discarded, and the file is rewritten without them: a resumed run redoes exactly
the chunks that did not finish.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path


def read_complete_chunks(path: Path, chunk_size: Callable[[int], int]) -> list[dict]:
    """The records of the complete chunks in `path` (each record has a "chunk" key; chunk c is complete
    when it holds chunk_size(c) records); rewrites the file to hold exactly those."""
    if not path.exists():
        return []
    by_chunk: dict[int, list[dict]] = defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue  # the torn last line of a killed run
            if isinstance(record, dict) and type(record.get("chunk")) is int:
                by_chunk[record["chunk"]].append(record)
    records = [r for c, rs in sorted(by_chunk.items()) if len(rs) == chunk_size(c) for r in rs]
    write_atomic(path, "".join(dumps(r) + "\n" for r in records))
    return records


def append_chunk(path: Path, records: list[dict]) -> None:
    """Appends one chunk's records durably."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(dumps(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: Path, text: str) -> None:
    """Writes `text` to a temporary file beside `path`, then renames it over `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def dumps(obj) -> str:
    """One JSON line; NaN (a reward nobody scored) becomes null, unknown objects their str()."""
    return json.dumps(_finite(obj), ensure_ascii=False, default=str)


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
