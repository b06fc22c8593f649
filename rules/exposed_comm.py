"""Communication not hidden behind computation (C001 exposed-comm).

## What it does
Per rank (run) and device, measures how much of the time spent in communication kernels (the
kernels of the `collectives` view: `nccl*`, `rccl*` and custom all-reduce kernels) runs while no
compute kernel is busy on the same device. Compute is the union of the device's other kernels (the
`compute` layer of `gpu_busy_layers`; memcpy/memset too when `memcpy_is_compute` is set); a
collective's exposed time is its duration minus its overlap with that union. Overlap % =
overlapped comm / total comm, as HTA's `get_comm_comp_overlap` defines it. The finding names the
rank, device, comm stream, the collectives with the most exposed time (kernel, collective, message
size, dtype, group size, as `collectives` reads them from the kernel's or its op's args), and the
op and Python frames that launched the worst one. When several ranks of one job are loaded, it
matches collectives across ranks by their order in each process group and splits exposed time into
*waiting for a late peer* (start skew) and the rest (transfer).

## Why it matters
Exposed communication is time the device does no compute, so it adds directly to step time.
In tensor-parallel decode, every layer's all-reduce sits between two matmuls; in data-parallel
training, gradient buckets that are not overlapped with the backward pass add up to the comm time.
When most of the exposed time is waiting for another rank, the fix is on the late rank (host
overhead, load imbalance), not in NCCL.

## Example
Rank 0 of a 2-GPU tensor-parallel run: 56 `ncclDevKernel_AllReduce_Sum_bf16_RING_LL` kernels on
stream 7, the compute stream, are exposed for 34% of the run's steady time with 0% overlap (the first
step, in which the first all-reduce waits 470 ms for rank 1 to start, is warm-up and left out);
matched against rank 1, 98.5% of that is rank 0 waiting for rank 1 to launch the same all-reduce
(median start skew 0.35 ms).

Use instead: make the late rank launch sooner (CUDA graphs, less host work per step), or issue the
collective on a side stream (`async_op=True`) and wait for it just before its result is needed.

## Reading the trace's own evidence
A trace can hold both variants of an experiment as annotated steps: serial steps of some layers and
steps of the same layers with the collective chunked and overlapped. Before proposing overlap, the
rule looks for them (rules/_variants.py: step groups of the run on the device with the same kernel
families, both running communication kernels, one on more streams). When the overlapped steps are
slower, it does not propose overlapping the collective: it says so with both groups' step times and
step counts and proposes fewer, larger chunks or the serial schedule; when they are faster, it says
overlap already pays here and points at applying it; a tie says what overlap could hide at most.
`extra.variants` holds both groups. Waiting for a late peer is told first: overlap is not the fix
there either way.

## Checked on
The corpus sweep (tests/test_corpus_sweep.py), the project's 2xH200 tensor-parallel samples, HTA's
NCCL traces (DDP, trace-diff pair, sampled ranks), and one-GPU traces in the overlap matrix's shape
with an all-reduce as the transfer, overlapped steps faster and slower than the serial ones
(tests/test_overlap_matrix.py). A two-rank NCCL version of the overlap matrix is not made yet.

## Options
- `min_exposed_share` (0.05): report a device whose exposed comm is at least this share of the run window.
- `max_overlap_pct` (20.0): also report a device (info unless its share is large) whose overlap % is below this ...
- `min_comm_share` (0.02): ... when its total comm time is at least this share of the window.
- `memcpy_is_compute` (False): count memcpy/memset as compute that can hide comm (HTA counts kernels only).
- `top_collectives` (5): how many collective groups to list in the finding's details.
- `critical_share` (0.2): severity critical when the exposed comm is at least this share of the run
  window; a device reported by `min_exposed_share` is a warning, one reported only for its overlap
  % an info.
- `max_idle_to_exposed` (5.0): a finding is held at info when, in the run's steady time, the GPU
  idles more than this many times as long as its communication is exposed: the step is bound by what
  keeps the GPU idle (host work, G001), and hiding the collective would not shorten it. On the
  corpus the host-bound DDP run (hta nccl_data) idles 14.4x its exposed comm; the runs where the
  exposed comm is on the critical path 1.3-2.3x (HTA's trace_diff pair, df_index_resolver, the TP2
  sample).
- `variant_min_change` (0.03): when the trace holds both a serial and an overlapped variant of the
  same collectives, step times differing by less than this share (or within the steps' noise) are
  a tie (the overlap matrix sets it, see G004 transfer-bound).
- `all_phases` (False): measure every phase of the run. By default a communication kernel mostly
  inside a warm-up, capture or profiler window (`run_phases`) is not counted, and shares are of the
  run's steady time; the finding lists the windows in `extra.left_out`, and a run with no steady
  state at all is left to P001 cold-profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.engine import advice, quality
from tracekit.engine.phrases import rerun
from tracekit.engine.registry import DataQuality, Example, Param, rule
from tracekit.engine.toolkit import locality, one, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _collectives, _phases, _variants
from tracekit.units import duration

# What shortens a step bound by its collectives when overlapping them does not.
CHEAPER_COLLECTIVES = (
    "make the collectives themselves cheaper: fewer, larger messages (bucket the small ones), a narrower payload "
    "dtype, or a smaller group"
)
SMALL_MESSAGE_BYTES = 1 << 20  # below ~1 MiB, NCCL time is latency, not bandwidth
WAITING = 0.5  # share of the exposed time spent waiting for a peer from which the late peer is the story


@rule(
    code="C001",
    name="exposed-comm",
    title="Communication not overlapped with computation",
    category="distributed",
    requires=("kernels",),
    params={
        "min_exposed_share": Param(0.05, "report when exposed comm is at least this share of the run window", "ratio"),
        "max_overlap_pct": Param(20.0, "also report when comm overlap is below this percentage ...", "%"),
        "min_comm_share": Param(0.02, "... and total comm is at least this share of the run window", "ratio"),
        "memcpy_is_compute": Param(False, "count memcpy/memset as compute that hides comm", "bool"),
        "top_collectives": Param(5, "collective groups listed in the details", "count"),
        "critical_share": Param(
            0.2, "severity critical when exposed comm is at least this share of the window", "ratio"
        ),
        "max_idle_to_exposed": Param(
            5.0,
            "held at info when the device idles more than this many times the exposed comm in the steady time "
            "(the step is bound elsewhere)",
            "ratio",
        ),
        "variant_min_change": _variants.MIN_CHANGE,
        "all_phases": _phases.ALL_PHASES,
    },
    example=Example(("gpu_tp2_rank0.json.gz", "gpu_tp2_rank1.json.gz")),
)
def check(con, params, ctx):
    comm_devices = rows(
        con, "SELECT run_id, device, count(*) AS kernels FROM kernels WHERE is_communication GROUP BY ALL ORDER BY ALL"
    )
    world = dict(con.execute("SELECT run_id, world_size FROM runs").fetchall())
    yield from _unrecognised_collectives(con, ctx, world, {d.run_id for d in comm_devices})
    if not comm_devices:
        return
    cross = _collectives.cross_rank(con, ctx)
    per_device = _collectives.per_kernel_of_runs(
        con, ctx, sorted({d.run_id for d in comm_devices}), bool(params["memcpy_is_compute"]), params["all_phases"]
    )
    reported = []
    for d in comm_devices:
        run = ctx.run(d.run_id)
        window = _phases.window(con, ctx, run, params)
        if window <= 0 or _phases.skip_run(con, ctx, run.run_id, params):
            continue
        sql_params = {
            "run_id": d.run_id,
            "device": d.device,
            "memcpy_is_compute": bool(params["memcpy_is_compute"]),
            "all_phases": params["all_phases"],
        }
        kernels = per_device.get((d.run_id, d.device), [])
        comm = sum(k.dur_ns for k in kernels)
        if not comm:
            continue
        exposed = sum(k.exposed_ns for k in kernels)
        overlap_pct = 100.0 * sum(k.overlapped_ns for k in kernels) / comm
        by_share = exposed / window >= params["min_exposed_share"]
        by_overlap = overlap_pct < params["max_overlap_pct"] and comm / window >= params["min_comm_share"]
        if by_share or by_overlap:
            waits = cross.get(d.run_id)
            if ctx.on_npu(d.run_id):  # only HCCL records its waits inside the collective
                waits = _collectives.with_own_waits(con, d.run_id, waits)
            groups = _collectives.collective_groups(kernels, waits, params["top_collectives"])
            worst = next(k for k in kernels if k.event_id == groups[0][0]["worst_event_id"])
            reported.append((run, d.device, sql_params, waits, kernels, window, groups, worst))
    if not reported:
        return
    # what every finding looks up, read for all of them together: a query each per finding cost more
    # in planning than in work on a database of many ranks
    run_ids = sorted({run.run_id for run, *_ in reported})
    compute_streams = {
        (r.run_id, r.device): set(r.streams) for r in rows(con, COMPUTE_STREAMS_SQL, {"run_ids": run_ids})
    }
    steady_busy = (
        {}
        if params["all_phases"]
        else {
            (r.run_id, r.device): int(r.busy_ns)
            for r in rows(
                con, STEADY_BUSY_SQL.replace("{phases}", _phases.phases_table(con, ctx)), {"run_ids": run_ids}
            )
        }
    )
    launched_by = _collectives.launchers(con, ctx, [worst for *_, worst in reported])
    for run, device, sql_params, waits, kernels, window, groups, worst in reported:
        looked_up = _LookedUp(
            compute_streams.get((run.run_id, device), set()),
            launched_by[worst.event_id],
            steady_busy.get((run.run_id, device), 0),
        )
        finding = _finding(con, ctx, run, device, params, sql_params, waits, kernels, window, groups, looked_up)
        yield quality.qualify(ctx, finding, (quality.GPU_TIMELINE,))


# Each device's GPU busy time inside its run's steady pieces (`run_phases`, read from this analysis's
# table), for the runs $run_ids: with the steady time it gives the idle time that C001 weighs exposed
# communication against.
STEADY_BUSY_SQL = """
SELECT b.run_id, b.device, coalesce(sum(least(b.end_ns, p.end_ns) - greatest(b.start_ns, p.start_ns)), 0) AS busy_ns
FROM gpu_busy b JOIN {phases} p ON p.run_id = b.run_id AND p.phase = 'steady'
 AND b.start_ns < p.end_ns AND b.end_ns > p.start_ns
