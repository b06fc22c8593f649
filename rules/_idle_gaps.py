"""Idle gaps between the activities of each GPU stream, each with its cause (what G001 gpu-idle measures).

The device-level gaps are the `idle_gaps` view; G001 asks the same question per stream: a gap is
the time from the end of a stream's earlier activities to the next activity that starts after all
of them ended, with the call that launched that activity (`first_launches`). other_busy_ns is the
device's busy time inside the gap (`gpu_busy_between`): the stream itself is idle there, so any
busy time is other streams' work, and gap_ns - other_busy_ns is idle time of the whole device.

Unless $all_phases, only the steady state is measured (`run_phases`): a gap is cut to its steady
pieces (`steady_pieces`), so warm-up, capture and profiler windows count neither as idle time nor in
the stream's active window (active_ns, its steady time between first_ns and last_ns).
"""

from __future__ import annotations

from tracekit.engine.toolkit import rows
from tracekit.rules import _phases

CAUSES = ("host", "other_gpu", "kernel_wait", "other")

# One row per gap of a stream of run $run_id (of every run when it is NULL); the cause is idle_gaps' (host: the launch returned after
# the gap began; kernel_wait: shorter than $kernel_wait_ns) with other_gpu, other streams busy for at
# least half of the gap, tested before kernel_wait.
GAPS_SQL = """
WITH on_stream AS (
    -- a gap ends at an activity that starts after every earlier activity of its stream ended; one
    -- window over the activities names that activity directly (a union of the stream's intervals
    -- would have to be joined back to the activities to find it)
    SELECT run_id, device, stream, event_id AS next_event_id, ts_ns AS end_ns,
           max(end_ns) OVER (PARTITION BY run_id, device, stream ORDER BY ts_ns, event_id
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS start_ns,
           min(ts_ns) OVER (PARTITION BY run_id, device, stream) AS stream_first_ns,
           max(end_ns) OVER (PARTITION BY run_id, device, stream) AS stream_last_ns,
           count(*) OVER (PARTITION BY run_id, device, stream) AS stream_activities
    FROM gpu_activities WHERE run_id = coalesce($run_id, run_id)
), whole_gaps AS (
    SELECT * FROM on_stream WHERE end_ns > start_ns
), gaps AS (
    SELECT *, end_ns - start_ns AS gap_ns FROM steady_pieces('whole_gaps', all_phases := $all_phases)
), active AS (
    -- read off the activities, not on_stream: a second reader of on_stream makes DuckDB materialize it,
    -- and the busy lookups over its gaps then join every gap with every other
    SELECT run_id, device, stream, min(ts_ns) AS start_ns, max(end_ns) AS end_ns
    FROM gpu_activities WHERE run_id = coalesce($run_id, run_id) GROUP BY ALL
), active_steady AS (
    SELECT run_id, device, stream, steady_ns AS active_ns FROM steady_between('active', all_phases := $all_phases)
), ended AS (
    SELECT g.* EXCLUDE (busy_ns), g.busy_ns AS other_busy_ns, a.active_ns,
           l.runtime_event_id, l.runtime_name, l.launch_ts_ns, l.launch_end_ns, l.tid AS launch_tid
    FROM gpu_busy_between('gaps', 'all', in_run := $run_id) g
    JOIN active_steady a USING (run_id, device, stream)
    LEFT JOIN first_launches l ON l.run_id = g.run_id AND l.gpu_event_id = g.next_event_id
)
SELECT *,
       CASE WHEN launch_end_ns > start_ns THEN 'host'
            WHEN 2 * other_busy_ns >= gap_ns THEN 'other_gpu'
            WHEN gap_ns < $kernel_wait_ns THEN 'kernel_wait'
            ELSE 'other' END AS cause
FROM ended
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
    any_value(stream_activities) AS activities,
    any_value(active_ns) AS active_ns
"""

# One stream's summary, self-contained: G001's evidence query (idle_ns, the first column, is observed).
STREAM_SQL = "SELECT" + SUMMARY_COLUMNS + "FROM (" + GAPS_SQL + ") g\nWHERE device = $device AND stream = $stream"

# The rule reads the gaps of every run from a temp table built once (a query per run would cost more
# in planning than in work on a database of many small runs); the evidence query stays self-contained.
GAPS_TABLE = "_g001_gaps"

STREAMS_SQL = (
    f"SELECT run_id, device, stream, {SUMMARY_COLUMNS} FROM {GAPS_TABLE} WHERE list_contains($run_ids, run_id)\n"
    "GROUP BY run_id, device, stream ORDER BY run_id, device, stream"
)

# The streams asked for: (run, device, stream) zipped from $runs, $devices and $streams.
_ASKED = """asked AS (
    SELECT unnest($runs) AS run_id, unnest($devices) AS device, unnest($streams) AS stream
)"""

