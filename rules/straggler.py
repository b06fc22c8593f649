"""One rank holds the others back at their collectives, and what on it grew (R001 straggler).

## What it does
Reads only the per-rank summaries, so it runs the same in one database of every rank and in a
cluster run's reducer. Per job (the ranked runs of one world size that share collectives), over the
iterations of the steady steps (`rank_step_waits`: a step's start to the next step's start, with the
ranks put on one clock by `collective_arrivals`), it takes each rank's mean wait for its peers inside
collectives per iteration. The rank that waits least is the one the others wait for; it *holds them
back* by the median of the other ranks' mean wait minus its own. Ranks that arrive last together (a
slow node: the ranks' mean waits split by a gap of at least `min_held_share` of the iteration and
half their range, no more ranks below the gap than above it) are one late group: the rank that
waits least stands for it, the time held and the causes are measured against the ranks above the
gap, the title names the group and `late_together` lists it (on 64 copies of the TP=2 pair, 32
ranks arrive last together, where the finding had said the other 63 waited). When the time held is at least
`min_held_share` of the iteration, the rule looks for the cause in that rank's own breakdown against
the median of its peers: a named op, annotation or kernel that takes longer per iteration
(`rank_op_times`: its total time, or its self time, which is host time inside it outside any traced
op and outside waiting for a collective), or a late start of its iterations (`rank_steps.lead_in_ns`:
time before its first traced work). The cause is named when it accounts for at least
`explain_share` of the time held; the finding lists the next candidates too. A rank that holds
the others back on average but not steadily (the held time's mean over its standard error across
iterations under `min_t`) is reported at info, as possible noise. It names the
collective where the others wait most for that rank. When the cause is an op or kernel and the rank
is given more input than its peers in some op (R005 load-imbalance's test at its default
thresholds, over `rank_op_inputs`), the finding says so, and its next experiment is to even out the
work instead of comparing the op's shapes and speed on two ranks. When instead the rank runs most
of the ops it shares with every peer slower at the same calls per iteration (at least half of them,
holding `uniform_share` of the peers' time in them, each at least `slower_ratio` slower), the
finding says the rank's core or GPU is slower, not one op, and its next experiment is a fixed
benchmark on that device.

## Why it matters
A collective finishes when its last rank arrives, so every other rank of the job loses the late
rank's delay, every iteration: one slow data loader or one rank with more work costs the whole job.
Per-rank views show the waiting on the *fast* ranks (long collectives, idle GPUs) and nothing
unusual on the slow one; only the cross-rank comparison names it. When the late rank does no more
work than its peers (its GPU idles as long as theirs wait, as in a host-launch-bound job whose ranks
started at different times), there is no rank to fix: the finding says so and stays at info.

## Example
Two gloo ranks on one H200 host (`sample_traces/gloo_rank0/1.json.gz`), where rank 1 sleeps 8 ms
inside its `grad_sync` annotation before the all-reduce: rank 0 waits 7.8 ms per iteration in the
all-reduce, rank 1 59 us; `grad_sync` holds 6.6 ms per iteration of host time on rank 1 outside any
traced op or collective, 6.1 ms more than on rank 0. In the eight-rank matrix cell slow_compute,
the finding names rank 5 and its op `extra_compute` (4.0 ms per iteration, run on no other rank),
holding the other seven ranks 2.9 ms per 31.8 ms iteration at the first gradient all-reduce. In
the expert-parallel sample `ep_hot_expert_rank0..3.json.gz`, rank 1's `expert` annotation takes
47.0 ms per iteration more than its peers' median and its `aten::linear` gets 3.7x the median rank's
input ([4508, 1024] against [1228, 1024]): rank 1 is given more work, not slower.

## Checked on
The eight-rank gloo matrix (healthy; extra compute of 10, 20 and 30% on one rank; 5 ms of
DataLoader work on one rank; a 5 ms and a 2 ms late start on one rank: tests/test_rule_straggler.py),
the 2-rank gloo sample with an 8 ms host delay in `grad_sync` on rank 1, and the 2xH200
tensor-parallel sample (rank 1 arrives last at every all-reduce with no extra work: info). Over the
matrix the healthy cell's least-waiting rank holds the others 3.1% of the iteration and nothing on it
explains more than 38% of that; every injected straggler holds them 5.7-17% and its cause explains
96-130%. The expert-parallel matrix (tests/data/ep_matrix, 4 and 8 gloo ranks): the hot-expert
cells are called given more input, in agreement with R005; in the 4-rank `slower_core` cell (a
data-parallel run made before the script moved its ranks between cores) rank 3 runs 45 of its 54
ops (93% of the time) at least 1.1x slower, 1.23x in all: a slower core, reported as such
(critical, 17.5%). No injected straggler of the rank matrix comes near that (at most 7% of the
peers' time in slower ops with the same calls), nor a balanced cell (at most 16%, or 2 ops of 15).
Whether the time held is steady or noise: over the iterations, its mean divided by its standard
error (t) is 2.3-6.4 for the rank matrix's injected stragglers (the weakest: 10% extra compute and a
2 ms late start), 11-36 for the hot experts and 10.6 for the slower core, but 1.1-2.1 on the
healthy and balanced cells whose ranks moved between cores (a few iterations' spikes on a shared
host); those are held at info, and say so.

## Options
- `min_held_share` (0.04): report a rank that holds the others back at least this share of the
  iteration (healthy matrix cell 3.1%; the smallest injected straggler, a 2 ms late start, 5.7%).
- `explain_share` (0.5): a cause is named when its excess over the peers is at least this share of
  the time held (healthy cell: 38% at most; injected stragglers: 96% or more).
- `critical_share` (0.15): severity critical when an explained straggler holds the others at least
  this share of the iteration; below it, warning; unexplained, info.
- `min_steps` (3): iterations with collectives each rank needs before the ranks are compared.
- `near_best` (0.8): among causes within this share of the largest, one that runs on this rank only
  is named first (the op added, not its parent).
- `min_t` (2.2): the time held per iteration, mean over standard error, that a warning or critical
  needs; below it the finding is info and asks for more iterations (noise: 2.1 at most; injected
  stragglers: 2.3 at least).
- `slower_ratio` (1.1): an op the rank runs as often as its peers counts as slower from this ratio of
  its self time per iteration to the peers' median.
- `uniform_share` (0.6): the rank is slower across the board when at least half of those ops are
  slower and they hold this share of the peers' time (slower core: 0.93; injected stragglers and
  balanced cells: 0.16 at most).
"""