WHERE list_contains($run_ids, b.run_id)
GROUP BY b.run_id, b.device
"""

# The streams each device of the runs $run_ids ran compute (not communication) kernels on.
COMPUTE_STREAMS_SQL = """
SELECT run_id, device, list(DISTINCT stream) AS streams FROM kernels
WHERE NOT is_communication AND list_contains($run_ids, run_id)
GROUP BY run_id, device
"""


@dataclass(frozen=True)
class _LookedUp:
    """What a finding reads beside its kernels: the device's compute streams, the launcher of its worst
    kernel (`_collectives.launchers`) and the device's GPU busy time in the steady time."""

    compute_streams: set
    launcher: dict
    steady_busy_ns: int


def _idle_to_exposed(window: int, exposed: int, steady_busy_ns: int, params) -> float | None:
    """The device's idle time in the measured window over its exposed communication; None when nothing
    is exposed or every phase is measured (then there is no steady split to weigh against)."""
    if not exposed or params["all_phases"]:
        return None
    return max(window - steady_busy_ns, 0) / exposed


def _unrecognised_collectives(con, ctx, world, with_comm):
    for run in ctx.runs:
        if run.run_id in with_comm or (world.get(run.run_id) or 1) <= 1:
            continue
        if one(con, "SELECT EXISTS (SELECT 1 FROM kernels WHERE run_id = ?) AS found", [run.run_id]).found:
            yield DataQuality(
                "C001",
                f"run {run.run_id} ({run.label}) has world_size {world[run.run_id]} but no kernel named "
                "nccl*/rccl*: its collectives are not recognised (custom all-reduce?) or not traced",
                run.run_id,
            )


