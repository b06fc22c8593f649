"""Communication kernels of one device with their overlap with compute, grouped into collectives and
matched across ranks (what C001 exposed-comm measures), read off the `collectives` view."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from tracekit.engine.toolkit import rows
from tracekit.rules import _phases

# Per communication kernel of one (run, device): its overlap with the union of what can hide it
# (the device's compute kernels, as the `compute` layer of gpu_busy_layers has them; memcpy/memset
# too when they count), read off the union's blocks by busy_between, without a range join. The
# union is taken here, over this device's kernels only, rather than read from gpu_busy_layers, which
# would merge every device of every run for each device asked.
PER_KERNEL_SQL = """
WITH all_comm AS (
    SELECT run_id, device AS comm_device, kernel_event_id AS event_id, kernel_name AS name, stream, gpu_ts_ns AS start_ns,
           gpu_end_ns AS end_ns, gpu_dur_ns AS dur_ns, collective, process_group, dtype, in_nelems, out_nelems,
           group_size, bytes, annotation, launch_event_id
    FROM collectives WHERE run_id = $run_id AND device = $device AND kernel_event_id IS NOT NULL
), comm AS (
    -- the steady state only (unless $all_phases): a kernel mostly inside a warm-up, capture or
    -- profiler window (`run_phases`) is left out
    SELECT * EXCLUDE (comm_device, left_out_ns, steady_ns), comm_device AS lane
    FROM steady_between('all_comm', all_phases := $all_phases) WHERE 2 * left_out_ns <= dur_ns
), hiding AS (
    SELECT run_id, device AS lane, ts_ns, end_ns FROM kernels
    WHERE NOT is_communication AND dur_ns IS NOT NULL AND run_id = $run_id AND device = $device
    UNION ALL
    SELECT run_id, device, ts_ns, end_ns FROM gpu_activities
    WHERE $memcpy_is_compute AND kind <> 'kernel' AND run_id = $run_id AND device = $device
), hiding_blocks AS (SELECT * FROM interval_union('hiding'))
SELECT * EXCLUDE (lane, busy_ns), busy_ns AS overlapped_ns, dur_ns - busy_ns AS exposed_ns
FROM busy_between('comm', 'hiding_blocks')
"""

# The evidence query: recomputes exposed comm (observed), its share of the window and the overlap %.
EVIDENCE_SQL = (
    "SELECT CAST(sum(exposed_ns) AS BIGINT) AS exposed_ns, CAST(sum(dur_ns) AS BIGINT) AS comm_ns,\n"
    "       CAST(sum(overlapped_ns) AS BIGINT) AS overlapped_ns, count(*) AS comm_kernels,\n"
    "       round(100.0 * sum(overlapped_ns) / nullif(sum(dur_ns), 0), 2) AS overlap_pct,\n"
    "       sum(exposed_ns) / (SELECT CASE WHEN $all_phases THEN window_ns ELSE steady_ns END FROM run_steady\n"
    "                          WHERE run_id = $run_id) AS exposed_share\n"
    "FROM (" + PER_KERNEL_SQL + ") per_kernel"
)

# Each communication kernel of this database's runs against the same collective on the job's other
# ranks (`collective_extremes`: the call's two latest starts and two earliest ends over the ranks,
# so a rank's latest peer and earliest peer end come without pairing it with every other rank; in a
# cluster worker, over every rank of the job, from what it was sent). A peer starting later means
# this rank waits. The n-th kernel of a process group on one rank is the n-th on every other rank.
CROSS_RANK_SQL = """
WITH own AS (
    SELECT run_id, rank, world_size, process_group, event_id, start_ns AS ts_ns, end_ns, dur_ns,
           row_number() OVER (PARTITION BY run_id, process_group ORDER BY seq) AS n
    FROM job_collectives
    WHERE on_device AND list_contains($run_ids, run_id) AND list_contains($own_run_ids, run_id)
), peers AS (
    SELECT a.run_id, a.event_id, a.ts_ns, a.end_ns, a.dur_ns,
           CASE WHEN e.latest_starts[1].rank = a.rank THEN e.latest_starts[2] ELSE e.latest_starts[1] END AS latest,
           CASE WHEN e.earliest_ends[1].rank = a.rank THEN e.earliest_ends[2] ELSE e.earliest_ends[1] END AS earliest
    FROM own a JOIN collective_extremes e
      ON e.world_size = a.world_size AND e.process_group = a.process_group AND e.n = a.n
    WHERE len(e.latest_starts) > 1
)
SELECT run_id, event_id, ts_ns, dur_ns, latest.start_ns - ts_ns AS latest_peer_start_skew_ns,
       latest.rank AS latest_peer_rank,
       greatest(latest.start_ns, ts_ns) <= least(earliest.end_ns, end_ns) AS overlaps_peers