from __future__ import annotations

import math
import statistics

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _inputs, _ranks
from tracekit.units import duration

# In how many iterations the rank waited less than the median of the other ranks in the same
# iteration (near 1 for a rank that is late every time, about half for noise), and the time it held
# them back per iteration: its mean and standard deviation over the iterations.
CONSISTENCY_SQL = """
WITH s AS (SELECT * FROM rank_step_waits WHERE collectives > 0 AND list_contains($run_ids, run_id)
           QUALIFY phase = 'steady' OR count(*) FILTER (WHERE phase = 'steady') OVER (PARTITION BY run_id) = 0),
o AS (SELECT a.step_index, a.wait_ns, median(b.wait_ns) AS others FROM s a
      JOIN s b ON a.step_index = b.step_index AND a.rank <> b.rank WHERE a.rank = $rank GROUP BY ALL)
SELECT count(*) FILTER (WHERE wait_ns < others) AS below, count(*) AS steps,
       avg(others - wait_ns) AS held_mean, stddev_samp(others - wait_ns) AS held_sd FROM o
"""

# Per collective (group, name): how much longer the other ranks wait in it per iteration than this rank.
BY_COLLECTIVE_SQL = """
WITH a AS (SELECT * FROM collective_arrivals WHERE list_contains($run_ids, run_id)),
per AS (SELECT rank, process_group, collective, sum(wait_ns) AS wait_ns FROM a GROUP BY ALL)
SELECT p.process_group, p.collective, median(p.wait_ns) FILTER (WHERE p.rank <> $rank) - coalesce(
           max(p.wait_ns) FILTER (WHERE p.rank = $rank), 0) AS held_ns
FROM per p GROUP BY ALL ORDER BY held_ns DESC, p.collective LIMIT 1
"""