def _caveats(params, kernels, exposed, window, shared_streams, cross) -> list[str]:
    caveats = [
        "Overlap counts any compute kernel running at the same time on the device (HTA's definition); "
        "overlapped kernels still share SMs and memory bandwidth, so overlapped comm is not free.",
    ]
    if not params["memcpy_is_compute"]:
        caveats.append("memcpy/memset are not counted as compute (set memcpy_is_compute to count them).")
    if shared_streams:
        caveats.append(
            f"Communication runs on stream(s) {shared_streams}, which also run compute: kernels of one stream "
            "never overlap, so these collectives cannot be hidden until they move to a side stream."
        )
    worst = max(kernels, key=lambda k: (k.exposed_ns, -k.event_id))
    if worst.exposed_ns > 0.5 * exposed and len(kernels) > 1:
        rest = exposed - worst.exposed_ns
        why = (
            "it is the first collective, which often absorbs start-up skew between ranks (profilers started at "
            "different times, a rank still warming up)"
            if worst.event_id == kernels[0].event_id
            else "check whether it is an outlier (a stalled peer, a one-off barrier) before tuning the rest"
        )
        caveats.append(
            f"One instance (event {worst.event_id}, {duration(worst.exposed_ns)} exposed) is "
            f"{100 * worst.exposed_ns / exposed:.0f}% of the exposed time; {why}. Without it: "
            f"{duration(rest)} ({100 * rest / window:.1f}% of the window)."
        )
    if cross is None:
        caveats.append(
            "No other rank of this job could be matched (not loaded, or its trace covers other steps): exposed time "
            "includes waiting for slower ranks. Load all ranks' traces of the same steps to split waiting from transfer."
        )
    return caveats


