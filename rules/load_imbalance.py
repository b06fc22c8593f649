"""One rank's ops given more input than the same ops on its peers (R005 load-imbalance).

## What it does
Reads only `rank_op_inputs`: per rank of a job, each host op's inputs, input by input, as elements
per iteration (the product of the recorded `Input Dims`, summed over the op's calls) with the op's
time per iteration. For every op input that every rank of the job records, it takes the median over
the ranks; a rank whose elements per iteration are at least `min_work_ratio` times that median, and
whose time per iteration in the op exceeds the median rank's by at least `min_share` of the
iteration, gets the input's extra work. One finding per rank names the op input whose extra time is
largest (the outermost op when ops nest: `aten::linear` over its `aten::addmm`), its shape on that
rank against a typical rank's, and the other ops given more input on it. Collective ops are left
out (`skip_ops`): their sizes follow the imbalance, and their time is the peers' waiting.

## Why it matters
A rank that is handed more work than its peers is a straggler that no faster hardware or setting
on that rank fixes: the tokens routed to one expert of a mixture-of-experts layer, a larger shard or
a longer batch. Its peers wait in the next collective for the difference every step. R001
straggler names the rank and the op that grew; this rule says why the op grew (its input, not its
speed) and so which fix applies: rebalance the work (the router's balance loss or capacity factor,
the sampler, the sharding), not the node.

## Example
`sample_traces/ep_hot_expert_rank0..3.json.gz` (`make_nccl_matrix.py`'s `hot_expert` cell: four gloo
ranks on the device machine's CPU cores, expert parallel): every rank routes 55% of its 2048 tokens
to rank 1's expert, so rank 1's `aten::linear` gets [4508, 1024] inputs against [1228, 1024] on the
others: 3.7x the median rank's elements and 37.3 ms more per iteration, 52% of it. R001 straggler
names the same rank as the one the others wait for; this finding says it is given more. Its twin
`ep_balanced` (the same tokens spread evenly) is quiet.

## Checked on
The expert-parallel matrix at 4 and 8 gloo ranks (tests/data/ep_matrix, made on the device
machine's CPU cores): `hot_expert` (3.7x and 8.6x the median rank's elements) and `hot_expert_mild`
(35% of the tokens to one expert: 1.6x and 3.8x) are reported on the hot rank, naming the expert's
`aten::linear`; `ep_balanced` and the data-parallel `healthy` cells (the same shapes everywhere) are
quiet, and so is the 4-rank `slower_core` cell (R001 reports its rank 3, which ran on a slower core
of the shared host, as slower in every op, not given more); so is the eight-rank
gloo rank matrix (stragglers from extra compute in an op of one rank only, data loading and late
starts: more time, the same shapes) (tests/test_rule_load_imbalance.py). The corpus holds no
multi-rank job whose ranks record shapes of the same ops.

## Options
- `min_work_ratio` (1.25): a rank's elements per iteration over the median rank's, at least.
- `min_share` (0.02): and its time per iteration in the op over the median rank's by at least this
  share of the median iteration (what the imbalance costs every step).
- `critical_share` (0.1): critical from this share of the iteration on, else a warning.
- `skip_ops` (`c10d::,nccl:,gloo:,record_param_comms,all_reduce,allreduce,all_gather,allgather,all_to_all,alltoall,reduce_scatter,broadcast`):
  comma-separated, case-insensitive substrings of op names left out (collectives).
"""

from __future__ import annotations

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _inputs, _ranks
from tracekit.units import duration

# The evidence query: one op input on every rank of the job.
EVIDENCE_SQL = """
SELECT o.rank, o.name, o.input_index, o.steps, o.calls, o.elements_per_step, o.largest_dims, o.per_step_ns
FROM rank_op_inputs o JOIN runs r USING (run_id)
WHERE r.world_size = $world_size AND o.name = $name AND o.input_index = $input_index
ORDER BY o.rank
"""

# Whether the job's ranks name experts (an op, annotation or module with `expert` or `moe` in its name):
# its imbalance is then the router's to fix
MOE_SQL = """
SELECT coalesce(bool_or(regexp_matches(lower(o.name), '(expert|moe)')), false)
FROM rank_op_times o JOIN runs r USING (run_id) WHERE r.world_size = $world_size
"""


