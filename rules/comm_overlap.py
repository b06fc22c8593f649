"""Communication not hidden behind computation (C001 exposed-comm).

## What it does
Per rank (run) and device, measures how much of the time spent in communication kernels
(`kernels.is_communication`: `nccl*`, `rccl*`) runs while no compute kernel is busy on the same
device. Compute is the union of all other kernels' intervals on the device (memcpy/memset too when
`memcpy_is_compute` is set); a collective's exposed time is its duration minus its overlap with
that union. Overlap % = overlapped comm / total comm, as HTA's `get_comm_comp_overlap` defines it.
The finding names the rank, device, comm stream, the collectives with the most exposed time (kernel,
`Collective name`, message size, dtype, group size from the kernel's args when the trace has them),
and the op and Python frames that launched the worst one. When several ranks of one job are loaded,
it matches collectives across ranks by order and splits exposed time into *waiting for a late
peer* (start skew) and the rest (transfer).

## Why it matters
Exposed communication is time the device does no compute, so it adds directly to step time.
In tensor-parallel decode, every layer's all-reduce sits between two matmuls; in data-parallel
training, gradient buckets that are not overlapped with the backward pass add up to the comm time.
When most of the exposed time is waiting for another rank, the fix is on the late rank (host
overhead, load imbalance), not in NCCL.

## Example
Rank 0 of a 2-GPU tensor-parallel run: 72 `ncclDevKernel_AllReduce_Sum_bf16_RING_LL` kernels on
stream 7, the compute stream, take 93% of the window with 0% overlap; matched against rank 1, 99.8% of
that is rank 0 waiting for rank 1 to launch the same all-reduce (median start skew 0.35 ms).

Use instead: make the late rank launch sooner (CUDA graphs, less host work per step), or issue the
collective on a side stream (`async_op=True`) and wait for it just before its result is needed.

## Options
- `min_exposed_share` (0.05): report a device whose exposed comm is at least this share of the run window.
- `max_overlap_pct` (20.0): also report a device (info unless its share is large) whose overlap % is below this ...
- `min_comm_share` (0.02): ... when its total comm time is at least this share of the window.
- `memcpy_is_compute` (False): count memcpy/memset as compute that can hide comm (HTA counts kernels only).
- `top_collectives` (5): how many collective groups to list in the finding's details.
"""

from __future__ import annotations

import json

from tracekit.engine.registry import DataQuality, Param, rule
from tracekit.findings.model import Finding, Quantity

# Per communication kernel on one (run, device): its overlap with the union of compute intervals.
# The union is a sweep line (running max of end, a new block where a start passes it). Blocks are
# disjoint, so busy(t) = compute-busy time before t is a running sum plus the part of the block at t;
# a kernel's overlap is busy(end) - busy(start), read with two ASOF joins: no range join, O(n log n).
PER_KERNEL_SQL = """
WITH busy_src AS (
    SELECT ts_ns, end_ns FROM kernels
    WHERE run_id = $run_id AND device = $device AND NOT is_communication AND dur_ns > 0
    UNION ALL
    SELECT ts_ns, end_ns FROM gpu_activities
    WHERE $memcpy_is_compute AND run_id = $run_id AND device = $device AND kind <> 'kernel' AND dur_ns > 0
), marked AS (
    SELECT ts_ns, end_ns,
           CASE WHEN ts_ns <= max(end_ns) OVER (ORDER BY ts_ns, end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                THEN 0 ELSE 1 END AS starts_block
    FROM busy_src
), blocks AS (
    SELECT ts_ns, end_ns, sum(starts_block) OVER (ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS block
    FROM marked
), busy AS (
    SELECT busy_start, busy_end,
           sum(busy_end - busy_start) OVER (ORDER BY busy_start ROWS UNBOUNDED PRECEDING) - (busy_end - busy_start)
             AS busy_before
    FROM (SELECT min(ts_ns) AS busy_start, max(end_ns) AS busy_end FROM blocks GROUP BY block)
), comm AS (
    SELECT event_id, stream, name, ts_ns, end_ns, dur_ns, args FROM kernels
    WHERE run_id = $run_id AND device = $device AND is_communication AND dur_ns IS NOT NULL
), at_start AS (
    SELECT c.event_id, coalesce(b.busy_before + least(c.ts_ns, b.busy_end) - b.busy_start, 0) AS busy_at
    FROM comm c ASOF LEFT JOIN busy b ON c.ts_ns >= b.busy_start
), at_end AS (
    SELECT c.event_id, coalesce(b.busy_before + least(c.end_ns, b.busy_end) - b.busy_start, 0) AS busy_at
    FROM comm c ASOF LEFT JOIN busy b ON c.end_ns >= b.busy_start
)
SELECT c.event_id, c.stream, c.name, c.ts_ns, c.end_ns, c.dur_ns, c.args,
       CAST(e.busy_at - s.busy_at AS BIGINT) AS overlapped_ns,
       CAST(c.dur_ns - (e.busy_at - s.busy_at) AS BIGINT) AS exposed_ns
FROM comm c JOIN at_start s USING (event_id) JOIN at_end e USING (event_id)
"""

