"""Steps and their GPU busy time and launch statistics: what G002 launch-bound and G003
graphed-step-idle measure, and the finding shape they share.

Steps are the `step_windows` view's (one annotation on one thread, never overlapping, else the whole
run) cut to their steady pieces (`steady_pieces`: warm-up, capture and profiler steps and windows
are not measured), on every device with GPU work: busy time by `gpu_busy_between`, idle in short gaps as
busy time of the union of the device's short `gpu_busy` gaps, launches from `first_launches`. A
run's steps on one device form a group.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.engine.phrases import plural, rerun
from tracekit.engine.registry import Param
from tracekit.engine.severity import by_share, share_params
from tracekit.engine.toolkit import locality, rows, user_frame
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _phases
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
    "all_phases": _phases.ALL_PHASES,
}

# One row per (step, device) of run $run_id (of every run when it is NULL): the step windows of
# `step_windows` on every device with GPU work, with the device's busy time and short idle inside the
# step and the step's launch stats.
STEPS_SQL = """
WITH step_windows_on_device AS MATERIALIZED (
    SELECT s.run_id, s.step_index, coalesce(s.name, '{whole_run}') AS step, s.start_ns, s.end_ns, d.device,
           -- a whole-run step is no thread's: its launches come from every thread
           CASE WHEN s.name IS NOT NULL THEN s.pid END AS pid, CASE WHEN s.name IS NOT NULL THEN s.tid END AS tid
    FROM step_windows s
    JOIN (SELECT DISTINCT run_id, device FROM gpu_activities WHERE run_id = coalesce($run_id, run_id)) d USING (run_id)
    WHERE s.run_id = coalesce($run_id, run_id) AND s.end_ns > s.start_ns
), windows AS MATERIALIZED (
    -- the steady parts of the steps (unless $all_phases): warm-up, capture and profiler steps and
    -- windows (`run_phases`) are not measured
    SELECT * FROM steady_pieces('step_windows_on_device', all_phases := $all_phases)
), busy AS (
    SELECT run_id, step_index, device, sum(end_ns - start_ns) AS steady_ns, sum(busy_ns) AS busy_ns
    FROM gpu_busy_between('windows', 'all', in_run := $run_id) GROUP BY ALL
), short_gaps AS (
    SELECT run_id, device AS lane, end_ns AS ts_ns, end_ns + next_gap_ns AS end_ns
    FROM gpu_busy WHERE run_id = coalesce($run_id, run_id) AND next_gap_ns <= $short_gap_ns
), short_blocks AS (
    SELECT * FROM interval_union('short_gaps')
), short_windows AS (
    SELECT run_id, step_index, device AS lane, start_ns, end_ns FROM windows
), short_idle AS (
    -- idle inside the step in gaps up to $short_gap_ns: the "busy" time of the union of those gaps
    SELECT run_id, step_index, lane AS device, sum(busy_ns) AS short_idle_ns
    FROM busy_between('short_windows', 'short_blocks') GROUP BY ALL
), kernel_islands AS (
    -- a run of tiny kernels on a stream: the tiny kernels after one that is not tiny
    SELECT event_id, run_id, device, stream, dur_ns < $tiny_kernel_ns AS tiny,
           sum(CASE WHEN dur_ns < $tiny_kernel_ns THEN 0 ELSE 1 END)
               OVER (PARTITION BY run_id, device, stream ORDER BY ts_ns, event_id ROWS UNBOUNDED PRECEDING) AS island
    FROM gpu_activities WHERE run_id = coalesce($run_id, run_id) AND kind = 'kernel'
), tiny_runs AS (
    SELECT event_id FROM kernel_islands WHERE tiny
    QUALIFY count(*) OVER (PARTITION BY run_id, device, stream, island) >= $min_run
), step_launch AS (
    SELECT w.step_index, l.*, l.runtime_name ILIKE '%GraphLaunch%' AS via_graph, t.event_id IS NOT NULL AS in_tiny_run
    FROM first_launches l
    ASOF JOIN windows w ON w.run_id = l.run_id AND w.device = l.device AND l.launch_ts_ns >= w.start_ns
    LEFT JOIN tiny_runs t ON t.event_id = l.gpu_event_id
    WHERE l.run_id = coalesce($run_id, l.run_id) AND l.launch_ts_ns < w.end_ns
), per_step AS (
    SELECT run_id, step_index, device,
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
    FROM step_launch GROUP BY run_id, step_index, device
)
SELECT w.run_id, w.pid, w.tid, w.step, w.step_index, w.start_ns AS ts_ns, w.end_ns, w.device, b.steady_ns, b.busy_ns,
       i.short_idle_ns,
       coalesce(p.launches, 0) AS launches, coalesce(p.shorter, 0) AS shorter, coalesce(p.tiny_run, 0) AS tiny_run,
       coalesce(p.launch_bound, 0) AS launch_bound, coalesce(p.graph_launches, 0) AS graph_launches,
       coalesce(p.gpu_ns, 0) AS gpu_ns, coalesce(p.launch_ns, 0) AS launch_ns,
       coalesce(p.slow_calls, 0) AS slow_calls, coalesce(p.late_starts, 0) AS late_starts,
       p.median_gpu_ns, p.median_launch_ns
