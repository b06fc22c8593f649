"""Idle gaps between consecutive GPU activities of a stream, each with its cause (what G001 measures).

One row per gap of run $run_id: the gap before activity event_id, from prev_end to ts_ns, the busy
time of the device's other streams during it, and the runtime call that launched the activity.
Device busy time is the union of all activities on the device; B(t), the busy time up to t, is
cum_end - max(e - t, 0) for the last merged interval [s, e) starting at or before t (cum_end: busy
time through e), found by a sweep (a window over intervals and probes; ASOF joins fall back to
nested loops when the left side looks small). other_busy_ns = B(ts_ns) - B(prev_end): the stream
itself is idle in the gap, so any device busy time there is other streams' work.
"""

from __future__ import annotations

from tracekit.engine.toolkit import rows

CAUSES = ("host", "other_gpu", "kernel_wait", "other")

GAPS_SQL = """
WITH win AS (
    SELECT start_ns, end_ns FROM runs WHERE run_id = $run_id
), act AS (
    SELECT g.event_id, g.kind, g.name, g.device, g.stream, g.ts_ns, g.end_ns
    FROM gpu_activities g, win
    WHERE g.run_id = $run_id AND g.ts_ns >= win.start_ns AND g.end_ns <= win.end_ns
), busy AS (
    SELECT device, start_ns AS s, end_ns AS e, busy_through_ns AS cum_end FROM gpu_busy WHERE run_id = $run_id
), seq AS (
    SELECT a.*,
           max(a.end_ns) OVER (PARTITION BY a.device, a.stream ORDER BY a.ts_ns, a.event_id
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end,
           min(a.ts_ns) OVER (PARTITION BY a.device, a.stream) AS stream_first_ns,
           max(a.end_ns) OVER (PARTITION BY a.device, a.stream) AS stream_last_ns,
           count(*) OVER (PARTITION BY a.device, a.stream) AS stream_activities
    FROM act a
), launch AS (
    SELECT gpu_event_id, runtime_event_id, runtime_name, launch_ts_ns, launch_ts_ns + launch_dur_ns AS launch_end_ns,
           tid AS launch_tid
    FROM launches WHERE run_id = $run_id
    QUALIFY row_number() OVER (PARTITION BY gpu_event_id ORDER BY launch_ts_ns, runtime_event_id) = 1
), gaps AS (
    SELECT s.event_id, s.kind, s.name, s.device, s.stream, s.prev_end, s.ts_ns, s.ts_ns - s.prev_end AS gap_ns,
           s.stream_first_ns, s.stream_last_ns, s.stream_activities,
           l.runtime_event_id, l.runtime_name, l.launch_ts_ns, l.launch_end_ns, l.launch_tid
    FROM seq s LEFT JOIN launch l ON l.gpu_event_id = s.event_id
    WHERE s.ts_ns > s.prev_end
), probes AS (
    -- B(t) at both ends of every gap by a sweep: carry the last merged interval starting at or before t.
    SELECT device, s AS t, 0 AS ord, e, cum_end, NULL::BIGINT AS event_id, NULL::INTEGER AS sign FROM busy
    UNION ALL SELECT device, prev_end, 1, NULL, NULL, event_id, -1 FROM gaps
    UNION ALL SELECT device, ts_ns, 1, NULL, NULL, event_id, 1 FROM gaps
), carried AS (
    SELECT event_id, sign, t, last_value(e IGNORE NULLS) OVER w AS e, last_value(cum_end IGNORE NULLS) OVER w AS cum_end
    FROM probes
    WINDOW w AS (PARTITION BY device ORDER BY t, ord ROWS UNBOUNDED PRECEDING)
), other_busy AS (
    SELECT event_id, sum(sign * coalesce(cum_end - greatest(e - t, 0), 0)) AS other_busy_ns
    FROM carried WHERE sign IS NOT NULL GROUP BY event_id
), at_end AS (
    SELECT g.*, o.other_busy_ns FROM gaps g JOIN other_busy o USING (event_id)
)
SELECT *,
       CASE WHEN launch_end_ns > prev_end THEN 'host'
            WHEN 2 * other_busy_ns >= gap_ns THEN 'other_gpu'
            WHEN gap_ns < $kernel_wait_ns THEN 'kernel_wait'
            ELSE 'other' END AS cause
FROM at_end
"""

