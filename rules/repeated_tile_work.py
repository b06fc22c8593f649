"""Work repeated in every tile of a kernel (K001 repeated-tile-work).

## What it does
Compares Nsight Compute launches of one kernel under different grid (tile) configurations, e.g. a
decode kernel run with BV = 16/32/64/128 over V. When executed instructions grow with the number
of tiles while DRAM bytes stay flat, every tile repeats work that does not depend on the tile (a
normalization, a gate, a reduction over K): the finding reports the repeated share at the finest
tiling. It then classifies the kernel from its speed-of-light metrics (NVIDIA's thresholds:
compute-, memory- or latency-bound) and says whether removing the repetition is expected to pay:
only a compute-bound kernel gets faster when it executes fewer instructions. The finding is a
warning when the kernel is compute-bound, an info otherwise (no threshold: the verdict decides).

## Why it matters
Tiling over an output dimension is how a kernel gets enough programs to fill the GPU, but any
computation inside the tile loop that only depends on the other dimensions is redone per tile. The
counters show it directly; the fix (compute it once per program, or in a preceding kernel) is only
worth its complexity where the kernel is compute-bound, and the finding must not sell a fusion
to a memory-bound kernel.

## Example
`fused_recurrent_kda_fwd_kernel` on an H200 at 1024/2048/4096/8192 programs: `sm__inst_executed`
grows 2.7x (8.0M -> 21.5M) while DRAM bytes stay within 2%: 63% of the instructions at 8192
programs repeat per tile. SM throughput is 38% and memory throughput 48% of peak: latency-bound,
and the four durations differ by 18% only, so removing the repetition is not expected to pay.
On the project's own H200 kernel with a heavy gate (`sample_traces/ncu_tiles_repeated_heavy.csv`)
the same signature is compute-bound at 8 tiles (SM 83%) and costs 35 us of 88 us: worth fixing.

## Options
- `min_launches` (3): launches of the kernel (with at least two grid sizes) needed to fit a trend.
- `min_growth` (2.5): instructions at the most tiles over those at the fewest. Tiling has overhead
  of its own (address math, per-tile loads and reductions): on the project's H200 kernel with the
  work hoisted out of the tile loop, 8 tiles executed 2.2x the instructions of 1 tile.
- `max_dram_change` (0.1): DRAM bytes may change at most this much between those configurations.
- `min_r2` (0.8): how well instructions follow the number of tiles (R^2 of a linear fit).
"""

from __future__ import annotations

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.units import duration

# Per (run, kernel): the trend of instructions and DRAM bytes over the number of tiles (grid size).
TREND_SQL = """
SELECT run_id, kernel, count(*) AS launches, count(DISTINCT grid_size) AS grids,
       min(grid_size) AS min_grid, max(grid_size) AS max_grid,
       arg_min(inst_executed, grid_size) AS inst_min_grid, arg_max(inst_executed, grid_size) AS inst_max_grid,
       arg_min(dram_bytes, grid_size) AS dram_min_grid, arg_max(dram_bytes, grid_size) AS dram_max_grid,
       1 - arg_min(inst_executed, grid_size) / arg_max(inst_executed, grid_size) AS repeated_share,
       regr_r2(inst_executed, grid_size) AS r2, regr_slope(inst_executed, grid_size) AS inst_per_tile,
       arg_max(duration_ns, grid_size) AS duration_max_grid,
       min(duration_ns) AS duration_min, max(duration_ns) AS duration_max,
       arg_max(sm_pct, grid_size) AS sm_pct, arg_max(mem_pct, grid_size) AS mem_pct,
       arg_max(bound, grid_size) AS bound,
       list(launch_id ORDER BY grid_size) AS launch_ids, list(grid_size ORDER BY grid_size) AS grid_sizes
FROM ncu_launches
WHERE inst_executed IS NOT NULL AND dram_bytes IS NOT NULL AND grid_size IS NOT NULL
GROUP BY run_id, kernel
"""

# The evidence query: the same aggregates for one kernel (repeated_share, the first column, = observed).
EVIDENCE_SQL = """
SELECT 1 - arg_min(inst_executed, grid_size) / arg_max(inst_executed, grid_size) AS repeated_share,
       arg_min(inst_executed, grid_size) AS inst_min_grid, arg_max(inst_executed, grid_size) AS inst_max_grid,
       arg_min(dram_bytes, grid_size) AS dram_min_grid, arg_max(dram_bytes, grid_size) AS dram_max_grid,
       regr_r2(inst_executed, grid_size) AS r2, arg_max(bound, grid_size) AS bound,
       arg_max(sm_pct, grid_size) AS sm_pct, arg_max(mem_pct, grid_size) AS mem_pct
FROM ncu_launches
WHERE run_id = $run_id AND kernel = $kernel
  AND inst_executed IS NOT NULL AND dram_bytes IS NOT NULL AND grid_size IS NOT NULL
"""


