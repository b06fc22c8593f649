"""Numerical error that grows with the problem size (N001 numerics-drift).

## What it does
Reads correctness reports (the `numerics` table: one row per check and error metric, with its
conditions; the size is the report's own size column, `seq_len`, `T`, `num_tokens`, ...) and, per
error metric (`max_rel_err` is skipped by default, since elements where the reference is near zero
dominate it) and per combination of the other conditions (precision, dtype, variant, partitions,
the rest), fits log(error) against log(size) by least squares. A metric grows when its error at the
largest size is at least `min_growth` times that at the smallest and the fitted rise of log(error)
is at least `min_trend_to_scatter` times the points' own scatter about the fit (a flat error with
noise does not grow). It flags the combinations that grow and whose error at the largest size
exceeds `tolerance`: relative metrics as written, absolute ones divided by the reference's
magnitude when the report measured it (a `ref_*` / `*scale*` column), else as written. It reports
the fitted exponent, the metrics that grow and those that stay flat under the same conditions, the
conditions that separate the failing combinations from the passing ones of the same metric (the
drivers), the failing rows, and how partitioned checks agree with unpartitioned ones at equal
conditions (ratio range). When nothing fails it reports an info finding, "not significant", with
the numbers.

Two neighbouring questions have rules of their own: whether fp32 checks carry the rounding of
TF32 tensor cores (N002 tf32-signature), and whether a variant of the computation adds error its
reference path does not have (N003 variant-divergence).

## Why it matters
`tl.dot` on fp32 operands uses TF32 tensor cores by default on NVIDIA sm80+ (Triton's
`input_precision="tf32"`, and PyTorch matmuls when `allow_tf32` is on). In a recurrence (a
linear-attention state carried across chunks, or a context-parallel merge of partition states)
the rounding compounds, so the error grows with the sequence length: tests at short lengths pass
and long contexts drift. The report table alone shows it when it holds the right conditions;
the finding names them and the one switch that tells rounding from a real bug.

## Example
The project's Triton chunked recurrence on an H200 (`sample_traces/numerics_tf32.csv`,
`S_t = A_t S_{t-1} + k_t^T v_t`, `o_t = q_t S_t`, 256..16384 tokens): under `tf32` the mean
relative error of the outputs grows 37x from 256 to 16384 tokens (fitted exponent 0.85) to 0.19,
while `tf32x3` and `ieee` stay below 1e-4 at every length (5.7e-5 and 1.3e-5 at 16384): growth
driven by `precision=tf32`. On the `tf32x3` rows alone the rule only says "not significant", and
that the fitted power law would reach the tolerance near 32k tokens.

## Checked on
Real H200 reports of the project's Triton recurrence (tests/data/numerics_matrix, made by
scripts/make_numerics_matrix.py): lengths 1k-64k named `T`, `seqlen`, `num_tokens` or
`context_len`; normal, uniform and heavy-tailed inputs; tf32 / tf32x3 / ieee and a torch fp32
reference with TF32 off; 1 and 4 partitions; relative Frobenius, max abs and mean abs errors of the
outputs and the state, next to measurements (reference magnitude, time, non-finite count,
difference against the unpartitioned run). The tf32 errors grow 14-15x from 1k to 64k (exponent
0.65) on every metric and are reported, driven by precision=tf32, with the partitioned runs within
0.8-1.0x of the unpartitioned ones; the report without tf32 rows (errors of 1e-6..2e-5 relative,
growing with length as fp32 rounding does) is "not significant" (tests/test_numerics_matrix.py).

## Options
- `tolerance` (1e-4): largest acceptable error at the largest size (relative for `*rel*` and
  `*ratio*` metrics; an absolute metric is divided by the reference's magnitude when the report has
  it, else taken in its own unit).
- `min_growth` (4.0): error at the largest size over the error at the smallest size.
- `min_trend_to_scatter` (2.0): fitted rise of log(error) from the smallest to the largest size
  over the standard deviation of the points about the fit. On the matrix every metric that grows
  4x or more rises 2.8-17x its scatter (median 9.6); a flat error with +-10% noise does not pass
  `min_growth` nor this.
- `min_sizes` (3): distinct sizes needed to fit a growth.
- `metrics` (""): comma-separated error metrics to read; empty reads all but `skip_metrics`.
- `skip_metrics` ("max_rel_err"): comma-separated error metrics to ignore.
"""

from __future__ import annotations

