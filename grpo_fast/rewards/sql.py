"""SQL execution reward: the completion's query must return the reference query's result set.

Query: the last ```sql fenced block of the completion, else the whole completion; one statement.
Database (`db` column): a path to a SQLite file, opened read-only (`file:...?mode=ro`), or a string of
DDL + INSERT statements, loaded into a private in-memory database.

Both queries run read-only and bounded:
- `PRAGMA query_only` and an authorizer that allows reads (SELECT, column reads, recursive CTEs) and
  the SQL functions of `ALLOWED_FUNCTIONS` only; writes, schema changes, ATTACH, PRAGMA and every
  other function (zeroblob, randomblob, load_extension, ...) are denied;
- no string or blob longer than `max_value_bytes` (SQLite's length limit: `zeroblob(1e9)`,
  `printf('%.*c', 1e9, 'x')`, a runaway `group_concat` fail instead of allocating);
- a progress handler aborts a query after `timeout_s`, or once SQLite's heap has grown by more than
  `max_memory_bytes` since the query started (a recursive CTE that sorts or aggregates millions of
  rows); the heap check reads `sqlite3_memory_used()` through ctypes where the library exposes it
  (it counts every connection of this process, so concurrent SQLite users can only make it stricter);
- at most `max_rows` rows are fetched.

Comparison: column names are ignored; rows compare as a multiset, or in order when the reference's
outermost query has ORDER BY (an ORDER BY inside a subquery, a CTE or a window's `OVER (...)` does not
count). Reward 1.0 equal, 0.0 otherwise (including a query that writes, attaches, calls a function
outside the allow-list, fails, or runs out of time or memory); None when the reference query itself
fails (the row cannot be judged).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.text import broadcast_column, completion_texts

log = logging.getLogger(__name__)

_SQL_FENCE = re.compile(r"```sql[^\n]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
# String literals, quoted identifiers and comments, which may contain anything (parentheses, "order by").
_OPAQUE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|--[^\n]*|/\*.*?(?:\*/|$)", re.DOTALL)
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


def extract_sql(text: str) -> str:
    """The query in a completion (see module doc)."""
    blocks = _SQL_FENCE.findall(text)
    return (blocks[-1] if blocks else text).strip().rstrip(";").strip()


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
    """Rows of `query` (read-only connection), or QueryError (also when it runs past `timeout_s` or grows
    SQLite's heap by more than `max_memory_bytes`)."""
    deadline = time.monotonic() + timeout_s
    heap = _heap_bytes()
    if heap is None:
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 100)
    else:
        ceiling = heap() + max_memory_bytes
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline or heap() > ceiling), 100)
    try:
        rows = conn.execute(query).fetchmany(max_rows + 1)
    except (sqlite3.Error, ValueError, OverflowError) as exc:  # ValueError: embedded NUL characters
        raise QueryError(str(exc)) from None
    finally:
        conn.set_progress_handler(None, 0)
    if len(rows) > max_rows:
        raise QueryError(f"more than {max_rows} rows")
    return rows


def outer_order_by(query: str) -> bool:
    """Whether the outermost query has ORDER BY: outside literals, comments and parentheses (subqueries,
    CTE bodies, `OVER (ORDER BY ...)` windows)."""
    text = _OPAQUE.sub(" ", query)
    depth, outer = 0, []
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        outer.append(ch if depth == 0 and ch != ")" else " ")
    return bool(_ORDER_BY.search("".join(outer)))


_PEOPLE = "CREATE TABLE people (name TEXT, age INTEGER); INSERT INTO people VALUES ('ann', 31), ('bob', 25);"
_SQL = {"db": _PEOPLE, "reference_sql": "SELECT name FROM people WHERE age > 30"}


@reward(
    "sql_execution",
    kind="accuracy",
    range=(0.0, 1.0),
    samples=(
        Sample("same result set", "SELECT name FROM people WHERE age >= 31", _SQL, True),
        Sample("other result set", "SELECT name FROM people", _SQL, False),
        Sample("a write", "DELETE FROM people", _SQL, False),
    ),
)
def sql_execution(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    db: Sequence[str],
    reference_sql: Sequence[str],
    *,
    timeout_s: float = 2.0,
    max_rows: int = 10_000,
    max_value_bytes: int = 1 << 20,
    max_memory_bytes: int = 256 << 20,
    **_: Any,
) -> list[float | None]:
    """1.0 / 0.0 per completion for whether its query's result equals `reference_sql`'s on `db`
    (bounds: see the module doc)."""
    texts = completion_texts(completions)
    dbs = broadcast_column("db", db, len(texts))
    references = broadcast_column("reference_sql", reference_sql, len(texts))
    bounds = dict(timeout_s=timeout_s, max_rows=max_rows, max_memory_bytes=max_memory_bytes)
    return [
        _score(extract_sql(text), d, ref, max_value_bytes, bounds)
        for text, d, ref in zip(texts, dbs, references, strict=True)
    ]


def _score(query: str, db: str, reference: str, max_value_bytes: int, bounds: dict) -> float | None:
    try:
        conn = open_readonly(db, max_value_bytes)
    except sqlite3.Error as exc:
        log.warning("sql_execution: cannot open db %r: %s", db[:200], exc)
        return None
    try:
        expected = run_query(conn, reference, **bounds)
    except QueryError as exc:
        log.warning("sql_execution: reference query fails: %s", exc)
        conn.close()
        return None
    try:
        got = run_query(conn, query, **bounds) if query else None
    except QueryError:
        got = None
    finally:
        conn.close()
    if got is None:
        return 0.0
    if outer_order_by(reference):
        return float(got == expected)
    return float(Counter(got) == Counter(expected))
