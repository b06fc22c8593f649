"""Which intervals (activities, ops, host calls) fall in which of the diff's windows, without a range join.

The range join `a.ts_ns < w.end_ns AND a.end_ns > w.ts_ns` with an equality on the run is planned as a
hash join with a residual filter: every window against every interval of its run, so its cost grows with
the number of steps times the trace (docs/schema.md). Here the windows of each (side, run) are numbered
by start; an interval can only overlap the windows from the first whose reach (the latest end among it
and the windows before it) passes the interval's start, to the last that starts before the interval's
end. Two ASOF lookups find that range, its windows are enumerated by index and the exact overlap test
keeps the ones that hit: for disjoint windows (steps, a run) about one candidate per interval, and exact
for any windows.
"""

from __future__ import annotations

# The group's windows per slot (one side's run; `device` is its main device), numbered by start.
_WINDOWS = """
w AS MATERIALIZED (
    SELECT side, run_id, device, ts_ns AS start_ns, end_ns, dense_rank() OVER (ORDER BY side, run_id) AS slot,
           row_number() OVER (PARTITION BY side, run_id ORDER BY ts_ns, end_ns) AS k
    FROM diff_windows WHERE grp = $grp
), reach AS (
    SELECT slot, max(end_ns) OVER (PARTITION BY slot ORDER BY k ROWS UNBOUNDED PRECEDING) AS reach, k FROM w
), first_reaching AS (SELECT slot, reach, min(k) AS k FROM reach GROUP BY slot, reach),
last_starting AS (SELECT slot, start_ns, max(k) AS k FROM w GROUP BY slot, start_ns)"""


def hits_sql(intervals: str, on_device: bool, starts_only: bool = False) -> str:
    """One row (id, side, ns) per interval of `intervals` and window of the group `$grp` that hit:
    ns is the interval's time clipped to the window. `intervals` is SQL with run_id, id, ts_ns, end_ns
    and, when `on_device`, device: GPU work counts on the window's device only. With `starts_only`, an
    interval hits the windows its start falls in (start_ns <= ts_ns < end_ns), whatever its end."""
    keys = "run_id, device" if on_device else "run_id"
    last_start = "i.ts_ns >= l.start_ns" if starts_only else "i.end_ns > l.start_ns"
    hit = (
        "w.start_ns <= r.ts_ns AND r.ts_ns < w.end_ns"
        if starts_only
        else "r.ts_ns < w.end_ns AND r.end_ns > w.start_ns"
    )
    return f"""
WITH {_WINDOWS},
slots AS (SELECT DISTINCT slot, {keys} FROM w),
iv AS (SELECT s.slot, i.id, i.ts_ns, i.end_ns FROM ({intervals}) i JOIN slots s USING ({keys})),
ranged AS (
    SELECT i.slot, i.id, i.ts_ns, i.end_ns, f.k AS first_k, l.k AS last_k
    FROM iv i
    ASOF JOIN first_reaching f ON f.slot = i.slot AND i.ts_ns < f.reach
    ASOF JOIN last_starting l ON l.slot = i.slot AND {last_start}
    WHERE f.k <= l.k
)
SELECT r.id, w.side, least(r.end_ns, w.end_ns) - greatest(r.ts_ns, w.start_ns) AS ns
FROM (SELECT slot, id, ts_ns, end_ns, unnest(range(first_k, last_k + 1)) AS k FROM ranged) r
JOIN w USING (slot, k)
WHERE {hit}
"""
