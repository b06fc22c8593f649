"""GPU idle time per stream, attributed to its cause (G001 gpu-idle).

## What it does
For every (run, device, stream) with GPU work (kernels, memcpys, memsets), takes the gaps between
consecutive activities on the stream inside the run window and attributes each gap to one cause,
in this order (the same split as HTA's `get_idle_time_breakdown`, plus the other streams):

- **host**: the runtime call that launched the activity after the gap (via `launches`) ended after
  the previous activity had finished, i.e. it started late or was still being issued: the GPU waited
  for the host to enqueue work (HTA "host wait").
- **other GPU work**: not host-caused, and other streams of the same device were busy for at least
  half of the gap: the stream waited on work elsewhere on the device (an event wait, a collective,
  a copy on a side stream).
- **kernel wait**: not the above, and the gap is shorter than `kernel_wait_ns`: the fixed latency
  between queued back-to-back kernels (HTA "kernel wait", `consecutive_kernel_delay`).
- **other**: everything else (e.g. activities with no launch record).

It reports per stream the idle time, its share of the stream's active window (first start to last
end), the split by cause, how much of the idle time the whole device was idle ("exposed"), the
largest gaps with their windows, and the call sites (runtime call, enclosing op, Python frames)
whose launches ended the host gaps. A stream is reported when its exposed idle time is at least
`min_idle_share` of its active window and at least `min_idle_ns`, so a communication side stream
that idles while compute runs elsewhere on the device is not reported.

## Why it matters
Idle GPU time is time the accelerator is paid for and unused. When the gaps are host-caused and
short, the host spends longer issuing each kernel (Python, dispatcher, launch) than the GPU spends
running it: the loop is launch-bound and CUDA graphs (`torch.compile(mode="reduce-overhead")`,
`torch.cuda.CUDAGraph`) remove the per-kernel launch cost. Long host gaps point at host work
between launches instead (data loading, `.item()` syncs, Python logic). Gaps spent waiting on other
streams point at cross-stream dependencies that serialize the device. nsys reports gaps
(`gpu_gaps`, default 500 ms) and low-utilization chunks (`gpu_time_util`) without a cause.

## Example
Device 0 stream 7 idle 95% of its 207 ms active window (197 ms in 3101 gaps, median 56 us), all of
it host-caused, in a greedy decode loop run eagerly: every kernel runs ~3 us but takes ~65 us of
host time to issue. Capturing the decode step in a CUDA graph cut the stream's idle share to 47%.

One finding per device: streams of a device see the same device idle, so the finding is on the
busiest stream over the thresholds, and the others are listed in `evidence.details.other_idle_streams`.

## Options
- `min_idle_share` (0.2): report streams whose exposed idle time is at least this share of the
  stream's active window.
- `min_idle_ns` (1000000): and at least this much exposed idle time (1 ms).
- `kernel_wait_ns` (5000): non-host gaps shorter than this count as kernel wait (back-to-back launch
  latency; measured 0.4-3 us between queued kernels on V100/A100/H200 traces).
- `short_gap_ns` (100000): host gaps up to this long are per-launch overhead; when they make most of
  the host-caused idle time the finding suggests CUDA graphs.
- `top_gaps` (5): how many of the largest gaps to list.
"""

from __future__ import annotations

from tracekit.engine.registry import DataQuality, Param, rule
from tracekit.engine.toolkit import ms, us, user_frame
from tracekit.findings.model import Finding, Quantity

CAUSES = ("host", "other_gpu", "kernel_wait", "other")

# One row per idle gap on a stream of run $run_id: the gap before activity event_id, from prev_end to
# ts_ns, its cause, the busy time of the device's other streams during it and the launching call.
# Device busy time is the union of all activities on the device; B(t), the busy time up to t, is
# cum_end - max(e - t, 0) for the last merged interval [s, e) starting at or before t (cum_end: busy
# time through e), found by a sweep (window over intervals and probes; ASOF joins fall back to nested
# loops when the left side looks small). other_busy_ns = B(ts_ns) - B(prev_end): the stream itself is
# idle in the gap, so any device busy time there is other streams' work.
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

# Per-stream summary over the gaps; streams with a single activity have no gaps and no row.
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

SUMMARY_SQL = (
    "SELECT device, stream," + SUMMARY_COLUMNS + "FROM (" + GAPS_SQL + ") g\n"
    "GROUP BY device, stream ORDER BY device, stream"
)

# The evidence query: recomputes the stream's idle time (first column, = observed) and its split.
STREAM_SQL = "SELECT" + SUMMARY_COLUMNS + "FROM (" + GAPS_SQL + ") g\nWHERE device = $device AND stream = $stream"

