"""Launch-bound steps: the host cannot issue kernels as fast as the GPU runs them (G002 launch-bound).

## What it does
Splits each run into steps: `ProfilerStep#N` annotations (or ops, in old traces) when present, else the run's
top-level user annotations (e.g. `prefill`, `decode_step`), else the whole run window. Steps with
the same name on the same thread form one group (`#N` is dropped). For each group and device it
measures, over the kernels, copies and memsets launched inside the steps (graph launches excluded):

- the GPU busy share: the union of all GPU activity on the device inside the step windows, over
  the steps' total time;
- kernels shorter than their launch: GPU duration below the duration of the runtime call that
  launched it (HTA `get_cuda_kernel_launch_stats` "short kernels");
- kernels in runs of tiny kernels: at least `min_run` consecutive kernels on a stream, each shorter
  than `tiny_kernel_ns`;
- short idle: the device's idle time inside the steps that falls in gaps between activities of at
  most `short_gap_ns`, i.e. per-launch host overhead rather than one long stretch of other host
  work (data loading, a sync, start-up);
- HTA's outliers: launch calls over 50 us and launch delays (GPU start - call start) over 100 us.

A group is reported when its busy share is below `max_busy_share`, it launched at least
`min_kernels` times, at least `min_short_share` of its launches are shorter than their launch
call or sit in tiny-kernel runs, and at least `min_short_idle_share` of its GPU idle time is short
idle. The finding names the step, the ops (top-level `cpu_op` above
the launch calls, with input shapes) that launched the most kernels and their Python code path,
and whether the run already replays CUDA graphs (`cudaGraphLaunch`).

## Why it matters
When a kernel runs for 3 us but its launch (Python, dispatcher, `cudaLaunchKernel`) costs 10-60 us
of host time, the GPU runs dry after every kernel: throughput is set by the CPU, and a faster GPU
or a bigger kernel does not help. Typical for small-batch inference (LLM decode), small models and
optimizer steps over many small tensors. CUDA graphs replay a captured loop body with one launch;
kernel fusion (torch.compile) cuts the number of launches.

## Example
`decode_step` (32 steps, 199 ms) on GPU 0: busy 4.8% of the step time; 2983 of 3040 launches run
shorter than their launch call (median kernel 2.5 us vs launch 8.5 us), 70% of the idle time is in
gaps under 100 us, and `aten::linear` in `nn.Module: Linear_*` launched the most kernels.
Capturing the decode step in a `torch.cuda.CUDAGraph` raised the busy share to 63% and the step
time fell 13x.

## Options
- `max_busy_share` (0.5): report groups whose GPU busy share is below this.
- `min_short_share` (0.5): and where at least this share of launches are shorter than their launch
  call, or in tiny-kernel runs.
- `min_kernels` (50): and which launched at least this many kernels, copies or memsets.
- `min_short_idle_share` (0.5): and where at least this share of the GPU idle time inside the steps
  is in gaps up to `short_gap_ns` (else G001 gpu-idle names the long host gaps instead).
- `short_gap_ns` (100000): idle gaps up to this long count as per-launch host overhead (100 us, a
  few ops' worth of eager host time).
- `min_share` (0.01): and whose GPU idle time inside the steps is at least this share of the run.
- `tiny_kernel_ns` (10000): a kernel under this GPU duration is tiny (10 us, about one launch).
- `min_run` (8): consecutive tiny kernels on a stream that make a run.
"""

from __future__ import annotations

from tracekit.engine.registry import Param, rule
from tracekit.engine.toolkit import ms, us, user_frame
from tracekit.findings.model import Finding, Quantity

