"""Run ids, and what a killed ingest leaves behind.

A run's rows are committed before what is derived from them (see tracekit.ingest.transaction), so a
process killed in between leaves rows of a run that has no `runs` row. Each ingest therefore takes
its run id from the sequence `run_ids` and commits an `ingest_pending` row first; the transaction
that writes the `runs` row deletes it. Opening a database for writing removes every row of a run
still pending, or with rows but no `runs` row, except the runs this process is writing right now
(another connection of the same process may be between its two commits; another process cannot be,
since DuckDB lets one process write a database file at a time).
"""

from __future__ import annotations

import os
import sys
import threading

_LIVE: set[tuple[str, int]] = set()  # (database file, run id) this process is ingesting now
_LIVE_LOCK = threading.Lock()


def ensure_sequence(con) -> None:
    """The `run_ids` sequence, starting past every run id a table holds (a database written before
    the sequence existed keeps its ids)."""
    exists = con.execute("SELECT count(*) FROM duckdb_sequences() WHERE sequence_name = 'run_ids' "
                         "AND database_name = current_database()").fetchone()[0]  # fmt: skip
    if not exists:
        con.execute(f"CREATE SEQUENCE run_ids START {_max_run_id(con) + 1}")


def take_run_ids(con, count: int = 1, floor: int | None = None) -> list[int]:
    """`count` run ids no run has used, nor will: a sequence's value is committed at once, so two
    ingests at the same time, or one after a killed one, never share an id. Ids come above every
    run id the tables hold, rows written without the sequence included (an older tracekit, or by
    hand); `floor`, when given, stands for that largest id: reading it costs a look at every table
    (4 ms a file on a fresh database), so an ingest of many files looks once and then counts on from
    the ids it gave, since while it holds the database nothing else writes to it; a caller that knows
    the floor has taken ids before, so the sequence exists."""
    if floor is None:
        ensure_sequence(con)
    ids = con.execute("SELECT list(id ORDER BY id) FROM (SELECT nextval('run_ids') AS id FROM range(?))", [count])
    ids = ids.fetchone()[0]
    floor = _max_run_id(con) if floor is None else floor
    if ids[0] <= floor:  # rows written without the sequence (an older tracekit, or by hand)
        ids = [floor + 1 + i for i in range(count)]
    return ids


def begin(
    con,
    source: str | list[str],
    count: int = 1,
    floor: int | None = None,
    database: str | None = None,
    reuse: list[int] | None = None,
) -> list[int]:
    """Run ids for an ingest (or copy) of `source`, recorded in `ingest_pending` (committed) before
    any of their rows: `count` of them, or with a list of sources (the files of a batch) one for
    each, in order, in one statement. `floor`: see take_run_ids; `database`: database_file(con), when
    the caller knows it; `reuse`: ids this process took before and gave up unused (a batch rolled
    back, whose files load one by one under the ids the batch had for them), taken instead of new
    ones."""
    from datetime import UTC, datetime

    sources = source if isinstance(source, list) else [source] * count
    run_ids = list(reuse) if reuse else take_run_ids(con, len(sources), floor)
    database = database_file(con) if database is None else database
    with _LIVE_LOCK:
        _LIVE.update((database, r) for r in run_ids)
    now = datetime.now(UTC).replace(tzinfo=None)
    con.execute(
        "INSERT INTO ingest_pending SELECT unnest($ids), $pid, unnest($sources), $now",
        {"ids": run_ids, "pid": os.getpid(), "sources": sources, "now": now},
    )
    return run_ids


def finish(con, run_ids: list[int]) -> None:
    """Inside the transaction that writes the runs' `runs` rows: they are no longer pending."""
    con.execute("DELETE FROM ingest_pending WHERE list_contains(?, run_id)", [list(run_ids)])


def forget(con, run_ids: list[int]) -> None:
    """The ingest of these runs has ended, committed or rolled back."""
    database = database_file(con)
    with _LIVE_LOCK:
        _LIVE.difference_update((database, r) for r in run_ids)


def remove_leftovers(con, tables: list[str]) -> list[str]:
    """Delete every row of the runs an ingest began and did not finish: run ids in `ingest_pending`,
    or with rows in `tables` but no `runs` row, that this process is not ingesting now. Returns one
    line per removed run, also written to stderr."""
    database = database_file(con)
    with _LIVE_LOCK:
        live = sorted(r for f, r in _LIVE if f == database)
    held = [t for t in tables if t != "runs"]
    if "ingest_pending" not in held:
        return []
    # which run ids first (DISTINCT reads run_id's compressed runs, 5 ms over 4M events); their rows
    # are counted only when there are any
    held_ids = " UNION ".join(f'SELECT DISTINCT run_id FROM "{t}"' for t in held if t != "ingest_pending")
    ids = [
        r
        for (r,) in con.execute(
            f"SELECT run_id FROM ({held_ids}) WHERE run_id NOT IN (SELECT run_id FROM runs) "
            "UNION SELECT run_id FROM ingest_pending ORDER BY run_id"
        ).fetchall()
        if r not in live
    ]
    if not ids:
        return []
    counted = " UNION ALL ".join(
        f'SELECT run_id, count(*) AS n FROM "{t}" WHERE list_contains($ids, run_id) GROUP BY run_id'
        for t in held
        if t != "ingest_pending"
    )
    rows = dict(con.execute(f"SELECT run_id, sum(n) FROM ({counted}) GROUP BY run_id", {"ids": ids}).fetchall())
    began = {
        r: (pid, source, at)
        for r, pid, source, at in con.execute(
            "SELECT run_id, pid, source, started_at FROM ingest_pending WHERE list_contains(?, run_id)", [ids]
        ).fetchall()
    }
    con.execute("BEGIN TRANSACTION")
    try:
        for table in tables:
            con.execute(f'DELETE FROM "{table}" WHERE list_contains(?, run_id)', [ids])
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    lines = []
    for run_id in ids:
        pid, source, at = began.get(run_id, (None, None, None))
        what = f"begun {at:%Y-%m-%d %H:%M:%S} UTC by process {pid} for {source}" if source else "with no runs row"
        lines.append(f"tracekit: {database or 'database'}: removed the {int(rows.get(run_id, 0))} rows of run {run_id}, {what}, "
                     "which did not finish (killed or failed)")  # fmt: skip
    for line in lines:
        print(line, file=sys.stderr)
    return lines


def report_leftovers(con) -> list[str]:
    """For a database opened read-only, which cannot remove them: the runs an ingest did not finish,
    said on stderr (their rows are still in the tables a query reads)."""
    import duckdb

    try:
        rows = con.execute("SELECT run_id, source FROM ingest_pending ORDER BY run_id").fetchall()
    except duckdb.CatalogException:  # written before ingest_pending existed
        return []
    database = database_file(con)
    with _LIVE_LOCK:
        rows = [(r, source) for r, source in rows if (database, r) not in _LIVE]
    lines = [f"tracekit: {database}: run {r} is an ingest of {source} that did not finish (killed or failed); "
             "its rows are still here until tracekit opens the database for writing (tracekit ingest or analyze)"
             for r, source in rows]  # fmt: skip
    for line in lines:
        print(line, file=sys.stderr)
    return lines


def _max_run_id(con) -> int:
    from tracekit.db.connection import run_tables

    union = " UNION ALL ".join(f'SELECT max(run_id) AS m FROM "{t}"' for t in run_tables(con))
    return con.execute(f"SELECT coalesce(max(m), 0) FROM ({union})").fetchone()[0]


def database_file(con) -> str:
    """The path of the connection's database file; '' for an in-memory one."""
    row = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    return (row[0] if row else None) or ""
