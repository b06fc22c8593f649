"""One link of a job moves its data far slower than the job's other links of the same kind (R004 slow-link).

## What it does
Reads `cluster_links`: msprof-analyze's communication matrix, the data each src -> dst link moved
per step and op, the time it took and its transport (HCCS, PCIE, RDMA, SIO). Per link it sums the
megabytes and the time over the transfers of at least `min_mb` (small ones measure latency, not
bandwidth: on the corpus job they run at 3-4 GB/s on links that move large ones at 18), and divides.
Each link is compared with the median of the job's links of the same transport; a link at
`max_ratio` of that median or less, among at least `min_links` links of its kind, is reported with
the time it lost against the median link's bandwidth. LOCAL rows (a rank's copy to itself) are no
link and are left out.

## Why it matters
A collective is as fast as its slowest link: one degraded HCCS lane, a NIC that negotiated a lower
speed or a PCIe link trained at fewer lanes slows every collective that crosses it, on every rank of
its group, and per-rank views only show every rank waiting in communication. The matrix names the
pair; the bandwidth against its siblings says whether the link or the algorithm is at fault.

## Example
`corpus/ascend/msinsight__full_db__cluster_analysis.db`, an 8-rank Ascend job whose 56 HCCS links
moved 1.5-1.6 GB each at 17.97-18.36 GB/s: healthy, within 2% of the median link. With `max_ratio`
raised to 0.9915 the page shows the slowest of them (0.991x), the nearest real output.

## Checked on
The two msprof-analyze cluster analyses of the corpus (the `cluster_analysis.db` export above, quiet:
its slowest HCCS link is 0.99x the median; the `cluster_analysis_output/` folder of the GPT-3 server
test data, quiet: one link per transport, nothing to compare), and copies of the `.db` with one
link's transit times made 1.5x and 2.5x longer (tests/test_rule_slow_link.py): the link is named at
both, and nothing else. The project has no multi-GPU NCCL traces with several process groups yet;
there, the same question (a group's collectives at a lower bus bandwidth than the same collectives
of its sibling groups) is left to a later rule.

## Options
- `max_ratio` (0.7): a link at this share of the median link's bandwidth or less is reported (healthy
  corpus job: 0.99 at the lowest).
- `min_mb` (1.0): transfers under this many megabytes are left out of a link's bandwidth.
- `min_links` (4): links of one transport a job needs before one can stand out.
- `critical_ratio` (0.5): critical at this share of the median or less, else a warning.
"""

from __future__ import annotations

import statistics

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.units import duration

# Per link of each run: the data it moved in transfers of at least $min_mb, the time they took, and
# the steps and ops they were in. The evidence query.
LINKS_SQL = """
SELECT run_id, transport, src_rank, dst_rank, any_value(process_group) AS process_group,
       count(*) AS transfers, count(DISTINCT step) AS steps, sum(transit_mb) AS mb, sum(transit_ns) AS ns,
       sum(transit_mb) / (sum(transit_ns) / 1e9) / 1e3 AS gbps
FROM cluster_links
WHERE transport IS NOT NULL AND upper(transport) <> 'LOCAL' AND src_rank IS NOT NULL AND dst_rank IS NOT NULL
  AND src_rank <> dst_rank AND transit_mb >= $min_mb AND transit_ns > 0
GROUP BY run_id, transport, src_rank, dst_rank
ORDER BY run_id, transport, gbps, src_rank, dst_rank
"""


# The analysed window of a cluster analysis, which has no timeline: the median rank's step (computing,
# communication not hidden and free time, as R002 splits it) summed over the steps.
WINDOW_SQL = """
SELECT sum(step_ns) FROM (
    SELECT step, median(coalesce(computing_ns, 0) + coalesce(communication_not_overlapped_ns, 0)
                        + coalesce(free_ns, 0)) AS step_ns
    FROM cluster_step_components WHERE run_id = $run_id GROUP BY step
)
"""