# Collective calls and their kernels, which the cause and slowdown queries leave out: their time is
# the waiting for peers, not the rank's own work.
COLLECTIVE_NAME = (
    "(name LIKE 'gloo:%' OR name LIKE 'nccl:%' OR name LIKE 'c10d::%' OR name = 'record_param_comms' "
    "OR name LIKE 'nccl%Kernel%')"
)

# This rank's time per iteration in each named op, annotation and kernel against the median of its
# peers (a peer without the name counts 0): total and self time, and whether any peer runs it.
OPS_SQL = f"""
WITH o AS (SELECT * FROM rank_op_times WHERE list_contains($run_ids, run_id)),
me AS (SELECT * FROM o WHERE rank = $rank),
peers AS (SELECT layer, name, list(per_step_ns) AS total, list(self_per_step_ns) AS self, count(*) AS n
          FROM o WHERE rank <> $rank GROUP BY ALL),
padded AS (
    SELECT me.*, coalesce(p.n, 0) AS peers_with_it,
           coalesce(p.total, []) || list_transform(range($peers - coalesce(p.n, 0)), lambda x: 0::DOUBLE) AS total,
           coalesce(p.self, []) || list_transform(range($peers - coalesce(p.n, 0)), lambda x: 0::DOUBLE) AS self
    FROM me LEFT JOIN peers p USING (layer, name)
)
SELECT layer, name, depth, per_step_ns, self_per_step_ns, peers_with_it,
       per_step_ns - list_median(total) AS total_excess_ns, self_per_step_ns - list_median(self) AS self_excess_ns
FROM padded
WHERE NOT {COLLECTIVE_NAME}
ORDER BY greatest(total_excess_ns, self_excess_ns) DESC, name LIMIT 5
"""

# Per op of one layer that this rank and every peer run as often per iteration (collectives left out):
# this rank's self time per iteration against its peers' median, summed; and the peers' time in the
# ops where this rank's is at least $ratio times theirs. A rank slower in most of them, with the same
# calls, computes on a slower core or GPU.
SLOWDOWN_SQL = f"""
WITH o AS (SELECT * FROM rank_op_times WHERE list_contains($run_ids, run_id) AND layer = $layer
           AND NOT {COLLECTIVE_NAME}),
per AS (SELECT name, max(self_per_step_ns) FILTER (WHERE rank = $rank) AS mine,
               median(self_per_step_ns) FILTER (WHERE rank <> $rank) AS peers,
               max(calls / steps) FILTER (WHERE rank = $rank) AS my_calls,
               median(calls / steps) FILTER (WHERE rank <> $rank) AS peer_calls,
               count(*) FILTER (WHERE rank <> $rank) AS n
        FROM o GROUP BY name)
SELECT count(*) AS ops, count(*) FILTER (WHERE mine >= $ratio * peers) AS slower_ops,
       sum(mine) AS mine_ns, sum(peers) AS peers_ns,
       coalesce(sum(peers) FILTER (WHERE mine >= $ratio * peers), 0) AS slower_peers_ns
FROM per WHERE n = $peers AND mine IS NOT NULL AND peers > 0 AND my_calls = peer_calls
"""

# Per rank: mean lead-in, GPU idle and host time per steady step.
STEP_PARTS_SQL = """
SELECT rank, avg(lead_in_ns) AS lead_in_ns, avg(idle_ns) AS idle_ns, avg(host_ns) AS host_ns
FROM rank_steps WHERE list_contains($run_ids, run_id) AND phase = 'steady'
GROUP BY rank
"""

DATA_LOADING = ("DataLoader", "dataloader", "_next_data", "__next__")


