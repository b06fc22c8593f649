"""The summary section of the output: where the time went, per run, before any rule speaks.

`top_costs(con, limit)` returns plain dicts and lists (JSON-serializable, deterministic order, every
list bounded by `limit`), one entry per run: its window, GPU busy time per device (union of kernel,
memcpy and memset intervals), the top kernels, the top CPU ops by (name, input dims), busy time per
GPU stream and CPU time per thread. Each part is one GROUP BY (or one window pass) over all runs, so
it stays fast on databases of millions of events.
"""

from __future__ import annotations

GPU_BUSY_SQL = """
SELECT run_id, device, CAST(sum(dur_ns) AS BIGINT) AS busy_ns, count(*) AS busy_blocks
FROM gpu_busy GROUP BY run_id, device ORDER BY run_id, device
"""

GPU_SUMS_SQL = """
SELECT run_id, device, count(*) AS activities, CAST(sum(dur_ns) AS BIGINT) AS activity_ns,
       CAST(sum(dur_ns) FILTER (WHERE kind = 'kernel') AS BIGINT) AS kernel_ns,
       CAST(sum(dur_ns) FILTER (WHERE kind = 'gpu_memcpy') AS BIGINT) AS memcpy_ns,
       CAST(sum(dur_ns) FILTER (WHERE kind = 'gpu_memset') AS BIGINT) AS memset_ns
FROM gpu_activities GROUP BY run_id, device
"""

TOP_KERNELS_SQL = """
SELECT run_id, name, count(*) AS count, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
       CAST(round(avg(dur_ns)) AS BIGINT) AS mean_ns, CAST(max(dur_ns) AS BIGINT) AS max_ns,
       bool_or(is_communication) AS is_communication, count(*) OVER (PARTITION BY run_id) AS distinct_kernels
FROM kernels WHERE dur_ns IS NOT NULL
GROUP BY run_id, name
QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY sum(dur_ns) DESC, name) <= $limit
ORDER BY run_id, total_ns DESC, name
"""

# Self time: an op's duration minus the durations of its direct children on the same thread (any kind).
TOP_OPS_SQL = """
WITH child AS (
    SELECT parent_id, sum(dur_ns) AS child_ns FROM events
    WHERE parent_id IS NOT NULL AND dur_ns IS NOT NULL GROUP BY parent_id
), ops AS (
    SELECT o.run_id, o.name, coalesce(o.input_dims, '') AS input_dims, o.dur_ns,
           greatest(o.dur_ns - coalesce(c.child_ns, 0), 0) AS self_ns
    FROM cpu_ops o LEFT JOIN child c ON c.parent_id = o.event_id
    WHERE o.dur_ns IS NOT NULL
)
SELECT run_id, name, input_dims, count(*) AS count, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
       CAST(sum(self_ns) AS BIGINT) AS self_ns, CAST(round(avg(dur_ns)) AS BIGINT) AS mean_ns,
       count(*) OVER (PARTITION BY run_id) AS distinct_ops
FROM ops GROUP BY run_id, name, input_dims
QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY sum(self_ns) DESC, name, input_dims) <= $limit
ORDER BY run_id, self_ns DESC, name, input_dims
"""

STREAMS_SQL = """
SELECT g.run_id, g.device, g.stream, any_value(s.name) AS name, count(*) AS activities,
       CAST(sum(g.dur_ns) AS BIGINT) AS busy_ns,
       CAST(sum(g.dur_ns) FILTER (WHERE g.kind = 'kernel') AS BIGINT) AS kernel_ns,
       count(*) OVER (PARTITION BY g.run_id) AS streams
FROM gpu_activities g
LEFT JOIN streams s ON s.run_id = g.run_id AND s.device = g.device AND s.stream = g.stream
GROUP BY g.run_id, g.device, g.stream
QUALIFY row_number() OVER (PARTITION BY g.run_id ORDER BY sum(g.dur_ns) DESC, g.device, g.stream) <= $limit
ORDER BY g.run_id, busy_ns DESC, g.device, g.stream
"""

# Top-level host events can overlap (a Python frame and a user annotation that straddle each other both sit at
# depth 0), so a thread's time is the union of its top-level intervals (interval_union), not their sum. The
# profiler's span and bookkeeping and runtime-event logs are not CPU time of a thread.
THREADS_SQL = """
WITH top AS (
    SELECT run_id, {'pid': pid, 'tid': tid} AS lane, ts_ns, end_ns FROM events
    WHERE depth = 0 AND dur_ns > 0 AND NOT is_device_kind(kind) AND kind NOT IN ('profiler_span', 'overhead', 'runtime_event')
), merged AS (
    SELECT run_id, lane.pid AS pid, lane.tid AS tid, intervals AS events, dur_ns AS busy_ns FROM interval_union('top')
)
SELECT m.run_id, m.pid, m.tid, any_value(t.name) AS name, CAST(sum(m.events) AS BIGINT) AS top_level_events,
       CAST(sum(m.busy_ns) AS BIGINT) AS cpu_ns, count(*) OVER (PARTITION BY m.run_id) AS threads
FROM merged m
LEFT JOIN threads t ON t.run_id = m.run_id AND t.pid = m.pid AND t.tid = m.tid
GROUP BY m.run_id, m.pid, m.tid
QUALIFY row_number() OVER (PARTITION BY m.run_id ORDER BY sum(m.busy_ns) DESC, m.pid, m.tid) <= $limit
ORDER BY m.run_id, cpu_ns DESC, m.pid, m.tid
"""

