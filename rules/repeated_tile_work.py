"""Work repeated in every tile of a kernel (K001 repeated-tile-work).

## What it does
Compares Nsight Compute launches of one kernel name under different configurations (grid, block
size, registers), two ways:

- Variants: a launch is compared with the forms of the same kernel that do its work without
  repeating it per tile, at equal DRAM bytes (within `max_dram_change`): another specialization with
  fewer programs (one program per head: a different block size or register count), or the same
  configuration after a small kernel of its own (a pre-normalising kernel, whose instructions, bytes
  and time count with it). The closest such form below the launch (the smallest excess, so the share
  is never overstated) gives the repeated share of warp instructions; at `min_share` or more the
  launch is reported, with the counters that show it (FADD, FMUL, FFMA thread instructions, global
  loads, each as excess over the form).
- Tiling sweep: launches of one block size at several grid sizes. When executed instructions grow
  `min_growth`-fold with the number of tiles while DRAM bytes stay flat, the share at the finest
  tiling repeats per tile (tiling alone has overhead: hence the growth threshold).

Each finding classifies the launch on the roofline: arithmetic intensity (FP32 FLOPs over DRAM
bytes) against the device's ridge point (peak FP32 rate over peak DRAM bandwidth, from the device
attributes in the report), and achieved DRAM bandwidth against peak: compute-bound above the ridge
(or issue-bound, SM >= 80%), memory-bound below it with DRAM at `saturated_bandwidth` of peak or
more, latency-bound below it with neither saturated. Without the counters it falls back to NVIDIA's
speed-of-light thresholds. It then says whether removing the repetition pays: measured, from the
form of the same tiling without it when the report has one (a warning when that saves `min_saving`
of the launch or more), and modelled (the repeated share of the SM's issue time). A compute-bound
kernel is a warning; a memory- or latency-bound one whose measured form is not faster is an info
that says plainly that hoisting is not expected to pay.

## Why it matters
Tiling over an output dimension is how a kernel gets enough programs to fill the GPU, but any
computation inside the tile loop that only depends on the other dimensions is redone per tile. The
counters show it directly; the fix (compute it once per program, or in a preceding kernel) is only
worth its complexity where the time follows the instructions, and the finding must not sell a
fusion to a memory-bound kernel.

## Example
On the project's own H200 kernel with a heavy gate (`sample_traces/ncu_tiles_repeated_heavy.csv`,
a BV sweep of one block size) instructions grow 5.2x from 1 to 8 tiles at flat DRAM bytes: 81% repeat
per tile, compute-bound at 8 tiles (SM 83%), 37 us of 88 us: worth fixing. The same sweep with the
work hoisted (`ncu_tiles_hoisted_*`) grows 2.2x from tiling overhead alone and is not reported.

## Checked on
Real H200 runs (tests/data/ncu_matrix, scripts/make_ncu_matrix.py, `ncu --clock-control none`, raw
and details pages): an FLA-style fused-recurrent decode kernel tiled over V (BV 16, one warp, grid of
V-tiles by heads) that reloads q/k and recomputes their norms and the gates per tile; the same
kernel with one program per head; a pre-normalised pair; 512 and 8192 batch*heads; light and heavy
gates. Every tiled launch is reported (18% of warp instructions over the per-head form with a light
gate, 64% with a heavy one; FADD +139-341%, FMUL +18-186%); none of the others. At 512 heads (19-22 us)
the kernel is latency-bound, 1.7-3.4 FLOP/byte against a ridge of 13.9, and the pre-normalised form
is 1.7-4.9 us slower: info, not expected to pay. At 8192 heads the pre-normalised form is 9-10%
faster: a warning with the measured saving. Also the KDA decode kernel's BV sweep on an H200
(`fused_recurrent_kda_fwd_kernel`, 1024-8192 programs: latency-bound, not expected to pay) and the
project's `ncu_tiles_*` sweeps (tests/test_ncu.py, tests/test_ncu_matrix.py).

## Options
- `min_launches` (3): launches of one block size (at two or more grid sizes) that make a sweep.
- `min_growth` (2.5): sweep: instructions at the most tiles over those at the fewest. On the
  project's H200 kernel with the work hoisted out of the tile loop, 8 tiles executed 2.2x the
  instructions of 1 tile.
- `max_dram_change` (0.1): DRAM bytes may change at most this much between compared launches
  (the matrix's forms differ by 0.6-7%).
- `min_r2` (0.8): sweep: how well instructions follow the number of tiles (R^2 of a linear fit).
- `min_share` (0.1): variants: share of warp instructions above the form without the repetition.
  The matrix's repeating launches are at 18% and more; two forms without the repetition doing the
  same work differ by 5% (per-head against the pre-normalised pair, light gate).
- `saturated_bandwidth` (0.6): share of peak DRAM bandwidth from which a kernel below the ridge
  point is memory-bound (NVIDIA's speed-of-light rule uses the same 60% for "latency").
- `min_saving` (0.05): measured saving of the form without the repetition, as a share of the
  launch, that makes the finding a warning (the matrix: -8 to -23% at 512 heads, +9-10% at 8192).
"""