# The next activity's kind and name are looked up for the listed gaps only: carried through the gap
# table they make the busy-time lookup over every gap markedly slower on large traces.
TOP_GAPS_SQL = f"""
WITH {_ASKED}, tops AS (
    -- a top-N aggregate keeps N rows a stream as it scans: a window over the gaps would sort them all
    SELECT g.run_id, g.device, g.stream,
           arg_max({{'next_event_id': next_event_id, 'start_ns': start_ns, 'end_ns': end_ns, 'gap_ns': gap_ns,
                     'cause': cause, 'runtime_event_id': runtime_event_id, 'runtime_name': runtime_name,
                     'other_busy_ns': other_busy_ns}}, (gap_ns, -next_event_id), $top) AS top
    FROM {GAPS_TABLE} g SEMI JOIN asked a ON a.run_id = g.run_id AND a.device = g.device AND a.stream = g.stream
    GROUP BY g.run_id, g.device, g.stream
), top AS (
    SELECT run_id, device, stream, unnest(top, recursive := true) FROM tops
)
SELECT top.*, e.kind AS next_kind, e.name AS next_name
FROM top JOIN events e ON e.event_id = top.next_event_id
ORDER BY run_id, device, stream, gap_ns DESC, next_event_id
"""

# Host gaps grouped by what launched the activity after them: the launching thread and the
# runtime call's parent (the op or Python frame that issued the launch), by its name key, so a
# site whose annotation carries a per-run id is one site.
HOST_SITES_SQL = f"""
WITH {_ASKED}
SELECT g.run_id, g.device, g.stream, g.launch_tid, name_key(coalesce(p.name, g.runtime_name)) AS site,
       count(*) AS gaps, sum(g.gap_ns) AS idle_ns, arg_max(g.runtime_event_id, g.gap_ns) AS worst_runtime_event_id
FROM {GAPS_TABLE} g
SEMI JOIN asked a ON a.run_id = g.run_id AND a.device = g.device AND a.stream = g.stream
LEFT JOIN events r ON r.event_id = g.runtime_event_id LEFT JOIN events p ON p.event_id = r.parent_id
WHERE g.cause = 'host'
GROUP BY g.run_id, g.device, g.stream, g.launch_tid, name_key(coalesce(p.name, g.runtime_name))
QUALIFY row_number() OVER (PARTITION BY g.run_id, g.device, g.stream ORDER BY idle_ns DESC, site) <= 3
ORDER BY g.run_id, g.device, g.stream, idle_ns DESC, site
"""


def build_gap_table(con, ctx, params) -> None:
    """The gaps of every run, which the queries below read."""
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {GAPS_TABLE} AS {_phases.in_rule(con, ctx, GAPS_SQL)}",
        {"run_id": None, "kernel_wait_ns": params["kernel_wait_ns"], "all_phases": params["all_phases"]},
    )


def stream_summaries(con, run_ids: list[int], params) -> dict[int, list]:
    """Per run, per (device, stream): idle time by cause, exposed idle, gaps, the active window."""
    out: dict[int, list] = {}
    for s in rows(con, STREAMS_SQL, {"run_ids": run_ids, "short_gap_ns": params["short_gap_ns"]}):
        out.setdefault(s.run_id, []).append(s)
    return out


def gaps_and_sites(con, ctx, streams: list[tuple], top: int) -> dict[tuple, tuple[list[dict], list[dict]]]:
    """Per (run, device, stream) asked: its longest gaps, with the launch (call, op, code path) that
    ended each, and the call sites whose launches ended the most host-caused idle time. Every stream's
    rows come from one statement each, and the launches' ops and code paths are looked up together."""
    if not streams:
        return {}
    asked = {
        "runs": [r for r, _, _ in streams],
        "devices": [d for _, d, _ in streams],
        "streams": [s for *_, s in streams],
    }
    gaps = rows(con, TOP_GAPS_SQL, {**asked, "top": top})
    found = rows(con, HOST_SITES_SQL, asked)
    launches = [g.runtime_event_id for g in gaps] + [h.worst_runtime_event_id for h in found]
    # the outermost op (aten::linear rather than aten::addmm) names the model code
    ops, paths = ctx.enclosing_ops(launches, outermost=True), ctx.code_paths(launches)
    pids = ctx.pids_of(h.worst_runtime_event_id for h in found)
    out: dict[tuple, tuple[list[dict], list[dict]]] = {key: ([], []) for key in streams}
    for g in gaps:
        item = {
            "window_ns": [int(g.start_ns), int(g.end_ns)],
            "gap_ns": int(g.gap_ns),
            "cause": g.cause,
            "next_activity": {"event_id": int(g.next_event_id), "kind": g.next_kind, "name": g.next_name},
            "other_streams_busy_ns": int(g.other_busy_ns),
        }
        if g.runtime_event_id is not None:
            op = ops[g.runtime_event_id]
            item["launch"] = {
                "runtime_event_id": int(g.runtime_event_id),
                "call": g.runtime_name,
                "op": op.name if op else None,
                "input_shapes": op.input_dims if op else None,
                "code_path": paths[g.runtime_event_id],
            }
        out[g.run_id, g.device, g.stream][0].append(item)
    for h in found:
        worst = h.worst_runtime_event_id
        op = ops.get(worst)
        out[h.run_id, h.device, h.stream][1].append(
            {
                "tid": h.launch_tid,
                "thread_name": ctx.thread_name(h.run_id, pids.get(worst), h.launch_tid) if worst is not None else None,
                "site": h.site,
                "gaps": int(h.gaps),
                "idle_ns": int(h.idle_ns),
                "op": op.name if op else None,
                "code_path": paths.get(worst, []),
                "sample_runtime_event_id": int(worst) if worst is not None else None,
            }
        )
    return out