# The evidence query: recomputes exposed comm (observed), its share of the window and the overlap %.
EVIDENCE_SQL = (
    "SELECT CAST(sum(exposed_ns) AS BIGINT) AS exposed_ns, CAST(sum(dur_ns) AS BIGINT) AS comm_ns,\n"
    "       CAST(sum(overlapped_ns) AS BIGINT) AS overlapped_ns, count(*) AS comm_kernels,\n"
    "       round(100.0 * sum(overlapped_ns) / nullif(sum(dur_ns), 0), 2) AS overlap_pct,\n"
    "       sum(exposed_ns) / (SELECT end_ns - start_ns FROM runs WHERE run_id = $run_id) AS exposed_share\n"
    "FROM (" + PER_KERNEL_SQL + ") per_kernel"
)

# Collectives matched across the ranks of one job: the n-th comm kernel of a process group on one
# rank is the n-th on every other rank. A peer starting later than this rank means this rank waits.
CROSS_RANK_SQL = """
WITH c AS (
    SELECT k.run_id, r.rank, k.event_id, k.ts_ns, k.end_ns, k.dur_ns,
           coalesce(k.args->>'Process Group Name', '') AS pg,
           row_number() OVER (PARTITION BY k.run_id, coalesce(k.args->>'Process Group Name', '')
                              ORDER BY k.ts_ns, k.event_id) AS seq
    FROM kernels k JOIN runs r USING (run_id)
    WHERE k.is_communication AND k.dur_ns IS NOT NULL AND list_contains($run_ids, k.run_id)
)
SELECT a.run_id, a.event_id, a.ts_ns, a.dur_ns,
       max(b.ts_ns) - a.ts_ns AS latest_peer_start_skew_ns,
       arg_max(b.rank, b.ts_ns) AS latest_peer_rank,
       greatest(max(b.ts_ns), a.ts_ns) <= least(min(b.end_ns), a.end_ns) AS overlaps_peers
FROM c a JOIN c b ON a.pg = b.pg AND a.seq = b.seq AND a.run_id <> b.run_id
GROUP BY a.run_id, a.event_id, a.ts_ns, a.end_ns, a.dur_ns
"""

# The runtime call that launched a kernel and the host events around it on its thread (cpu ops and
# annotations that contain it), innermost first: e.g. cudaLaunchKernel < nccl:all_reduce <
# record_param_comms < c10d::allreduce_ < the module or autograd op that called it.
LAUNCH_CHAIN_SQL = """
WITH l AS (
    SELECT r.event_id, r.run_id, r.pid, r.tid, r.ts_ns, r.end_ns, r.name
    FROM launches x JOIN runtime_calls r ON r.event_id = x.runtime_event_id
    WHERE x.run_id = $run_id AND x.gpu_event_id = $event_id LIMIT 1
)
SELECT l.event_id, 'launch' AS kind, l.name, NULL AS input_dims, NULL AS args, 1000000 AS depth FROM l
UNION ALL
SELECT e.event_id, e.kind, e.name, CAST(coalesce(e.args->'Input Dims', e.args->'Input dims') AS VARCHAR),
       CAST(e.args AS VARCHAR), e.depth
FROM events e, l
WHERE e.run_id = $run_id AND e.pid = l.pid AND e.tid = l.tid AND e.kind IN ('cpu_op', 'user_annotation')
  AND e.ts_ns <= l.ts_ns AND e.end_ns >= l.end_ns
ORDER BY depth DESC, event_id
"""

DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16,
}  # fmt: skip

COLLECTIVE_KEYS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name")
SMALL_MESSAGE_BYTES = 1 << 20  # below ~1 MiB, NCCL time is latency, not bandwidth