from __future__ import annotations

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.units import duration

# Per (run, kernel, block size): the trend of instructions and DRAM bytes over the number of tiles
# (grid size): a tiling sweep of one launch shape.
TREND_SQL = """
SELECT run_id, kernel, block_size, count(*) AS launches, count(DISTINCT grid_size) AS grids,
       min(grid_size) AS min_grid, max(grid_size) AS max_grid,
       arg_min(inst_executed, grid_size) AS inst_min_grid, arg_max(inst_executed, grid_size) AS inst_max_grid,
       arg_min(dram_bytes, grid_size) AS dram_min_grid, arg_max(dram_bytes, grid_size) AS dram_max_grid,
       1 - arg_min(inst_executed, grid_size) / arg_max(inst_executed, grid_size) AS repeated_share,
       regr_r2(inst_executed, grid_size) AS r2, regr_slope(inst_executed, grid_size) AS inst_per_tile,
       arg_max(duration_ns, grid_size) AS duration_max_grid,
       min(duration_ns) AS duration_min, max(duration_ns) AS duration_max,
       arg_max(sm_pct, grid_size) AS sm_pct, arg_max(mem_pct, grid_size) AS mem_pct,
       arg_max(bound, grid_size) AS bound, arg_max(launch_id, grid_size) AS finest_launch,
       list(launch_id ORDER BY grid_size) AS launch_ids, list(grid_size ORDER BY grid_size) AS grid_sizes
FROM ncu_launches
WHERE inst_executed IS NOT NULL AND dram_bytes IS NOT NULL AND grid_size IS NOT NULL
GROUP BY run_id, kernel, block_size
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
  AND block_size IS NOT DISTINCT FROM $block_size
  AND inst_executed IS NOT NULL AND dram_bytes IS NOT NULL AND grid_size IS NOT NULL
"""

# Every launch with what the variant comparison and the roofline read, and the launch before it.
LAUNCHES_SQL = """
SELECT run_id, launch_id, kernel, grid, block, grid_size, block_size, registers, duration_ns, sm_pct, mem_pct,
       bound, inst_executed, dram_bytes, dram_pct, fadd_thread_inst, fmul_thread_inst, ffma_thread_inst,
       global_load_inst, coalesce(fp32_flops, fp32_thread_inst) AS flops, dram_peak_bytes_per_s,
       fp32_peak_flops_per_s,
       lag(launch_id) OVER w AS previous_launch, lag(kernel) OVER w AS previous_kernel
FROM ncu_launches
WHERE inst_executed IS NOT NULL AND dram_bytes IS NOT NULL AND grid_size IS NOT NULL
WINDOW w AS (PARTITION BY run_id ORDER BY launch_id)
ORDER BY run_id, launch_id
"""