# One row per (step instance, device) of run $run_id, with the step's GPU busy time and launch stats.
# Steps: ProfilerStep#N annotations, else top-level user annotations, else the whole run window (when
# no annotated step launches anything). Busy time is the union of activities on the device, read
# as B(end) - B(start) where B(t) is the busy time up to t (a sweep over the merged intervals).
STEPS_SQL = """
WITH launch AS (
    SELECT runtime_event_id, runtime_name, launch_ts_ns, launch_dur_ns, launch_delay_ns, gpu_event_id, gpu_kind,
           device, stream, gpu_dur_ns, runtime_name ILIKE '%GraphLaunch%' AS via_graph
    FROM launches WHERE run_id = $run_id
    QUALIFY row_number() OVER (PARTITION BY gpu_event_id ORDER BY launch_ts_ns, runtime_event_id) = 1
), ua AS (
    SELECT event_id, pid, tid, name, ts_ns, end_ns,
           max(end_ns) OVER (PARTITION BY pid, tid ORDER BY ts_ns, end_ns DESC, event_id
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS outer_end,
           bool_or(name LIKE 'ProfilerStep#%') OVER () AS profiler_steps
    FROM events
    WHERE run_id = $run_id AND dur_ns > 0
      AND (kind = 'user_annotation' OR (kind = 'cpu_op' AND name LIKE 'ProfilerStep#%'))
), candidates AS (
    SELECT pid, tid, regexp_replace(name, '#[0-9]+$', '') AS step, ts_ns, end_ns, false AS whole
    FROM ua
    WHERE CASE WHEN profiler_steps THEN name LIKE 'ProfilerStep#%' ELSE outer_end IS NULL OR outer_end < end_ns END
    UNION ALL
    SELECT NULL, NULL, '(whole run)', start_ns, end_ns, true FROM runs WHERE run_id = $run_id
), cand_launch AS (
    SELECT c.pid, c.tid, c.step, c.ts_ns AS step_ts, c.whole, l.*
    FROM candidates c JOIN launch l ON l.launch_ts_ns >= c.ts_ns AND l.launch_ts_ns < c.end_ns
), pick AS (
    SELECT NOT EXISTS (SELECT 1 FROM cand_launch WHERE NOT whole) AS use_whole
), steps AS (
    SELECT c.* FROM candidates c, pick WHERE c.whole = pick.use_whole
), act AS (
    SELECT device, stream, event_id, kind, ts_ns, end_ns, dur_ns FROM gpu_activities WHERE run_id = $run_id
), gapped AS (
    SELECT device, start_ns AS s, end_ns AS e, busy_through_ns AS cum_end, next_gap_ns AS next_gap
    FROM gpu_busy WHERE run_id = $run_id
), busy AS (
    SELECT *, coalesce(sum(CASE WHEN next_gap <= $short_gap_ns THEN next_gap ELSE 0 END)
                           OVER (PARTITION BY device ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                  AS short_at_s
    FROM gapped
), step_dev AS (
    SELECT s.*, d.device, row_number() OVER (ORDER BY s.ts_ns, s.tid, s.step, d.device) AS sid
    FROM steps s, (SELECT DISTINCT device FROM act) d
), probes AS (
    -- B(t) (busy time up to t) and S(t) (idle up to t in short gaps) at both ends of every step, by a
    -- sweep that carries the last merged interval starting at or before t (ASOF joins fall back to
    -- nested loops when the left side is small, as steps are).
    SELECT device, s AS t, 0 AS ord, e, cum_end, coalesce(next_gap, -1) AS next_gap, short_at_s,
           NULL::BIGINT AS sid, NULL::INTEGER AS sign
    FROM busy  -- next_gap -1: the last interval, no gap after it (a NULL would carry an older interval's)
    UNION ALL SELECT device, ts_ns, 1, NULL, NULL, NULL, NULL, sid, -1 FROM step_dev
    UNION ALL SELECT device, end_ns, 1, NULL, NULL, NULL, NULL, sid, 1 FROM step_dev
), carried AS (
    SELECT sid, sign, t, last_value(e IGNORE NULLS) OVER w AS e, last_value(cum_end IGNORE NULLS) OVER w AS cum_end,
           last_value(next_gap IGNORE NULLS) OVER w AS next_gap,
           last_value(short_at_s IGNORE NULLS) OVER w AS short_at_s
    FROM probes
    WINDOW w AS (PARTITION BY device ORDER BY t, ord ROWS UNBOUNDED PRECEDING)
), measured AS (
    SELECT sid,
           sum(sign * coalesce(cum_end - greatest(e - t, 0), 0)) AS busy_ns,
           sum(sign * coalesce(short_at_s + CASE WHEN t > e AND next_gap BETWEEN 0 AND $short_gap_ns
                                                 THEN t - e ELSE 0 END, 0)) AS short_idle_ns
    FROM carried WHERE sign IS NOT NULL GROUP BY sid
), at_end AS (
    SELECT x.*, m.busy_ns, m.short_idle_ns FROM step_dev x JOIN measured m USING (sid)
), kseq AS (
    SELECT event_id, device, stream, dur_ns < $tiny_kernel_ns AS tiny,
           sum(CASE WHEN dur_ns < $tiny_kernel_ns THEN 0 ELSE 1 END)
               OVER (PARTITION BY device, stream ORDER BY ts_ns, event_id ROWS UNBOUNDED PRECEDING) AS island
    FROM act WHERE kind = 'kernel'
), tiny_runs AS (
    SELECT event_id FROM (
        SELECT event_id, tiny,
               sum(CASE WHEN tiny THEN 1 ELSE 0 END) OVER (PARTITION BY device, stream, island) AS run_len
        FROM kseq) WHERE tiny AND run_len >= $min_run
), step_launch AS (
    SELECT cl.*, t.event_id IS NOT NULL AS in_tiny_run
    FROM cand_launch cl JOIN pick ON cl.whole = pick.use_whole
    LEFT JOIN tiny_runs t ON t.event_id = cl.gpu_event_id
), per_step AS (
    SELECT tid, step, step_ts, device,
           count(*) FILTER (WHERE NOT via_graph) AS launches,
           count(*) FILTER (WHERE NOT via_graph AND gpu_dur_ns < launch_dur_ns) AS shorter,
           count(*) FILTER (WHERE NOT via_graph AND in_tiny_run) AS tiny_run,
           count(*) FILTER (WHERE NOT via_graph AND (gpu_dur_ns < launch_dur_ns OR in_tiny_run)) AS launch_bound,
           count(DISTINCT runtime_event_id) FILTER (WHERE via_graph) AS graph_launches,
           coalesce(sum(gpu_dur_ns) FILTER (WHERE NOT via_graph), 0) AS gpu_ns,
           coalesce(sum(launch_dur_ns) FILTER (WHERE NOT via_graph), 0) AS launch_ns,
           count(*) FILTER (WHERE NOT via_graph AND launch_dur_ns > 50000) AS slow_calls,
           count(*) FILTER (WHERE NOT via_graph AND launch_delay_ns > 100000) AS late_starts,
           median(gpu_dur_ns) FILTER (WHERE NOT via_graph) AS median_gpu_ns,
           median(launch_dur_ns) FILTER (WHERE NOT via_graph) AS median_launch_ns
    FROM step_launch GROUP BY tid, step, step_ts, device
)
SELECT a.pid, a.tid, a.step, a.ts_ns, a.end_ns, a.device, a.busy_ns, a.short_idle_ns,
       coalesce(p.launches, 0) AS launches, coalesce(p.shorter, 0) AS shorter, coalesce(p.tiny_run, 0) AS tiny_run,
       coalesce(p.launch_bound, 0) AS launch_bound, coalesce(p.graph_launches, 0) AS graph_launches,
       coalesce(p.gpu_ns, 0) AS gpu_ns, coalesce(p.launch_ns, 0) AS launch_ns,
       coalesce(p.slow_calls, 0) AS slow_calls, coalesce(p.late_starts, 0) AS late_starts,
       p.median_gpu_ns, p.median_launch_ns
FROM at_end a LEFT JOIN per_step p
  ON p.tid IS NOT DISTINCT FROM a.tid AND p.step = a.step AND p.step_ts = a.ts_ns AND p.device = a.device
"""