@rule(
    code="K001",
    name="repeated-tile-work",
    title="Instructions grow with the number of tiles while DRAM bytes stay flat",
    category="kernel",
    requires=("ncu_launches",),
    params={
        "min_launches": Param(3, "launches of one kernel needed, with two or more grid sizes", "launches"),
        "min_growth": Param(2.5, "instructions at the most tiles over those at the fewest", "ratio"),
        "max_dram_change": Param(0.1, "largest relative change of DRAM bytes between those configurations", "ratio"),
        "min_r2": Param(0.8, "how well instructions follow the grid size", "R^2"),
    },
    example=Example(("ncu_tiles_repeated_heavy.csv",)),
)
def check(con, params, ctx):
    for t in rows(con, TREND_SQL + " ORDER BY run_id, kernel"):
        if t.launches < params["min_launches"] or t.grids < 2 or not t.inst_min_grid:
            continue
        growth = t.inst_max_grid / t.inst_min_grid
        dram_change = abs(t.dram_max_grid - t.dram_min_grid) / max(t.dram_min_grid, 1)
        if growth < params["min_growth"] or dram_change > params["max_dram_change"] or (t.r2 or 0) < params["min_r2"]:
            continue
        yield _finding(ctx, params, t, growth, dram_change)


def _compute_bound(t) -> bool:
    return t.bound == "compute" or (t.bound == "high throughput" and (t.sm_pct or 0) >= (t.mem_pct or 0))


def _verdict(t, bound: str) -> tuple[str, int]:
    """Whether removing the repetition pays, and the time it would save per launch (0 unless compute-bound)."""
    if _compute_bound(t):
        # measured, not modelled: what the finest tiling costs over the fastest configuration
        duration_max = t.duration_max_grid or 0
        saving = int(max(0.0, duration_max - (t.duration_min or duration_max)))
        return (
            f"compute-bound at {t.max_grid:.0f} tiles (SM {t.sm_pct:.0f}%, memory {t.mem_pct:.0f}% of peak): the "
            f"repeated {t.repeated_share:.0%} of instructions cost time there, {duration(saving)} per launch over "
            "the fastest tiling",
            saving,
        )
    spread = (t.duration_max - t.duration_min) / t.duration_min if t.duration_min else None
    sol = f"SM {t.sm_pct:.0f}%, memory {t.mem_pct:.0f}% of peak" if t.sm_pct is not None else "no SOL metrics"
    return (
        f"{bound}-bound ({sol}): fewer instructions are not expected to make it faster"
        + (f"; its duration differs by only {spread:.0%} across the tilings" if spread is not None else ""),
        0,
    )


def _finding(ctx, params, t, growth, dram_change):
    run = ctx.run(t.run_id)
    share = t.repeated_share
    bound = t.bound or "unknown"
    compute_bound = _compute_bound(t)
    spread = (t.duration_max - t.duration_min) / t.duration_min if t.duration_min else None
    verdict, saving = _verdict(t, bound)
    return Finding(
        rule="K001",
        severity="warning" if compute_bound else "info",
        confidence=min(0.95, 0.5 + 0.5 * (t.r2 or 0)) if compute_bound else 0.7,
        title=(
            f"{t.kernel[:60]}: {share:.0%} of instructions repeat per tile ({growth:.1f}x from {t.min_grid:.0f} to "
            f"{t.max_grid:.0f} tiles, DRAM bytes {dram_change:+.0%}); {bound}-bound"
        ),
        locality=locality(
            run,
            kernel=t.kernel,
            launch={"grid_sizes": [int(g) for g in t.grid_sizes], "ncu_launch_ids": t.launch_ids},
        ),
        observed=Quantity(
            share,
            "ratio",
            f"share of sm__inst_executed at {t.max_grid:.0f} tiles above the {t.min_grid:.0f}-tile launch "
            f"({t.inst_min_grid:.3g} -> {t.inst_max_grid:.3g}; ~{t.inst_per_tile:.3g} per extra tile)",
        ),
        expected=Quantity(0.0, "ratio", "instructions independent of the tiling when the work per element is fixed"),
        impact_ns=saving,
        window_ns=int(t.duration_max_grid or 0),
        sql=EVIDENCE_SQL,
        sql_params={"run_id": t.run_id, "kernel": t.kernel},
        hypothesis=(
            "each tile recomputes something that does not depend on the tile (e.g. an FP32 normalization or gating "
            "over K) before its own slice of the output; " + verdict + "."
        ),
        next_experiment=(
            "Move the tile-independent part out of the tile loop (compute it once per program, or in a small "
            "preceding kernel) or use fewer, larger tiles; re-run `ncu --clock-control none --metrics "
            "sm__inst_executed.sum,dram__bytes.sum,gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed` "
            "on the same configurations"
            + ("" if compute_bound else ", and only keep the change if gpu__time_duration drops")
            + "."
        ),
        acceptance=rerun(
            "report",
            f"repeated_share below {1 - 1 / params['min_growth']:.0%}"
            + (" and the duration at the finest tiling down by the saving estimated here." if compute_bound else "."),
        ),
        caveats=[] if t.sm_pct is not None else ["no speed-of-light metrics in the report: bound unknown"],
        extra={"durations_spread": round(spread, 4) if spread is not None else None, "verdict": verdict},
    )
