"""SQL execution reward: the completion's query must return the reference query's result set.

Query: the last ```sql fenced block of the completion, else the whole completion; one statement.
Database (`db` column): a path to a SQLite file, opened read-only (`file:...?mode=ro`), or a string of
DDL + INSERT statements, loaded into a private in-memory database.

Both queries run read-only: `PRAGMA query_only`, and an authorizer that allows only reads (SELECT,
column reads, functions, recursive CTEs) and denies writes, schema changes, ATTACH and PRAGMA; a
progress handler aborts a query after `timeout_s`, and at most `max_rows` rows are fetched.

Comparison: column names are ignored; rows compare as a multiset, or in order when the reference
has ORDER BY. Reward 1.0 equal, 0.0 otherwise (including a query that writes, attaches, fails, or
runs too long); None when the reference query itself fails (the row cannot be judged).
"""

from __future__ import annotations

import logging
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from grpo_fast.rewards.text import broadcast_column, completion_texts

log = logging.getLogger(__name__)

_SQL_FENCE = re.compile(r"```sql[^\n]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


class QueryError(Exception):
    """A query failed, was denied, returned too many rows, or ran out of time."""


def extract_sql(text: str) -> str:
    """The query in a completion (see module doc)."""
    blocks = _SQL_FENCE.findall(text)
    return (blocks[-1] if blocks else text).strip().rstrip(";").strip()


def open_readonly(db: str) -> sqlite3.Connection:
    """A read-only connection to `db`: a file path, or DDL + inserts (detected by a CREATE statement)."""
    if re.search(r"\bcreate\s+table\b", db, re.IGNORECASE):
        conn = sqlite3.connect(":memory:")
        conn.executescript(db)
    else:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.execute("PRAGMA query_only = ON")
    conn.set_authorizer(lambda action, *_: sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY)
    return conn


def run_query(conn: sqlite3.Connection, query: str, timeout_s: float, max_rows: int) -> list[tuple]:
    """Rows of `query` (read-only connection), or QueryError."""
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        rows = conn.execute(query).fetchmany(max_rows + 1)
    except (sqlite3.Error, ValueError) as exc:  # ValueError: embedded NUL characters
        raise QueryError(str(exc)) from None
    finally:
        conn.set_progress_handler(None, 0)
    if len(rows) > max_rows:
        raise QueryError(f"more than {max_rows} rows")
    return rows


def sql_execution(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    db: Sequence[str],
    reference_sql: Sequence[str],
    *,
    timeout_s: float = 2.0,
    max_rows: int = 10_000,
    **_: Any,
) -> list[float | None]:
    """1.0 / 0.0 per completion for whether its query's result equals `reference_sql`'s on `db`."""
    texts = completion_texts(completions)
    dbs = broadcast_column("db", db, len(texts))
    references = broadcast_column("reference_sql", reference_sql, len(texts))
    return [
        _score(extract_sql(text), d, ref, timeout_s, max_rows)
        for text, d, ref in zip(texts, dbs, references, strict=True)
    ]


def _score(query: str, db: str, reference: str, timeout_s: float, max_rows: int) -> float | None:
    try:
        conn = open_readonly(db)
    except sqlite3.Error as exc:
        log.warning("sql_execution: cannot open db %r: %s", db[:200], exc)
        return None
    try:
        expected = run_query(conn, reference, timeout_s, max_rows)
    except QueryError as exc:
        log.warning("sql_execution: reference query fails: %s", exc)
        conn.close()
        return None
    try:
        got = run_query(conn, query, timeout_s, max_rows) if query else None
    except QueryError:
        got = None
    finally:
        conn.close()
    if got is None:
        return 0.0
    if _ORDER_BY.search(reference):
        return float(got == expected)
    return float(Counter(got) == Counter(expected))
