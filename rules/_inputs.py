"""Which ranks of a job are given more input than their peers in the same ops: R005 load-imbalance
reports them, and R001 straggler says so of the rank the others wait for."""

from __future__ import annotations

import statistics

from tracekit.engine.toolkit import contains_any, rows

# R005's defaults, which R001 applies too
MIN_WORK_RATIO = 1.25  # a rank's input elements per iteration over the median rank's
MIN_SHARE = 0.02  # and its time in the op over the median rank's, as a share of the median iteration
SKIP_OPS = (
    "c10d::,nccl:,gloo:,record_param_comms,all_reduce,allreduce,all_gather,allgather,all_to_all,alltoall,"
    "reduce_scatter,broadcast"
)
DEFAULTS = {"min_work_ratio": MIN_WORK_RATIO, "min_share": MIN_SHARE, "skip_ops": SKIP_OPS}

# Each op input every rank of the job records, per rank: its elements and the op's time per iteration.
INPUTS_SQL = f"""
WITH i AS (
    SELECT o.* FROM rank_op_inputs o JOIN runs r USING (run_id) WHERE r.world_size = $world_size
), ranks AS (
    SELECT count(DISTINCT rank) AS n FROM i
)
SELECT run_id, rank, name, input_index, steps, calls, elements_per_step, largest_dims, per_step_ns
FROM i
WHERE NOT {contains_any("name", "$skip_ops")}
QUALIFY count(DISTINCT rank) OVER (PARTITION BY name, input_index) = (SELECT n FROM ranks)
ORDER BY name, input_index, rank
"""

# The median iteration of the job's ranks, over the steps their summaries are measured on.
ITERATION_SQL = """
SELECT median(s.iteration_end_ns - s.start_ns) FROM rank_measured_steps s JOIN runs r USING (run_id)
WHERE r.world_size = $world_size
"""

# an op's extra time and that of the op it calls differ by their own overheads only
NEST_TOLERANCE = 0.05


def heavy_inputs(con, ctx, world_size: int, params: dict = DEFAULTS) -> tuple[float | None, dict]:
    """(the job's median iteration, rank -> [(extra ns per iteration, ratio, the rank's row, a median
    rank's row)] for the op inputs it gets at least `min_work_ratio` times the median rank's of, at a
    cost of at least `min_share` of the iteration, the outermost op of the largest extra time first).
    No ranks where the job has no measured iteration. Computed once per analysis and options: R001
    and R005 both ask (ctx.once)."""
    key = ("heavy_inputs", world_size, *(params[k] for k in sorted(DEFAULTS)))
    return ctx.once(key, lambda: _heavy_inputs(con, world_size, params))


def _heavy_inputs(con, world_size: int, params: dict) -> tuple[float | None, dict]:
    (median,) = con.execute(ITERATION_SQL, {"world_size": world_size}).fetchone()
    if not median:
        return None, {}
    iteration = float(median)
    inputs = rows(con, INPUTS_SQL, {"world_size": world_size, "skip_ops": params["skip_ops"]})
    by_input: dict = {}
    for r in inputs:
        by_input.setdefault((r.name, r.input_index), []).append(r)
    found: dict = {}
    for per_rank in by_input.values():
        if len(per_rank) < 2 or len({r.rank for r in per_rank}) != len(per_rank):
            continue
        median_elements = statistics.median(r.elements_per_step for r in per_rank)
        median_ns = statistics.median(r.per_step_ns for r in per_rank)
        if median_elements <= 0:
            continue
        typical = min(per_rank, key=lambda r: (abs(r.elements_per_step - median_elements), r.rank))
        for r in per_rank:
            ratio = r.elements_per_step / median_elements
            extra = r.per_step_ns - median_ns
            if ratio >= params["min_work_ratio"] and extra >= params["min_share"] * iteration:
                found.setdefault(r.rank, []).append((extra, ratio, r, typical))
    return iteration, {rank: _outer_first(h) for rank, h in found.items()}


def _outer_first(heavy: list) -> list:
    """Largest extra time first; an op and the ops it calls grow alike (`aten::linear` and its
    `aten::addmm`, within a few percent), so of those within NEST_TOLERANCE of the largest the one
    taking longest, the outer op, leads."""
    heavy = sorted(heavy, key=lambda x: (-x[0], x[2].name, x[2].input_index))
    top = heavy[0][0]
    close = [h for h in heavy if h[0] >= (1 - NEST_TOLERANCE) * top]
    lead = max(close, key=lambda x: (x[2].per_step_ns, -x[2].input_index))
    return [lead] + [h for h in heavy if h is not lead]