GROUP_COLUMNS = """
    round(sum(busy_ns) / sum(end_ns - ts_ns), 4) AS busy_share,
    count(*) AS steps,
    sum(end_ns - ts_ns) AS step_ns,
    sum(busy_ns) AS busy_ns,
    sum(short_idle_ns) AS short_idle_ns,
    round(sum(short_idle_ns) / nullif(sum(end_ns - ts_ns) - sum(busy_ns), 0), 4) AS short_idle_share,
    sum(launches) AS launches,
    sum(shorter) AS shorter,
    sum(tiny_run) AS tiny_run,
    sum(launch_bound) AS launch_bound,
    sum(graph_launches) AS graph_launches,
    sum(gpu_ns) AS gpu_ns,
    sum(launch_ns) AS launch_ns,
    sum(slow_calls) AS slow_calls,
    sum(late_starts) AS late_starts,
    min(launches) AS min_step_launches,
    max(launches) AS max_step_launches,
    median(median_gpu_ns) AS median_gpu_ns,
    median(median_launch_ns) AS median_launch_ns,
    min(ts_ns) AS first_ns,
    max(end_ns) AS last_ns,
    any_value(pid) AS pid
"""

GROUPS_SQL = (
    "SELECT tid, step, device," + GROUP_COLUMNS + "FROM (" + STEPS_SQL + ") s\n"
    "WHERE end_ns > ts_ns GROUP BY tid, step, device ORDER BY step, tid, device"
)