# The evidence query of a variant comparison: one launch against the launches of the form without
# the repetition (repeated_share, the first column, = observed).
VARIANT_EVIDENCE_SQL = """
SELECT 1 - b.inst / l.inst_executed AS repeated_share, l.inst_executed, b.inst AS baseline_inst,
       l.dram_bytes, b.dram AS baseline_dram_bytes, l.duration_ns, b.duration AS baseline_duration_ns,
       l.fadd_thread_inst, b.fadd AS baseline_fadd, l.fmul_thread_inst, b.fmul AS baseline_fmul,
       l.ffma_thread_inst, b.ffma AS baseline_ffma, l.global_load_inst, b.global_ld AS baseline_global_load
FROM ncu_launches l,
     (SELECT sum(inst_executed) AS inst, sum(dram_bytes) AS dram, sum(duration_ns) AS duration,
             sum(fadd_thread_inst) AS fadd, sum(fmul_thread_inst) AS fmul, sum(ffma_thread_inst) AS ffma,
             sum(global_load_inst) AS global_ld
      FROM ncu_launches WHERE run_id = $run_id AND list_contains($baseline_launch_ids, launch_id)) b
WHERE l.run_id = $run_id AND l.launch_id = $launch_id
"""

COUNTERS = {
    "fadd_thread_inst": "FADD",
    "fmul_thread_inst": "FMUL",
    "ffma_thread_inst": "FFMA",
    "global_load_inst": "global loads",
    "inst_executed": "warp instructions",
}


@rule(
    code="K001",
    name="repeated-tile-work",
    title="Work repeated in every tile: more instructions at equal DRAM bytes than the form without it",
    category="kernel",
    requires=("ncu_launches",),
    params={
        "min_launches": Param(3, "launches of one kernel needed for a sweep, with two or more grid sizes", "launches"),
        "min_growth": Param(2.5, "sweep: instructions at the most tiles over those at the fewest", "ratio"),
        "max_dram_change": Param(0.1, "largest relative change of DRAM bytes between compared launches", "ratio"),
        "min_r2": Param(0.8, "sweep: how well instructions follow the grid size", "R^2"),
        "min_share": Param(0.1, "variants: excess share of warp instructions over the form without it", "ratio"),
        "saturated_bandwidth": Param(
            0.6, "share of peak DRAM bandwidth from which a kernel below the ridge point is memory-bound", "ratio"
        ),
        "min_saving": Param(0.05, "measured saving, as a share of the launch, that makes it worth fixing", "ratio"),
    },
    example=Example(("ncu_tiles_repeated_heavy.csv",)),
)
def check(con, params, ctx):
    launches = rows(con, LAUNCHES_SQL)
    trends = rows(con, TREND_SQL + " ORDER BY run_id, kernel, block_size")
    sweeps = [t for t in trends if t.launches >= params["min_launches"] and t.grids >= 2 and t.inst_min_grid]
    yield from _variant_findings(ctx, params, launches, {(t.run_id, t.kernel, t.block_size) for t in sweeps})
    for t in sweeps:
        growth = t.inst_max_grid / t.inst_min_grid
        dram_change = abs(t.dram_max_grid - t.dram_min_grid) / max(t.dram_min_grid, 1)
        if growth < params["min_growth"] or dram_change > params["max_dram_change"] or (t.r2 or 0) < params["min_r2"]:
            continue
        finest = next(x for x in launches if x.run_id == t.run_id and x.launch_id == t.finest_launch)
        yield _finding(ctx, params, t, growth, dram_change, _roofline(finest, params))


def _sweep_key(x) -> tuple:
    return (x.run_id, x.kernel, x.block_size)