# What each list holds and how it is ordered; shipped in the output so readers need not guess.
COLUMNS = {
    "gpu.devices": "per device: busy_ns = union of kernel/memcpy/memset intervals; busy_share of the run window",
    "top_kernels": "by kernel name, ordered by total_ns desc; share_of_gpu_busy = total_ns / the run's GPU busy_ns",
    "top_cpu_ops": "by (name, input_dims), ordered by self_ns desc; total_ns is inclusive, self_ns excludes direct children",
    "streams": "per (device, stream), ordered by busy_ns desc; busy_ns = sum of activity durations on the stream",
    "threads": "per (pid, tid), ordered by cpu_ns desc; cpu_ns = union of the thread's top-level (depth 0) host events",
    "distinct": "how many kernels, op groups, streams and threads the run has before the limit",
}


def _share(part, whole) -> float | None:
    return round(part / whole, 4) if whole else None


def _rows(con, sql: str, params: dict | None = None) -> list[dict]:
    cur = con.execute(sql, params or {})
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row)) for row in cur.fetchall()]


def top_costs(con, limit: int = 10) -> dict:
    """Summary of where time went, per run; see the module docstring. `limit` bounds every list."""
    limit = max(1, int(limit))
    runs = _rows(con, "SELECT run_id, label, rank, start_ns, end_ns FROM runs ORDER BY run_id")
    by_run: dict[int, dict] = {}
    for r in runs:
        window = int(r["end_ns"] - r["start_ns"]) if r["start_ns"] is not None and r["end_ns"] is not None else 0
        by_run[r["run_id"]] = {
            "run_id": r["run_id"],
            "label": r["label"],
            "rank": r["rank"],
            "window_ns": [r["start_ns"], r["end_ns"]],
            "window_duration_ns": window,
            "gpu": {"devices": [], "busy_ns": 0},
            "top_kernels": [],
            "top_cpu_ops": [],
            "streams": [],
            "threads": [],
            "distinct": {"kernels": 0, "cpu_ops": 0, "streams": 0, "threads": 0},
        }

    sums = {(r["run_id"], r["device"]): r for r in _rows(con, GPU_SUMS_SQL)}
    for b in _rows(con, GPU_BUSY_SQL):
        run = by_run.get(b["run_id"])
        if run is None:
            continue
        s = sums.get((b["run_id"], b["device"]), {})
        run["gpu"]["devices"].append(
            {
                "device": b["device"],
                "busy_ns": int(b["busy_ns"]),
                "busy_share": _share(b["busy_ns"], run["window_duration_ns"]),
                "activities": int(s.get("activities") or 0),
                "kernel_ns": int(s.get("kernel_ns") or 0),
                "memcpy_ns": int(s.get("memcpy_ns") or 0),
                "memset_ns": int(s.get("memset_ns") or 0),
            }
        )
        run["gpu"]["busy_ns"] += int(b["busy_ns"])
    for run in by_run.values():
        run["gpu"]["devices"] = run["gpu"]["devices"][:limit]

    for k in _rows(con, TOP_KERNELS_SQL, {"limit": limit}):
        run = by_run.get(k["run_id"])
        if run is None:
            continue
        run["distinct"]["kernels"] = int(k["distinct_kernels"])
        run["top_kernels"].append(
            {
                "name": k["name"],
                "count": int(k["count"]),
                "total_ns": int(k["total_ns"]),
                "mean_ns": int(k["mean_ns"]),
                "max_ns": int(k["max_ns"]),
                "share_of_gpu_busy": _share(k["total_ns"], run["gpu"]["busy_ns"]),
                "is_communication": bool(k["is_communication"]),
            }
        )

    for o in _rows(con, TOP_OPS_SQL, {"limit": limit}):
        run = by_run.get(o["run_id"])
        if run is None:
            continue
        run["distinct"]["cpu_ops"] = int(o["distinct_ops"])
        run["top_cpu_ops"].append(
            {
                "name": o["name"],
                "input_dims": o["input_dims"] or None,
                "count": int(o["count"]),
                "self_ns": int(o["self_ns"]),
                "total_ns": int(o["total_ns"]),
                "mean_ns": int(o["mean_ns"]),
                "self_share_of_window": _share(o["self_ns"], run["window_duration_ns"]),
            }
        )

    for s in _rows(con, STREAMS_SQL, {"limit": limit}):
        run = by_run.get(s["run_id"])
        if run is None:
            continue
        run["distinct"]["streams"] = int(s["streams"])
        run["streams"].append(
            {
                "device": s["device"],
                "stream": s["stream"],
                "name": s["name"].strip() if s["name"] else None,
                "activities": int(s["activities"]),
                "busy_ns": int(s["busy_ns"]),
                "kernel_ns": int(s["kernel_ns"] or 0),
                "busy_share": _share(s["busy_ns"], run["window_duration_ns"]),
            }
        )

    for t in _rows(con, THREADS_SQL, {"limit": limit}):
        run = by_run.get(t["run_id"])
        if run is None:
            continue
        run["distinct"]["threads"] = int(t["threads"])
        run["threads"].append(
            {
                "pid": t["pid"],
                "tid": t["tid"],
                "name": t["name"],
                "top_level_events": int(t["top_level_events"]),
                "cpu_ns": int(t["cpu_ns"]),
                "share_of_window": _share(t["cpu_ns"], run["window_duration_ns"]),
            }
        )

    return {"limit": limit, "time_unit": "ns", "columns": COLUMNS, "runs": [by_run[r["run_id"]] for r in runs]}
