"""Steps and their GPU busy time and launch statistics: what G002 launch-bound and G003
graphed-step-idle measure, and the finding shape they share.

Steps are `ProfilerStep#N` annotations (or ops, in old traces) when present, else the run's
top-level user annotations, else the whole run window (when no annotated step launches anything).
Steps of one name on one thread form a group. Busy time is the union of activities on the device,
read as B(end) - B(start) where B(t) is the busy time up to t (a sweep over the merged intervals).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.engine.phrases import plural, rerun
from tracekit.engine.registry import Param
from tracekit.engine.severity import by_share, share_params
from tracekit.engine.toolkit import locality, rows, user_frame
from tracekit.findings.model import Finding, Quantity
from tracekit.units import duration

WHOLE_RUN = "(whole run)"

# The options both rules read: the same measurement gates both.
PARAMS = {
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
    **share_params("the steps' GPU idle time over the run window", critical=0.3, warning=0.1),
}

# One row per (step instance, device) of run $run_id, with the step's GPU busy time and launch stats.
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
""".replace("{steps}", STEPS_SQL)


@dataclass
class Group:
    """One reported step group on one device: its measured row and what launched its kernels."""

    row: object
    idle_ns: int
    run_graphs: int
    top_ops: list[dict]
    code_path: list[str]
    signatures: int
    step_signatures: int

    @property
    def launches(self) -> int:
        return int(self.row.launches)

    @property
    def steps(self) -> int:
        return int(self.row.steps)

    @property
    def graphs_here(self) -> int:
        return int(self.row.graph_launches)

    @property
    def per_step(self) -> float:
        return self.launches / self.steps

    @property
    def repeated(self) -> bool:
        """Every step issued the same number of launches."""
        g = self.row
        return self.steps >= 2 and g.min_step_launches > 0 and g.min_step_launches == g.max_step_launches

    @property
    def static_shapes(self) -> bool:
        """Every step used the same op/shape signatures."""
        return self.steps >= 2 and self.signatures == self.step_signatures

    @property
    def step_text(self) -> str:
        if self.row.step == WHOLE_RUN:
            return "the run (no step annotations)"
        return f"{self.row.step} ({self.steps} step{'s' if self.steps != 1 else ''})"

    @property
    def top_text(self) -> str:
        top = self.top_ops[0] if self.top_ops else None
        return (
            f"{top['op']} issued {top['launches']} of them (most often with shapes {top['input_shapes']})"
            if top
            else ""
        )

    @property
    def where(self) -> str:
        return user_frame(self.code_path)


def measure_params(run, params) -> dict:
    return {
        "run_id": run.run_id,
        "tiny_kernel_ns": params["tiny_kernel_ns"],
        "min_run": params["min_run"],
        "short_gap_ns": params["short_gap_ns"],
    }


def reported_groups(con, ctx, run, params, graphed: bool) -> list[Group]:
    """The run's step groups over every threshold, those with CUDA graph replays inside their steps
    (graphed) or those without."""
    window = run.window_ns
    if window <= 0:
        return []
    found = []
    for g in rows(con, GROUPS_SQL, measure_params(run, params)):
        launches = int(g.launches or 0)
        if launches < params["min_kernels"] or g.busy_share is None or bool(g.graph_launches) != graphed:
            continue
        idle = int(g.step_ns - g.busy_ns)
        if (
            g.busy_share >= params["max_busy_share"]
            or g.launch_bound / launches < params["min_short_share"]
            or (g.short_idle_share or 0) < params["min_short_idle_share"]
            or idle < params["min_share"] * window
        ):
            continue
        found.append((g, idle))
    if not found:
        return []
    run_graphs = ctx.graph_launches(run.run_id)
    return [_group(con, ctx, run, params, g, idle, run_graphs) for g, idle in found]


def _group(con, ctx, run, params, g, idle, run_graphs) -> Group:
    where = {**measure_params(run, params), "tid": g.tid, "step": g.step, "device": g.device}
    ops = rows(con, OPS_SQL, where)
    top_ops = [
        {
            "op": o.op,
            "input_shapes": o.input_dims,
            "launches": int(o.launches),
            "shorter_than_launch": int(o.shorter),
            "gpu_ns": int(o.gpu_ns or 0),
            "launch_call_ns": int(o.launch_ns or 0),
            "steps": int(o.steps),
            "shapes": int(o.shapes),
            "sample_runtime_event_id": int(o.sample_runtime_event_id),
        }
        for o in ops
    ]
    return Group(
        row=g,
        idle_ns=idle,
        run_graphs=int(run_graphs),
        top_ops=top_ops,
        code_path=ctx.code_path(top_ops[0]["sample_runtime_event_id"]) if top_ops else [],
        signatures=ops[0].signatures if ops else 0,
        step_signatures=ops[0].step_signatures if ops else 0,
    )