def _roofline(x, params) -> dict:
    """Where a launch sits on the roofline: arithmetic intensity against the device's ridge point, achieved
    DRAM bandwidth against peak, and the bound that follows (speed-of-light metrics when the counters or
    the device's peaks are missing)."""
    out = {"bound": None, "ai": None, "ridge": None, "bandwidth_share": None, "sm_pct": x.sm_pct}
    if x.duration_ns and x.dram_peak_bytes_per_s:
        out["bandwidth_share"] = x.dram_bytes / (x.duration_ns * 1e-9) / x.dram_peak_bytes_per_s
    if x.flops is not None and x.dram_bytes and x.fp32_peak_flops_per_s and x.dram_peak_bytes_per_s:
        out["ai"] = x.flops / x.dram_bytes
        out["ridge"] = x.fp32_peak_flops_per_s / x.dram_peak_bytes_per_s
    issue_bound = (x.sm_pct or 0) >= 80 and (x.sm_pct or 0) >= (x.mem_pct or 0)
    if out["ai"] is not None and out["bandwidth_share"] is not None:
        if out["ai"] >= out["ridge"] or issue_bound:
            out["bound"] = "compute"
        elif out["bandwidth_share"] >= params["saturated_bandwidth"]:
            out["bound"] = "memory"
        else:
            out["bound"] = "latency"
    elif x.bound is not None:
        compute = x.bound == "compute" or (x.bound == "high throughput" and issue_bound)
        out["bound"] = "compute" if compute else ("memory" if x.bound == "high throughput" else x.bound)
    return out


def _roofline_text(r: dict) -> str:
    if r["ai"] is None:
        return f"{r['bound'] or 'unknown'}-bound by its speed-of-light metrics"
    side = "below" if r["ai"] < r["ridge"] else "above"
    return (
        f"{r['bound']}-bound: arithmetic intensity {r['ai']:.2g} FLOP/byte, {side} the device's ridge point "
        f"{r['ridge']:.3g} FLOP/byte, DRAM at {r['bandwidth_share']:.0%} of peak bandwidth"
    )


def _verdict(t, r: dict) -> tuple[str, int]:
    """Whether removing the repetition pays, and the time it would save per launch (0 unless compute-bound)."""
    if r["bound"] == "compute":
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
        f"{_roofline_text(r)} ({sol}): fewer instructions are not expected to make it faster"
        + (f"; its duration differs by only {spread:.0%} across the tilings" if spread is not None else ""),
        0,
    )


def _finding(ctx, params, t, growth, dram_change, r):
    run = ctx.run(t.run_id)
    share = t.repeated_share
    bound = r["bound"] or "unknown"
    compute_bound = bound == "compute"
    spread = (t.duration_max - t.duration_min) / t.duration_min if t.duration_min else None
    verdict, saving = _verdict(t, r)
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
        sql_params={"run_id": t.run_id, "kernel": t.kernel, "block_size": t.block_size},
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
        extra={
            "comparison": "tiling sweep",
            "durations_spread": round(spread, 4) if spread is not None else None,
            "verdict": verdict,
            "roofline": r,
        },
    )


def _config(x) -> tuple:
    return (x.grid_size, x.block_size, x.registers)


def _config_text(x) -> str:
    regs = f", {x.registers:.0f} registers" if x.registers is not None else ""
    return f"grid {x.grid}, block {x.block}{regs}"


def _producer(x, by_id: dict):
    """The launch of another kernel right before this one: work that may have been hoisted out of it."""
    if x.previous_kernel is None or x.previous_kernel == x.kernel:
        return None
    return by_id.get((x.run_id, x.previous_launch))


