"""A rank whose computing, communication or free time stands out from the other ranks' (R002 outlier-ranks).

## What it does
Reads only `rank_components`: per rank of a job, the mean time per iteration in the three parts
every step splits into (computing, communication not hidden behind computing, free time), from
tracekit's own per-rank summaries of the traces, or from the profiler's cluster summary when only
that was given (msprof-analyze's `cluster_step_trace_time.csv`). For each part it takes the median
over the ranks and the median absolute deviation (MAD, floored at `mad_floor_share` of the median
iteration, so identical ranks do not make any difference infinitely significant), and a rank's
robust z-score `0.6745 * (x - median) / MAD`. A part is an outlier on a rank when its z-score is at
least `min_z` in size and it differs from the median by at least `min_share` of the iteration. One
finding per rank names its outlying parts, read the way msprof-analyze's slow-rank check reads
them: a rank with more free time or more computing than the others, and less communication, is the
slow one the others wait for (host-bound when it is free time: data loading, Python, a late start);
a rank with more communication and nothing else is one that waits (for the others, or on a slower
link) and is reported at info.

## Why it matters
Each rank's own numbers look ordinary: a slow rank is busy or idle for its own reasons, and the fast
ranks show the cost as long collectives. Only the comparison across ranks names the rank to look
at, and on a job of hundreds of ranks it has to be a robust one: a mean and a standard deviation are
pulled by the outlier they should find, a median and MAD are not.

## Example
msprof-analyze's cluster database of an 8-rank Ascend job in the corpus
(`msinsight__full_db__cluster_analysis.db`: the profiler's step split per rank, no rank traces): every
rank computes about 178 ms of a 1.8 s step, but ranks 5 and 0 spend 398 and 363 ms more per step free
than the median rank and 552 and 359 ms less in communication: the other six wait in their
collectives for those two. In the eight-rank gloo matrix, the same ranks R001 straggler names are
the outliers here (a late start as free time, extra compute or data loading as computing, each with
less communication); R002 then stays at info and points to R001, which names the op that grew.

## Checked on
The cluster summaries of the corpus (the 8-rank database above; the 16-rank GPT-3 job's
cluster_step_trace_time.csv, whose two pipeline stages differ in free time as groups of eight,
with no single rank apart from its stage: quiet), the eight-rank gloo matrix (healthy: no part of any rank beyond z 1.7 or 2.5% of the iteration;
late starts of 5 and 2 ms: free time z 10.8 and 4.8, +16% and +7.1%; 30% extra compute: computing
z 10.3, +15%; 5 ms of data loading: computing z 4.2, +11.9%; 10 and 20% extra compute: z 2.9 and 2.2,
below the bar, which R001 finds from the waits), the 2-rank samples (too few ranks to call one an
outlier: quiet) (tests/test_rule_outlier_ranks.py).

## Options
- `min_z` (3.5): robust z-score a part must reach (Iglewicz and Hoaglin's cut for the modified
  z-score; the healthy matrix cell reaches 1.7).
- `min_share` (0.05): and differ from the median rank by at least this share of the iteration (the
  healthy cell: 2.5% at most; the smallest injected straggler, a 2 ms late start: 7.1%).
- `mad_floor_share` (0.01): the MAD is at least this share of the iteration.
- `min_ranks` (3): ranks a job needs before one can stand out (with two, either is the outlier).
- `warning_share` (0.05): a slow rank whose outlying parts exceed the median by this share of the
  iteration is a warning, else info.
"""

from __future__ import annotations

import statistics

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _ranks
from tracekit.units import duration

# The evidence query: each rank's parts per iteration in the job.
COMPONENTS_SQL = """
SELECT run_id, rank, steps, source, iteration_ns, computing_ns, communication_ns, free_ns
FROM rank_components WHERE world_size = $world_size AND source = $source ORDER BY rank, run_id
"""
# A job: the ranks of one world size from one source (traces, or one profiler cluster summary)
JOBS_SQL = "SELECT DISTINCT world_size, source FROM rank_components ORDER BY world_size, source"

# Whether there is anything to compare: two ranked runs of one job, or a profiler's cluster summary
# (`rank_components` computes every run's steps, which a single-rank analysis should not pay for).
ANY_JOB_SQL = """
SELECT (SELECT count(*) FROM (SELECT world_size FROM runs WHERE rank IS NOT NULL AND world_size > 1
                              GROUP BY world_size HAVING count(DISTINCT rank) > 1))
     + (SELECT count(*) FROM (SELECT 1 FROM cluster_step_components LIMIT 1))
"""