# The per-finding detail queries read the run's gaps from a temp table built once per run
# (GAPS_TABLE): the gap sweep is the expensive part, and the evidence query above stays self-contained.
GAPS_TABLE = "_g001_gaps"

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

GRAPH_LAUNCHES_SQL = "SELECT count(*) FROM runtime_calls WHERE run_id = $run_id AND (name ILIKE '%GraphLaunch%')"


def _enclosing_op(ctx, event_id):
    """The outermost op above a launch (e.g. aten::linear rather than aten::addmm), with its shapes."""
    return ctx.enclosing_op(event_id, outermost=True) if event_id is not None else None


@rule(
    code="G001",
    name="gpu-idle",
    title="GPU stream idle between activities, attributed to host / other GPU work / launch latency",
    category="gpu",
    requires=("gpu_activities",),
    params={
        "min_idle_share": Param(0.2, "smallest exposed idle share of the stream's active window to report", "ratio"),
        "min_idle_ns": Param(1_000_000, "smallest exposed idle time to report", "ns"),
        "kernel_wait_ns": Param(5_000, "non-host gaps shorter than this are back-to-back launch latency", "ns"),
        "short_gap_ns": Param(100_000, "host gaps up to this long count as per-launch overhead", "ns"),
        "top_gaps": Param(5, "how many of the largest gaps to list", "gaps"),
    },
)
def check(con, params, ctx):
    for run in ctx.runs:
        if run.window_ns <= 0:
            continue
        base = {"run_id": run.run_id, "kernel_wait_ns": params["kernel_wait_ns"]}
        con.execute(f"CREATE OR REPLACE TEMP TABLE {GAPS_TABLE} AS {GAPS_SQL}", base)
        cur = con.execute(
            f"SELECT device, stream, {SUMMARY_COLUMNS} FROM {GAPS_TABLE} GROUP BY device, stream ORDER BY device, stream",
            {"short_gap_ns": params["short_gap_ns"]},
        )
        cols = [d[0] for d in cur.description]
        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
        if not rows:
            continue
        graph_launches = con.execute(GRAPH_LAUNCHES_SQL, {"run_id": run.run_id}).fetchone()[0]
        reported = [r for r in rows if _over_threshold(r, params)]
        # Exposed idle is device idle seen from a stream: streams of one device mostly report the same
        # idle time. One finding per device, on its busiest stream (the one whose next launch ends the
        # idle most often); the other streams go into the finding's details.
        for r in reported:
            same_device = [o for o in reported if o["device"] == r["device"]]
            if r is not max(same_device, key=lambda o: (o["activities"], -o["stream"])):
                continue
            active = int(r["last_ns"] - r["first_ns"])
            s = {
                "idle": int(r["idle_ns"]), "host": int(r["host_ns"]), "other_gpu": int(r["other_gpu_ns"]),
                "kernel_wait": int(r["kernel_wait_ns"]), "other": int(r["other_ns"]), "exposed": int(r["exposed_ns"]),
                "gaps": int(r["gaps"]), "host_gaps": int(r["host_gaps"]), "host_short": int(r["host_short_ns"]),
                "host_median": r["host_gap_median_ns"], "with_launch": int(r["gaps_with_launch"]),
                "first": int(r["first_ns"]), "last": int(r["last_ns"]), "active": active,
                "activities": int(r["activities"]),
            }  # fmt: skip
            others = [_stream_brief(o) for o in same_device if o is not r]
            yield _finding(con, ctx, run, params, r["device"], r["stream"], graph_launches, s, others)
        if not con.execute("SELECT EXISTS (SELECT 1 FROM launches WHERE run_id = ?)", [run.run_id]).fetchone()[0]:
            yield DataQuality(
                "G001",
                "gpu-idle: no runtime call correlates with GPU work (launches is empty), so no gap is "
                "attributed to the host",
                run.run_id,
            )


def _over_threshold(r: dict, params: dict) -> bool:
    active = int(r["last_ns"] - r["first_ns"])
    if active <= 0 or not r["idle_ns"]:
        return False
    return r["exposed_ns"] / active >= params["min_idle_share"] and r["exposed_ns"] >= params["min_idle_ns"]


def _stream_brief(r: dict) -> dict:
    return {
        "stream": int(r["stream"]),
        "activities": int(r["activities"]),
        "idle_ns": int(r["idle_ns"]),
        "exposed_idle_ns": int(r["exposed_ns"]),
        "host_ns": int(r["host_ns"]),
    }