# The evidence query: recomputes the group's GPU busy share (first column, = observed) and its counts.
GROUP_SQL = (
    "SELECT" + GROUP_COLUMNS + "FROM (" + STEPS_SQL + ") s\n"
    "WHERE end_ns > ts_ns AND tid IS NOT DISTINCT FROM $tid AND step = $step AND device = $device"
)

# Ops that issued the group's launches: the top-level cpu_op above each launch call (ProfilerStep#N,
# an op in old traces, skipped), with its input shapes.
OPS_SQL = """
WITH RECURSIVE sel AS (
    SELECT l.runtime_event_id, l.gpu_dur_ns, l.launch_dur_ns, s.step_ts
    FROM (SELECT DISTINCT tid, step, ts_ns AS step_ts, end_ns AS step_end FROM ({steps}) x
          WHERE tid IS NOT DISTINCT FROM $tid AND step = $step AND device = $device AND end_ns > ts_ns) s
    JOIN launches l ON l.launch_ts_ns >= s.step_ts AND l.launch_ts_ns < s.step_end
    WHERE l.run_id = $run_id AND l.device = $device AND l.runtime_name NOT ILIKE '%GraphLaunch%'
), up(runtime_event_id, event_id, parent_id, kind, name, hops) AS (
    SELECT s.runtime_event_id, e.event_id, e.parent_id, e.kind, e.name, 0
    FROM (SELECT DISTINCT runtime_event_id FROM sel) s JOIN events e ON e.event_id = s.runtime_event_id
    UNION ALL
    SELECT up.runtime_event_id, e.event_id, e.parent_id, e.kind, e.name, up.hops + 1
    FROM up JOIN events e ON e.event_id = up.parent_id WHERE up.hops < 64
), top_op AS (
    SELECT runtime_event_id, arg_max(event_id, hops) AS op_event_id
    FROM up WHERE kind = 'cpu_op' AND name NOT LIKE 'ProfilerStep#%' GROUP BY runtime_event_id
), labelled AS (
    SELECT sel.*, coalesce(c.name, '(no op)') AS op, c.input_dims
    FROM sel LEFT JOIN top_op t USING (runtime_event_id) LEFT JOIN cpu_ops c ON c.event_id = t.op_event_id
), sig AS (
    SELECT op, input_dims, count(*) AS n, count(*) FILTER (WHERE gpu_dur_ns < launch_dur_ns) AS shorter,
           sum(gpu_dur_ns) AS gpu_ns, sum(launch_dur_ns) AS launch_ns, min(runtime_event_id) AS sample,
           count(DISTINCT step_ts) AS steps
    FROM labelled GROUP BY op, input_dims
)
SELECT op, list(input_dims ORDER BY n DESC, input_dims NULLS LAST)[1] AS input_dims, sum(n) AS launches,
       sum(shorter) AS shorter, sum(gpu_ns) AS gpu_ns, sum(launch_ns) AS launch_ns,
       list(sample ORDER BY n DESC, input_dims NULLS LAST)[1] AS sample_runtime_event_id, max(steps) AS steps,
       count(*) AS shapes,
       (SELECT count(DISTINCT (op, input_dims)) FROM labelled) AS signatures,
       (SELECT max(k) FROM (SELECT count(DISTINCT (op, input_dims)) AS k FROM labelled GROUP BY step_ts))
           AS step_signatures
FROM sig GROUP BY op ORDER BY launches DESC, gpu_ns DESC, op LIMIT 5
"""