def _forms_without_repetition(launch, same_kernel: list, by_id: dict, params) -> list[dict]:
    """The launches of the same kernel that do its work without repeating it per tile, at equal DRAM
    bytes: another specialization with fewer programs (one program per head: a different block size or
    register count), or the same configuration after a kernel of its own (a pre-normalising kernel) that
    `launch` does not have before it; that kernel's instructions, bytes and time count with it."""
    mine = _producer(launch, by_id)
    out = []
    for b in same_kernel:
        if b.launch_id == launch.launch_id:
            continue
        producer = _producer(b, by_id)
        if producer is not None and mine is not None and producer.kernel == mine.kernel:
            producer = None  # both follow the same kind of kernel: nothing was hoisted into it
        if b.grid_size < launch.grid_size and (b.block_size, b.registers) != (launch.block_size, launch.registers):
            kind = "fewer programs"
        elif _config(b) == _config(launch) and producer is not None:
            kind = "pre-normalised"
        else:
            continue
        parts = [producer, b] if producer is not None else [b]
        form = {
            "kind": kind,
            "launches": parts,
            "launch_ids": [p.launch_id for p in parts],
            "inst": sum(p.inst_executed for p in parts),
            "dram": sum(p.dram_bytes for p in parts),
            "duration_ns": sum(p.duration_ns or 0 for p in parts),
        }
        equal_bytes = abs(form["dram"] - launch.dram_bytes) <= params["max_dram_change"] * launch.dram_bytes
        if equal_bytes and form["inst"] < launch.inst_executed:
            out.append(form)
    return out


def _counters(launch, form) -> dict:
    """Per counter: the launch's count over the form's, minus one (the excess)."""
    out = {}
    for column, label in COUNTERS.items():
        mine = getattr(launch, column)
        theirs = [getattr(p, column) for p in form["launches"]]
        if mine is not None and all(v is not None for v in theirs) and sum(theirs) > 0:
            out[label] = mine / sum(theirs) - 1
    return out


def _variant_findings(ctx, params, launches, sweeps: set):
    """Launches compared with the forms of the same kernel without the repetition; launches of one block
    size at several grid sizes are a tiling sweep, judged by its trend instead (tiling has overhead of
    its own that a pairwise comparison would take for repetition)."""
    by_id = {(x.run_id, x.launch_id): x for x in launches}
    groups: dict = {}
    for x in launches:
        groups.setdefault((x.run_id, x.kernel), []).append(x)
    for (run_id, kernel), same_kernel in groups.items():
        repeated: dict = {}
        for launch in same_kernel:
            others = [b for b in same_kernel if not (_sweep_key(b) == _sweep_key(launch) and _sweep_key(b) in sweeps)]
            forms = _forms_without_repetition(launch, others, by_id, params)
            if not forms:
                continue
            # the closest form below: the smallest excess, so the share is never overstated
            closest = max(forms, key=lambda f: (f["inst"], -f["launch_ids"][-1]))
            share = 1 - closest["inst"] / launch.inst_executed
            if share < params["min_share"]:
                continue
            same_tiling = [f for f in forms if f["kind"] == "pre-normalised"]
            timed = max(same_tiling, key=lambda f: f["inst"]) if same_tiling else None
            repeated.setdefault(_config(launch), []).append(
                {"launch": launch, "form": closest, "share": share, "timed": timed, "r": _roofline(launch, params)}
            )
        for cells in repeated.values():
            yield _variant_finding(ctx.run(run_id), params, kernel, cells)


def _saving_text(cell) -> tuple[str, int | None]:
    """The measured time removing the repetition saves: the form of the same tiling when the report has it."""
    launch, timed = cell["launch"], cell["timed"]
    if timed is None or not launch.duration_ns:
        return "", None
    saved = launch.duration_ns - timed["duration_ns"]
    names = " + ".join(p.kernel for p in timed["launches"])
    verb = f"{duration(saved)} ({saved / launch.duration_ns:.0%}) faster" if saved > 0 else f"{duration(-saved)} slower"
    return (
        f"the pre-normalised form of the same tiling ({names}, {duration(timed['duration_ns'])}) measured {verb} "
        f"than this launch ({duration(launch.duration_ns)})",
        int(saved),
    )