@rule(
    code="R001",
    name="straggler",
    title="One rank holds the other ranks back at their collectives",
    category="cluster",
    requires=("runs",),
    params={
        "min_held_share": Param(
            0.04, "report a rank holding the others back at least this share of the iteration", "ratio"
        ),
        "explain_share": Param(0.5, "name a cause that accounts for at least this share of the time held", "ratio"),
        "critical_share": Param(0.15, "critical when an explained straggler holds the others this share", "ratio"),
        "min_steps": Param(3, "iterations with collectives each rank needs", "count"),
        "near_best": Param(0.8, "causes within this share of the largest count as tied", "ratio"),
        "min_t": Param(
            2.2, "the held time's mean over its standard error across iterations a warning needs; below, info", "ratio"
        ),
        "slower_ratio": Param(1.1, "an op with the same calls counts as slower on the rank from this ratio", "ratio"),
        "uniform_share": Param(
            0.6, "the rank is slower across the board when ops of this share of its peers' time are slower", "ratio"
        ),
    },
    example=Example(("gloo_rank0.json.gz", "gloo_rank1.json.gz")),
    scope="job",
)
def check(con, params, ctx):
    for world_size in _ranks.world_sizes(con):
        finding = _job(con, ctx, params, world_size)
        if finding is not None:
            yield finding


def _job(con, ctx, params, world_size: int):
    found = _ranks.least_waiting(con, world_size, params["min_steps"])
    if found is None:
        return None
    slow, peers, held, iteration = found
    if iteration <= 0:
        return None
    # ranks late together (a slow node): measured against the ranks that wait for them, not each other
    late = _ranks.late_group(slow, peers, params["min_held_share"] * iteration)
    if len(late) > 1:
        peers = [p for p in peers if p not in late]
        held = statistics.median(p.wait_ns for p in peers) - slow.wait_ns
    if held < params["min_held_share"] * iteration:
        return None
    run_ids = [r.run_id for r in (slow, *peers)]
    where = {"run_ids": run_ids, "rank": slow.rank}
    causes = _causes(con, params, slow, peers, run_ids)
    cause = _pick(causes, params["near_best"])
    explained = cause is not None and cause["excess_ns"] >= params["explain_share"] * held
    consistency = rows(con, CONSISTENCY_SQL, where)[0]
    at = (rows(con, BY_COLLECTIVE_SQL, where) or [None])[0]
    skew = _input_skew(con, ctx, world_size, slow.rank) if explained and cause["kind"] in ("op", "kernel") else None
    slower = (
        _uniform_slowdown(con, params, run_ids, slow.rank, len(peers), cause["layer"])
        if explained and skew is None and cause["kind"] in ("op", "kernel")
        else None
    )
    return _finding(ctx, params, world_size, slow, peers, held, iteration, cause if explained else None, causes,
                    consistency, at, skew, slower, late[1:])  # fmt: skip


def _steadiness(consistency) -> float:
    """The time held per iteration, its mean over its standard error: how far from noise it is. A
    rank that holds the others back by the same amount every iteration scores high; one whose mean
    comes from a few spikes scores low."""
    if not consistency.steps or consistency.held_mean is None:
        return 0.0
    if not consistency.held_sd:
        return float("inf") if consistency.held_mean > 0 else 0.0
    return consistency.held_mean / (consistency.held_sd / math.sqrt(consistency.steps))


def _noise_text(consistency, t: float, params) -> str:
    return (
        f" But not steadily: per iteration it holds them back {duration(consistency.held_mean)} on average with a "
        f"standard deviation of {duration(consistency.held_sd)} over {consistency.steps} iterations (t = {t:.1f}, "
        f"under {params['min_t']:g}): as likely timing noise of the host as a straggler."
    )


