"""Transactions of an ingest: a file's rows land all together or not at all.

`transaction` is one BEGIN ... COMMIT, rolled back on any exception (a KeyboardInterrupt too).
A run takes two of them, because DuckDB gives uncommitted rows temporary rowids and parent_id
refers to rowids: the rows first, then what is derived from them (nesting, entities, the runs and
ingest_log rows). `run_or_nothing` makes the pair one unit: when the second fails, the rows the
first committed are deleted again, so a file that fails leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def transaction(con) -> Iterator[None]:
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def run_tables(con) -> list[str]:
    """The database's tables with a run_id column (every table that holds rows of a run)."""
    return [
        name
        for (name,) in con.execute(
            "SELECT c.table_name FROM duckdb_columns() c JOIN duckdb_tables() t "
            "ON t.database_name = c.database_name AND t.schema_name = c.schema_name AND t.table_name = c.table_name "
            "WHERE c.column_name = 'run_id' AND c.database_name = current_database() AND c.schema_name = 'main' "
            "ORDER BY c.table_name"
        ).fetchall()
    ]


def next_run_id(con) -> int:
    """One more than any run id a table holds: a run whose rows outlived a crash before its runs row
    was written is never merged into by the next one."""
    tables = run_tables(con)
    union = " UNION ALL ".join(f'SELECT max(run_id) AS m FROM "{t}"' for t in tables)
    return con.execute(f"SELECT coalesce(max(m), 0) + 1 FROM ({union})").fetchone()[0]


@contextmanager
def run_or_nothing(con, run_id: int) -> Iterator[None]:
    """Everything of run `run_id` is deleted again when the block fails."""
    try:
        yield
    except BaseException:
        with transaction(con):
            for table in run_tables(con):
                con.execute(f'DELETE FROM "{table}" WHERE run_id = ?', [run_id])
        raise
