"""Communication kernels, their overlap with compute, and collectives matched across ranks (what
C001 exposed-comm measures)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tracekit.engine.toolkit import rows

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


def kernel_args(raw) -> dict:
    """A kernel's args column (JSON text) as a dict; anything else as {}."""
    if not raw:
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def message_bytes(meta: dict) -> int | None:
    """Bytes per message from a collective's element count and dtype, when both are known."""
    size = DTYPE_BYTES.get(str(meta.get("dtype", "")).lower())
    if size is None and str(meta.get("dtype", "")).lower().startswith("float8"):
        size = 1
    try:
        nelems = int(meta["In msg nelems"])
    except (KeyError, TypeError, ValueError):
        return None
    return nelems * size if size else None


def per_kernel(con, sql_params: dict) -> list:
    """The comm kernels of one (run, device) with their overlapped and exposed time: the rows the
    evidence SQL aggregates, so the finding's numbers equal the evidence exactly."""
    return rows(
        con,
        "SELECT event_id, stream, name, ts_ns, end_ns, dur_ns, CAST(args AS VARCHAR) AS args, overlapped_ns, "
        f"exposed_ns FROM ({PER_KERNEL_SQL}) ORDER BY ts_ns, event_id",
        sql_params,
    )


def launch_chain(con, run_id: int, event_id: int) -> list:
    """The launch call of a kernel and the host events around it, innermost first."""
    return rows(con, LAUNCH_CHAIN_SQL, {"run_id": run_id, "event_id": event_id})