@rule(
    code="R005",
    name="load-imbalance",
    title="One rank's ops get more input than the same ops on its peers",
    category="cluster",
    requires=("runs",),
    params={
        "min_work_ratio": Param(
            _inputs.MIN_WORK_RATIO, "a rank's input elements per iteration over the median rank's", "ratio"
        ),
        "min_share": Param(
            _inputs.MIN_SHARE, "and its op time over the median rank's, as a share of the iteration", "ratio"
        ),
        "critical_share": Param(0.1, "critical from this share of the iteration on", "ratio"),
        "skip_ops": Param(_inputs.SKIP_OPS, "comma-separated op name substrings left out (collectives)", "patterns"),
    },
    example=Example(tuple(f"ep_hot_expert_rank{r}.json.gz" for r in range(4))),
    scope="job",
)
def check(con, params, ctx):
    for world_size in _ranks.world_sizes(con):
        iteration, found = _inputs.heavy_inputs(con, ctx, world_size, params)
        moe = bool(found) and con.execute(MOE_SQL, {"world_size": world_size}).fetchone()[0]
        for rank, heavy in found.items():
            yield _finding(ctx, params, world_size, iteration, rank, heavy, moe)


def _finding(ctx, params, world_size: int, iteration: float, rank: int, heavy: list, moe: bool) -> Finding:
    extra, ratio, row, typical = heavy[0]
    share = extra / iteration
    others = [h for h in heavy[1:] if h[2].name != row.name]
    also = list(dict.fromkeys(h[2].name for h in others))
    where = (
        f"input {row.input_index} {row.largest_dims} against {typical.largest_dims} on rank {typical.rank}"
        if row.largest_dims != typical.largest_dims
        else f"input {row.input_index}, {row.calls / row.steps:g} calls per iteration against "
        f"{typical.calls / typical.steps:g} on rank {typical.rank}"
    )
    title = (
        f"Rank {rank} gets {ratio:.1f}x the median rank's input in {row.name} ({where}): "
        f"{duration(extra)} more per iteration ({share:.0%} of it), which its peers wait for"
    )
    run = ctx.run(row.run_id)
    return Finding(
        rule="R005",
        severity="critical" if share >= params["critical_share"] else "warning",
        # shapes say how much input, not how much work each element costs: equal in the same op
        confidence=0.8,
        title=title,
        locality=locality(run, rank=rank, op=row.name, input_shapes=row.largest_dims),
        observed=Quantity(
            int(row.elements_per_step),
            "elements",
            f"input {row.input_index} of {row.name} per iteration on rank {rank} "
            f"(median rank: {int(typical.elements_per_step)}), {duration(row.per_step_ns)} per iteration",
        ),
        expected=Quantity(
            int(params["min_work_ratio"] * typical.elements_per_step),
            "elements",
            f"under {params['min_work_ratio']}x the median rank's",
        ),
        impact_ns=int(extra * row.steps),
        window_ns=int(iteration * row.steps),
        sql=EVIDENCE_SQL,
        sql_params={"world_size": world_size, "name": row.name, "input_index": row.input_index},
        hypothesis=(
            f"The same op gets {ratio:.1f}x the input on rank {rank} and takes {duration(extra)} longer per "
            "iteration there; the other ranks reach the next collective that much earlier and wait. The "
            "rank is not slow, it is given more: "
            + (
                "its expert receives more of the tokens the router sends."
                if moe
                else "a larger share of the batch, shard or sequence than its peers."
            )
            + (f" Also larger on this rank: {', '.join(also[:5])}." if also else "")
        ),
        next_experiment=(
            (
                f"Log the tokens each expert receives per step (the all_to_all split sizes) next to rank {rank}'s: "
                "if the router sends one expert most of them, raise the load-balancing loss weight or set a "
                "capacity factor (token dropping), or place the hot expert's replicas on several ranks."
            )
            if moe
            else (
                f"Compare the input shapes of {row.name} on rank {rank} and rank {typical.rank} over a few steps "
                "(the evidence query): a sampler or sharding that gives rank "
                f"{rank} more rows or longer sequences (uneven split, no bucketing by length) is the cause; "
                "make the per-rank work equal."
            )
        ),
        acceptance=rerun(
            "trace of every rank",
            f"{row.name}'s input {row.input_index} on rank {rank} comes within {params['min_work_ratio']}x of the "
            f"median rank's, and its time per iteration within {params['min_share']:.0%} of the iteration.",
        ),
        extra={
            "world_size": world_size,
            "iteration_ns": int(iteration),
            "work_ratio": round(ratio, 2),
            "extra_ns_per_iteration": int(extra),
            "typical_rank": typical.rank,
            "inputs": [
                {
                    "op": h[2].name,
                    "input_index": h[2].input_index,
                    "work_ratio": round(h[1], 2),
                    "extra_ns_per_iteration": int(h[0]),
                    "dims": h[2].largest_dims,
                    "median_rank_dims": h[3].largest_dims,
                }
                for h in heavy[:10]
            ],
        },
    )
