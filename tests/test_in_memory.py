"""An in-memory trace database (tracekit.open without a file) is compressed, and every cursor of it
reads the trace's tables."""

from __future__ import annotations

import pytest

import tracekit
from tests.conftest import sample
from tracekit.db import connection


def test_an_in_memory_trace_is_stored_compressed():
    # DuckDB's default in-memory database keeps columns uncompressed (2.3x the memory on the 1 GB
    # trace, which then spills past the memory limit); the trace lives in one attached with COMPRESS
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        home, options = con.execute(
            "SELECT database_name, options FROM duckdb_databases() WHERE database_name = current_database()"
        ).fetchone()
        assert home == connection.IN_MEMORY
        assert str(options.get("compress")).lower() == "true"
        assert con.execute("SELECT count(*) FROM tracekit.main.event_rows").fetchone()[0] > 0


def test_a_cursor_reads_the_trace_not_the_empty_default_database():
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        cur = connection.cursor(con)
        try:
            assert cur.execute("SELECT current_database()").fetchone()[0] == connection.IN_MEMORY
            count = cur.execute("SELECT count(*) FROM kernels").fetchone()[0]
        finally:
            cur.close()
        assert count == con.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0
        # relations of the Python API run on such cursors
        assert trace.sql("SELECT count(*) AS n FROM kernels").fetchall()[0][0] == count


def test_opening_a_cursor_leaves_a_pending_result_of_the_connection_alone():
    # the findings insert opens its cursor while a rule's result may still be pending on the connection
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz")) as trace:
        con = trace._db.con
        pending = con.execute("SELECT rowid FROM event_rows ORDER BY rowid")
        assert pending.fetchone() == (0,)
        cur = connection.cursor(con)
        try:
            assert cur.execute("SELECT current_database()").fetchone()[0] == connection.IN_MEMORY
        finally:
            cur.close()
        assert pending.fetchone() == (1,)


def test_a_cursor_of_a_database_file_stays_in_it(tmp_path):
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz"), db=tmp_path / "t.duckdb") as trace:
        con = trace._db.con
        cur = connection.cursor(con)
        try:
            assert cur.execute("SELECT current_database()").fetchone()[0] == "t"
            assert cur.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0
        finally:
            cur.close()


@pytest.mark.parametrize("in_file", [False, True])
def test_a_relation_runs_on_a_new_cursor(tmp_path, in_file):
    # DuckDB refuses a relation on a connection with an unfinished result: the cursor leaves none
    db = tmp_path / "t.duckdb" if in_file else None
    with tracekit.open(sample("gpu_prefill_decode_eager.json.gz"), db=db) as trace:
        cur = connection.cursor(trace._db.con)
        try:
            assert cur.sql("SELECT count(*) FROM kernels").fetchall()[0][0] > 0
        finally:
            cur.close()