RUN_GRAPHS_SQL = "SELECT count(*) FROM runtime_calls WHERE run_id = $run_id AND name ILIKE '%GraphLaunch%'"


@rule(
    code="G002",
    name="launch-bound",
    title="Launch-bound step: kernels shorter than their launch, GPU mostly idle",
    category="gpu",
    requires=("launches",),
    params={
        "max_busy_share": Param(0.5, "report groups whose GPU busy share inside the steps is below this", "ratio"),
        "min_short_share": Param(0.5, "smallest share of launches shorter than their call or in tiny runs", "ratio"),
        "min_kernels": Param(50, "smallest number of launches in a group", "launches"),
        "min_share": Param(0.01, "smallest GPU idle time inside the steps, as a share of the run window", "ratio"),
        "min_short_idle_share": Param(
            0.5, "smallest share of the steps' GPU idle time in gaps up to short_gap_ns", "ratio"
        ),
        "short_gap_ns": Param(100_000, "idle gaps up to this long are per-launch host overhead", "ns"),
        "tiny_kernel_ns": Param(10_000, "kernels shorter than this are tiny", "ns"),
        "min_run": Param(8, "consecutive tiny kernels on a stream that make a run", "kernels"),
    },
)
def check(con, params, ctx):
    for run in ctx.runs:
        window = run.window_ns
        if window <= 0:
            continue
        base = {
            "run_id": run.run_id,
            "tiny_kernel_ns": params["tiny_kernel_ns"],
            "min_run": params["min_run"],
            "short_gap_ns": params["short_gap_ns"],
        }
        cur = con.execute(GROUPS_SQL, base)
        cols = [d[0] for d in cur.description]
        rows = cur.fetchall()
        if not rows:
            continue
        run_graphs = con.execute(RUN_GRAPHS_SQL, {"run_id": run.run_id}).fetchone()[0]
        for row in rows:
            g = dict(zip(cols, row))
            launches = int(g["launches"] or 0)
            if launches < params["min_kernels"] or g["busy_share"] is None:
                continue
            idle = int(g["step_ns"] - g["busy_ns"])
            bound_share = g["launch_bound"] / launches
            if (
                g["busy_share"] >= params["max_busy_share"]
                or bound_share < params["min_short_share"]
                or (g["short_idle_share"] or 0) < params["min_short_idle_share"]
                or idle < params["min_share"] * window
            ):
                continue
            yield _finding(con, ctx, run, params, base, g, idle, run_graphs)