def _args(raw) -> dict:
    if not raw:
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _message_bytes(meta: dict) -> int | None:
    size = DTYPE_BYTES.get(str(meta.get("dtype", "")).lower())
    if size is None and str(meta.get("dtype", "")).lower().startswith("float8"):
        size = 1
    try:
        nelems = int(meta["In msg nelems"])
    except (KeyError, TypeError, ValueError):
        return None
    return nelems * size if size else None


def _fmt_ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms" if ns >= 1e5 else f"{ns / 1e3:.1f} us"


def _cross_rank(con, ctx, world: dict[int, int | None]) -> dict[int, dict]:
    """Per run: wait-for-peer time per comm kernel, from collectives matched across the job's ranks.

    Runs are one job when they share world_size and have distinct ranks; matching needs the same number
    of comm kernels per process group on every rank and clocks that make matched kernels overlap.
    """
    jobs: dict[int, list] = {}
    for run in ctx.runs:
        ws = world.get(run.run_id)
        if run.rank is not None and ws and ws > 1:
            jobs.setdefault(ws, []).append(run)
    out: dict[int, dict] = {}
    for ws, runs in jobs.items():
        ranks = [r.rank for r in runs]
        if len(runs) < 2 or len(set(ranks)) != len(ranks):
            continue
        ids = [r.run_id for r in runs]
        counts = con.execute(
            """SELECT run_id, coalesce(args->>'Process Group Name', '') AS pg, count(*), count(DISTINCT device)
               FROM kernels WHERE is_communication AND dur_ns IS NOT NULL AND list_contains(?, run_id)
               GROUP BY ALL""",
            [ids],
        ).fetchall()
        per_pg: dict[str, list] = {}
        for _run_id, pg, n, devices in counts:
            per_pg.setdefault(pg, []).append((n, devices))
        if not per_pg or any(len(v) != len(runs) or len(set(v)) != 1 or v[0][1] != 1 for v in per_pg.values()):
            continue  # collective counts differ per rank (traces cover different steps) or a rank has 2 devices
        rows = con.execute(CROSS_RANK_SQL, {"run_ids": ids}).fetchall()
        if not rows or sum(1 for r in rows if r[6]) < 0.9 * len(rows):
            continue  # matched kernels do not overlap in time: clocks differ between ranks
        for run_id, event_id, _ts, dur, skew, late_rank, _ok in rows:
            entry = out.setdefault(run_id, {"wait": {}, "late": {}, "skews": [], "peers": sorted(set(ranks))})
            entry["wait"][event_id] = int(min(dur, max(0, skew)))
            entry["late"][late_rank] = entry["late"].get(late_rank, 0) + int(min(dur, max(0, skew)))
            entry["skews"].append(int(skew))
    return out