def _finding(con, ctx, run, params, device, stream, graph_launches, s, others):
    where = {"device": device, "stream": stream}
    top = con.execute(TOP_GAPS_SQL, {**where, "top": params["top_gaps"]}).fetchall()
    sites = con.execute(HOST_SITES_SQL, where).fetchall()
    where = {"run_id": run.run_id, **where, "kernel_wait_ns": params["kernel_wait_ns"]}

    idle, active = s["idle"], s["active"]
    share = idle / active
    exposed_share = s["exposed"] / active
    split = {c: s[c] for c in CAUSES}
    dominant = max(CAUSES, key=lambda c: split[c])
    host_share = s["host"] / idle
    short_host = s["host"] and s["host_short"] / s["host"] >= 0.5 and s["host_gaps"] >= 50

    largest = []
    for event_id, kind, name, prev_end, ts, gap, cause, rt_id, rt_name, other_busy in top:
        item = {
            "window_ns": [int(prev_end), int(ts)],
            "gap_ns": int(gap),
            "cause": cause,
            "next_activity": {"event_id": int(event_id), "kind": kind, "name": name},
            "other_streams_busy_ns": int(other_busy),
        }
        if rt_id is not None:
            op = _enclosing_op(ctx, rt_id)
            item["launch"] = {
                "runtime_event_id": int(rt_id),
                "call": rt_name,
                "op": op[1] if op else None,
                "input_shapes": op[2] if op else None,
                "code_path": ctx.code_path(rt_id),
            }
        largest.append(item)

    host_sites = []
    for tid, site, n, site_idle, worst in sites:
        op = _enclosing_op(ctx, worst)
        host_sites.append(
            {
                "tid": tid,
                "thread_name": ctx.thread_name(run.run_id, _pid_of(con, worst), tid) if worst is not None else None,
                "site": site,
                "gaps": int(n),
                "idle_ns": int(site_idle),
                "op": op[1] if op else None,
                "code_path": ctx.code_path(worst) if worst is not None else [],
                "sample_runtime_event_id": int(worst) if worst is not None else None,
            }
        )

    severity = "critical" if exposed_share >= 0.5 else "warning" if exposed_share >= 0.3 else "info"
    site_text = ""
    if host_sites:
        h = host_sites[0]
        where_txt = user_frame(h["code_path"]) or h["op"] or h["site"]
        site_text = f" The largest share of host gaps ends at launches from {h['site']} ({where_txt})."

    caveats = []
    confidence = 0.85
    if s["with_launch"] < s["gaps"]:
        missing = s["gaps"] - s["with_launch"]
        caveats.append(
            f"{missing} of {s['gaps']} gaps have no launch record (no runtime call with the activity's "
            "correlation id); they can not be attributed to the host"
        )
        confidence = 0.85 if missing / s["gaps"] < 0.1 else 0.6
    if graph_launches:
        caveats.append(
            f"the run replays CUDA graphs ({graph_launches} graph launches): the kernels of one replay share one "
            "launch call, so gaps inside a replay count as host-caused while that call is still running"
        )

    if dominant == "host" and short_host and not graph_launches:
        hypothesis = (
            f"The stream is launch-bound: {s['host_gaps']} host-caused gaps (median {us(s['host_median'])}) "
            f"make {host_share:.0%} of its idle time; the host takes longer to issue each kernel (Python, "
            "dispatcher, launch) than the GPU takes to run it." + site_text
        )
        next_experiment = (
            'Capture the repeated loop body in a CUDA graph: `torch.compile(model, mode="reduce-overhead")`, '
            "or `torch.cuda.CUDAGraph` with static input buffers (warm up on a side stream, capture once, "
            "copy inputs in and `graph.replay()` each step), then re-profile the same loop."
        )
    elif dominant == "host" and graph_launches:
        hypothesis = (
            f"CUDA graphs are already replayed, yet {host_share:.0%} of the idle time is host-caused "
            f"({s['host_gaps']} gaps, median {us(s['host_median'])}): work outside the graphs (eager kernels, "
            "copies, per-step syncs and Python between replays) keeps the GPU waiting." + site_text
        )
        next_experiment = (
            "Look at the code between graph replays at the listed call sites: move the remaining eager kernels "
            "(sampling, input copies) into the captured region, and drop or defer per-step host syncs "
            "(`.item()`, `.cpu()`) so the next replay is enqueued before the current one finishes; re-profile."
        )
    elif dominant == "host":
        long_share = 1 - s["host_short"] / s["host"]
        hypothesis = (
            f"{host_share:.0%} of the idle time is host-caused ({s['host_gaps']} gaps, median "
            f"{us(s['host_median'])}, {long_share:.0%} of it in gaps over {us(params['short_gap_ns'])}): "
            "the host does other work between launches (data loading, syncs, Python logic, allocation)." + site_text
        )
        next_experiment = (
            "Open the largest gaps' windows in the trace and read what the launching thread does there "
            "(rule H001 lists blocking syncs); move that work off the launch path (DataLoader workers with "
            "pin_memory, non_blocking copies, deferring host reads) and re-profile."
        )
    elif dominant == "other_gpu":
        hypothesis = (
            f"{split['other_gpu'] / idle:.0%} of the idle time passes while other streams of device {device} are "
            "busy: this stream waits on their work (an event wait, a collective or copy on a side stream)."
        )
        next_experiment = (
            "Check which stream the largest gaps wait on (the other streams' activities inside the listed "
            "windows) and whether the dependency is needed; overlap independent work or split it so this "
            "stream can proceed, then re-profile."
        )
    elif dominant == "kernel_wait":
        hypothesis = (
            f"{split['kernel_wait'] / idle:.0%} of the idle time is launch latency between queued back-to-back "
            f"kernels (gaps under {us(params['kernel_wait_ns'])}): the stream runs many very short kernels."
        )
        next_experiment = (
            "Fuse the short kernels (torch.compile, fused optimizers/norms) or replay them in a CUDA graph, "
            "which shortens the inter-kernel latency; re-profile."
        )
    else:
        hypothesis = (
            f"{split['other'] / idle:.0%} of the idle time could not be attributed (no launch record, or long "
            "gaps with the launch already queued)."
        )
        next_experiment = (
            "Open the largest gaps' windows in the trace and check what the stream waits on (events, "
            "host-side sleeps, another process on the device); re-profile with CUDA runtime tracing on."
        )

    title = (
        f"GPU {device} stream {stream} idle {share:.0%} of its active window ({ms(idle)} of {ms(active)}): "
        f"host {s['host'] / idle:.0%}, other GPU work {s['other_gpu'] / idle:.0%}, "
        f"kernel wait {s['kernel_wait'] / idle:.0%}, other {s['other'] / idle:.0%}"
    )
    return Finding(
        rule="G001",
        severity=severity,
        confidence=confidence,
        title=title,
        locality={
            **run.locality(),
            "device": int(device),
            "stream": int(stream),
            "window_ns": [s["first"], s["last"]],
        },
        observed=Quantity(
            s["idle"],
            "ns",
            f"idle in {s['gaps']} gaps between {s['activities']} activities: host {us(s['host'])}, "
            f"other GPU work {us(s['other_gpu'])}, kernel wait {us(s['kernel_wait'])}, other {us(s['other'])}; "
            f"{us(s['exposed'])} of it with the whole device idle",
        ),
        expected=Quantity(
            int(params["min_idle_share"] * active),
            "ns",
            f"idle below {params['min_idle_share']:.0%} of the stream's active window",
        ),
        impact_ns=s["exposed"],
        window_ns=active,
        sql=STREAM_SQL,
        sql_params={**where, "short_gap_ns": params["short_gap_ns"]},
        sample_event_ids=[g["next_activity"]["event_id"] for g in largest],
        hypothesis=hypothesis,
        next_experiment=next_experiment,
        acceptance=(
            "Re-run the evidence SQL on the new trace of the same workload: idle_ns falls below "
            f"{params['min_idle_share']:.0%} of the stream's active window (last_ns - first_ns) and the "
            f"dominant cause ({dominant}_ns) shrinks; G001 no longer reports this stream."
        ),
        caveats=caveats,
        extra={
            "idle_share": round(share, 4),
            "exposed_share": round(exposed_share, 4),
            "idle_by_cause_ns": split,
            "idle_share_by_cause": {c: round(v / idle, 4) for c, v in split.items()},
            "dominant_cause": dominant,
            "gaps": s["gaps"],
            "host_gaps": s["host_gaps"],
            "host_gap_median_ns": s["host_median"],
            "host_short_gap_ns": s["host_short"],
            "graph_launches": int(graph_launches),
            "largest_gaps": largest,
            "host_gap_sites": host_sites,
            "other_idle_streams": others,
            "hta_equivalent": "get_idle_time_breakdown: host_wait = host, kernel_wait = kernel_wait, "
            "other = other_gpu + other",
        },
    )


def _pid_of(con, event_id):
    row = con.execute("SELECT pid FROM events WHERE event_id = ?", [event_id]).fetchone()
    return row[0] if row else None
