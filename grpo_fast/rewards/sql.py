"""SQL execution reward: the completion's query must return the reference query's result set.

Query: the last ```sql fenced block of the completion, else the whole completion; one statement.
Database (`db` column): a path to a SQLite file, opened read-only (`file:...?mode=ro`), or a string of
DDL + INSERT statements, loaded into a private in-memory database.

Both queries run read-only and bounded, in a child process of their own per completion
(sql_child.py), never in the reward worker:
- `PRAGMA query_only` and an authorizer that allows reads (SELECT, column reads, recursive CTEs) and
  the SQL functions of `ALLOWED_FUNCTIONS` only; writes, schema changes, ATTACH, PRAGMA and every
  other function (zeroblob, randomblob, load_extension, ...) are denied;
- no string or blob longer than `max_value_bytes` (SQLite's length limit: `zeroblob(1e9)`,
  `printf('%.*c', 1e9, 'x')`, a runaway `group_concat` fail instead of allocating);
- time: `Connection.interrupt()` from a timer stops a query at `timeout_s`; one operation that runs
  long inside SQLite (a string search over megabytes, which no interrupt reaches) is ended by killing
  the child at `timeout_s` + 1 s;
- memory: a progress handler aborts a query once SQLite's heap has grown by more than
  `max_memory_bytes` (read through ctypes where the library exposes `sqlite3_memory_used`), and the
  child's address space is limited to `memory_bytes`, its CPU time to its time limits, its file
  writes (temporary tables stay in memory) to 16 MiB;
- at most `max_rows` rows are fetched; the child returns digests of the rows, not the rows.

Comparison: column names are ignored; rows compare as a multiset, or in order when the reference's
outermost query has ORDER BY (an ORDER BY inside a subquery, a CTE or a window's `OVER (...)` does not
count); values compare as Python compares them (1 = 1.0). Reward 1.0 equal, 0.0 otherwise (including
a query that writes, attaches, calls a function outside the allow-list, fails, or runs out of time or
memory: a ProgramFailure when it ran out or killed its child); None when the reference query itself
fails or cannot run (the row cannot be judged).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_fast.rewards.outcomes import ProgramFailure
from grpo_fast.rewards.pool import time_left
from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.text import broadcast_column, completion_texts

log = logging.getLogger(__name__)

_SQL_FENCE = re.compile(r"```sql[^\n`]*\n(.*?)```", re.DOTALL | re.IGNORECASE)  # no "`" in its info string
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
# String literals, quoted identifiers and comments, which may contain anything (parentheses, "order by").
_OPAQUE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|--[^\n]*|/\*.*?(?:\*/|$)", re.DOTALL)
_LOAD_S = 30.0  # loading the database (a DDL script) before the first query


def extract_sql(text: str) -> str:
    """The query in a completion (see module doc)."""
    blocks = _SQL_FENCE.findall(text)
    return (blocks[-1] if blocks else text).strip().rstrip(";").strip()


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
    memory_bytes: int = 1 << 30,
    **_: Any,
) -> list[float | None]:
    """1.0 / 0.0 per completion for whether its query's result equals `reference_sql`'s on `db`
    (bounds: see the module doc)."""
    texts = completion_texts(completions)
    dbs = broadcast_column("db", db, len(texts))
    references = broadcast_column("reference_sql", reference_sql, len(texts))
    bounds = QueryBounds(timeout_s, max_rows, max_value_bytes, max_memory_bytes, memory_bytes)
    return [_score(extract_sql(text), d, ref, bounds) for text, d, ref in zip(texts, dbs, references, strict=True)]


def _score(query: str, db: str, reference: str, bounds: QueryBounds) -> float | None:
    with QueryProcess(db, bounds) as child:
        expected = child.run(reference)
        if "rows" not in expected:
            log.warning("sql_execution: reference query fails: %s", expected.get("error"))
            return None
        if not query:
            return 0.0
        got = child.run(query)
    if "rows" not in got:
        return ProgramFailure(0.0, got["error"]) if got.get("killed") else 0.0
    kind = "ordered" if outer_order_by(reference) else "multiset"
    return float(got["rows"][kind] == expected["rows"][kind])


@dataclass(frozen=True)
class QueryBounds:
    """What the queries of one completion may use (the module doc says how each is enforced)."""

    timeout_s: float  # wall seconds a query
    max_rows: int  # rows fetched
    max_value_bytes: int  # bytes of one string or blob
    max_memory_bytes: int  # growth of SQLite's heap during a query
    memory_bytes: int  # the child's address space


class QueryProcess:
    """A child process (sql_child.py) holding one read-only connection to `db`; `run` sends it one query
    and waits at most its time limit plus a second: {"rows": {"ordered": digest, "multiset": digest}},
    {"error": why} (the query failed or was denied), or {"error": ..., "killed": True} (it overran, or its
    child died: the process is gone, and later queries get the same)."""

    def __init__(self, db: str, bounds: QueryBounds) -> None:
        self.bounds, self.buffer, self.dead = bounds, b"", None
        root = str(Path(__file__).resolve().parents[2])
        script = f"import sys; sys.path.insert(0, {root!r}); from grpo_fast.rewards.sql_child import main; main()"
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", script, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        ready = self._exchange({"db": db, **dataclasses.asdict(bounds)}, _LOAD_S)
        if ready.get("ready") is not True:
            self.dead = f"the database does not load: {ready.get('error')}"

    def run(self, query: str) -> dict:
        if self.dead is not None:
            return {"error": self.dead, "killed": True}
        left = time_left()
        timeout = self.bounds.timeout_s + 1.0
        return self._exchange({"query": query}, timeout if left is None else max(0.1, min(timeout, left - 1.0)))

    def _exchange(self, message: dict, timeout: float) -> dict:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            return self._kill("the query process died")
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return self._kill(f"the query ran past its {self.bounds.timeout_s} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                return self._kill("the query process died (memory or CPU limit)")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            return self._kill("the query process answered garbage")
        return answer if isinstance(answer, dict) else self._kill("the query process answered garbage")

    def _kill(self, why: str) -> dict:
        self.dead = why
        self.close()
        return {"error": why, "killed": True}

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()

    def __enter__(self) -> QueryProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