# Per-stream summary over the gaps; a stream with a single activity has no gaps and no row.
SUMMARY_COLUMNS = """
    sum(gap_ns) AS idle_ns,
    coalesce(sum(gap_ns) FILTER (WHERE cause = 'host'), 0) AS host_ns,
    coalesce(sum(gap_ns) FILTER (WHERE cause = 'other_gpu'), 0) AS other_gpu_ns,
    coalesce(sum(gap_ns) FILTER (WHERE cause = 'kernel_wait'), 0) AS kernel_wait_ns,
    coalesce(sum(gap_ns) FILTER (WHERE cause = 'other'), 0) AS other_ns,
    sum(gap_ns - other_busy_ns) AS exposed_ns,
    count(*) AS gaps,
    count(*) FILTER (WHERE cause = 'host') AS host_gaps,
    coalesce(sum(gap_ns) FILTER (WHERE cause = 'host' AND gap_ns <= $short_gap_ns), 0) AS host_short_ns,
    median(gap_ns) FILTER (WHERE cause = 'host') AS host_gap_median_ns,
    count(runtime_event_id) AS gaps_with_launch,
    any_value(stream_first_ns) AS first_ns,
    any_value(stream_last_ns) AS last_ns,
    any_value(stream_activities) AS activities
"""

# One stream's summary, self-contained: G001's evidence query (idle_ns, the first column, is observed).
STREAM_SQL = "SELECT" + SUMMARY_COLUMNS + "FROM (" + GAPS_SQL + ") g\nWHERE device = $device AND stream = $stream"

# The per-finding detail queries read the run's gaps from a temp table built once per run: the gap
# sweep is the expensive part, and the evidence query stays self-contained.
GAPS_TABLE = "_g001_gaps"

STREAMS_SQL = (
    f"SELECT device, stream, {SUMMARY_COLUMNS} FROM {GAPS_TABLE} GROUP BY device, stream ORDER BY device, stream"
)

TOP_GAPS_SQL = (
    "SELECT event_id, kind, name, prev_end, ts_ns, gap_ns, cause, runtime_event_id, runtime_name, other_busy_ns\n"
    f"FROM {GAPS_TABLE} g\nWHERE device = $device AND stream = $stream ORDER BY gap_ns DESC, event_id LIMIT $top"
)

# Host gaps grouped by what launched the activity after them: the launching thread and the
# runtime call's parent (the op or Python frame that issued the launch).
HOST_SITES_SQL = (
    "SELECT g.launch_tid, coalesce(p.name, g.runtime_name) AS site, count(*) AS gaps, sum(g.gap_ns) AS idle_ns,\n"
    "       arg_max(g.runtime_event_id, g.gap_ns) AS worst_runtime_event_id\n"
    f"FROM {GAPS_TABLE} g\n"
    "LEFT JOIN events r ON r.event_id = g.runtime_event_id LEFT JOIN events p ON p.event_id = r.parent_id\n"
    "WHERE g.device = $device AND g.stream = $stream AND g.cause = 'host'\n"
    "GROUP BY ALL ORDER BY idle_ns DESC, site LIMIT 3"
)


def stream_summaries(con, run_id: int, params) -> list:
    """Per (device, stream) of the run: idle time by cause, exposed idle, gaps, the active window.
    Builds the run's gap table, which the detail queries below read."""
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {GAPS_TABLE} AS {GAPS_SQL}",
        {"run_id": run_id, "kernel_wait_ns": params["kernel_wait_ns"]},
    )
    return rows(con, STREAMS_SQL, {"short_gap_ns": params["short_gap_ns"]})


def largest_gaps(con, ctx, where: dict, top: int) -> list[dict]:
    """The stream's longest gaps, with the launch (call, op, code path) that ended each."""
    largest = []
    for g in rows(con, TOP_GAPS_SQL, {**where, "top": top}):
        item = {
            "window_ns": [int(g.prev_end), int(g.ts_ns)],
            "gap_ns": int(g.gap_ns),
            "cause": g.cause,
            "next_activity": {"event_id": int(g.event_id), "kind": g.kind, "name": g.name},
            "other_streams_busy_ns": int(g.other_busy_ns),
        }
        if g.runtime_event_id is not None:
            # the outermost op (aten::linear rather than aten::addmm) names the model code
            op = ctx.enclosing_op(g.runtime_event_id, outermost=True)
            item["launch"] = {
                "runtime_event_id": int(g.runtime_event_id),
                "call": g.runtime_name,
                "op": op.name if op else None,
                "input_shapes": op.input_dims if op else None,
                "code_path": ctx.code_path(g.runtime_event_id),
            }
        largest.append(item)
    return largest


def host_sites(con, ctx, run_id: int, where: dict) -> list[dict]:
    """The call sites whose launches ended the most host-caused idle time."""
    sites = []
    for h in rows(con, HOST_SITES_SQL, where):
        worst = h.worst_runtime_event_id
        op = ctx.enclosing_op(worst, outermost=True)
        sites.append(
            {
                "tid": h.launch_tid,
                "thread_name": ctx.thread_name(run_id, ctx.pid_of(worst), h.launch_tid) if worst is not None else None,
                "site": h.site,
                "gaps": int(h.gaps),
                "idle_ns": int(h.idle_ns),
                "op": op.name if op else None,
                "code_path": ctx.code_path(worst) if worst is not None else [],
                "sample_runtime_event_id": int(worst) if worst is not None else None,
            }
        )
    return sites
