"""Blocking host calls in the steady state (H001 host-sync).

## What it does
Finds runtime calls that block the launching CPU thread until the GPU catches up, repeated at the
same call site: `cudaDeviceSynchronize`, `cudaStreamSynchronize`, `cudaEventSynchronize` (and
their `hip*`/`cu*` forms), synchronous `cudaMemcpy`/`cudaMemset`, and async copies into pageable
host memory (which the driver turns synchronous). A call site is the thread, the call and the op
or Python frame that issued it (e.g. `aten::_local_scalar_dense`, i.e. `tensor.item()`), so the
finding names the line of code to change.

## Why it matters
While the host waits it enqueues nothing, so the GPU drains its queue and then idles until the
host launches again: every sync in a decode loop turns the launch queue's lookahead into a bubble.
`.item()`, `.cpu()`, `.tolist()`, `torch.nonzero` and printing a CUDA tensor all sync implicitly.
Mirrors the nsys expert rules `cuda_api_sync`, `cuda_memcpy_sync` and `cuda_memcpy_async`
(pageable), which list calls but do not say who issued them.

## Example
On the H200 eager decode sample (`sample_traces/gpu_prefill_decode_eager.json.gz`):
`cudaStreamSynchronize` 32 times from `aten::_local_scalar_dense` (`tensor.item()`) on the main
thread, a per-step `if (next_token == eos).all().item(): break`; after each return the GPU waits
~0.2 ms for the host to enqueue the next step, 6.9 ms of a 305 ms window.

Use instead: check the stop condition every N steps, or on a side stream with a pinned host buffer
and `non_blocking=True`, and read it one step late.

## Options
- `min_calls` (3): a site must repeat this often to count as steady state.
- `min_share` (0.005): report sites whose cost, the GPU idle time from each call's return until
  the next GPU work, is at least this share of the run's window. (Time the host spends blocked
  is not the cost: the GPU is busy then, and when it is the bottleneck the wait is harmless.)
- `small_htod_bytes` (65536): synchronous host-to-device copies up to this size are exempt (as in nsys).
"""

from __future__ import annotations

from tracekit.engine.registry import Param, rule
from tracekit.findings.model import Finding, Quantity

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

# One row per blocking call: a call is blocking by name, or by being a synchronous copy/memset, or
# by an async copy whose device side touched pageable memory.
BLOCKING_CALLS_SQL = """
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
         WHEN call IN ({sync_calls}) THEN 'sync'
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

# The evidence query: recomputes calls and blocked time for one site.
SITE_SQL = (
    "SELECT sum(gpu_idle_after_ns) AS gpu_idle_after_ns, count(*) AS calls, sum(dur_ns) AS host_blocked_ns,\n"
    "       min(ts_ns) AS first_ns, max(ts_ns + dur_ns) AS last_ns\n"
    "FROM (" + BLOCKING_CALLS_SQL + ") b\nWHERE blocking IS NOT NULL AND tid = $tid AND call = $call AND site = $site"
)


def _blocking_sql() -> str:
    return BLOCKING_CALLS_SQL.replace("{sync_calls}", ", ".join(f"'{c}'" for c in SYNC_CALLS))


@rule(
    code="H001",
    name="host-sync",
    title="Blocking host call in the steady state",
    category="host",
    requires=("runtime_calls",),
    params={
        "min_calls": Param(3, "a site must repeat at least this often", "calls"),
        "min_share": Param(0.005, "smallest share of the run window worth reporting", "ratio"),
        "small_htod_bytes": Param(65536, "sync HtoD copies up to this size are exempt", "bytes"),
    },
)
def check(con, params, ctx):
    sql = _blocking_sql()
    site_sql = SITE_SQL.replace("{sync_calls}", ", ".join(f"'{c}'" for c in SYNC_CALLS))
    for run in ctx.runs:
        window = run.window_ns
        if window <= 0:
            continue
        rows = con.execute(
            f"""
            SELECT tid, pid, call, site, any_value(blocking), count(*), sum(dur_ns), min(ts_ns),
                   max(ts_ns + dur_ns), arg_max(event_id, dur_ns), list(event_id ORDER BY dur_ns DESC)[1:5],
                   median(dur_ns), coalesce(sum(gpu_idle_after_ns), 0)
            FROM ({sql}) b WHERE blocking IS NOT NULL
            GROUP BY tid, pid, call, site
            HAVING count(*) >= $min_calls AND coalesce(sum(gpu_idle_after_ns), 0) >= $min_share * $window
            ORDER BY coalesce(sum(gpu_idle_after_ns), 0) DESC, site, call
            """,
            {
                "run_id": run.run_id,
                "small_htod_bytes": params["small_htod_bytes"],
                "min_calls": params["min_calls"],
                "min_share": params["min_share"],
                "window": window,
            },
        ).fetchall()
        for tid, pid, call, site, blocking, calls, blocked, first, last, worst, samples, median, idle_after in rows:
            cost = idle_after
            share = cost / window
            severity = "critical" if share >= 0.10 else "warning" if share >= 0.02 else "info"
            thread = ctx.thread_name(run.run_id, pid, tid)
            path = ctx.code_path(worst)
            yield Finding(
                rule="H001",
                severity=severity,
                confidence=0.9 if blocking == "sync" else 0.8,
                title=(
                    f"GPU idle {idle_after / 1e6:.2f} ms after {calls} blocking {call} ({blocking}) from {site} "
                    f"(host blocked {blocked / 1e6:.2f} ms in them)"
                ),
                locality={
                    **run.locality(),
                    "pid": pid,
                    "tid": tid,
                    "thread_name": thread,
                    "op": site,
                    "code_path": path or None,
                    "window_ns": [int(first), int(last)],
                    "launch": {"call": call},
                },
                observed=Quantity(
                    int(cost),
                    "ns",
                    f"GPU idle from the return of each of {calls} calls until the next GPU work; the host was "
                    f"blocked {blocked / 1e3:.0f} us in them (median {median / 1e3:.1f} us), waiting for the GPU",
                ),
                expected=Quantity(0, "ns", "no blocking call inside the steady-state loop"),
                impact_ns=int(cost),
                window_ns=window,
                sql=site_sql,
                sql_params={
                    "run_id": run.run_id,
                    "tid": tid,
                    "call": call,
                    "site": site,
                    "small_htod_bytes": params["small_htod_bytes"],
                },
                sample_event_ids=samples,
                hypothesis=(
                    f"{site} forces the host to wait for the GPU every time it runs "
                    f"({'an implicit sync such as .item()/.cpu()/.tolist()' if blocking == 'sync' else blocking}); "
                    "while it waits nothing is enqueued, so the GPU idles after each call."
                ),
                next_experiment=(
                    "Run the loop with `torch.cuda.set_sync_debug_mode('warn')` to get the Python line of each "
                    "implicit sync, then move the check off the per-step path (read the value one step late "
                    "through a pinned buffer with non_blocking=True) and re-profile."
                ),
                acceptance=(
                    "Re-run the evidence SQL on the new trace: calls at this site drop to 0 (or below "
                    f"{params['min_calls']}) and rule G001 reports less idle time on the stream it fed."
                ),
            )