def _explain(
    run,
    worst,
    launcher,
    cross,
    late_rank,
    waiting,
    exposed,
    comm_stream,
    compute_streams,
    context,
    ctx_ranks=frozenset(),
):
    """(hypothesis, next experiment): waiting for a late peer, small latency-bound messages, or no overlap."""
    nbytes, collective = worst.get("message_bytes"), launcher["collective"]
    if waiting and cross.recorded and not cross.skews:
        loaded = late_rank in ctx_ranks
        return (
            f"Most exposed comm is rank {run.rank} waiting inside the collective for rank {late_rank}: the "
            f"collective's own tasks record it (HCCL's longest Notify_Wait of each op is on the link to rank "
            f"{late_rank}){'' if loaded else f', and rank {late_rank} is not among the loaded traces'}. The time is "
            "a late peer, not transfer, so communication tuning or overlap will not remove it.",
            advice.exposed_comm(context, "waiting", collective, run.rank, late_rank, late_loaded=loaded),
        )
    if waiting:
        return (
            f"Most exposed comm is rank {run.rank} waiting inside the collective for rank {late_rank}, which launches "
            f"the same collective a median {duration(cross.median_skew_ns)} later: the time is skew, not transfer, "
            "so NCCL tuning or overlap will not remove it.",
            advice.exposed_comm(context, "waiting", collective, run.rank, late_rank),
        )
    if nbytes is not None and nbytes < SMALL_MESSAGE_BYTES:
        return (
            f"{worst['count']} small {collective or 'collective'}s ({nbytes} B each) run with no compute alongside: "
            "each is latency-bound and sits between dependent kernels, so the GPU waits for every one.",
            advice.exposed_comm(context, "small", collective),
        )
    where = (
        "they run on the compute stream itself, so they serialize with the compute that could hide them."
        if comm_stream in compute_streams
        else "they start when no compute is queued (issued after the compute that could hide them, or the "
        "compute stream waits on them)."
    )
    return (
        f"{collective or 'Collectives'} on stream {comm_stream} run with no compute alongside for {duration(exposed)}: "
        + where,
        advice.exposed_comm(context, "not_overlapped", collective),
    )