def _median(values: list[int]) -> int:
    s = sorted(values)
    return s[len(s) // 2] if s else 0


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
    },
)
def check(con, params, ctx):
    comm_devices = con.execute(
        "SELECT run_id, device, count(*) FROM kernels WHERE is_communication GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    world = dict(con.execute("SELECT run_id, world_size FROM runs").fetchall())
    with_comm = {r for r, _, _ in comm_devices}
    for run in ctx.runs:
        if run.run_id not in with_comm and (world.get(run.run_id) or 1) > 1:
            has_kernels = con.execute(
                "SELECT EXISTS (SELECT 1 FROM kernels WHERE run_id = ?)", [run.run_id]
            ).fetchone()[0]
            if has_kernels:
                yield DataQuality(
                    "C001",
                    f"run {run.run_id} ({run.label}) has world_size {world[run.run_id]} but no kernel named "
                    "nccl*/rccl*: its collectives are not recognised (custom all-reduce?) or not traced",
                    run.run_id,
                )
    if not comm_devices:
        return
    cross = _cross_rank(con, ctx, world)
    for run_id, device, _n in comm_devices:
        run = ctx.run(run_id)
        window = run.window_ns
        if window <= 0:
            continue
        sql_params = {"run_id": run_id, "device": device, "memcpy_is_compute": bool(params["memcpy_is_compute"])}
        # The same rows the evidence SQL aggregates, so observed == evidence exactly.
        rows = con.execute(
            "SELECT event_id, stream, name, ts_ns, end_ns, dur_ns, CAST(args AS VARCHAR), overlapped_ns, exposed_ns "
            f"FROM ({PER_KERNEL_SQL}) ORDER BY ts_ns, event_id",
            sql_params,
        ).fetchall()
        comm = sum(r[5] for r in rows)
        if not comm:
            continue
        exposed = sum(r[8] for r in rows)
        overlapped = sum(r[7] for r in rows)
        overlap_pct = 100.0 * overlapped / comm
        by_share = exposed / window >= params["min_exposed_share"]
        by_overlap = overlap_pct < params["max_overlap_pct"] and comm / window >= params["min_comm_share"]
        if not (by_share or by_overlap):
            continue
        yield _finding(con, ctx, run, device, params, sql_params, cross.get(run_id), rows,
                       exposed=int(exposed), comm=int(comm), overlapped=int(overlapped), overlap_pct=overlap_pct)  # fmt: skip


def _finding(con, ctx, run, device, params, sql_params, cross, rows, *, exposed, comm, overlapped, overlap_pct):
    window = run.window_ns
    kernels_n = len(rows)
    compute_streams = {
        s for (s,) in con.execute(
            "SELECT DISTINCT stream FROM kernels WHERE run_id = ? AND device = ? AND NOT is_communication",
            [run.run_id, device],
        ).fetchall()
    }  # fmt: skip

    # The nccl:<collective> annotation above each launch names the collective when the kernel's args do not.
    annotations = dict(
        con.execute(
            """SELECT l.gpu_event_id, any_value(p.name) FROM launches l
               JOIN runtime_calls r ON r.event_id = l.runtime_event_id
               JOIN events p ON p.event_id = r.parent_id
               WHERE l.run_id = $run_id AND l.device = $device AND p.kind = 'user_annotation'
                 AND p.name LIKE 'nccl:%' AND l.gpu_kind = 'kernel'
               GROUP BY l.gpu_event_id""",
            {"run_id": run.run_id, "device": device},
        ).fetchall()
    )

    # Group instances into collectives: kernel + collective metadata (or annotation) + stream.
    groups: dict[tuple, dict] = {}
    stream_exposed: dict[int, int] = {}
    for event_id, stream, name, ts, end, dur, raw_args, ov, ex in rows:
        args = _args(raw_args)
        meta = {k: args[k] for k in COLLECTIVE_KEYS if k in args}
        if "Collective name" not in meta and event_id in annotations:
            meta["annotation"] = annotations[event_id]
        key = (name, stream, json.dumps(meta, sort_keys=True))
        g = groups.setdefault(key, {"kernel": name, "stream": stream, **meta, "count": 0, "total_ns": 0,
                                    "overlapped_ns": 0, "exposed_ns": 0, "wait_for_peers_ns": 0,
                                    "worst_event_id": event_id, "worst_exposed_ns": -1, "worst_window_ns": [ts, end]})  # fmt: skip
        g["count"] += 1
        g["total_ns"] += dur
        g["overlapped_ns"] += ov
        g["exposed_ns"] += ex
        if cross:
            g["wait_for_peers_ns"] += min(cross["wait"].get(event_id, 0), ex)
        if ex > g["worst_exposed_ns"]:
            g.update(worst_event_id=event_id, worst_exposed_ns=ex, worst_window_ns=[ts, end])
        stream_exposed[stream] = stream_exposed.get(stream, 0) + ex
    ranked = sorted(groups.values(), key=lambda g: (-g["exposed_ns"], g["kernel"], g["stream"]))
    top = ranked[: max(1, int(params["top_collectives"]))]
    for g in top:
        nbytes = _message_bytes(g)
        if nbytes is not None:
            g["message_bytes"] = nbytes
        if not cross:
            g.pop("wait_for_peers_ns")
    worst = top[0]
    comm_stream = max(stream_exposed, key=lambda s: (stream_exposed[s], -s))
    comm_streams = sorted(stream_exposed)
    shares_stream = bool(compute_streams & set(comm_streams))

    # Who launched the worst instance of the top collective.
    chain = con.execute(LAUNCH_CHAIN_SQL, {"run_id": run.run_id, "event_id": worst["worst_event_id"]}).fetchall()
    launch_call = chain[0][2] if chain else None
    annotation = next((n for _, k, n, _, _, _ in chain if k == "user_annotation" and n.startswith("nccl:")), None)
    ops = [(eid, n, dims) for eid, k, n, dims, _, _ in chain if k == "cpu_op" and n != "record_param_comms"]
    coll_op = ops[0] if ops else None  # the collective op (c10d::allreduce_) or whatever op issued the launch
    outer = ops[-1] if ops else None  # the outermost op on the thread: the model code's entry point
    if "Collective name" not in worst:  # older traces keep collective metadata on record_param_comms only
        rpc = next((_args(a) for _, k, n, _, a, _ in chain if n == "record_param_comms"), {})
        for k in COLLECTIVE_KEYS:
            if k in rpc:
                worst[k] = rpc[k]
    # Frames like "<built-in method allreduce of ... object at 0x7f1c...>" carry a per-process address: drop it
    # so the finding id stays stable across runs.
    code_path = ctx.code_path(chain[0][0]) if chain else []
    collective = worst.get("Collective name") or (annotation or "").removeprefix("nccl:") or None

    # Waiting for a late peer, clipped per kernel to its exposed part (overlapped waiting costs nothing).
    wait = sum(min(cross["wait"].get(r[0], 0), r[8]) for r in rows) if cross else None
    late_rank = max(cross["late"], key=lambda k: (cross["late"][k], -k)) if cross and cross["late"] else None
    wait_share = (wait / exposed) if (wait is not None and exposed) else None

    share = exposed / window
    severity = "critical" if share >= 0.20 else "warning" if share >= params["min_exposed_share"] else "info"
    worst_instance = max(rows, key=lambda r: (r[8], -r[0]))
    nbytes = worst.get("message_bytes")

    title = (
        f"rank {run.rank if run.rank is not None else '?'} device {device}: {_fmt_ms(exposed)} of communication exposed "
        f"({100 * share:.1f}% of the window), {overlap_pct:.1f}% of {_fmt_ms(comm)} comm overlapped with compute"
    )
    if wait_share is not None and wait_share >= 0.5:
        title += f"; {100 * wait_share:.1f}% of it waiting for rank {late_rank}"

    caveats = [
        "Overlap counts any compute kernel running at the same time on the device (HTA's definition); "
        "overlapped kernels still share SMs and memory bandwidth, so overlapped comm is not free.",
    ]
    if not params["memcpy_is_compute"]:
        caveats.append("memcpy/memset are not counted as compute (set memcpy_is_compute to count them).")
    if shares_stream:
        caveats.append(
            f"Communication runs on stream(s) {sorted(compute_streams & set(comm_streams))}, which also run compute: "
            "kernels of one stream never overlap, so these collectives cannot be hidden until they move to a side stream."
        )
    if worst_instance[8] > 0.5 * exposed and len(rows) > 1:
        rest = exposed - worst_instance[8]
        why = (
            "it is the first collective, which often absorbs start-up skew between ranks (profilers started at "
            "different times, a rank still warming up)"
            if worst_instance[0] == rows[0][0]
            else "check whether it is an outlier (a stalled peer, a one-off barrier) before tuning the rest"
        )
        caveats.append(
            f"One instance (event {worst_instance[0]}, {_fmt_ms(worst_instance[8])} exposed) is "
            f"{100 * worst_instance[8] / exposed:.0f}% of the exposed time; {why}. Without it: "
            f"{_fmt_ms(rest)} ({100 * rest / window:.1f}% of the window)."
        )
    if cross is None:
        caveats.append(
            "No other rank of this job could be matched (not loaded, or its trace covers other steps): exposed time "
            "includes waiting for slower ranks. Load all ranks' traces of the same steps to split waiting from transfer."
        )

    if wait_share is not None and wait_share >= 0.5:
        hypothesis = (
            f"Most exposed comm is rank {run.rank} waiting inside the collective for rank {late_rank}, which launches "
            f"the same collective a median {_fmt_ms(_median(cross['skews']))} later: the time is skew, not transfer, "
            "so NCCL tuning or overlap will not remove it."
        )
        next_experiment = (
            f"Find why rank {late_rank} reaches each collective late: compare its per-thread CPU time and GPU busy share "
            f"with rank {run.rank}'s (tracekit summary), and look for host-bound findings (H001 host-sync, launch "
            "overhead) on it; then cut its host work per step (CUDA graphs / torch.compile for the decode step, move "
            "logging or .item() off the step) or rebalance its work. Start the profilers of all ranks after a "
            "torch.distributed.barrier() so the first collective does not absorb start-up skew, and re-profile all ranks."
        )
    elif nbytes is not None and nbytes < SMALL_MESSAGE_BYTES:
        hypothesis = (
            f"{worst['count']} small {collective or 'collective'}s ({nbytes} B each) run with no compute alongside: "
            "each is latency-bound and sits between dependent kernels (e.g. a TP all-reduce between two matmuls), "
            "so the GPU waits for every one."
        )
        next_experiment = (
            "For small latency-bound collectives: try a one-shot/custom all-reduce (vLLM custom_all_reduce, torch "
            "symmetric memory) or NCCL_PROTO=LL / NCCL_ALGO=Tree and compare kernel time; fuse the all-reduce with "
            "the following residual-add + RMSNorm (e.g. FlashInfer/TRT-LLM allreduce fusion); capture the decode step "
            "in a CUDA graph; or overlap it with the next layer's independent compute (async_op=True on a side "
            "stream, wait just before the result is used). Re-profile and re-run the evidence SQL."
        )
    else:
        hypothesis = (
            f"{collective or 'Collectives'} on stream {comm_stream} run with no compute alongside for {_fmt_ms(exposed)}: "
            + (
                "they run on the compute stream itself, so they serialize with the compute that could hide them."
                if comm_stream in compute_streams
                else "they start when no compute is queued (issued after the compute that could hide them, or the "
                "compute stream waits on them)."
            )
        )
        next_experiment = (
            "Issue the collective asynchronously on a communication stream and wait for it only where its result is "
            "needed (async_op=True + work.wait(); DDP bucket_cap_mb / gradient_as_bucket_view; FSDP backward/forward "
            "prefetch; sequence-parallel or async-TP so all-reduce overlaps the next matmul), and check NCCL_ALGO / "
            "NCCL_PROTO / NCCL_NCHANNELS for the message size. Re-profile and re-run the evidence SQL."
        )

    locality = {
        **run.locality(),
        "device": int(device),
        "stream": int(comm_stream),
        "kernel": worst["kernel"],
        "op": coll_op[1] if coll_op else None,
        "input_shapes": coll_op[2] if coll_op and coll_op[2] else None,
        "code_path": code_path or None,
        "window_ns": [int(min(r[3] for r in rows)), int(max(r[4] for r in rows))],
        "launch": {
            k: v for k, v in {"call": launch_call, "annotation": annotation, "collective": collective}.items() if v
        },
    }
    if not locality["launch"]:
        locality["launch"] = None

    extra = {
        "comm_ns": comm,
        "overlapped_ns": overlapped,
        "overlap_pct": round(overlap_pct, 2),
        "comm_kernels": kernels_n,
        "comm_streams": comm_streams,
        "comm_shares_compute_stream": shares_stream,
        "top_collectives": top,
        "worst": {
            "event_id": int(worst["worst_event_id"]),
            "window_ns": [int(x) for x in worst["worst_window_ns"]],
            "exposed_ns": int(worst["worst_exposed_ns"]),
            "launch_event_id": int(chain[0][0]) if chain else None,
            "enclosing_op": outer[1] if outer else None,
        },
    }
    if cross:
        extra["cross_rank"] = {
            "ranks": cross["peers"],
            "wait_for_peers_ns": int(wait),
            "wait_share_of_exposed": round(wait_share, 4) if wait_share is not None else None,
            "latest_rank": late_rank,
            "median_start_skew_ns": _median(cross["skews"]),
            "wait_by_late_rank_ns": {str(k): v for k, v in sorted(cross["late"].items())},
        }
    samples = [r[0] for r in sorted(rows, key=lambda r: (-r[8], r[0]))[:5]]
    return Finding(
        rule="C001",
        severity=severity,
        confidence=0.9 if kernels_n >= 3 else 0.6,
        title=title,
        locality=locality,
        observed=Quantity(
            exposed,
            "ns",
            f"{kernels_n} comm kernels, {_fmt_ms(comm)} in total, {overlap_pct:.1f}% overlapped with compute; "
            f"{_fmt_ms(exposed)} exposed = {100 * share:.1f}% of the {_fmt_ms(window)} window",
        ),
        expected=Quantity(
            int(params["min_exposed_share"] * window),
            "ns",
            f"exposed comm below {100 * params['min_exposed_share']:.0f}% of the window",
        ),
        impact_ns=exposed,
        window_ns=window,
        sql=EVIDENCE_SQL,
        sql_params=sql_params,
        sample_event_ids=samples,
        hypothesis=hypothesis,
        next_experiment=next_experiment,
        acceptance=(
            "Re-run the evidence SQL on the new trace of this rank: exposed_share below "
            f"{params['min_exposed_share']} (or overlap_pct above {params['max_overlap_pct']}), with step time "
            "down by about the exposed time removed"
            + (
                f"; with all ranks loaded, extra.cross_rank.median_start_skew_ns against rank {late_rank} shrinks."
                if wait_share is not None and wait_share >= 0.5
                else "."
            )
        ),
        caveats=caveats,
        extra=extra,
    )
