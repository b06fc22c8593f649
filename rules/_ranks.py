"""What the cross-rank rules share: the jobs a database (or a cluster run's reducer) holds, and the
rank the others wait for."""

from __future__ import annotations

import statistics

from tracekit.engine.toolkit import rows

# A job is the ranked runs of one world size; it takes two distinct ranks to compare any.
JOBS_SQL = (
    "SELECT world_size FROM runs WHERE rank IS NOT NULL AND world_size > 1 "
    "GROUP BY world_size HAVING count(DISTINCT rank) > 1 ORDER BY world_size"
)


def world_sizes(con) -> list[int]:
    """The world size of each job with at least two ranks loaded, smallest first."""
    return [w for (w,) in con.execute(JOBS_SQL).fetchall()]


# Per rank: its mean wait for the peers per iteration, over the steady steps' iterations (every step
# when a run has none steady) that hold shared collectives. R001's evidence query: the time a rank
# holds the others back is the median of the other ranks' wait_ns minus the least-waiting rank's.
PER_RANK_WAITS_SQL = """
WITH s AS (
    SELECT w.*, r.world_size FROM rank_step_waits w JOIN runs r USING (run_id)
    WHERE w.collectives > 0
    QUALIFY w.phase = 'steady' OR count(*) FILTER (WHERE w.phase = 'steady') OVER (PARTITION BY w.run_id) = 0
)
SELECT run_id, rank, world_size, count(*) AS steps, avg(wait_ns) AS wait_ns, avg(iteration_ns) AS iteration_ns,
       avg(arrival_lag_ns) AS lag_ns, sum(arrived_last) AS arrived_last, sum(collectives) AS collectives
FROM s WHERE world_size = $world_size GROUP BY run_id, rank, world_size ORDER BY rank
"""


def least_waiting(con, world_size: int, min_steps: int):
    """(the rank that waits least in its collectives, its peers, how long it holds them back per
    iteration, the median iteration) over the ranks with at least `min_steps` iterations that hold
    shared collectives; None when fewer than two ranks (or a rank twice) qualify."""
    per_rank = [r for r in rows(con, PER_RANK_WAITS_SQL, {"world_size": world_size}) if r.steps >= min_steps]
    if len(per_rank) < 2 or len({r.rank for r in per_rank}) != len(per_rank):
        return None
    slow = min(per_rank, key=lambda r: (r.wait_ns, r.rank))
    peers = [r for r in per_rank if r is not slow]
    held = statistics.median(r.wait_ns for r in peers) - slow.wait_ns
    return slow, peers, held, statistics.median(r.iteration_ns for r in per_rank)


def late_group(slow, peers, min_gap_ns: float) -> list:
    """The ranks that arrive last together with `slow` (a slow node's ranks, two slower ranks), `slow`
    first then by wait: in the ranks' mean waits, sorted, those below the widest gap, where that gap
    is at least `min_gap_ns` and half the waits' whole range and leaves at least as many ranks above
    it as below (more late ranks than waiting ones is no group holding the rest back). Otherwise
    only `slow`."""
    ranked = sorted([slow, *peers], key=lambda r: (r.wait_ns, r.rank))
    span = ranked[-1].wait_ns - ranked[0].wait_ns
    if len(ranked) < 3 or span <= 0:
        return [slow]
    gap, at = max(((ranked[i + 1].wait_ns - ranked[i].wait_ns, i) for i in range(len(ranked) - 1)),
                  key=lambda g: (g[0], -g[1]))  # fmt: skip
    if gap < min_gap_ns or gap < 0.5 * span or 2 * (at + 1) > len(ranked):
        return [slow]
    return [slow] + [r for r in ranked[: at + 1] if r is not slow]
