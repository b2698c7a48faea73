"""SQL execution, JSON schema and language-consistency rewards."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from grpo_fast.rewards import json_schema, language_consistency, sql_execution
from grpo_fast.rewards.language import language_share

DDL = """
CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT, age INTEGER);
INSERT INTO people VALUES (1, 'ann', 31), (2, 'bob', 25), (3, 'cid', 40);
"""


@pytest.fixture
def db_file(tmp_path):
    path = tmp_path / "people.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(DDL)
    conn.close()
    return str(path)


def _sql(completion, reference, db=DDL, **kw):
    return sql_execution(["q"], [completion], [db], [reference], **kw)[0]


@pytest.mark.parametrize(
    ("completion", "reference", "reward"),
    [
        ("SELECT name FROM people WHERE age > 30", "SELECT name FROM people WHERE age > 30", 1.0),
        (
            "```sql\nSELECT name AS n FROM people WHERE age >= 31 ORDER BY age DESC;\n```",
            "SELECT name FROM people WHERE age > 30",
            1.0,
        ),
        (
            "SELECT name FROM people WHERE age > 30 ORDER BY age DESC",
            "SELECT name FROM people WHERE age > 30 ORDER BY age",
            0.0,
        ),
        ("SELECT name FROM people ORDER BY age", "SELECT name FROM people ORDER BY age", 1.0),
        ("SELECT name FROM people", "SELECT name FROM people WHERE age > 30", 0.0),
        ("SELECT name, age FROM people WHERE age > 30", "SELECT name FROM people WHERE age > 30", 0.0),
        ("SELECT nme FROM people", "SELECT name FROM people", 0.0),
        ("", "SELECT name FROM people", 0.0),
    ],
)
def test_sql_result_sets(completion, reference, reward):
    assert _sql(completion, reference) == reward


@pytest.mark.parametrize(
    "attack",
    [
        "DELETE FROM people",
        "UPDATE people SET age = 0",
        "DROP TABLE people",
        "INSERT INTO people VALUES (4, 'eve', 1)",
        "ATTACH DATABASE '/tmp/x.db' AS x",
        "PRAGMA query_only = OFF",
        "SELECT name FROM people; DELETE FROM people",
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r",
    ],
)
def test_sql_writes_attach_and_slow_queries_get_zero(db_file, attack):
    before = sqlite3.connect(db_file).execute("SELECT * FROM people").fetchall()
    assert _sql(attack, "SELECT count(*) FROM people", db=db_file, timeout_s=0.5) == 0.0
    assert sqlite3.connect(db_file).execute("SELECT * FROM people").fetchall() == before


def test_sql_file_database_and_broken_reference(db_file):
    assert _sql("SELECT age FROM people WHERE name = 'bob'", "SELECT 25", db=db_file) == 1.0
    assert _sql("SELECT 1", "SELECT nothing FROM nowhere", db=db_file) is None


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}, "required": ["name"]}


@pytest.mark.parametrize(
    ("attack", "reference"),
    [
        # Each attack returns the reference's value when it is allowed to run, so it would earn 1.0.
        ("SELECT length(printf('%.*c', 100000000, 'x'))", "SELECT 100000000"),  # a 100 MB string
        ("SELECT length(replace(hex(zeroblob(50000000)), '0', 'ab'))", "SELECT 200000000"),
        ("SELECT length(zeroblob(1000000000))", "SELECT 1000000000"),  # a function off the allow-list
        ("SELECT length(randomblob(8))", "SELECT 8"),
        ("SELECT load_extension('/nonexistent')", "SELECT NULL"),
        # A recursive CTE doubling a string to 268 MB.
        (
            "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r WHERE length(s) < 200000000) "
            "SELECT max(length(s)) FROM r",
            "SELECT 268435456",
        ),
        # 400 values of 500 kB each, each under the size bound, sorted in memory at once (~200 MB of heap).
        (
            "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 400) "
            "SELECT count(*) FROM (SELECT printf('%.*c', 500000, 'x') || i AS v FROM r ORDER BY v)",
            "SELECT 400",
        ),
    ],
)
def test_sql_memory_size_and_function_bounds(attack, reference):
    assert _sql(reference, reference) == 1.0  # the reference itself is fine
    reward = _sql(attack, reference, timeout_s=60, max_value_bytes=1 << 20, max_memory_bytes=16 << 20)
    assert reward == 0.0


def test_sql_one_long_operation_ends_at_the_time_limit():
    """A single SQLite operation that runs for seconds (a naive string search over megabytes), which no
    progress handler or interrupt reaches: its process is killed at the time limit, and it scores 0."""
    haystack, needle = "printf('%.*c', 900000, 'a')", "printf('%.*c', 400000, 'a') || 'b'"
    start = time.monotonic()
    reward = _sql(f"SELECT instr({haystack}, {needle})", "SELECT 0", timeout_s=0.3)
    assert reward == 0.0 and time.monotonic() - start < 3.0


def test_a_query_timer_costs_the_child_little_address_space():
    """Each query's interrupt timer is a thread started under the child's RLIMIT_AS. With glibc's defaults a thread
    takes an 8 MiB stack and may reserve a 64 MiB malloc arena: under a 96 MiB limit that left the thread's start no
    memory, and it hung (a reference query "ran past its 20 s"; one run in six here). It must cost under 2 MiB."""
    from grpo_fast.rewards.sql import QueryBounds, QueryProcess

    def address_space(pid: int) -> int:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        line = next(x for x in status if x.startswith("VmSize:"))
        return int(line.split()[1]) << 10

    bounds = QueryBounds(
        timeout_s=5, max_rows=10, max_value_bytes=1 << 20, max_memory_bytes=16 << 20, memory_bytes=1 << 30
    )
    with QueryProcess(DDL, bounds) as child:
        before = address_space(child.proc.pid)
        assert "rows" in child.run("SELECT 1")
        grown = address_space(child.proc.pid) - before
    assert grown < 2 << 20, f"the first query's timer thread took {grown >> 20} MiB of address space"


def test_sql_runs_under_an_address_space_limit():
    """The heap check is off here (max_memory_bytes large): the process's own limit still holds."""
    huge = "SELECT length(printf('%.*c', 400000000, 'x'))"
    bounds = dict(max_value_bytes=1 << 30, max_memory_bytes=4 << 30, memory_bytes=96 << 20, timeout_s=20)
    assert _sql(huge, "SELECT 400000000", **bounds) == 0.0
    assert _sql("SELECT 400000000", "SELECT 400000000", **bounds) == 1.0