FROM peers
"""

# The job's ranked runs with communication kernels: (run, rank, world size), this database's and,
# in a cluster worker, every other rank's.
MEMBERS_SQL = "SELECT DISTINCT run_id, rank, world_size FROM collective_counts ORDER BY run_id"

# Per run of one job and process group: its communication kernels and the devices they ran on.
COUNTS_SQL = """
SELECT run_id, process_group AS pg, calls AS kernels, devices FROM collective_counts
WHERE list_contains($run_ids, run_id)
"""

# The launch call and the host events around it on its thread (cpu ops and annotations that contain
# it), innermost first: e.g. cudaLaunchKernel < nccl:all_reduce < record_param_comms <
# c10d::allreduce_ < the module or autograd op that called it.
LAUNCH_CHAIN_SQL = """
WITH l AS (
    SELECT event_id, run_id, pid, tid, ts_ns, end_ns, name FROM runtime_calls
    WHERE list_contains($launch_event_ids, event_id)
)
SELECT l.event_id AS launch_event_id, l.event_id, 'launch' AS kind, l.name, NULL AS input_dims, 1000000 AS depth FROM l
UNION ALL
SELECT l.event_id, e.event_id, e.kind, e.name, CAST(coalesce(e.args->'Input Dims', e.args->'Input dims') AS VARCHAR),
       e.depth
FROM events e JOIN l ON e.run_id = l.run_id AND e.pid = l.pid AND e.tid = l.tid
WHERE e.kind IN ('cpu_op', 'user_annotation') AND e.ts_ns <= l.ts_ns AND e.end_ns >= l.end_ns
ORDER BY launch_event_id, depth DESC, event_id
"""

# What makes two comm kernels one collective in the finding's details (beside kernel name and stream).
GROUP_KEYS = ("collective", "process_group", "dtype", "in_nelems", "out_nelems", "group_size")


def _rewritten(sql: str, *changes: tuple[str, str]) -> str:
    """`sql` with each (old, new) replaced, every old text required to be there."""
    for old, new in changes:
        if old not in sql:
            raise RuntimeError(f"cannot derive a query: {old!r} is not in it")
        sql = sql.replace(old, new)
    return sql


# PER_KERNEL_SQL for every device of several runs at once ($run_ids), each row with its `lane` (the
# device): the union and the overlap are per (run, device) either way, so each device's rows are
# those PER_KERNEL_SQL (the evidence's) gives it, and the statement is planned once rather than once
# per device.
PER_KERNEL_OF_RUNS_SQL = _rewritten(
    PER_KERNEL_SQL,
    ("run_id = $run_id AND device = $device", "list_contains($run_ids, run_id)"),
    ("SELECT * EXCLUDE (lane, busy_ns), busy_ns AS", "SELECT * EXCLUDE (busy_ns), busy_ns AS"),
)


def per_kernel_of_runs(con, ctx, run_ids: list[int], memcpy_is_compute: bool, all_phases: bool) -> dict:
    """The comm kernels of every (run, device) of these runs with their overlapped and exposed time,
    by (run, device), from one statement: per device, the rows the evidence SQL aggregates, so the
    finding's numbers equal the evidence exactly."""
    sql = _phases.in_rule(con, ctx, PER_KERNEL_OF_RUNS_SQL)
    out: dict[tuple[int, int], list] = {}
    for k in rows(
        con,
        f"SELECT * FROM ({sql}) ORDER BY run_id, lane, start_ns, event_id",
        {"run_ids": run_ids, "memcpy_is_compute": memcpy_is_compute, "all_phases": all_phases},
    ):
        out.setdefault((k.run_id, k.lane), []).append(k)
    return out