PARTS = ("computing", "communication", "free")
# R001's default: the least-waiting rank is its finding when it holds the others this share
STRAGGLER_SHARE = 0.04


@rule(
    code="R002",
    name="outlier-ranks",
    title="A rank's computing, communication or free time stands out from the other ranks'",
    category="cluster",
    requires=("runs",),
    params={
        "min_z": Param(3.5, "robust z-score (median and MAD over the ranks) a part must reach", "ratio"),
        "min_share": Param(0.05, "and differ from the median rank by this share of the iteration", "ratio"),
        "mad_floor_share": Param(0.01, "the MAD is at least this share of the iteration", "ratio"),
        "min_ranks": Param(3, "ranks a job needs before one can stand out", "count"),
        "warning_share": Param(0.05, "a slow rank this share of the iteration over the median is a warning", "ratio"),
    },
    example=Example(("corpus/ascend/msinsight__full_db__cluster_analysis.db",)),
    scope="job",
)
def check(con, params, ctx):
    if not con.execute(ANY_JOB_SQL).fetchone()[0]:
        return
    for world_size, source in con.execute(JOBS_SQL).fetchall():
        ranks = rows(con, COMPONENTS_SQL, {"world_size": world_size, "source": source})
        if len({r.rank for r in ranks}) != len(ranks) or len(ranks) < params["min_ranks"]:
            continue
        iteration = statistics.median(r.iteration_ns for r in ranks)
        if not iteration or iteration <= 0:
            continue
        straggler = _straggler(con, world_size) if source == "trace" else None
        for rank, parts in _outliers(ranks, iteration, params).items():
            yield _finding(ctx, params, world_size, ranks, rank, parts, iteration, straggler)


def _outliers(ranks, iteration: float, params) -> dict:
    """rank -> {part: (value, median, z)} for the parts that stand out on it."""
    found: dict = {}
    for part in PARTS:
        values = [(r, getattr(r, f"{part}_ns")) for r in ranks if getattr(r, f"{part}_ns") is not None]
        if len(values) < params["min_ranks"]:
            continue
        median = statistics.median(v for _, v in values)
        mad = max(statistics.median(abs(v - median) for _, v in values), params["mad_floor_share"] * iteration)
        for r, v in values:
            z = 0.6745 * (v - median) / mad
            if abs(z) >= params["min_z"] and abs(v - median) >= params["min_share"] * iteration:
                found.setdefault(r, {})[part] = (v, median, z)
    return found


def _straggler(con, world_size: int):
    """The rank R001 names (it waits least and holds the others back), or None."""
    found = _ranks.least_waiting(con, world_size, 1)
    if found is None:
        return None
    slow, _, held, iteration = found
    return slow.rank if iteration > 0 and held >= STRAGGLER_SHARE * iteration else None


def _reading(parts: dict) -> str:
    """slow (the others wait for it), waits, or light (less work than the others)."""
    up = {p for p, (v, m, _) in parts.items() if v > m}
    down = set(parts) - up
    if up & {"computing", "free"} and "communication" not in up:
        return "slow"
    if up == {"communication"}:
        return "waits"
    if down and not up:
        return "light"
    return "mixed"


def _part_text(part: str, value: float, median: float, iteration: float) -> str:
    more = "more" if value > median else "less"
    name = {"computing": "computing", "communication": "communication not hidden behind computing",
            "free": "free time"}[part]  # fmt: skip
    return (f"{name} {duration(value)} per iteration, {duration(abs(value - median))} ({abs(value - median) / iteration:.1%} "
            f"of the iteration) {more} than the median rank")  # fmt: skip


