"""processes, threads and streams of a run, from its events: the same for every format.

Metadata events name them (Kineto writes process_name / thread_name / ..._sort_index; other readers
emit the same metadata rows); the tracks events use list them. A track of device work (a kernel's
device and stream) is a stream, not a host thread.
"""

from __future__ import annotations

from tracekit.db.run_set import OF_RUNS, of_runs
from tracekit.db.schema import DEVICE_KINDS


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def fill_entities(con, run_ids: int | list[int]) -> None:
    """processes / threads / streams of these runs (one statement each for a batch of files), from
    metadata events and from the tracks events use."""
    bounds = of_runs(run_ids)
    con.execute(
        f"""
        INSERT INTO processes
        SELECT run_id, pid,
               max(CASE WHEN name = 'process_name' THEN args->>'name' END),
               max(CASE WHEN name = 'process_labels' THEN args->>'labels' END),
               max(CASE WHEN name = 'process_sort_index' THEN TRY_CAST(args->>'sort_index' AS BIGINT) END)
        FROM event_rows WHERE {OF_RUNS} AND kind = 'metadata' AND pid IS NOT NULL
          AND name IN ('process_name', 'process_labels', 'process_sort_index')
        GROUP BY run_id, pid
        """,
        bounds,
    )
    device_kinds = ", ".join(_sql_str(k) for k in DEVICE_KINDS)
    con.execute(
        f"""
        INSERT INTO threads
        WITH named AS (
            SELECT run_id, pid, tid,
                   -- a thread can be named twice (its Python name and the interpreter's); keep the specific one
                   arg_min(args->>'name', (args->>'name' SIMILAR TO '.*\\((python[0-9.]*|pt_main_thread)\\)', rowid))
                       FILTER (WHERE name = 'thread_name') AS name,
                   max(CASE WHEN name = 'thread_sort_index' THEN TRY_CAST(args->>'sort_index' AS BIGINT) END) AS sort_index
            FROM event_rows WHERE {OF_RUNS} AND kind = 'metadata' AND tid IS NOT NULL AND pid IS NOT NULL
              AND name IN ('thread_name', 'thread_sort_index')
            GROUP BY run_id, pid, tid
        ), used AS (
            SELECT DISTINCT run_id, pid, tid FROM event_rows
            WHERE {OF_RUNS} AND kind NOT IN ('metadata', {device_kinds}) AND pid IS NOT NULL AND tid IS NOT NULL
              AND NOT (kind = 'flow' AND ph = 'f')
        )
        , device_tracks AS (
            SELECT DISTINCT run_id, pid, tid FROM event_rows WHERE {OF_RUNS} AND kind IN ({device_kinds})
        )
        SELECT t.run_id, t.pid, t.tid, t.name, t.sort_index
        FROM (SELECT run_id, pid, tid, named.name, named.sort_index
              FROM used FULL OUTER JOIN named USING (run_id, pid, tid)) t
        ANTI JOIN device_tracks d ON t.run_id = d.run_id AND t.pid = d.pid AND t.tid = d.tid
        """,
        bounds,
    )
    con.execute(
        f"""
        INSERT INTO streams
        SELECT s.run_id, s.device, s.stream, max(m.args->>'name')
        FROM (SELECT DISTINCT run_id, device, stream FROM event_rows
              WHERE {OF_RUNS} AND kind IN ({device_kinds}) AND device IS NOT NULL AND stream IS NOT NULL) s
        LEFT JOIN (SELECT run_id, pid, tid, args FROM event_rows
                   WHERE {OF_RUNS} AND kind = 'metadata' AND name = 'thread_name') m
             ON m.run_id = s.run_id AND m.pid = s.device AND m.tid = s.stream
        GROUP BY s.run_id, s.device, s.stream
        """,
        bounds,
    )