import json
import math

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _numerics

GROUP_COLS = ("precision", "dtype", "variant", "partitions", "other_conditions")

# An absolute error is judged against the tolerance relative to the reference's magnitude when the
# report measured it (numerics.reference_scale); a relative one, or one without it, as written.
TREND_COLUMNS = """
       CASE WHEN regexp_matches(lower(any_value(metric)), 'rel|ratio') OR arg_max(reference_scale, seq_len) IS NULL
            THEN arg_max(value, seq_len) ELSE arg_max(value, seq_len) / arg_max(reference_scale, seq_len)
       END AS judged_max_size,
       count(DISTINCT seq_len) AS sizes, min(seq_len) AS min_size, max(seq_len) AS max_size,
       arg_min(value, seq_len) AS err_min_size, arg_max(value, seq_len) AS err_max_size,
       arg_max(value, seq_len) / arg_min(value, seq_len) AS growth,
       arg_max(reference_scale, seq_len) AS scale_max_size,
       regr_slope(ln(value), ln(seq_len)) AS exponent, regr_intercept(ln(value), ln(seq_len)) AS intercept,
       regr_r2(ln(value), ln(seq_len)) AS r2,
       list(row_index ORDER BY seq_len, row_index) AS row_indexes,
       list(seq_len ORDER BY seq_len, row_index) AS seq_lens,
       list(value ORDER BY seq_len, row_index) AS errors
"""

# Per (run, metric, conditions other than the size): the error's trend over the size.
GROWTH_SQL = f"""
SELECT run_id, metric, precision, dtype, variant, partitions, other_conditions, {TREND_COLUMNS}
FROM numerics
WHERE seq_len > 0 AND value > 0
GROUP BY run_id, metric, precision, dtype, variant, partitions, other_conditions
ORDER BY run_id, metric, precision, dtype, variant, partitions, other_conditions
"""

# The evidence query: one combination's trend (judged_max_size, the first column, = observed).
GROWTH_EVIDENCE_SQL = f"""
SELECT judged_max_size, err_max_size, err_min_size, scale_max_size, growth, exponent, r2, min_size, max_size,
       row_indexes, seq_lens, errors
FROM (SELECT {TREND_COLUMNS} FROM numerics
      WHERE seq_len > 0 AND value > 0 AND run_id = $run_id AND metric = $metric
        AND precision IS NOT DISTINCT FROM $precision AND dtype IS NOT DISTINCT FROM $dtype
        AND variant IS NOT DISTINCT FROM $variant AND partitions IS NOT DISTINCT FROM $partitions
        AND other_conditions = $other_conditions)
"""

# Partitioned checks next to the unpartitioned check at equal conditions: how well they agree.
AGREEMENT_SQL = """
SELECT count(*) AS pairs, min(v.value / r.value) AS ratio_min, max(v.value / r.value) AS ratio_max,
       list(DISTINCT v.partitions ORDER BY v.partitions) AS partitions
FROM numerics v JOIN numerics r
  ON r.run_id = v.run_id AND r.metric = v.metric AND r.other_conditions = v.other_conditions
 AND r.precision IS NOT DISTINCT FROM v.precision AND r.dtype IS NOT DISTINCT FROM v.dtype
 AND r.variant IS NOT DISTINCT FROM v.variant AND r.seq_len IS NOT DISTINCT FROM v.seq_len
 AND r.partitions = 1 AND v.partitions > 1
WHERE v.run_id = $run_id AND v.metric = $metric AND r.value > 0
"""


@rule(
    code="N001",
    name="numerics-drift",
    title="Numerical error that grows with the problem size",
    category="numerics",
    requires=("numerics",),
    params={
        "tolerance": Param(1e-4, "largest acceptable error at the largest size", "error"),
        "min_growth": Param(4.0, "error at the largest size over that at the smallest", "ratio"),
        "min_trend_to_scatter": Param(
            2.0, "fitted rise of log(error) over the sizes, in units of the points' scatter about the fit", "ratio"
        ),
        "min_sizes": Param(3, "distinct sizes needed to fit a growth", "sizes"),
        **_numerics.METRIC_PARAMS,
    },
    example=Example(("numerics_tf32.csv",)),
)
def check(con, params, ctx):
    ok = _numerics.metric_filter(params)
    growth = [g for g in rows(con, GROWTH_SQL) if ok(g.metric)]
    for run_id in _numerics.runs_with_numerics(con):
        groups = [g for g in growth if g.run_id == run_id and g.sizes >= params["min_sizes"] and g.growth is not None]
        if groups:
            yield _finding(con, ctx.run(run_id), params, groups)


