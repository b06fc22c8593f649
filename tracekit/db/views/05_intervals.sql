-- Interval arithmetic: the union of intervals, and busy time inside windows read off that union.
-- Written once here; `gpu_busy_layers`, `steps` and the summary's thread time use them.

-- The union of a set of intervals per (run, lane), as disjoint ordered blocks. `interval_source` names a
-- table, view or CTE with columns run_id, lane (any type: a device, a thread, a struct of both),
-- ts_ns and end_ns. Returns run_id, lane, start_ns, end_ns, dur_ns, intervals (how many it merges),
-- busy_before_ns / busy_through_ns (union time of the lane before the block starts / through its
-- end) and next_gap_ns (time until the lane's next block; NULL for the last).
--
-- Cost: one sort of the intervals per lane (a sweep: an interval starts a block when it starts after
-- every earlier one has ended), O(n log n).
CREATE OR REPLACE MACRO interval_union(interval_source) AS TABLE
WITH _marked AS (
    SELECT run_id, lane, ts_ns, end_ns,
           CASE WHEN ts_ns <= max(end_ns) OVER (PARTITION BY run_id, lane ORDER BY ts_ns, end_ns
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                THEN 0 ELSE 1 END AS starts_block
    FROM query_table(interval_source)
), _numbered AS (
    SELECT run_id, lane, ts_ns, end_ns,
           sum(starts_block) OVER (PARTITION BY run_id, lane ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS block
    FROM _marked
), _merged AS (
    SELECT run_id, lane, min(ts_ns) AS start_ns, max(end_ns) AS end_ns, count(*) AS intervals
    FROM _numbered GROUP BY run_id, lane, block
)
SELECT run_id, lane, start_ns, end_ns, end_ns - start_ns AS dur_ns, intervals,
       sum(end_ns - start_ns) OVER _w - (end_ns - start_ns) AS busy_before_ns,
       sum(end_ns - start_ns) OVER _w AS busy_through_ns,
       lead(start_ns) OVER (PARTITION BY run_id, lane ORDER BY start_ns) - end_ns AS next_gap_ns
FROM _merged
WINDOW _w AS (PARTITION BY run_id, lane ORDER BY start_ns ROWS UNBOUNDED PRECEDING);

-- Busy time inside each of a set of windows, from the blocks of `interval_union`, without a range
-- join. `windows` names a relation with run_id, lane, start_ns, end_ns (any other columns pass
-- through); `blocks` one with run_id, lane, start_ns, end_ns, busy_before_ns (disjoint blocks per
-- lane). Returns every window row with `busy_ns` added: B(end_ns) - B(start_ns), where B(t) =
-- busy_before_ns + (least(t, end_ns) - start_ns) of the last block starting at or before t.
--
-- Cost: two ASOF joins of the windows against the blocks, O((windows + blocks) log). The range join
-- `b.start_ns < w.end_ns AND b.end_ns > w.start_ns` with an equality on the lane is planned as a
-- hash join with a residual filter instead, orders of magnitude slower on large traces.
CREATE OR REPLACE MACRO busy_between(windows, blocks) AS TABLE
WITH _windows AS MATERIALIZED (
    SELECT *, row_number() OVER () AS _window FROM query_table(windows)
), _blocks AS (
    SELECT run_id, lane, start_ns AS _block_start, end_ns AS _block_end, busy_before_ns AS _before FROM query_table(blocks)
), _at_start AS (
    SELECT w._window, coalesce(b._before + least(w.start_ns, b._block_end) - b._block_start, 0) AS busy
    FROM _windows w ASOF LEFT JOIN _blocks b ON w.run_id = b.run_id AND w.lane = b.lane AND w.start_ns >= b._block_start
), _at_end AS (
    SELECT w._window, coalesce(b._before + least(w.end_ns, b._block_end) - b._block_start, 0) AS busy
    FROM _windows w ASOF LEFT JOIN _blocks b ON w.run_id = b.run_id AND w.lane = b.lane AND w.end_ns >= b._block_start
)
SELECT w.* EXCLUDE (_window), CAST(e.busy - s.busy AS BIGINT) AS busy_ns
FROM _windows w JOIN _at_start s USING (_window) JOIN _at_end e USING (_window)
ORDER BY w._window;