@pytest.mark.parametrize(
    ("completion", "reference", "reward"),
    [
        # ORDER BY inside a window, a subquery, a CTE or a string literal does not make the result ordered.
        (
            "SELECT name, row_number() OVER (ORDER BY age) FROM people ORDER BY name DESC",
            "SELECT name, row_number() OVER (ORDER BY age) FROM people",
            1.0,
        ),
        (
            "SELECT name FROM people ORDER BY name DESC",
            "SELECT name FROM (SELECT name FROM people ORDER BY age)",
            1.0,
        ),
        (
            "SELECT name FROM people ORDER BY name DESC",
            "WITH young AS (SELECT name FROM people ORDER BY age LIMIT 3) SELECT name FROM young",
            1.0,
        ),
        ("SELECT 'order by', name FROM people ORDER BY name DESC", "SELECT 'order by', name FROM people", 1.0),
        # The outermost ORDER BY (also after a window or a compound select) does.
        (
            "SELECT name, row_number() OVER (ORDER BY age) FROM people ORDER BY name DESC",
            "SELECT name, row_number() OVER (ORDER BY age) FROM people ORDER BY name",
            0.0,
        ),
        ("SELECT name FROM people ORDER BY name DESC", "SELECT name FROM people UNION SELECT 'x' ORDER BY 1", 0.0),
    ],
)
def test_sql_only_the_outer_order_by_orders_the_comparison(completion, reference, reward):
    assert _sql(completion, reference) == reward


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ('{"name": "x", "n": 3}', 1.0),
        ('Sure:\n```json\n{"name": "x"}\n```', 1.0),
        ('{"n": 3}', 0.0),
        ('{"name": 5}', 0.0),
        ('{"name": "x",}', 0.0),
        ("not json", 0.0),
    ],
)
def test_json_schema(completion, reward):
    assert json_schema(["q"], [completion], [SCHEMA]) == [reward]
    assert json_schema(["q"], [completion], [json.dumps(SCHEMA)]) == [reward]


@pytest.mark.parametrize(("completion", "reward"), [("0.5", 1.0), ("NaN", 0.0), ("Infinity", 0.0), ("-Infinity", 0.0)])
def test_json_schema_refuses_what_only_pythons_reader_calls_json(completion, reward):
    """NaN passes `minimum` and `maximum` (every comparison with it is false)."""
    assert json_schema(["q"], [completion], [{"type": "number", "minimum": 0, "maximum": 1}]) == [reward]


def test_json_schema_invalid_schema_is_skipped():
    assert json_schema(["q"], ['{"a": 1}'], [{"type": "no-such-type"}]) == [None]


@pytest.mark.parametrize(
    ("text", "language", "share"),
    [
        ("<think>Let me think about this carefully.</think> 答案是 4", "en", 1.0),
        ("<think>我们来计算一下</think>", "zh", 1.0),
        ("<think>abcd我们</think>", "zh", 2 / 6),
        ("<think>日本語のテキスト</think>", "ja", 1.0),
        ("<think>한국어 텍스트</think>", "ko", 1.0),
        ("<think>Привет, мир</think>", "ru", 1.0),
        ("<think>Привет world</think>", "ru", 6 / 11),
        ("<think>مرحبا</think>", "ar", 1.0),
        ("<think>我们用 $\\frac{a}{b}$ 和 \\sqrt{x} 计算</think>", "zh", 1.0),
        # Symbols are not counted (step, def, f, x, sin, alpha, log, ab); a longer word in code is (return).
        ("<think>我们 <step> 用 ```def f(x): return x``` 计算 $\\sin \\alpha + \\log(ab)$</think>", "zh", 5 / 11),
        # Text hidden in notation counts as the language it is written in.
        ("<think>Ok <两个加两个是四> so.</think> 4", "en", 4 / 11),
        ("<think>Ok $两个加两个是四$ so.</think> 4", "en", 4 / 11),
        ("<think>Ok \\text{两个加两个是四} so.</think> 4", "en", 4 / 11),
        ("<think>Ok ```两个加两个是四``` so.</think> 4", "en", 4 / 11),
        ("<think>我们 $let us think in english here$</think>", "zh", 2 / 18),
        ("no think tags, plain English", "en", 1.0),
        ("no think tags, plain English", "zh", 0.0),
    ],
)
def test_language_share(text, language, share):
    assert language_share(text, language) == pytest.approx(share)


def test_language_consistency_column_and_errors():
    assert language_consistency(["q"] * 2, ["hello", "你好"], language=["en", "zh"]) == [1.0, 1.0]
    assert language_consistency(["q"], ["<think>1 + 1 = 2</think>"]) == [None]
    with pytest.raises(ValueError, match="language"):
        language_consistency(["q"], ["x"], language="xx")
