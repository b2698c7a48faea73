"""The child process of `sql_execution` (sql.py): one read-only SQLite connection, bounded queries.

Started as `python -I -S -c "...main()" <parent pid>` (stdlib only); dies with its parent. Reads a job line
{"db", "timeout_s", "max_rows", "max_value_bytes", "max_memory_bytes", "memory_bytes"}, limits its own
address space, CPU time and file size, opens the database read-only (`open_readonly`) and answers
{"ready": true} (or {"error": ...}); then answers each {"query": ...} line with {"rows": digests} or
{"error": why}. Queries are read-only, allow-listed and bounded (see sql.py's module doc).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import json
import logging
import os
import re
import resource
import signal
import sqlite3
import sys
import threading
from typing import Any

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_M_ARENA_MAX = -8  # glibc's mallopt parameter
_TIMER_STACK_BYTES = 256 << 10
_LOAD_CPU_S = 30  # CPU seconds for loading the database, before the queries' own
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
ALLOWED_FUNCTIONS = frozenset(
    # core scalar functions
    "abs char coalesce concat concat_ws format glob hex ifnull iif instr length like likelihood likely lower "
    "ltrim max min nullif octet_length printf quote replace round rtrim sign substr substring trim typeof "
    "unicode unlikely upper "
    # aggregates and window functions
    "avg count group_concat string_agg sum total cume_dist dense_rank first_value lag last_value lead "
    "nth_value ntile percent_rank rank row_number "
    # date and time
    "date time datetime julianday unixepoch strftime timediff "
    # math (when compiled in)
    "acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log log10 log2 mod pi "
    "pow power radians sin sinh sqrt tan tanh trunc "
    # JSON (reads)
    "json json_array json_array_length json_extract json_group_array json_group_object json_object json_quote "
    "json_type json_valid json_each json_tree".split()
)


class QueryError(Exception):
    """A query failed, was denied, returned too many rows, or ran out of time."""


def _authorize(action: int, arg1, arg2, *_) -> int:
    """Reads, and calls of the allow-listed functions (arg2 names the function), nothing else."""
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and isinstance(arg2, str) and arg2.lower() in ALLOWED_FUNCTIONS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def open_readonly(db: str, max_value_bytes: int = 1 << 20) -> sqlite3.Connection:
    """A read-only connection to `db`: a file path, or DDL + inserts (detected by a CREATE statement).
    Strings and blobs longer than `max_value_bytes` are errors in the queries run on it."""
    if re.search(r"\bcreate\s+table\b", db, re.IGNORECASE):
        conn = sqlite3.connect(":memory:")
        conn.executescript(db)
    else:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.execute("PRAGMA temp_store = MEMORY")  # sorts and temporary tables never write files
    conn.execute("PRAGMA query_only = ON")
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)
    conn.set_authorizer(_authorize)
    return conn


@functools.cache
def _heap_bytes():
    """`sqlite3_memory_used` of the SQLite library this process uses, or None where it is not reachable."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("sqlite3") or sqlite3.__file__)
        used = lib.sqlite3_memory_used
    except (OSError, AttributeError, TypeError):
        log.warning("sql_execution: sqlite3_memory_used unavailable; queries are bounded by time and size only")
        return None
    used.restype, used.argtypes = ctypes.c_int64, []
    return used


def run_query(
    conn: sqlite3.Connection, query: str, timeout_s: float, max_rows: int, max_memory_bytes: int = 256 << 20
) -> list[tuple]:
    """Rows of `query` (read-only connection), or QueryError (also when it runs past `timeout_s`, stopped by
    `Connection.interrupt()` from a timer, or grows SQLite's heap by more than `max_memory_bytes`)."""
    heap = _heap_bytes()
    if heap is not None:
        ceiling = heap() + max_memory_bytes
        conn.set_progress_handler(lambda: int(heap() > ceiling), 100)
    timer = threading.Timer(timeout_s, conn.interrupt)
    timer.start()
    try:
        rows = conn.execute(query).fetchmany(max_rows + 1)
    except (sqlite3.Error, ValueError, OverflowError) as exc:  # ValueError: embedded NUL characters
        raise QueryError(str(exc)) from None
    finally:
        timer.cancel()
        conn.set_progress_handler(None, 0)
    if len(rows) > max_rows:
        raise QueryError(f"more than {max_rows} rows")
    return rows


def digests(rows: list[tuple]) -> dict[str, str]:
    """{"ordered": digest of the rows in order, "multiset": digest of the rows in any order}, with values
    as Python compares them (an integral float as its int; a blob apart from any text)."""
    lines = [json.dumps([_canonical(v) for v in row]) for row in rows]
    sorted_lines = sorted(lines)
    return {
        "ordered": hashlib.sha256("\n".join(lines).encode()).hexdigest(),
        "multiset": hashlib.sha256("\n".join(sorted_lines).encode()).hexdigest(),
    }


def _canonical(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"blob": value.hex()}
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def main() -> None:
    """The child's loop (see module doc); argv[1] is the parent's pid."""
    parent = int(sys.argv[1])
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
    # Each query's interrupt timer is a thread, started under RLIMIT_AS: by default one costs ~72 MiB of address
    # space (an 8 MiB stack and a 64 MiB malloc arena of its own), most of a 96 MiB limit, and its start could then
    # fail or hang. Threads share the main arena here, on a small stack: ~0.3 MiB each.
    libc.mallopt(_M_ARENA_MAX, 1)
    threading.stack_size(_TIMER_STACK_BYTES)

    def answer(message: dict) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    job = json.loads(sys.stdin.readline())
    for name, value in (
        ("RLIMIT_AS", job["memory_bytes"]),
        ("RLIMIT_CPU", int(_LOAD_CPU_S + 3 * job["timeout_s"])),
        ("RLIMIT_FSIZE", 16 << 20),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))
    try:
        conn = open_readonly(job["db"], job["max_value_bytes"])
    except (sqlite3.Error, ValueError) as exc:
        answer({"error": str(exc)})
        return
    answer({"ready": True})
    bounds = {k: job[k] for k in ("timeout_s", "max_rows", "max_memory_bytes")}
    for line in sys.stdin:
        try:
            answer({"rows": digests(run_query(conn, json.loads(line)["query"], **bounds))})
        except QueryError as exc:
            answer({"error": str(exc)[:500]})