def _uniform_slowdown(con, params, run_ids, rank: int, peers: int, layer: str) -> dict | None:
    """How much slower the rank runs the ops it shares with every peer at the same calls per
    iteration, when most of them are slower (at least half of them, holding `uniform_share` of the
    peers' time in them, at least `slower_ratio` slower): the rank's core or GPU is slower, whichever
    op grew most."""
    r = rows(con, SLOWDOWN_SQL, {"run_ids": run_ids, "rank": rank, "layer": layer, "peers": peers,
                                 "ratio": params["slower_ratio"]})[0]  # fmt: skip
    if not r.ops or not r.peers_ns:
        return None
    ratio, share = r.mine_ns / r.peers_ns, r.slower_peers_ns / r.peers_ns
    # most ops by count too: two large ops slower with the same shapes may be a kernel or algorithm
    # choice on that rank, which the comparison of those ops tells
    if ratio < params["slower_ratio"] or share < params["uniform_share"] or 2 * r.slower_ops < r.ops:
        return None
    return {"ratio": round(ratio, 2), "slower_share": round(share, 2), "ops": int(r.ops),
            "slower_ops": int(r.slower_ops), "layer": layer, "at_least": params["slower_ratio"]}  # fmt: skip


def _work(slower: dict) -> str:
    return "kernels" if slower["layer"] == "gpu" else "ops"


def _slowdown_text(slower: dict, rank: int, device: str) -> str:
    return (
        f"rank {rank} runs its {_work(slower)} {slower['ratio']:.2f}x slower "
        f"than its peers with the same calls ({slower['slower_ops']} of {slower['ops']}, holding "
        f"{slower['slower_share']:.0%} of the peers' time in them, at least {slower['at_least']:g}x slower): a "
        f"slower {device}"
    )


def _input_skew(con, ctx, world_size: int, rank: int) -> dict | None:
    """The op input the slow rank gets most more of than its peers (R005's test, at its defaults):
    then the op that grew grew because the rank is given more, and the question the next
    experiment would ask is answered."""
    _, found = _inputs.heavy_inputs(con, ctx, world_size)
    if rank not in found:
        return None
    extra, ratio, row, typical = found[rank][0]
    return {"op": row.name, "input_index": row.input_index, "work_ratio": round(ratio, 2),
            "dims": row.largest_dims, "typical_rank": typical.rank, "typical_dims": typical.largest_dims,
            "extra_ns_per_iteration": int(extra)}  # fmt: skip


def _skew_text(skew: dict) -> str:
    shapes = (
        f" ({skew['dims']} against {skew['typical_dims']} on rank {skew['typical_rank']})"
        if skew["dims"] != skew["typical_dims"]
        else ""
    )
    return f"`{skew['op']}` gets {skew['work_ratio']:.1f}x the median rank's input there{shapes}"


def _causes(con, params, slow, peers, run_ids) -> list[dict]:
    """What on the slow rank takes longer than on its peers, per iteration, largest first."""
    found = []
    for op in rows(con, OPS_SQL, {"run_ids": run_ids, "rank": slow.rank, "peers": len(peers)}):
        self_first = op.layer == "host" and op.self_excess_ns > op.total_excess_ns
        excess = op.self_excess_ns if self_first else op.total_excess_ns
        if excess > 0:
            found.append({
                "kind": "self" if self_first else ("kernel" if op.layer == "gpu" else "op"),
                "name": op.name, "layer": op.layer, "depth": op.depth, "excess_ns": int(excess),
                "per_step_ns": int(op.self_per_step_ns if self_first else op.per_step_ns),
                "only_here": op.peers_with_it == 0,
            })  # fmt: skip
    parts = {r.rank: r for r in rows(con, STEP_PARTS_SQL, {"run_ids": run_ids})}
    me, others = parts.get(slow.rank), [parts[p.rank] for p in peers if p.rank in parts]
    if me is not None and others and me.lead_in_ns is not None:
        lead = me.lead_in_ns - statistics.median(o.lead_in_ns or 0 for o in others)
        if lead > 0:
            found.append({"kind": "lead_in", "name": None, "excess_ns": int(lead), "per_step_ns": int(me.lead_in_ns),
                          "only_here": False})  # fmt: skip
    found.sort(key=lambda c: (-c["excess_ns"], c["name"] or ""))
    if me is not None and others and me.idle_ns is not None:
        # not a cause: a GPU idling longer on the late rank is what the others' waiting looks like there
        idle = me.idle_ns - statistics.median(o.idle_ns or 0 for o in others)
        host = me.host_ns - statistics.median(o.host_ns or 0 for o in others)
        found.append({"kind": "gpu_idle", "name": None, "excess_ns": int(idle), "host_excess_ns": int(host),
                      "per_step_ns": int(me.idle_ns), "only_here": False})  # fmt: skip
    return found


