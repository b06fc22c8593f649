"""parent_id / depth of complete (ph X) events: the call tree on each thread and each GPU stream.

A sweep over start and end points per track gives each event's nesting level; its parent is then
the latest earlier start one level up (an ASOF join), both set-based so they run inside DuckDB.
Ties: at the same instant ends come before starts (adjacent siblings do not nest), the longer of two
events that start together is the outer one, and a zero-length event ends after it starts.

Python frames (python_function) form their own tree: record_function annotations open inside one
frame (`__enter__`) and close in another, so frames and ops do not nest with each other. An op's
Python stack is found by time instead (tracekit.engine.toolkit.Context.code_path).
"""

from tracekit.db.run_set import OF_RUNS, of_runs

NESTING_SQL = f"""
CREATE OR REPLACE TEMP TABLE _nesting AS
WITH x AS (
    SELECT rowid AS id, hash(run_id, pid, tid, track, kind = 'python_function') AS track_key, ts_ns AS ts,
           ts_ns + dur_ns AS te, dur_ns
    FROM event_rows
    WHERE {OF_RUNS}
      AND ph = 'X' AND dur_ns IS NOT NULL AND kind <> 'profiler_span'
      -- GPU work only nests under gpu_user_annotation ranges; without any in its run, its tracks are flat
      AND (kind NOT IN ('kernel', 'gpu_memcpy', 'gpu_memset') OR list_contains($gpu_ranges, run_id))
), points AS (
    SELECT track_key, id, ts AS t, 1 AS typ, -dur_ns AS k2 FROM x
    UNION ALL
    SELECT track_key, id, te AS t, CASE WHEN dur_ns = 0 THEN 2 ELSE 0 END AS typ, 0 AS k2 FROM x
), swept AS (
    SELECT track_key, id, typ,
           sum(CASE WHEN typ = 1 THEN 1 ELSE -1 END) OVER w AS level,
           row_number() OVER w AS pos
    FROM points
    WINDOW w AS (PARTITION BY track_key ORDER BY t, typ, k2, id ROWS UNBOUNDED PRECEDING)
), starts AS (
    SELECT track_key, id, pos, CAST(level - 1 AS INTEGER) AS depth FROM swept WHERE typ = 1
)
SELECT c.id, p.id AS parent_id, c.depth
FROM starts c ASOF LEFT JOIN starts p
  ON c.track_key = p.track_key AND c.depth - 1 = p.depth AND c.pos > p.pos
"""


def compute_nesting(con, run_ids: int | list[int]) -> None:
    """Sets parent_id/depth of nested events of these runs (one statement for a batch of files);
    roots keep NULL, which the events view shows as depth 0."""
    bounds = of_runs(run_ids)
    gpu_ranges = [
        r[0]
        for r in con.execute(
            f"SELECT DISTINCT run_id FROM event_rows WHERE {OF_RUNS} AND kind = 'gpu_user_annotation'", bounds
        ).fetchall()
    ]
    con.execute(NESTING_SQL, {**bounds, "gpu_ranges": gpu_ranges})
    con.execute(
        """
        UPDATE event_rows SET parent_id = n.parent_id, depth = n.depth
        FROM _nesting n WHERE event_rows.rowid = n.id AND n.depth > 0
        """
    )
    con.execute("DROP TABLE _nesting")