def _next_experiment(reading: str, parts: dict, rank: int, peer: int, source: str) -> str:
    if reading == "slow" and "free" in parts and source == "trace":
        return (f"Rank {rank} is idle where its peers compute: run R001 straggler's evidence for its cause, or sample "
                f"its host between steps (`py-spy dump --pid <rank {rank}>`), and compare its data loading with rank "
                f"{peer}'s.")  # fmt: skip
    if reading == "slow" and "free" in parts:
        return (f"Profile rank {rank} and rank {peer} with their traces (torch_npu's profiler on those two ranks, "
                "with_stack on the host) and compare what their step threads do in the free time: data loading, a "
                "host sync, Python between the ops, or a late start of the step.")  # fmt: skip
    if reading == "slow":
        return (f"Compare the ops of rank {rank} with rank {peer}'s (same ops with larger shapes: more work, rebalance "
                f"the shard or the experts; same shapes taking longer: a slower device, check its clock and placement).")  # fmt: skip
    if reading == "waits":
        return (f"Find whom rank {rank} waits for: its collectives' arrival times (`collective_arrivals`) name the last "
                "rank; if it arrives last itself, compare the bandwidth of its collectives with the other ranks' (a "
                "slower link).")  # fmt: skip
    return (f"Compare rank {rank}'s steps with rank {peer}'s in `rank_components` and `rank_steps`: which part moved, "
            "and in which steps.")  # fmt: skip


def _finding(ctx, params, world_size, ranks, rank_row, parts, iteration, straggler):
    reading = _reading(parts)
    # the time the rank spends beyond the median rank (its lower communication is the same time seen
    # from the others' side, so it is not added)
    excess = sum(v - m for p, (v, m, _) in parts.items() if v > m and p != "communication") or sum(
        abs(v - m) for v, m, _ in parts.values()
    )
    typical = min((r for r in ranks if r is not rank_row),
                  key=lambda r: (sum(abs(getattr(r, f"{p}_ns") - m) for p, (_, m, _) in parts.items()), r.rank))  # fmt: skip
    said = "; ".join(_part_text(p, v, m, iteration) for p, (v, m, _) in parts.items())
    by_r001 = rank_row.source == "trace" and straggler == rank_row.rank
    severity = (
        "warning" if reading == "slow" and excess >= params["warning_share"] * iteration and not by_r001 else "info"
    )
    what = {"slow": "the others wait for it", "waits": "it waits for the others or on its link",
            "light": "it has less to do than the others", "mixed": "its parts differ from the others'"}[reading]  # fmt: skip
    title = f"Rank {rank_row.rank} stands out from the other {len(ranks) - 1} ranks ({what}): {said}"
    hypothesis = (
        f"Over {len(ranks)} ranks, rank {rank_row.rank}'s "
        + ", ".join(f"{p} is {z:+.1f} robust standard deviations from the median" for p, (_, _, z) in parts.items())
        + ". "
        + {
            "slow": "More free time or computing and no more communication is the slow rank: its peers spend that "
            "time waiting in their collectives.",
            "waits": "More communication alone is a rank that waits: for a slower rank, or on a slower link.",
            "light": "Less work than its peers: it waits for them in its collectives.",
            "mixed": "The parts move in directions that do not tell the slow rank from the waiting one.",
        }[reading]
        + (
            " R001 straggler names this rank and the op that grew; this finding is the summary view of it."
            if by_r001
            else ""
        )
    )
    run = ctx.run(rank_row.run_id)
    return Finding(
        rule="R002",
        severity=severity,
        confidence=0.7 if rank_row.source == "trace" else 0.6,
        title=title,
        locality=locality(run, rank=rank_row.rank),
        observed=Quantity(int(excess), "ns", "per iteration beyond the median rank in the outlying parts"),
        expected=Quantity(int(params["min_share"] * iteration), "ns", "under min_share of the iteration"),
        impact_ns=int(excess * (rank_row.steps or 1)) if reading == "slow" else 0,
        window_ns=int(iteration * (rank_row.steps or 1)),
        sql=COMPONENTS_SQL,
        sql_params={"world_size": world_size, "source": rank_row.source},
        hypothesis=hypothesis,
        next_experiment=_next_experiment(reading, parts, rank_row.rank, typical.rank, rank_row.source),
        acceptance=rerun(
            "profile of every rank",
            f"rank {rank_row.rank}'s " + " and ".join(parts) + f" per iteration come within {params['min_share']:.0%} "
            "of the iteration of the median rank's.",
        ),
        extra={
            "world_size": world_size,
            "ranks": len(ranks),
            "source": rank_row.source,
            "reading": reading,
            "iteration_ns": int(iteration),
            "parts": {
                p: {"ns": int(v), "median_ns": int(m), "robust_z": round(z, 2)} for p, (v, m, z) in parts.items()
            },
            "straggler_by_r001": by_r001,
        },
    )
