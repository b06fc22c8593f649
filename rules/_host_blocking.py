"""Runtime calls that block the host thread until the GPU catches up, each with the GPU idle time
that follows it (what H001 host-sync measures)."""

from __future__ import annotations

SYNC_CALLS = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipEventSynchronize",
)
_SYNC_LIST = ", ".join(f"'{c}'" for c in SYNC_CALLS)

# One row per blocking call: a call is blocking by name, or by being a synchronous copy/memset, or
# by an async copy whose device side touched pageable memory.
CALLS_SQL = f"""
WITH copies AS (
    SELECT l.runtime_event_id, l.gpu_name, g.bytes
    FROM launches l JOIN gpu_activities g ON g.event_id = l.gpu_event_id
    WHERE l.run_id = $run_id AND l.gpu_kind IN ('gpu_memcpy', 'gpu_memset')
), calls AS (
    SELECT r.event_id, r.run_id, r.name AS call, r.pid, r.tid, r.ts_ns, r.dur_ns, r.parent_id,
           c.gpu_name, c.bytes
    FROM runtime_calls r LEFT JOIN copies c ON c.runtime_event_id = r.event_id
    WHERE r.run_id = $run_id
)
SELECT calls.*, coalesce(p.name, '(top level)') AS site,
       -- the cost: the GPU has nothing to do from the call's return until the host enqueues again
       CASE WHEN cur.end_ns > calls.ts_ns + calls.dur_ns THEN 0
            ELSE coalesce(nxt.start_ns - (calls.ts_ns + calls.dur_ns), 0) END AS gpu_idle_after_ns,
       CASE
         WHEN call IN ({_SYNC_LIST}) THEN 'sync'
         WHEN regexp_matches(call, '^(cuda|hip)Memcpy') AND NOT contains(call, 'Async')
              AND NOT (contains(coalesce(gpu_name, ''), 'HtoD') AND coalesce(bytes, 0) <= $small_htod_bytes)
              AND NOT contains(coalesce(gpu_name, ''), 'DtoD')
           THEN 'sync memcpy'
         WHEN regexp_matches(call, '^(cuda|hip)Memset') AND NOT contains(call, 'Async') THEN 'sync memset'
         WHEN contains(call, 'Async') AND contains(coalesce(gpu_name, ''), 'Pageable') THEN 'pageable async memcpy'
       END AS blocking
FROM calls LEFT JOIN events p ON p.event_id = calls.parent_id
ASOF LEFT JOIN (SELECT start_ns, end_ns FROM gpu_busy WHERE run_id = $run_id) cur
  ON calls.ts_ns + calls.dur_ns >= cur.start_ns
ASOF LEFT JOIN (SELECT start_ns FROM gpu_busy WHERE run_id = $run_id) nxt
  ON calls.ts_ns + calls.dur_ns <= nxt.start_ns
"""

# The run's repeated blocking call sites (thread, call, issuing op or frame) over the thresholds.
SITES_SQL = f"""
SELECT tid, pid, call, site, any_value(blocking) AS blocking, count(*) AS calls, sum(dur_ns) AS blocked_ns,
       min(ts_ns) AS first_ns, max(ts_ns + dur_ns) AS last_ns, arg_max(event_id, dur_ns) AS worst_event_id,
       list(event_id ORDER BY dur_ns DESC)[1:5] AS sample_event_ids, median(dur_ns) AS median_ns,
       coalesce(sum(gpu_idle_after_ns), 0) AS gpu_idle_after_ns
FROM ({CALLS_SQL}) b WHERE blocking IS NOT NULL
GROUP BY tid, pid, call, site
HAVING count(*) >= $min_calls AND coalesce(sum(gpu_idle_after_ns), 0) >= $min_share * $window
ORDER BY coalesce(sum(gpu_idle_after_ns), 0) DESC, site, call
"""

# The evidence query: recomputes calls and blocked time for one site.
SITE_SQL = (
    "SELECT sum(gpu_idle_after_ns) AS gpu_idle_after_ns, count(*) AS calls, sum(dur_ns) AS host_blocked_ns,\n"
    "       min(ts_ns) AS first_ns, max(ts_ns + dur_ns) AS last_ns\n"
    "FROM (" + CALLS_SQL + ") b\nWHERE blocking IS NOT NULL AND tid = $tid AND call = $call AND site = $site"
)
