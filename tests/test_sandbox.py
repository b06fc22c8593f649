"""The query sandbox refuses writes, file reads, network, extensions, ATTACH and configuration changes."""

from __future__ import annotations

import os

import pytest

from tests.conftest import sample
from tracekit.agent.sandbox import QueryRefused, check_statement, open_sandbox, run_query
from tracekit.agent.session import Session
from tracekit.agent.tools import call


@pytest.fixture(scope="module")
def session():
    with Session() as s:
        s.ingest([str(sample("gil_hold.json.gz"))])
        yield s


@pytest.fixture(scope="module")
def db_path(session):
    return session.latest.path


def _counts(path):
    # a plain read-only connection, outside the sandbox, to see that nothing changed
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM runs)").fetchone()
    finally:
        con.close()


REFUSED = [
    "INSERT INTO runs (run_id) VALUES (99)",
    "UPDATE events SET name = 'x'",
    "DELETE FROM events",
    "DROP TABLE events",
    "CREATE TABLE t AS SELECT 1",
    "CREATE TEMP TABLE t AS SELECT 1",
    "COPY events TO '/tmp/tracekit_sandbox_leak.csv'",
    "ATTACH '/tmp/tracekit_sandbox_other.duckdb' AS other",
    "DETACH trace",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "PRAGMA database_list",
    "EXPORT DATABASE '/tmp/tracekit_sandbox_export'",
    "SELECT 1; DROP TABLE events",
    "CHECKPOINT",
    "CALL pragma_version()",
]


@pytest.mark.parametrize("sql", REFUSED)
def test_statement_types_refused_before_running(sql, db_path):
    with pytest.raises(QueryRefused) as e:
        run_query(db_path, sql)
    assert e.value.hint


FILE_READS = [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_blob('/etc/hostname')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT * FROM read_json_auto('/proc/self/environ')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM read_parquet('https://example.com/x.parquet')",
    "SELECT * FROM duckdb_extensions()",
]


@pytest.mark.parametrize("sql", FILE_READS)
def test_selects_that_touch_files_or_network_fail(sql, db_path):
    check_statement(sql)  # they are SELECTs: the engine itself must refuse them
    with pytest.raises(QueryRefused) as e:
        run_query(db_path, sql)
    # refused by the engine (external access off; replacement scans of file paths are off with it)
    assert any(w in str(e.value) for w in ("disabled", "Permission", "does not exist")), str(e.value)
    assert "root:" not in str(e.value)


def test_engine_refuses_even_without_the_statement_check(db_path, tmp_path):
    # layer 2 on its own: the sandbox connection, statements sent straight to DuckDB
    import duckdb

    con = open_sandbox(db_path)
    target = tmp_path / "leak.csv"
    try:
        for sql in [
            f"COPY (SELECT 1) TO '{target}'",
            f"ATTACH '{tmp_path / 'x.duckdb'}' AS x",
            "INSTALL httpfs",
            "LOAD httpfs",
            "SET enable_external_access = true",
            "SET lock_configuration = false",
            "INSERT INTO runs (run_id) VALUES (99)",
            "CREATE TABLE trace.main.t AS SELECT 1",
            "SELECT * FROM read_text('/etc/passwd')",
        ]:
            with pytest.raises(duckdb.Error):
                con.execute(sql)
        assert con.execute("SELECT current_setting('enable_external_access')").fetchone()[0] is False
    finally:
        con.close()
    assert not target.exists()
    assert not (tmp_path / "x.duckdb").exists()


def test_nothing_changed_after_the_refusals(db_path):
    before = _counts(db_path)
    for sql in REFUSED + FILE_READS:
        with pytest.raises(QueryRefused):
            run_query(db_path, sql)
    assert _counts(db_path) == before
    assert not os.path.exists("/tmp/tracekit_sandbox_leak.csv")
    assert not os.path.exists("/tmp/tracekit_sandbox_other.duckdb")


def test_reads_work_with_row_cap_and_cell_cap(db_path):
    total = _counts(db_path)[0]
    res = run_query(db_path, "SELECT event_id FROM events ORDER BY event_id", max_rows=7)
    assert res["row_count"] == 7 and res["truncated"] is (total > 7)
    res = run_query(db_path, "SELECT count(*) FROM events")
    assert res["rows"] == [[total]] and res["truncated"] is False
    long = run_query(db_path, "SELECT repeat('x', 5000) AS s")["rows"][0][0]
    assert len(long) < 600 and long.endswith("[5000 chars]")
    # FROM-first, DESCRIBE and SHOW parse as SELECT and are allowed
    assert run_query(db_path, "FROM runs SELECT count(*)")["rows"][0][0] == _counts(db_path)[1]
    assert "run_id" in [r[0] for r in run_query(db_path, "DESCRIBE runs")["rows"]]


def test_timeout_interrupts_a_long_query(db_path):
    with pytest.raises(QueryRefused) as e:
        run_query(db_path, "SELECT count(*) FROM range(100000000000) a", timeout_s=0.3)
    assert "interrupted" in str(e.value)


def test_query_tool_returns_refusals_as_errors_with_hints(session):
    result, is_error = call(session, "query", {"sql": "SELECT * FROM read_text('/etc/passwd')"})
    assert is_error and "hint" in result and "root:" not in str(result)
    result, is_error = call(session, "query", {"sql": "ATTACH ':memory:' AS m"})
    assert is_error and "ATTACH" in result["error"]
    result, is_error = call(session, "query", {"sql": "SELECT 1", "max_rows": 100000})
    assert is_error and "max_rows" in result["error"]