@rule(
    code="R004",
    name="slow-link",
    title="One link moves its data far slower than the job's other links of the same kind",
    category="cluster",
    requires=("run_metrics",),
    params={
        "max_ratio": Param(0.7, "report a link at this share of the median link's bandwidth or less", "ratio"),
        "min_mb": Param(1.0, "transfers under this many MB are left out of a link's bandwidth", "MB"),
        "min_links": Param(4, "links of one transport a job needs before one can stand out", "count"),
        "critical_ratio": Param(0.5, "critical at this share of the median or less", "ratio"),
    },
    example=Example(
        ("corpus/ascend/msinsight__full_db__cluster_analysis.db",),
        params={"max_ratio": 0.9915},
        note="every link of this job is within 2% of the median; raised, the threshold names the slowest one",
    ),
    scope="run",
)
def check(con, params, ctx):
    links = rows(con, LINKS_SQL, {"min_mb": params["min_mb"]})
    kinds: dict = {}
    for link in links:
        kinds.setdefault((link.run_id, link.transport), []).append(link)
    for (run_id, transport), same in kinds.items():
        if len(same) < params["min_links"]:
            continue
        median = statistics.median(link.gbps for link in same)
        if median <= 0:
            continue
        slow = [link for link in same if link.gbps <= params["max_ratio"] * median]
        if not slow:
            continue
        (window,) = con.execute(WINDOW_SQL, {"run_id": run_id}).fetchone()  # once per run, not per link
        for link in slow:
            yield _finding(ctx, params, link, median, len(same), int(window or link.ns))


def _finding(ctx, params, link, median: float, siblings: int, window_ns: int) -> Finding:
    ratio = link.gbps / median
    lost_ns = link.ns - link.mb / median * 1e6  # MB / (GB/s) = ms
    name = f"{link.src_rank} -> {link.dst_rank}"
    title = (
        f"Link rank {name} ({link.transport}) moves {link.mb / 1e3:.2f} GB at {link.gbps:.1f} GB/s, {ratio:.2f}x "
        f"the median of the job's {siblings} {link.transport} links ({median:.1f} GB/s): {duration(lost_ns)} lost"
    )
    run = ctx.run(link.run_id)
    return Finding(
        rule="R004",
        severity="critical" if ratio <= params["critical_ratio"] else "warning",
        # the matrix is msprof-analyze's measurement, not tracekit's: its transit time includes the
        # link's share of waiting inside the op
        confidence=0.75,
        title=title,
        locality=locality(
            run,
            rank=link.src_rank,
            link={"src_rank": link.src_rank, "dst_rank": link.dst_rank, "transport": link.transport},
        ),  # fmt: skip
        observed=Quantity(
            round(link.gbps, 3),
            "GB/s",
            f"link {name}, {link.transfers} transfers of >= {params['min_mb']:g} MB over {link.steps} steps",
        ),  # fmt: skip
        expected=Quantity(round(median, 3), "GB/s", f"median of the job's {siblings} {link.transport} links"),
        impact_ns=int(max(lost_ns, 0)),
        window_ns=window_ns,
        sql=LINKS_SQL,
        sql_params={"min_mb": params["min_mb"]},
        hypothesis=(
            f"Rank {link.src_rank}'s {link.transport} link to rank {link.dst_rank} carries the same kind of "
            f"traffic as the job's other {siblings - 1} {link.transport} links at {ratio:.0%} of their median "
            "bandwidth. Every collective of the group that crosses it waits for it: a degraded or "
            "mis-trained link (fewer lanes, a lower negotiated speed, errors and retransmits), not the "
            "algorithm, which the other links run at full speed."
        ),
        next_experiment=(
            f"Measure the link alone: a point-to-point bandwidth test between rank {link.src_rank}'s and rank "
            f"{link.dst_rank}'s devices and between a healthy pair with the same transport (on Ascend "
            "`hccl_test`'s all-reduce or send/recv test on those two devices, and the link's state with "
            "`npu-smi info` / `hccn_tool -i <device> -link -g`; on NVIDIA `nccl-tests` and `nvidia-smi nvlink -s`). "
            "A lower figure there is the hardware: reseat, replace or route around it."
        ),
        acceptance=rerun(
            "cluster analysis (msprof-analyze cluster) of the job",
            f"link {name} reaches at least {params['max_ratio']:.0%} of the median {link.transport} link's "
            "bandwidth in the evidence query.",
        ),
        extra={
            "process_group": link.process_group,
            "transport": link.transport,
            "src_rank": link.src_rank,
            "dst_rank": link.dst_rank,
            "bandwidth_gbps": round(link.gbps, 3),
            "median_gbps": round(median, 3),
            "ratio": round(ratio, 3),
            "links_compared": siblings,
            "transit_mb": round(link.mb, 3),
            "lost_ns": int(max(lost_ns, 0)),
        },
    )