@dataclass
class CrossRank:
    """One rank's collectives matched against its peers': per comm kernel the time spent waiting for
    the latest peer to start it, summed per late rank, and every start skew."""

    peers: list[int]
    wait: dict[int, int] = field(default_factory=dict)
    late: dict[int, int] = field(default_factory=dict)
    skews: list[int] = field(default_factory=list)

    @property
    def median_skew_ns(self) -> int:
        s = sorted(self.skews)
        return s[len(s) // 2] if s else 0

    @property
    def latest_rank(self) -> int | None:
        return max(self.late, key=lambda k: (self.late[k], -k)) if self.late else None


def cross_rank(con, ctx, world: dict[int, int | None]) -> dict[int, CrossRank]:
    """Per run: wait-for-peer time per comm kernel, from collectives matched across the job's ranks.

    Runs are one job when they share world_size and have distinct ranks; matching needs the same number
    of comm kernels per process group on every rank and clocks that make matched kernels overlap.
    """
    jobs: dict[int, list] = {}
    for run in ctx.runs:
        ws = world.get(run.run_id)
        if run.rank is not None and ws and ws > 1:
            jobs.setdefault(ws, []).append(run)
    out: dict[int, CrossRank] = {}
    for runs in jobs.values():
        ranks = [r.rank for r in runs]
        if len(runs) < 2 or len(set(ranks)) != len(ranks):
            continue
        ids = [r.run_id for r in runs]
        counts = rows(
            con,
            """SELECT run_id, coalesce(args->>'Process Group Name', '') AS pg, count(*) AS kernels,
                      count(DISTINCT device) AS devices
               FROM kernels WHERE is_communication AND dur_ns IS NOT NULL AND list_contains(?, run_id)
               GROUP BY ALL""",
            [ids],
        )
        per_pg: dict[str, list] = {}
        for c in counts:
            per_pg.setdefault(c.pg, []).append(c)
        if not per_pg or any(
            len(ranks_of_pg) != len(runs)
            or {(c.kernels, c.devices) for c in ranks_of_pg} != {(ranks_of_pg[0].kernels, 1)}
            for ranks_of_pg in per_pg.values()
        ):
            continue  # collective counts differ per rank (traces cover different steps) or a rank has 2 devices
        matched = rows(con, CROSS_RANK_SQL, {"run_ids": ids})
        if not matched or sum(1 for m in matched if m.overlaps_peers) < 0.9 * len(matched):
            continue  # matched kernels do not overlap in time: clocks differ between ranks
        for m in matched:
            entry = out.setdefault(m.run_id, CrossRank(peers=sorted(set(ranks))))
            waited = int(min(m.dur_ns, max(0, m.latest_peer_start_skew_ns)))
            entry.wait[m.event_id] = waited
            entry.late[m.latest_peer_rank] = entry.late.get(m.latest_peer_rank, 0) + waited
            entry.skews.append(int(m.latest_peer_start_skew_ns))
    return out


def collective_groups(
    con, run_id: int, device: int, kernels: list, cross, top_n: int
) -> tuple[list[dict], dict[int, int]]:
    """The comm kernels grouped into collectives (kernel + collective metadata or annotation + stream),
    most exposed first, and the exposed time per stream."""
    # The nccl:<collective> annotation above each launch names the collective when the kernel's args do not.
    annotations = dict(
        con.execute(
            """SELECT l.gpu_event_id, any_value(p.name) FROM launches l
               JOIN runtime_calls r ON r.event_id = l.runtime_event_id
               JOIN events p ON p.event_id = r.parent_id
               WHERE l.run_id = $run_id AND l.device = $device AND p.kind = 'user_annotation'
                 AND p.name LIKE 'nccl:%' AND l.gpu_kind = 'kernel'
               GROUP BY l.gpu_event_id""",
            {"run_id": run_id, "device": device},
        ).fetchall()
    )
    groups: dict[tuple, dict] = {}
    stream_exposed: dict[int, int] = {}
    for k in kernels:
        args = kernel_args(k.args)
        meta = {key: args[key] for key in COLLECTIVE_KEYS if key in args}
        if "Collective name" not in meta and k.event_id in annotations:
            meta["annotation"] = annotations[k.event_id]
        g = groups.setdefault(
            (k.name, k.stream, json.dumps(meta, sort_keys=True)),
            {"kernel": k.name, "stream": k.stream, **meta, "count": 0, "total_ns": 0, "overlapped_ns": 0,
             "exposed_ns": 0, "wait_for_peers_ns": 0, "worst_event_id": k.event_id, "worst_exposed_ns": -1,
             "worst_window_ns": [k.ts_ns, k.end_ns]},
        )  # fmt: skip
        g["count"] += 1
        g["total_ns"] += k.dur_ns
        g["overlapped_ns"] += k.overlapped_ns
        g["exposed_ns"] += k.exposed_ns
        if cross:
            g["wait_for_peers_ns"] += min(cross.wait.get(k.event_id, 0), k.exposed_ns)
        if k.exposed_ns > g["worst_exposed_ns"]:
            g.update(worst_event_id=k.event_id, worst_exposed_ns=k.exposed_ns, worst_window_ns=[k.ts_ns, k.end_ns])
        stream_exposed[k.stream] = stream_exposed.get(k.stream, 0) + k.exposed_ns
    ranked = sorted(groups.values(), key=lambda g: (-g["exposed_ns"], g["kernel"], g["stream"]))
    top = ranked[: max(1, int(top_n))]
    for g in top:
        nbytes = message_bytes(g)
        if nbytes is not None:
            g["message_bytes"] = nbytes
        if not cross:
            g.pop("wait_for_peers_ns")
    return top, stream_exposed


def launcher(con, ctx, run_id: int, worst: dict) -> dict:
    """Who launched the worst instance of the top collective: the call, the nccl annotation, the
    collective op and the outermost op on the thread, the Python frames. Fills in the collective
    metadata that older traces keep on record_param_comms only."""
    chain = launch_chain(con, run_id, worst["worst_event_id"])
    ops = [c for c in chain if c.kind == "cpu_op" and c.name != "record_param_comms"]
    if "Collective name" not in worst:
        rpc = next((kernel_args(c.args) for c in chain if c.name == "record_param_comms"), {})
        worst.update({k: rpc[k] for k in COLLECTIVE_KEYS if k in rpc})
    annotation = next((c.name for c in chain if c.kind == "user_annotation" and c.name.startswith("nccl:")), None)
    return {
        "launch_event_id": chain[0].event_id if chain else None,
        "call": chain[0].name if chain else None,
        "annotation": annotation,
        "op": ops[0] if ops else None,  # the collective op (c10d::allreduce_) or whatever op issued the launch
        "outer": ops[-1] if ops else None,  # the outermost op on the thread: the model code's entry point
        "code_path": ctx.code_path(chain[0].event_id) if chain else [],
        "collective": worst.get("Collective name") or (annotation or "").removeprefix("nccl:") or None,
    }