def _caveats(group: Group, params) -> tuple[list[str], float]:
    g, caveats, confidence = group.row, [], 0.8
    if group.graphs_here or group.run_graphs:
        confidence = 0.6
        caveats.append(
            f"the run already replays CUDA graphs ({group.run_graphs} graph launches, {group.graphs_here} inside "
            "these steps); their kernels are left out of the launch counts, and the busy share includes them"
        )
    if g.step == WHOLE_RUN:
        caveats.append("no step annotations: the whole run window counts as one step, start-up and tail included")
    if group.launches and g.shorter / group.launches < params["min_short_share"]:
        caveats.append("most launches are not shorter than their call; the group is reported for its tiny-kernel runs")
    return caveats, confidence


def finding(
    code, run, ctx, params, group: Group, explanation: tuple[str, str], label: str, launch_kind: str = "launches"
) -> Finding:
    """The finding both rules give on a step group; the title's label and the explanation (hypothesis,
    next experiment) differ."""
    hypothesis, next_experiment = explanation
    g, launches, steps = group.row, group.launches, group.steps
    top = group.top_ops[0] if group.top_ops else None
    caveats, confidence = _caveats(group, params)
    return Finding(
        rule=code,
        severity=by_share(group.idle_ns / run.window_ns, params),
        confidence=confidence,
        title=(
            f"{label} {g.step} on GPU {g.device}: GPU busy {g.busy_share:.0%} of {duration(g.step_ns)} over "
            f"{plural(steps, 'step')}; {g.shorter}/{launches} {launch_kind} shorter than their launch call"
        ),
        locality=locality(
            run,
            **ctx.thread(run.run_id, g.pid, g.tid),
            device=int(g.device),
            step=g.step,
            op=top["op"] if top else None,
            input_shapes=top["input_shapes"] if top else None,
            code_path=group.code_path,
            window_ns=[g.first_ns, g.last_ns],
        ),
        observed=Quantity(
            g.busy_share,
            "ratio",
            f"GPU busy share inside {plural(steps, 'step')} ({duration(g.busy_ns)} of {duration(g.step_ns)}); "
            f"{launches} launches, {g.shorter} shorter than their call, {g.tiny_run} in tiny-kernel runs",
        ),
        expected=Quantity(params["max_busy_share"], "ratio", "GPU busy at least this share of the step time"),
        impact_ns=group.idle_ns,
        window_ns=run.window_ns,
        sql=GROUP_SQL,
        sql_params={**measure_params(run, params), "tid": g.tid, "step": g.step, "device": g.device},
        sample_event_ids=[o["sample_runtime_event_id"] for o in group.top_ops],
        hypothesis=hypothesis,
        next_experiment=next_experiment,
        acceptance=rerun(
            "trace",
            f"busy_share rises above {params['max_busy_share']:.0%} (or step_ns / steps falls) and launches per "
            f"step drop; {code} no longer reports this step.",
        ),
        caveats=caveats,
        extra={
            "steps": steps,
            "step_ns": int(g.step_ns),
            "gpu_busy_ns": int(g.busy_ns),
            "gpu_idle_ns": group.idle_ns,
            "short_idle_ns": int(g.short_idle_ns),
            "short_idle_share": g.short_idle_share,
            "launches": launches,
            "launches_per_step": [int(g.min_step_launches), int(g.max_step_launches)],
            "shorter_than_launch": int(g.shorter),
            "in_tiny_runs": int(g.tiny_run),
            "kernel_gpu_ns": int(g.gpu_ns),
            "launch_call_ns": int(g.launch_ns),
            "median_kernel_ns": g.median_gpu_ns,
            "median_launch_call_ns": g.median_launch_ns,
            "hta_launch_stats": {
                "short_kernels": int(g.shorter),
                "runtime_over_50us": int(g.slow_calls),
                "launch_delay_over_100us": int(g.late_starts),
            },
            "graph_launches_in_steps": group.graphs_here,
            "graph_launches_in_run": group.run_graphs,
            "repeated_body": group.repeated,
            "static_shapes": group.static_shapes,
            "op_shape_signatures": int(group.signatures or 0),
            "top_ops": group.top_ops,
        },
    )