def _pick(causes: list[dict], near_best: float) -> dict | None:
    """The largest cause; among those close to it, one that runs on this rank only (the op that was
    added rather than the parent that contains it)."""
    ranked = [c for c in causes if c["kind"] != "gpu_idle"]
    if not ranked:
        return None
    best = ranked[0]
    close = [c for c in ranked if c["excess_ns"] >= near_best * best["excess_ns"]]
    return next((c for c in close if c["only_here"]), best)


def _cause_text(cause: dict, rank: int) -> str:
    per_step, excess = duration(cause["per_step_ns"]), duration(cause["excess_ns"])
    if cause["kind"] == "lead_in":
        return (f"rank {rank} starts its work {per_step} into each iteration, {excess} later than its peers, "
                "outside any traced op")  # fmt: skip
    if cause["kind"] == "self":
        return (f"`{cause['name']}` holds {per_step} per iteration of host time on rank {rank} outside any traced "
                f"op or collective, {excess} more than on its peers")  # fmt: skip
    what = "kernel" if cause["kind"] == "kernel" else "op"
    where = "and does not run on the other ranks" if cause["only_here"] else f"{excess} more than its peers' median"
    return f"{what} `{cause['name']}` takes {per_step} per iteration on rank {rank}{'' if cause['only_here'] else ','} {where}"


def _where(cause: dict | None) -> dict:
    """The locality keys of a named cause: its op on the host, its kernel on the GPU."""
    if cause is None or not cause.get("name"):
        return {}
    return {"op" if cause["layer"] == "host" else "kernel": cause["name"]}


def _others(peers) -> str:
    return "the other rank" if len(peers) == 1 else f"the other {len(peers)} ranks"


def _next_experiment(
    cause: dict | None, rank: int, peer: int, context_gpu: bool, skew: dict | None = None, slower: dict | None = None
) -> str:
    if cause is None:
        return (
            f"Check whether the ranks do the same work: compare rank {rank}'s and rank {peer}'s `rank_steps` "
            "(host_ns, idle_ns, lead_in_ns) and G002 launch-bound on each. If every rank's host is the bound, "
            "cut launch overhead on all of them (CUDA graphs, fewer small kernels); the late rank is only the one "
            "whose queue is shallowest. If the profilers started at different times, profile again after a barrier."
        )
    name = cause.get("name") or ""
    if cause["kind"] == "lead_in":
        return (
            f"Find what rank {rank} does between iterations: wrap the code before the step's first op in "
            f"`torch.profiler.record_function`, or sample it (`py-spy dump --pid <rank {rank}>` during a step, or "
            "with_stack=True). Checkpoint or logging I/O, a host barrier and a data copy on that rank only are the "
            "usual suspects."
        )
    if any(k in name for k in DATA_LOADING):
        return (
            f"Time rank {rank}'s data loading alone (`next(iter(loader))` in a loop on that rank) against rank "
            f"{peer}'s; if it is slower there, give its DataLoader workers (`num_workers>0`, `pin_memory=True`, "
            "`prefetch_factor`) or check its shard (larger samples, a slower disk)."
        )
    if cause["kind"] == "self":
        return (
            f"Sample rank {rank} inside `{name}` (`py-spy dump --pid <rank {rank}>` while it runs, or the "
            "profiler with with_stack=True) to name the host code that is not a traced op; compare with rank "
            f"{peer}."
        )
    if skew is not None:
        return (
            f"Rank {rank} is given more work, not slower: {_skew_text(skew)}. Even out what each rank gets "
            "(the router's balance loss or capacity factor where experts are routed, else the sampler or the "
            f"sharding); R005 load-imbalance's finding on rank {rank} carries the per-rank input query."
        )
    if slower is not None:
        device = "GPU" if context_gpu else "core"
        checks = (
            "its clocks and throttling (`nvidia-smi -q -d CLOCK,PERFORMANCE`), its PCIe/NUMA placement and other "
            "processes on it"
            if context_gpu
            else "its placement (`taskset -p <pid>`, NUMA), frequency and other processes on that host"
        )
        return (
            f"Time one fixed piece of work (the step's largest matmul in a loop) on rank {rank}'s {device} and on "
            f"rank {peer}'s: if it is slower there, check {checks}; move rank {rank} to another {device} and see "
            "whether the slowness follows the device or the rank."
        )
    compare = (
        f"SELECT r.rank, e.name, count(*), avg(e.dur_ns), any_value(CAST(e.args->'Input Dims' AS VARCHAR)) "
        f"FROM events e JOIN runs r USING (run_id) WHERE name_key(e.name) = '{name}' AND r.rank IN ({rank}, {peer}) "
        "GROUP BY ALL"
    )
    device = "GPU" if context_gpu else "core"
    return (
        f"Compare `{name}` on rank {rank} and rank {peer} (`{compare}`): more calls or larger input shapes mean "
        f"rank {rank} gets more work (rebalance the shard, the bucket or the experts); the same calls and shapes "
        f"taking longer mean a slower {device} there (run the op alone on that rank; check clocks, placement, "
        "other processes)."
    )