def _finding(con, ctx, run, device, params, sql_params, cross, kernels, window, groups, looked_up: _LookedUp):
    comm = int(sum(k.dur_ns for k in kernels))
    exposed = int(sum(k.exposed_ns for k in kernels))
    overlapped = int(sum(k.overlapped_ns for k in kernels))
    overlap_pct = 100.0 * overlapped / comm
    share = exposed / window
    compute_streams = looked_up.compute_streams
    top, stream_exposed = groups
    worst = top[0]
    launcher = looked_up.launcher
    comm_stream = max(stream_exposed, key=lambda s: (stream_exposed[s], -s))
    comm_streams = sorted(stream_exposed)
    shared_streams = sorted(compute_streams & set(comm_streams))
    # Waiting for a late peer, clipped per kernel to its exposed part (overlapped waiting costs nothing).
    wait = sum(min(cross.wait.get(k.event_id, 0), k.exposed_ns) for k in kernels) if cross else None
    late_rank = cross.latest_rank if cross else None
    wait_share = (wait / exposed) if (wait is not None and exposed) else None
    waiting = wait_share is not None and wait_share >= WAITING
    loaded_ranks = frozenset(r.rank for r in ctx.runs if r.rank is not None)
    hypothesis, advised = _explain(
        run,
        worst,
        launcher,
        cross,
        late_rank,
        waiting,
        exposed,
        comm_stream,
        compute_streams,
        ctx.workload(run.run_id),
        loaded_ranks,
    )
    variants = None if waiting else _variants.find(con, run.run_id, device, "comm", params["variant_min_change"])
    next_experiment = advised.text
    if variants:
        hypothesis += f" Overlap was tried: {variants.sentence()}."
        next_experiment = _variants.next_experiment(variants, "collectives", CHEAPER_COLLECTIVES)
    title = (
        f"rank {run.rank if run.rank is not None else '?'} device {device}: {duration(exposed)} of communication "
        f"exposed ({100 * share:.1f}% of the window), {overlap_pct:.1f}% of {duration(comm)} comm overlapped with compute"
    )
    if waiting:
        title += f"; {100 * wait_share:.1f}% of it waiting for rank {late_rank}"
    op = launcher["op"]
    launch = {k: launcher[k] for k in ("call", "annotation", "collective") if launcher[k]}
    left_out = _phases.run_left_out(con, ctx, run, params)
    note = _phases.caveat(left_out, "the communication kernels and the run window")
    extra = {
        "left_out_ns": sum(w["dur_ns"] for w in left_out),
        "left_out": _phases.listed(left_out),
        "comm_ns": comm,
        "overlapped_ns": overlapped,
        "overlap_pct": round(overlap_pct, 2),
        "comm_kernels": len(kernels),
        "comm_streams": comm_streams,
        "comm_shares_compute_stream": bool(shared_streams),
        "top_collectives": top,
        "worst": {
            "event_id": int(worst["worst_event_id"]),
            "window_ns": [int(x) for x in worst["worst_window_ns"]],
            "exposed_ns": int(worst["worst_exposed_ns"]),
            "launch_event_id": int(launcher["launch_event_id"]) if launcher["launch_event_id"] is not None else None,
            "enclosing_op": launcher["outer"].name if launcher["outer"] else None,
        },
    }
    if variants:
        extra["variants"] = variants.record()
    if cross:
        extra["cross_rank"] = {
            "ranks": cross.peers,
            "wait_for_peers_ns": int(wait),
            "wait_share_of_exposed": round(wait_share, 4) if wait_share is not None else None,
            "latest_rank": late_rank,
            "median_start_skew_ns": cross.median_skew_ns,
            "wait_by_late_rank_ns": {str(k): v for k, v in sorted(cross.late.items())},
        }
    if share >= params["critical_share"]:
        severity = "critical"
    else:
        severity = "warning" if share >= params["min_exposed_share"] else "info"
    bound_elsewhere = _idle_to_exposed(window, exposed, looked_up.steady_busy_ns, params)
    caveats = [note] if note else []
    if bound_elsewhere is not None and bound_elsewhere > params["max_idle_to_exposed"]:
        # hiding the collective cannot shorten a step whose GPU mostly waits for something else
        severity = "info"
        caveats.append(
            f"in the steady time the device idles {bound_elsewhere:.1f}x as long as its communication is exposed: "
            "the step is bound by what keeps the GPU idle (see G001), so hiding this communication would not "
            "shorten it; fix the idle time first"
        )
        extra["idle_to_exposed"] = round(bound_elsewhere, 2)
    return Finding(
        rule="C001",
        severity=advised.cap(severity),
        confidence=0.9 if len(kernels) >= 3 else 0.6,
        title=title,
        locality=locality(
            run,
            device=int(device),
            stream=int(comm_stream),
            kernel=worst["kernel"],
            op=op.name if op else None,
            input_shapes=op.input_dims if op and op.input_dims else None,
            code_path=launcher["code_path"],
            window_ns=[min(k.start_ns for k in kernels), max(k.end_ns for k in kernels)],
            launch=launch or None,
        ),
        observed=Quantity(
            exposed,
            "ns",
            f"{len(kernels)} comm kernels, {duration(comm)} in total, {overlap_pct:.1f}% overlapped with compute; "
            f"{duration(exposed)} exposed = {100 * share:.1f}% of the {duration(window)} window",
        ),
        expected=Quantity(
            int(params["min_exposed_share"] * window),
            "ns",
            f"exposed comm below {100 * params['min_exposed_share']:.0f}% of the window",
        ),
        impact_ns=exposed,
        window_ns=window,
        sql=_collectives.EVIDENCE_SQL,
        sql_params=sql_params,
        sample_event_ids=[k.event_id for k in sorted(kernels, key=lambda k: (-k.exposed_ns, k.event_id))[:5]],
        hypothesis=hypothesis,
        next_experiment=next_experiment,
        acceptance=rerun(
            "trace of this rank",
            f"exposed_share below {params['min_exposed_share']} (or overlap_pct above {params['max_overlap_pct']}), "
            "with step time down by about the exposed time removed"
            + (
                f"; with all ranks loaded, extra.cross_rank.median_start_skew_ns against rank {late_rank} shrinks."
                if waiting
                else "."
            ),
        ),
        caveats=_caveats(params, kernels, exposed, window, shared_streams, cross) + caveats,
        extra=extra,
    )