def _scatter(g) -> float:
    """Standard deviation of log(error) about the fitted power law."""
    # an infinite error (an overflow the check measured) leaves the fit without an intercept
    if g.exponent is None or g.intercept is None or len(g.errors) < 3:
        return 0.0
    residuals = [math.log(e) - (g.intercept + g.exponent * math.log(n)) for n, e in zip(g.seq_lens, g.errors)
                 if 0 < e < math.inf]  # fmt: skip
    return math.sqrt(sum(r * r for r in residuals) / max(1, len(residuals) - 2))


def _grows(g, params) -> bool:
    """The error grows: min_growth from the smallest to the largest size, and a fitted rise well
    above the points' own scatter (a flat error with noise does not grow)."""
    if g.growth < params["min_growth"] or not g.exponent or g.exponent <= 0:
        return False
    rise = g.exponent * math.log(g.max_size / g.min_size)
    return rise >= params["min_trend_to_scatter"] * _scatter(g)


def _combination(g) -> tuple:
    return tuple(getattr(g, k) for k in GROUP_COLS)


def _drivers(failing: list, passing: list) -> dict:
    """Conditions whose values among failing combinations never occur among passing ones."""
    if not passing:
        return {}
    out = {}
    keys = {k for g in failing for k in _numerics.conditions(g)}
    for key in sorted(keys):
        bad = {json.dumps(_numerics.conditions(g).get(key)) for g in failing}
        good = {json.dumps(_numerics.conditions(g).get(key)) for g in passing}
        if not bad & good:
            out[key] = sorted(json.loads(v) for v in bad) if len(bad) > 1 else json.loads(next(iter(bad)))
    return out


def _finding(con, run, params, groups) -> Finding:
    tol = params["tolerance"]
    size = _numerics.size_column(con, run.run_id)
    failing = [g for g in groups if g.judged_max_size > tol and _grows(g, params)]
    if failing:
        rep = min(failing, key=lambda g: (_numerics.preference(g.metric), -g.judged_max_size, g.metric))
    else:
        rep = min(groups, key=lambda g: (_numerics.preference(g.metric), -g.judged_max_size / tol, g.metric))
    conds = _numerics.conditions(rep)
    summary = (
        f"{rep.metric} {rep.err_min_size:.3g} at {size} {rep.min_size} -> {rep.err_max_size:.3g} at "
        f"{rep.max_size} ({rep.growth:.1f}x, fitted exponent {rep.exponent:.2f}, R^2 {rep.r2 or 0:.2f})"
    )
    judged = "error" if rep.scale_max_size is None or _numerics.relative(rep.metric) else "error / reference scale"
    agreement = _agreement(con, rep)
    details = {
        "conditions": conds,
        "size_column": size,
        "seq_lens": rep.seq_lens,
        "errors": rep.errors,
        "report_rows": rep.row_indexes,
        "exponent": rep.exponent,
        "growth": rep.growth,
        "partition_agreement": agreement,
    }
    common = {
        "locality": locality(run, launch={"metric": rep.metric, "conditions": conds}),
        "observed": Quantity(rep.judged_max_size, judged, f"{rep.metric} at the largest {size} ({rep.max_size})"),
        "expected": Quantity(tol, judged, "tolerance at the largest size"),
        "impact_ns": 0,
        "window_ns": 0,
        "sql": GROWTH_EVIDENCE_SQL,
        "sql_params": {"run_id": rep.run_id, "metric": rep.metric, **{k: getattr(rep, k) for k in GROUP_COLS}},
    }
    if not failing:
        return _not_significant(rep, tol, len(groups), size, summary, details, common)
    # drivers compare combinations of one metric: another metric's tolerance says nothing about them
    same_metric = [g for g in groups if g.metric == rep.metric]
    failing_combos = [g for g in failing if g.metric == rep.metric]
    bad = {_combination(g) for g in failing_combos}
    drivers = _drivers(failing_combos, [g for g in same_metric if _combination(g) not in bad])
    tf32_driven = _numerics.is_tf32(drivers.get("precision", conds.get("precision")))
    growing = sorted({g.metric for g in failing})
    steady = sorted(
        {g.metric for g in groups if _combination(g) in bad and not _grows(g, params)}
        - {g.metric for g in groups if _combination(g) in bad and _grows(g, params)}
    )
    return Finding(
        rule="N001",
        severity="warning",
        confidence=min(0.95, 0.5 + 0.45 * (rep.r2 or 0)),
        title=(
            f"numerics: error grows with {size} ({summary}), above {tol:g}; "
            + (f"driven by {_fmt(drivers)}" if drivers else "under every combination of conditions")
        ),
        hypothesis=(
            f"{len(bad)} of {len(same_metric)} condition combinations of {rep.metric} fail ({len(failing)} metric "
            f"fits over {', '.join(growing)}"
            + (f"; {', '.join(steady)} stay flat under the same conditions" if steady else "")
            + "); the error compounds along the sequence (a state or scan carried across chunks/partitions)"
            + (
                "; the failing rows use TF32 tensor-core dots on fp32 operands and the passing ones do not, so "
                "rounding of the carried state at 10 mantissa bits is the likely cause"
                if tf32_driven
                else ""
            )
            + (f"; {_agreement_text(agreement)}" if agreement else "")
            + "."
        ),
        next_experiment=(
            (_numerics.NEXT_PRECISION + "; re-run the same report.")
            if tf32_driven or conds.get("precision") is None
            else f"Re-run the failing conditions ({_fmt(conds)}) against an fp64 reference run, with "
            '`input_precision="ieee"`, to separate rounding from an algorithmic error; then '
            + _numerics.NEXT_PRECISION
            + "."
        ),
        acceptance=rerun("report", f"judged_max_size below {tol:g}, or growth below {params['min_growth']:g}x."),
        caveats=[] if (rep.r2 or 0) >= 0.8 else ["log-log fit is loose (R^2 < 0.8): the exponent is indicative"],
        extra={
            **details,
            "drivers": drivers,
            "growing_metrics": growing,
            "steady_metrics": steady,
            "failing_rows": sorted({i for g in failing for i in g.row_indexes}),
            "failing_combinations": [
                {
                    "metric": g.metric,
                    "conditions": _numerics.conditions(g),
                    "err_max_size": g.err_max_size,
                    "growth": g.growth,
                }
                for g in failing
            ],
        },
        **common,
    )