FROM step_windows_on_device w JOIN busy b USING (run_id, step_index, device)
JOIN short_idle i USING (run_id, step_index, device)
LEFT JOIN per_step p USING (run_id, step_index, device)
""".replace("{whole_run}", WHOLE_RUN)

GROUP_COLUMNS = """
    round(sum(busy_ns) / sum(steady_ns), 4) AS busy_share,
    count(*) AS steps,
    sum(steady_ns) AS step_ns,
    sum(busy_ns) AS busy_ns,
    sum(short_idle_ns) AS short_idle_ns,
    round(sum(short_idle_ns) / nullif(sum(steady_ns) - sum(busy_ns), 0), 4) AS short_idle_share,
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
    any_value(pid) AS pid,
    any_value(tid) AS tid
"""

# A run's steps are one group per device (`step_windows` delimits them by one annotation on one thread).
GROUPS_SQL = (
    "SELECT run_id, step, device," + GROUP_COLUMNS + "FROM (" + STEPS_SQL + ") s\n"
    "GROUP BY run_id, step, device ORDER BY run_id, step, device"
)

# The evidence query: recomputes the group's GPU busy share (first column, = observed) and its counts.
GROUP_SQL = "SELECT" + GROUP_COLUMNS + "FROM (" + STEPS_SQL + ") s\nWHERE device = $device"

# Ops that issued each group's launches: the top-level cpu_op above each launch call (ProfilerStep#N,
# an op in old traces, skipped), with its input shapes; the five that launched most per (run, device)
# of $runs and $devices (zipped: the groups reported), in one statement for every group.
OPS_SQL = """
WITH RECURSIVE pairs AS (
    SELECT unnest($runs) AS run_id, unnest($devices) AS device
), windows AS MATERIALIZED (
    SELECT run_id, step_index, start_ns, end_ns FROM step_windows
    WHERE list_contains($runs, run_id) AND end_ns > start_ns
), sel AS (
    SELECT l.run_id, l.device, l.runtime_event_id, l.gpu_dur_ns, l.launch_dur_ns, w.step_index
    FROM first_launches l ASOF JOIN windows w ON w.run_id = l.run_id AND l.launch_ts_ns >= w.start_ns
    SEMI JOIN pairs p ON p.run_id = l.run_id AND p.device = l.device
    WHERE list_contains($runs, l.run_id) AND l.launch_ts_ns < w.end_ns
      AND l.runtime_name NOT ILIKE '%GraphLaunch%'
), up(runtime_event_id, event_id, parent_id, kind, name, hops) AS (
    -- a launch's ancestors are events of its own run: each level joins those runs' events only
    SELECT s.runtime_event_id, e.event_id, e.parent_id, e.kind, e.name, 0
    FROM (SELECT DISTINCT runtime_event_id FROM sel) s JOIN events e ON e.event_id = s.runtime_event_id
    WHERE list_contains($runs, e.run_id)
    UNION ALL
    SELECT up.runtime_event_id, e.event_id, e.parent_id, e.kind, e.name, up.hops + 1
    FROM up JOIN events e ON e.event_id = up.parent_id WHERE up.hops < 64 AND list_contains($runs, e.run_id)
), top_op AS (
    SELECT runtime_event_id, arg_max(event_id, hops) AS op_event_id
    FROM up WHERE kind = 'cpu_op' AND name NOT LIKE 'ProfilerStep#%' GROUP BY runtime_event_id
), labelled AS (
    SELECT sel.*, coalesce(c.name, '(no op)') AS op, c.input_dims
    FROM sel LEFT JOIN top_op t USING (runtime_event_id)
    LEFT JOIN (SELECT event_id, name, input_dims FROM cpu_ops WHERE list_contains($runs, run_id)) c
      ON c.event_id = t.op_event_id
), sig AS (
    SELECT run_id, device, op, input_dims, count(*) AS n, count(*) FILTER (WHERE gpu_dur_ns < launch_dur_ns) AS shorter,
           sum(gpu_dur_ns) AS gpu_ns, sum(launch_dur_ns) AS launch_ns, min(runtime_event_id) AS sample,
           count(DISTINCT step_index) AS steps
    FROM labelled GROUP BY run_id, device, op, input_dims
), signatures AS (
    SELECT run_id, device, count(DISTINCT (op, input_dims)) AS signatures FROM labelled GROUP BY run_id, device
), step_signatures AS (
    SELECT run_id, device, max(k) AS step_signatures
    FROM (SELECT run_id, device, count(DISTINCT (op, input_dims)) AS k FROM labelled GROUP BY run_id, device, step_index)
    GROUP BY run_id, device
), per_op AS (
    SELECT run_id, device, op, list(input_dims ORDER BY n DESC, input_dims NULLS LAST)[1] AS input_dims,
           sum(n) AS launches, sum(shorter) AS shorter, sum(gpu_ns) AS gpu_ns, sum(launch_ns) AS launch_ns,
           list(sample ORDER BY n DESC, input_dims NULLS LAST)[1] AS sample_runtime_event_id, max(steps) AS steps,
           count(*) AS shapes
    FROM sig GROUP BY run_id, device, op
)
SELECT o.*, g.signatures, t.step_signatures
FROM per_op o JOIN signatures g USING (run_id, device) JOIN step_signatures t USING (run_id, device)
QUALIFY row_number() OVER (PARTITION BY o.run_id, o.device ORDER BY o.launches DESC, o.gpu_ns DESC, o.op) <= 5
ORDER BY o.run_id, o.device, o.launches DESC, o.gpu_ns DESC, o.op
"""


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
    window_ns: int
    left_out: list[dict]

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
        "all_phases": params["all_phases"],
    }


# G002 and G003 split one measurement between them: taken once per analysis (ctx.once) and options,
# over every run at once (a query per run would cost more in planning than in work on many small runs).
def _measured_groups(con, ctx, run, params) -> list:
    every_run = {**measure_params(run, params), "run_id": None}
    key = ("step groups", *every_run.items())
    taken = ctx.once(key, lambda: rows(con, _phases.in_rule(con, ctx, GROUPS_SQL), every_run))
    return [g for g in taken if g.run_id == run.run_id]


def reported_groups(con, ctx, params, graphed: bool) -> list[tuple]:
    """(run, Group) of every run's step groups over every threshold, in run order: those with CUDA
    graph replays inside their steps (graphed) or those without. What launched each group's kernels
    is read for every group in one statement."""
    found = []
    for run in ctx.runs:
        window = _phases.window(con, ctx, run, params)
        if window <= 0 or _phases.skip_run(con, ctx, run.run_id, params):
            continue
        for g in _measured_groups(con, ctx, run, params):
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
            found.append((run, g, idle, window))
    if not found:
        return []
    ops: dict[tuple, list] = {}
    for o in rows(con, OPS_SQL, {"runs": [r.run_id for r, *_ in found], "devices": [g.device for _, g, *_ in found]}):
        ops.setdefault((o.run_id, o.device), []).append(o)
    return [
        (run, _group(con, ctx, run, params, g, idle, window, ops.get((run.run_id, g.device), [])))
        for run, g, idle, window in found
    ]


def _group(con, ctx, run, params, g, idle, window, ops) -> Group:
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
        run_graphs=int(ctx.graph_launches(run.run_id)),
        top_ops=top_ops,
        code_path=ctx.code_path(top_ops[0]["sample_runtime_event_id"]) if top_ops else [],
        signatures=ops[0].signatures if ops else 0,
        step_signatures=ops[0].step_signatures if ops else 0,
        window_ns=window,
        left_out=_phases.run_left_out(con, ctx, run, params),
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
        caveats.append("no step annotations: the whole run window counts as one step, its tail included")
    note = _phases.caveat(group.left_out, "the steps and the run window")
    if note:
        caveats.append(note)
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
        severity=by_share(group.idle_ns / group.window_ns, params),
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
        window_ns=group.window_ns,
        sql=GROUP_SQL,
        sql_params={**measure_params(run, params), "device": g.device},
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
            "left_out_ns": sum(w["dur_ns"] for w in group.left_out),
            "left_out": _phases.listed(group.left_out),
        },
    )
