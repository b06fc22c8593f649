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

from tracekit.db import run_tables


@contextmanager
def transaction(con) -> Iterator[None]:
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


@contextmanager
def run_or_nothing(con, run_ids: list[int]) -> Iterator[None]:
    """Everything of the runs in `run_ids` is deleted again when the block fails (the block may add
    run ids to the list: a file split into one run per rank)."""
    try:
        yield
    except BaseException:
        try:
            delete_runs(con, run_ids)
        except Exception:
            # the database cannot take the delete (a full disk invalidates it): the runs' ingest_pending
            # row makes the next open remove their rows (tracekit.db.pending)
            pass
        raise


def delete_runs(con, run_ids: list[int]) -> None:
    """Every row of these runs, from every table that holds rows of a run, in one transaction."""
    with transaction(con):
        delete_rows(con, run_ids)


def delete_rows(con, run_ids: list[int]) -> None:
    """Every row of these runs, inside the caller's transaction (a replaced run goes in the same commit
    that completes the run replacing it, so a kill never leaves both or neither)."""
    for table in run_tables(con):
        con.execute(f'DELETE FROM "{table}" WHERE list_contains(?, run_id)', [list(run_ids)])