def _agreement(con, rep) -> dict | None:
    """Partitioned vs unpartitioned checks of the representative metric, when the report has both."""
    row = rows(con, AGREEMENT_SQL, {"run_id": rep.run_id, "metric": rep.metric})[0]
    if not row.pairs:
        return None
    return {
        "metric": rep.metric,
        "pairs": row.pairs,
        "partitions": row.partitions,
        "ratio_min": row.ratio_min,
        "ratio_max": row.ratio_max,
    }


def _agreement_text(a: dict) -> str:
    return (
        f"partitioned runs ({', '.join(str(p) for p in a['partitions'])} parts) agree with the unpartitioned ones "
        f"within {a['ratio_min']:.2f}-{a['ratio_max']:.2f}x on {a['metric']} ({a['pairs']} pairs)"
        + (", so the partition merge adds no error of its own" if a["ratio_max"] < 2 else "")
    )


def _not_significant(rep, tol, combinations, size, summary, details, common) -> Finding:
    reach = None
    if rep.exponent and rep.exponent > 0 and rep.judged_max_size > 0:
        # where the fitted power law crosses the tolerance: the margin, in sequence length
        reach = rep.max_size * (tol / rep.judged_max_size) ** (1 / rep.exponent)
    agreement = details["partition_agreement"]
    return Finding(
        rule="N001",
        severity="info",
        confidence=0.8,
        title=f"numerics: error growth with {size} not significant ({summary}; below the {tol:g} tolerance)",
        hypothesis=(
            f"in all {combinations} metric/condition combinations the error stays below {tol:g} at every size "
            "or does not grow beyond its own scatter; any growth is rounding at the precision used"
            + (f"; the fitted power law reaches it near {size} {reach:.3g}" if reach else "")
            + (f"; {_agreement_text(agreement)}" if agreement else "")
        ),
        next_experiment="None needed; to see the margin, extend the report to longer sequences.",
        acceptance=f"Re-run the evidence SQL on a new report: judged_max_size stays below {tol:g}.",
        extra={**details, "verdict": "not significant", "seq_len_at_tolerance": reach},
        **common,
    )


def _fmt(conds: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in conds.items()) or "all conditions"