def _finding(con, ctx, run, params, base, g, idle, run_graphs):
    where = {**base, "tid": g["tid"], "step": g["step"], "device": g["device"]}
    ops = con.execute(OPS_SQL.replace("{steps}", STEPS_SQL), where).fetchall()
    window = run.window_ns
    launches, steps = int(g["launches"]), int(g["steps"])
    share = idle / window
    severity = "critical" if share >= 0.3 else "warning" if share >= 0.1 else "info"

    op_rows = [
        {
            "op": op,
            "input_shapes": dims,
            "launches": int(n),
            "shorter_than_launch": int(short),
            "gpu_ns": int(gpu or 0),
            "launch_call_ns": int(lns or 0),
            "steps": int(nsteps),
            "shapes": int(nshapes),
            "sample_runtime_event_id": int(sample),
        }
        for op, dims, n, short, gpu, lns, sample, nsteps, nshapes, _, _ in ops
    ]
    top = op_rows[0] if op_rows else None
    code_path = ctx.code_path(top["sample_runtime_event_id"]) if top else []
    signatures = ops[0][9] if ops else 0
    step_signatures = ops[0][10] if ops else 0
    repeated = steps >= 2 and g["min_step_launches"] > 0 and g["min_step_launches"] == g["max_step_launches"]
    static_shapes = steps >= 2 and signatures == step_signatures
    graphs_here = int(g["graph_launches"])

    if g["step"] == "(whole run)":
        step_txt = "the run (no step annotations)"
    else:
        step_txt = f"{g['step']} ({steps} step{'s' if steps != 1 else ''})"
    top_txt = (
        f"{top['op']} issued {top['launches']} of them (most often with shapes {top['input_shapes']})" if top else ""
    )
    where_txt = user_frame(code_path)
    per_step = launches / steps

    caveats = []
    confidence = 0.8
    if graphs_here or run_graphs:
        confidence = 0.6
        caveats.append(
            f"the run already replays CUDA graphs ({run_graphs} graph launches, {graphs_here} inside these steps); "
            "their kernels are left out of the launch counts, and the busy share includes them"
        )
    if g["step"] == "(whole run)":
        caveats.append("no step annotations: the whole run window counts as one step, start-up and tail included")
    if launches and g["shorter"] / launches < params["min_short_share"]:
        caveats.append("most launches are not shorter than their call; the group is reported for its tiny-kernel runs")

    if graphs_here:
        hypothesis = (
            f"{step_txt} already replays a CUDA graph ({graphs_here} replays), but the GPU is still busy only "
            f"{g['busy_share']:.0%} of the step time: {per_step:.0f} eager launches per step outside the graph "
            f"({g['launch_bound']} of {launches} shorter than their launch call or in tiny runs) and the host work "
            f"between replays keep it waiting. {top_txt}."
        )
        next_experiment = (
            "Extend the captured region to the eager work around the replay (input copies, sampling, the "
            f"ops listed, from {where_txt or 'the step body'}) or batch it into one kernel; remove per-step host "
            "syncs so the next replay is enqueued early. Re-profile and compare the busy share."
        )
    elif run_graphs:
        hypothesis = (
            f"{step_txt} runs eagerly although the run uses CUDA graphs elsewhere: GPU busy "
            f"{g['busy_share']:.0%} of the step time, {g['shorter']} of {launches} launches run shorter than their "
            f"launch call (median kernel {us(g['median_gpu_ns'])} vs call {us(g['median_launch_ns'])}). {top_txt}."
        )
        next_experiment = (
            "Check why this step is not captured (dynamic shapes, host syncs, unsupported ops); capture it "
            "as well, with shapes padded to a few buckets if they vary, or fuse its small kernels with "
            "torch.compile; re-profile."
        )
    elif repeated and static_shapes:
        hypothesis = (
            f"{step_txt} is launch-bound: GPU busy {g['busy_share']:.0%} of the step time; {g['shorter']} of "
            f"{launches} launches run shorter than their launch call (median kernel {us(g['median_gpu_ns'])} vs "
            f"call {us(g['median_launch_ns'])}), {g['tiny_run']} sit in runs of >= {params['min_run']} tiny "
            f"kernels and {g['short_idle_share']:.0%} of the GPU idle time is in gaps under "
            f"{us(params['short_gap_ns'])}: the host's per-launch cost sets the pace. Every step issues the "
            f"same {per_step:.0f} launches with the same shapes: a CUDA graph fits. "
            f"{top_txt}."
        )
        next_experiment = (
            'Capture one step in a CUDA graph and replay it: `torch.compile(model, mode="reduce-overhead")`, or '
            "`torch.cuda.CUDAGraph` with static input/output buffers (warm up on a side stream, capture once, "
            "copy the new inputs in and `graph.replay()` per step); keep host syncs out of the captured "
            f"region{' (code path: ' + where_txt + ')' if where_txt else ''}. Re-profile the same loop."
        )
    elif repeated:
        hypothesis = (
            f"{step_txt} is launch-bound: GPU busy {g['busy_share']:.0%}; {g['shorter']} of {launches} launches "
            f"run shorter than their launch call. Steps repeat the same {per_step:.0f} launches but input shapes "
            f"change between steps ({signatures} op/shape signatures vs {step_signatures} per step), e.g. a "
            f"growing KV cache. {top_txt}."
        )
        next_experiment = (
            "Make the shapes static (preallocated KV cache with a length mask, shapes padded to a few "
            'buckets) and capture the step in CUDA graphs, one per bucket (`torch.compile(mode="reduce-overhead", '
            "dynamic=False)` does this); or fuse the small ops with torch.compile first. Re-profile."
        )
    else:
        hypothesis = (
            f"{step_txt} is launch-bound: GPU busy {g['busy_share']:.0%}; {g['shorter']} of {launches} launches "
            f"run shorter than their launch call (median kernel {us(g['median_gpu_ns'])} vs call "
            f"{us(g['median_launch_ns'])}). The step is not a repeated identical body, so a CUDA graph fits "
            f"less well. {top_txt}."
        )
        next_experiment = (
            "Cut the number of launches: torch.compile the region (fuses elementwise/norm chains), use fused "
            "implementations (fused optimizers with foreach/fused=True, SDPA, fused norms) and larger batches; "
            f"re-profile{' (code path: ' + where_txt + ')' if where_txt else ''}."
        )

    title = (
        f"Launch-bound {g['step']} on GPU {g['device']}: GPU busy {g['busy_share']:.0%} of {ms(g['step_ns'])} over "
        f"{steps} step(s); {g['shorter']}/{launches} launches shorter than their launch call"
    )
    thread = ctx.thread_name(run.run_id, g["pid"], g["tid"]) if g["tid"] is not None else None
    return Finding(
        rule="G002",
        severity=severity,
        confidence=confidence,
        title=title,
        locality={
            **run.locality(),
            "pid": g["pid"],
            "tid": g["tid"],
            "thread_name": thread,
            "device": int(g["device"]),
            "step": g["step"],
            "op": top["op"] if top else None,
            "input_shapes": top["input_shapes"] if top else None,
            "code_path": code_path or None,
            "window_ns": [int(g["first_ns"]), int(g["last_ns"])],
        },
        observed=Quantity(
            g["busy_share"],
            "ratio",
            f"GPU busy share inside {steps} step(s) ({ms(g['busy_ns'])} of {ms(g['step_ns'])}); "
            f"{launches} launches, {g['shorter']} shorter than their call, {g['tiny_run']} in tiny-kernel runs",
        ),
        expected=Quantity(params["max_busy_share"], "ratio", "GPU busy at least this share of the step time"),
        impact_ns=idle,
        window_ns=window,
        sql=GROUP_SQL,
        sql_params=where,
        sample_event_ids=[o["sample_runtime_event_id"] for o in op_rows],
        hypothesis=hypothesis,
        next_experiment=next_experiment,
        acceptance=(
            "Re-run the evidence SQL on the new trace: busy_share rises above "
            f"{params['max_busy_share']:.0%} (or step_ns / steps falls) and launches per step drop; "
            "G002 no longer reports this step."
        ),
        caveats=caveats,
        extra={
            "steps": steps,
            "step_ns": int(g["step_ns"]),
            "gpu_busy_ns": int(g["busy_ns"]),
            "gpu_idle_ns": idle,
            "short_idle_ns": int(g["short_idle_ns"]),
            "short_idle_share": g["short_idle_share"],
            "launches": launches,
            "launches_per_step": [int(g["min_step_launches"]), int(g["max_step_launches"])],
            "shorter_than_launch": int(g["shorter"]),
            "in_tiny_runs": int(g["tiny_run"]),
            "kernel_gpu_ns": int(g["gpu_ns"]),
            "launch_call_ns": int(g["launch_ns"]),
            "median_kernel_ns": g["median_gpu_ns"],
            "median_launch_call_ns": g["median_launch_ns"],
            "hta_launch_stats": {
                "short_kernels": int(g["shorter"]),
                "runtime_over_50us": int(g["slow_calls"]),
                "launch_delay_over_100us": int(g["late_starts"]),
            },
            "graph_launches_in_steps": graphs_here,
            "graph_launches_in_run": int(run_graphs),
            "repeated_body": bool(repeated),
            "static_shapes": bool(static_shapes),
            "op_shape_signatures": int(signatures or 0),
            "top_ops": op_rows,
        },
    )