def _late_text(slow, also_late, total: int) -> str:
    """`Rank 5`, or `Ranks 1, 3, 5 (3 of 64, late together)`."""
    if not also_late:
        return f"Rank {slow.rank}"
    ranks = sorted([slow.rank, *(r.rank for r in also_late)])
    shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")  # all of them: details.late_together
    return f"Ranks {shown} ({len(ranks)} of {total}, late together)"


def _finding(
    ctx, params, world_size, slow, peers, held, iteration, cause, causes, consistency, at, skew=None, slower=None,
    also_late=(),
):  # fmt: skip
    run = ctx.run(slow.run_id)
    total = len(peers) + 1 + len(also_late)
    who = _late_text(slow, also_late, total)
    share = held / iteration
    t = _steadiness(consistency)
    peer = min(peers, key=lambda p: (abs(p.wait_ns - statistics.median(q.wait_ns for q in peers)), p.rank)).rank
    collective = f" at {at.collective}" if at is not None and at.collective else ""
    device = "GPU" if any(c["kind"] == "gpu_idle" for c in causes) else "core"
    if cause is not None:
        severity = "critical" if share >= params["critical_share"] else "warning"
        if t < params["min_t"]:
            severity = "info"  # on average it holds them back, but no more steadily than noise does
        hypothesis = (
            (f"{who} arrive last; rank {slow.rank} waits least of them. " if also_late else "")
            + f"{_others(peers).capitalize()} wait for rank {slow.rank}: {_cause_text(cause, slow.rank)}. "
            f"It waits {duration(slow.wait_ns)} per iteration in collectives, its peers a median "
            f"{duration(slow.wait_ns + held)}; it waited less than the others' median in {consistency.below} of "
            f"{consistency.steps} iterations."
            + (f" It is given more: {_skew_text(skew)}." if skew is not None else "")
            + (f" Not one op: {_slowdown_text(slower, slow.rank, device)}." if slower is not None else "")
            + (_noise_text(consistency, t, params) if t < params["min_t"] else "")
        )
        why = (
            _cause_text(cause, slow.rank)
            if slower is None
            else f"it runs its {_work(slower)} {slower['ratio']:.2f}x slower than its peers with the same calls, "
            f"most of all `{cause['name']}` (+{duration(cause['excess_ns'])} per iteration)"
        )
        verb = "hold" if also_late else "holds"
        title = f"{who} {verb} {_others(peers)} back {duration(held)} per iteration ({share:.1%}){collective}: {why}"
    else:
        severity = "info"
        idle = next((c for c in causes if c["kind"] == "gpu_idle"), None)
        same_work = (
            f" Its GPU idles {duration(idle['excess_ns'])} more per iteration than its peers' while its host is "
            f"busy about as long ({duration(idle['host_excess_ns'])} difference): it does no more work, it starts "
            "its collectives later because its launch queue is the shallowest."
            if idle is not None
            and idle["excess_ns"] >= params["explain_share"] * held
            and abs(idle["host_excess_ns"]) < params["explain_share"] * held
            else ""
        )
        hypothesis = (
            (f"{who} arrive last; rank {slow.rank} waits least of them. " if also_late else "")
            + f"Rank {slow.rank} arrives last: its peers wait a median {duration(slow.wait_ns + held)} per iteration "
            f"in collectives, it waits {duration(slow.wait_ns)}. Nothing in its own breakdown accounts for "
            f"{params['explain_share']:.0%} of that (largest: "
            f"{_cause_text(causes[0], slow.rank) if causes and causes[0]['kind'] != 'gpu_idle' else 'none'})."
            + same_work
        )
        title = (f"{who} {'arrive' if also_late else 'arrives'} last{collective}: {_others(peers)} wait "
                 f"{duration(held)} per iteration ({share:.1%}) for {'them' if also_late else 'it'}, with no extra "
                 f"work of {'their' if also_late else 'its'} own found")  # fmt: skip
    steady = t >= params["min_t"]
    return Finding(
        rule="R001",
        severity=severity,
        confidence=min(0.95, 0.5 + 0.5 * consistency.below / max(consistency.steps, 1)) * (1 if steady else 0.5),
        title=title,
        locality=locality(run, **_where(cause)),
        observed=Quantity(int(held), "ns", "median of the other ranks' wait per iteration minus this rank's"),
        expected=Quantity(int(params["min_held_share"] * iteration), "ns", "at most min_held_share of the iteration"),
        impact_ns=int(held * slow.steps),
        window_ns=int(iteration * slow.steps),
        sql=_ranks.PER_RANK_WAITS_SQL,
        sql_params={"world_size": world_size},
        hypothesis=hypothesis,
        next_experiment=(
            _next_experiment(cause, slow.rank, peer, any(c["kind"] == "gpu_idle" for c in causes), skew, slower)
            if steady or cause is None
            else (
                f"Profile more steady iterations (50 or more) and see whether rank {slow.rank} stays the last to "
                "arrive; the evidence query gives each rank's wait per iteration. On a shared host, pin each rank "
                "to its own cores first."
            )
        ),
        acceptance=rerun(
            "traces of every rank",
            f"the other ranks' wait_ns per iteration comes within {params['min_held_share']:.0%} of the iteration "
            f"of rank {slow.rank}'s (today {duration(held)} apart), and the iteration shortens by about as much.",
        ),
        extra={
            "world_size": world_size,
            "ranks": total,
            # the ranks late together with this one (a slow node), measured like it against the others
            "late_together": sorted(r.rank for r in also_late),
            "iterations": slow.steps,
            "iteration_ns": int(iteration),
            "held_ns": int(held),
            "wait_ns_by_rank": {
                str(r.rank): int(r.wait_ns) for r in sorted([slow, *peers, *also_late], key=lambda r: r.rank)
            },
            "waited_less_than_peers": [int(consistency.below), int(consistency.steps)],
            "held_t": round(t, 2) if t != float("inf") else None,
            "held_sd_ns": int(consistency.held_sd or 0),
            "collective": {"process_group": at.process_group, "collective": at.collective, "held_ns": int(at.held_ns)}
            if at is not None
            else None,
            "causes": causes[:5],
            "explained": cause is not None,
            "input_skew": skew,
            "uniform_slowdown": slower,
        },
    )