def _variant_finding(run, params, kernel, cells) -> Finding:
    rep = max(cells, key=lambda c: (c["share"], c["launch"].launch_id))
    launch, form, r = rep["launch"], rep["form"], rep["r"]
    counters = _counters(launch, form)
    shown = ", ".join(f"{k} {v:+.0%}" for k, v in sorted(counters.items(), key=lambda kv: -kv[1]))
    measured, saved = _saving_text(rep)
    pays = saved is not None and saved >= params["min_saving"] * launch.duration_ns
    compute_bound = r["bound"] == "compute"
    modelled = int(rep["share"] * (launch.duration_ns or 0) * min(1.0, (launch.sm_pct or 0) / 100))
    if compute_bound or pays:
        verdict = f"{_roofline_text(r)}; " + (
            measured + ": removing the repetition pays" if pays else "the repeated instructions cost issue time"
        )
    else:
        verdict = (
            f"{_roofline_text(r)}: the repeated instructions are not what limits it, and hoisting them is not "
            "expected to pay" + (f" ({measured})" if measured else "")
        )
    base = form["launches"][-1]
    shares = sorted(c["share"] for c in cells)
    share_text = f"{shares[0]:.0%}" if len(shares) == 1 else f"{shares[0]:.0%}-{shares[-1]:.0%}"
    return Finding(
        rule="K001",
        severity="warning" if compute_bound or pays else "info",
        confidence=0.8 if compute_bound or pays else 0.7,
        title=(
            f"{kernel[:60]} ({_config_text(launch)}): {share_text} of warp instructions repeat per tile against "
            f"the form without it ({form['kind']}: {_config_text(base)}) at equal DRAM bytes; {r['bound']}-bound"
            + ("" if compute_bound or pays else ", not expected to pay")
        ),
        locality=locality(
            run,
            kernel=kernel,
            launch={
                "ncu_launch_ids": [c["launch"].launch_id for c in cells],
                "grid": launch.grid,
                "block": launch.block,
                "registers": launch.registers,
            },
        ),
        observed=Quantity(
            rep["share"],
            "ratio",
            f"share of sm__inst_executed of launch {launch.launch_id} above launches {form['launch_ids']} "
            f"({launch.inst_executed:.3g} vs {form['inst']:.3g})",
        ),
        expected=Quantity(0.0, "ratio", "the instructions of the form that computes the tile-independent part once"),
        impact_ns=max(0, saved or 0) if pays else (modelled if compute_bound else 0),
        window_ns=int(launch.duration_ns or 0),
        sql=VARIANT_EVIDENCE_SQL,
        sql_params={"run_id": run.run_id, "launch_id": launch.launch_id, "baseline_launch_ids": form["launch_ids"]},
        hypothesis=(
            "each tile recomputes work that does not depend on the tile (reloads inputs shared by all tiles and "
            f"recomputes e.g. their FP32 norms or gates) before its own slice of the output: the counters show it "
            f"({shown}); "
            + verdict
            + f"; modelled, the repeated share of the issue time is {duration(modelled)} per launch."
        ),
        next_experiment=(
            "Compute the tile-independent part once (one program per head, or a small preceding kernel that writes "
            "the normalised q/k and gates) and re-run `ncu --clock-control none` on both forms"
            + ("" if compute_bound or pays else "; keep the change only if gpu__time_duration drops")
            + "."
        ),
        acceptance=rerun("report", f"repeated_share below {params['min_share']:.0%} against the same form."),
        caveats=[]
        if rep["timed"] is not None
        else ["no form of the same tiling without the repetition in the report: the saving is modelled, not measured"],
        extra={
            "comparison": "variants",
            "launches": [
                {
                    "launch_id": c["launch"].launch_id,
                    "repeated_share": c["share"],
                    "baseline_launch_ids": c["form"]["launch_ids"],
                    "baseline_kind": c["form"]["kind"],
                    "counters": _counters(c["launch"], c["form"]),
                    "duration_ns": c["launch"].duration_ns,
                    "same_tiling_duration_ns": c["timed"]["duration_ns"] if c["timed"] else None,
                    "roofline": c["r"],
                }
                for c in sorted(cells, key=lambda c: c["launch"].launch_id)
            ],
            "roofline": r,
            "verdict": verdict,
            "pays": pays,
        },
    )