@dataclass
class CrossRank:
    """One rank's collectives matched against its peers': per comm kernel the time spent waiting for
    the latest peer to start it, summed per late rank, and every start skew."""

    peers: list[int]
    wait: dict[int, int] = field(default_factory=dict)
    # kernels whose wait the rank recorded itself inside the collective (not a start skew)
    recorded: set[int] = field(default_factory=set)
    late: dict[int, int] = field(default_factory=dict)
    skews: list[int] = field(default_factory=list)

    @property
    def median_skew_ns(self) -> int:
        s = sorted(self.skews)
        return s[len(s) // 2] if s else 0

    @property
    def latest_rank(self) -> int | None:
        return max(self.late, key=lambda k: (self.late[k], -k)) if self.late else None


def cross_rank(con, ctx) -> dict[int, CrossRank]:
    """Per run of this database: wait-for-peer time per comm kernel, from collectives matched across
    the job's ranks (`collective_counts` and `collective_extremes`, which in a cluster worker are of
    every rank of the job, from what it was sent).

    Runs are one job when they share world_size and have distinct ranks; matching needs the same number
    of comm kernels per process group on every rank and clocks that make matched kernels overlap.
    """
    own = {r.run_id for r in ctx.runs}
    ranked = con.execute(
        "SELECT (SELECT count(*) FROM runs WHERE rank IS NOT NULL AND world_size > 1) + (SELECT count(*) FROM "
        "(SELECT 1 FROM peer_collectives LIMIT 1)) + (SELECT count(*) FROM (SELECT 1 FROM peer_collective_counts LIMIT 1))"
    ).fetchone()[0]
    if ranked < 2:  # one rank and no peers: nothing to match (and `job_collectives` is not cheap)
        return {}
    jobs: dict[int, list] = {}
    for m in rows(con, MEMBERS_SQL):
        if m.rank is not None and m.world_size and m.world_size > 1:
            jobs.setdefault(m.world_size, []).append(m)
    out: dict[int, CrossRank] = {}
    for members in jobs.values():
        ranks = [m.rank for m in members]
        if len(members) < 2 or len(set(ranks)) != len(ranks) or not own & {m.run_id for m in members}:
            continue
        ids = [m.run_id for m in members]
        counts = rows(con, COUNTS_SQL, {"run_ids": ids})
        per_pg: dict[str, list] = {}
        for c in counts:
            per_pg.setdefault(c.pg, []).append(c)
        if not per_pg or any(
            len(ranks_of_pg) != len(members)
            or {(c.kernels, c.devices) for c in ranks_of_pg} != {(ranks_of_pg[0].kernels, 1)}
            for ranks_of_pg in per_pg.values()
        ):
            continue  # collective counts differ per rank (traces cover different steps) or a rank has 2 devices
        matched = rows(con, CROSS_RANK_SQL, {"run_ids": ids, "own_run_ids": sorted(own)})
        if not matched or sum(1 for m in matched if m.overlaps_peers) < 0.9 * len(matched):
            continue  # matched kernels do not overlap in time: clocks differ between ranks
        for m in matched:
            entry = out.setdefault(m.run_id, CrossRank(peers=sorted(set(ranks))))
            waited = int(min(m.dur_ns, max(0, m.latest_peer_start_skew_ns)))
            entry.wait[m.event_id] = waited
            entry.late[m.latest_peer_rank] = entry.late.get(m.latest_peer_rank, 0) + waited
            entry.skews.append(int(m.latest_peer_start_skew_ns))
    return out


# The waits a rank recorded itself inside its collectives: HCCL (Ascend) writes each op's Notify_Wait
# tasks, and the longest one is how long the rank waited there for its latest peer's signal.
OWN_WAITS_SQL = """
SELECT event_id, TRY_CAST(args->>'longest notify wait ns' AS BIGINT) AS waited,
       TRY_CAST(args->>'longest notify wait peer' AS INTEGER) AS peer
FROM kernels WHERE run_id = $run_id AND is_communication AND args->>'longest notify wait ns' IS NOT NULL
"""


def with_own_waits(con, run_id: int, cross: CrossRank | None) -> CrossRank | None:
    """`cross` with each collective's wait raised to what the rank recorded itself waiting inside it
    for a peer (OWN_WAITS_SQL), so a peer that is not loaded (or not profiled) can still be the late
    one; unchanged when the trace records no such waits."""
    own = [w for w in rows(con, OWN_WAITS_SQL, {"run_id": run_id}) if w.waited and w.peer is not None]
    if not own:
        return cross
    out = cross or CrossRank(peers=sorted({w.peer for w in own}))
    for w in own:
        if w.waited > out.wait.get(w.event_id, 0):
            out.wait[w.event_id] = int(w.waited)
            out.late[w.peer] = out.late.get(w.peer, 0) + int(w.waited)
            out.recorded.add(w.event_id)
    return out


def collective_groups(kernels: list, cross, top_n: int) -> tuple[list[dict], dict[int, int]]:
    """The comm kernels grouped into collectives (kernel, stream and the view's collective, process
    group and message), most exposed first, and the exposed time per stream."""
    groups: dict[tuple, dict] = {}
    stream_exposed: dict[int, int] = {}
    group_of = attrgetter("name", "stream", *GROUP_KEYS)
    for k in kernels:
        key = group_of(k)
        g = groups.get(key)
        if g is None:
            meta = {name: value for name, value in zip(GROUP_KEYS, key[2:]) if value is not None}
            g = groups[key] = {
                "kernel": k.name, "stream": k.stream, **meta, "count": 0, "total_ns": 0, "overlapped_ns": 0,
                "exposed_ns": 0, "wait_for_peers_ns": 0, "worst_event_id": k.event_id, "worst_exposed_ns": -1,
                "worst_window_ns": [k.start_ns, k.end_ns],
            }  # fmt: skip
            if k.bytes is not None:
                g["message_bytes"] = k.bytes
        g["count"] += 1
        g["total_ns"] += k.dur_ns
        g["overlapped_ns"] += k.overlapped_ns
        g["exposed_ns"] += k.exposed_ns
        if cross:
            g["wait_for_peers_ns"] += min(cross.wait.get(k.event_id, 0), k.exposed_ns)
        if k.exposed_ns > g["worst_exposed_ns"]:
            g.update(worst_event_id=k.event_id, worst_exposed_ns=k.exposed_ns, worst_window_ns=[k.start_ns, k.end_ns])
        stream_exposed[k.stream] = stream_exposed.get(k.stream, 0) + k.exposed_ns
    ranked = sorted(groups.values(), key=lambda g: (-g["exposed_ns"], g["kernel"], g["stream"]))
    top = ranked[: max(1, int(top_n))]
    if not cross:
        for g in top:
            g.pop("wait_for_peers_ns")
    return top, stream_exposed


def launchers(con, ctx, kernels: list) -> dict[int, dict]:
    """Who launched each of these comm kernels (the worst instance of a finding's top collective), by
    the kernel's event id: the call, the nccl annotation, the collective op and the outermost op on the
    thread, the Python frames. The kernels' launch chains and code paths are read together."""
    launches = [k.launch_event_id for k in kernels if k.launch_event_id is not None]
    chains: dict[int, list] = {}
    if launches:
        for c in rows(con, LAUNCH_CHAIN_SQL, {"launch_event_ids": launches}):
            chains.setdefault(c.launch_event_id, []).append(c)
    paths = ctx.code_paths(launches)
    out = {}
    for kernel in kernels:
        launch = kernel.launch_event_id
        chain = chains.get(launch, [])
        ops = [c for c in chain if c.kind == "cpu_op" and c.name != "record_param_comms"]
        out[kernel.event_id] = {
            "launch_event_id": launch,
            "call": chain[0].name if chain else None,
            "annotation": kernel.annotation,
            "op": ops[0] if ops else None,  # the collective op (c10d::allreduce_) or whatever op issued the launch
            "outer": ops[-1] if ops else None,  # the outermost op on the thread: the model code's entry point
            "code_path": paths.get(launch, []) if launch is not None else [],
            "collective": kernel.collective,
        }
    return out
