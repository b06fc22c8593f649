"""Numerical error that grows with the problem size (N001 numerics-drift).

## What it does
Reads correctness reports (the `numerics` table: one row per check and error metric, with its
conditions) and, per error metric (columns whose name contains `err`; `max_rel_err` is skipped by
default, since elements where the reference is near zero dominate it) and per combination of the
other conditions (precision, dtype, variant, partitions, the rest), fits log(error) against
log(seq_len) by least squares. It flags the combinations whose error at the largest size exceeds
`tolerance` and grew at least `min_growth`-fold from the smallest size, and reports the fitted
exponent, the conditions that separate the failing combinations from the passing ones (the
drivers) and the failing rows. When errors grow but stay below the tolerance it reports an info
finding, "not significant", with the numbers.

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

## Options
- `tolerance` (1e-4): largest acceptable error at the largest size (the metric's own unit;
  relative for `*_rel_err` and `*_ratio`).
- `min_growth` (4.0): error at the largest size over the error at the smallest size.
- `min_sizes` (3): distinct sizes needed to fit a growth.
- `metrics` (""): comma-separated error metrics to read; empty reads all but `skip_metrics`.
- `skip_metrics` ("max_rel_err"): comma-separated error metrics to ignore.
"""

from __future__ import annotations

import json

from tracekit.engine.phrases import rerun
from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _numerics

GROUP_COLS = ("precision", "dtype", "variant", "partitions", "other_conditions")

TREND_COLUMNS = """
       count(DISTINCT seq_len) AS sizes, min(seq_len) AS min_size, max(seq_len) AS max_size,
       arg_min(value, seq_len) AS err_min_size, arg_max(value, seq_len) AS err_max_size,
       arg_max(value, seq_len) / arg_min(value, seq_len) AS growth,
       regr_slope(ln(value), ln(seq_len)) AS exponent, regr_r2(ln(value), ln(seq_len)) AS r2,
       list(row_index ORDER BY seq_len, row_index) AS row_indexes,
       list(seq_len ORDER BY seq_len, row_index) AS seq_lens,
       list(value ORDER BY seq_len, row_index) AS errors
"""

# Per (run, metric, conditions other than the size): the error's trend over seq_len.
GROWTH_SQL = f"""
SELECT run_id, metric, precision, dtype, variant, partitions, other_conditions, {TREND_COLUMNS}
FROM numerics
WHERE seq_len > 0 AND value > 0
GROUP BY run_id, metric, precision, dtype, variant, partitions, other_conditions
ORDER BY run_id, metric, precision, dtype, variant, partitions, other_conditions
"""

# The evidence query: one combination's trend (err_max_size, the first column, = observed).
GROWTH_EVIDENCE_SQL = f"""
SELECT err_max_size, err_min_size, growth, exponent, r2, min_size, max_size, row_indexes, seq_lens, errors
FROM (SELECT {TREND_COLUMNS} FROM numerics
      WHERE seq_len > 0 AND value > 0 AND run_id = $run_id AND metric = $metric
        AND precision IS NOT DISTINCT FROM $precision AND dtype IS NOT DISTINCT FROM $dtype
        AND variant IS NOT DISTINCT FROM $variant AND partitions IS NOT DISTINCT FROM $partitions
        AND other_conditions = $other_conditions)
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
            yield _finding(ctx.run(run_id), params, groups)


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


def _finding(run, params, groups) -> Finding:
    tol, min_growth = params["tolerance"], params["min_growth"]
    failing = [g for g in groups if g.err_max_size > tol and g.growth >= min_growth]
    if failing:
        rep = min(failing, key=lambda g: (_numerics.preference(g.metric), -g.err_max_size, g.metric))
    else:
        rep = min(groups, key=lambda g: (_numerics.preference(g.metric), -g.err_max_size / tol, g.metric))
    conds = _numerics.conditions(rep)
    summary = (
        f"{rep.metric} {rep.err_min_size:.3g} at seq_len {rep.min_size} -> {rep.err_max_size:.3g} at "
        f"{rep.max_size} ({rep.growth:.1f}x, fitted exponent {rep.exponent:.2f}, R^2 {rep.r2 or 0:.2f})"
    )
    details = {
        "conditions": conds,
        "seq_lens": rep.seq_lens,
        "errors": rep.errors,
        "report_rows": rep.row_indexes,
        "exponent": rep.exponent,
        "growth": rep.growth,
    }
    common = {
        "locality": locality(run, launch={"metric": rep.metric, "conditions": conds}),
        "observed": Quantity(rep.err_max_size, "error", f"{rep.metric} at the largest seq_len ({rep.max_size})"),
        "expected": Quantity(tol, "error", "tolerance at the largest size"),
        "impact_ns": 0,
        "window_ns": 0,
        "sql": GROWTH_EVIDENCE_SQL,
        "sql_params": {"run_id": rep.run_id, "metric": rep.metric, **{k: getattr(rep, k) for k in GROUP_COLS}},
    }
    if not failing:
        return _not_significant(rep, tol, len(groups), summary, details, common)
    failing_combos = list({_combination(g): g for g in failing}.values())
    bad = {_combination(g) for g in failing}
    passing_combos = list({_combination(g): g for g in groups if _combination(g) not in bad}.values())
    drivers = _drivers(failing_combos, passing_combos)
    tf32_driven = str(drivers.get("precision", conds.get("precision", ""))).lower() in _numerics.TF32_NAMES
    return Finding(
        rule="N001",
        severity="warning",
        confidence=min(0.95, 0.5 + 0.45 * (rep.r2 or 0)),
        title=(
            f"numerics: error grows with seq_len ({summary}), above {tol:g}; "
            + (f"driven by {_fmt(drivers)}" if drivers else "under every combination of conditions")
        ),
        hypothesis=(
            f"{len(failing_combos)} of {len(failing_combos) + len(passing_combos)} condition combinations fail "
            f"({len(failing)} metric fits); the error compounds along the sequence (a state or scan carried across "
            "chunks/partitions)"
            + (
                "; the failing rows use TF32 tensor-core dots on fp32 operands and the passing ones do not, so "
                "rounding of the carried state at 10 mantissa bits is the likely cause"
                if tf32_driven
                else ""
            )
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
        acceptance=rerun("report", f"err_max_size below {tol:g}, or growth below {min_growth:g}x."),
        caveats=[] if (rep.r2 or 0) >= 0.8 else ["log-log fit is loose (R^2 < 0.8): the exponent is indicative"],
        extra={
            **details,
            "drivers": drivers,
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


def _not_significant(rep, tol, combinations, summary, details, common) -> Finding:
    reach = None
    if rep.exponent and rep.exponent > 0 and rep.err_max_size > 0:
        # where the fitted power law crosses the tolerance: the margin, in sequence length
        reach = rep.max_size * (tol / rep.err_max_size) ** (1 / rep.exponent)
    return Finding(
        rule="N001",
        severity="info",
        confidence=0.8,
        title=f"numerics: error growth with seq_len not significant ({summary}; below the {tol:g} tolerance)",
        hypothesis=(
            f"the error stays below {tol:g} at every size in all {combinations} metric/condition combinations; "
            "any growth is rounding at the precision used"
            + (f"; the fitted power law reaches it near seq_len {reach:.3g}" if reach else "")
        ),
        next_experiment="None needed; to see the margin, extend the report to longer sequences.",
        acceptance=f"Re-run the evidence SQL on a new report: err_max_size stays below {tol:g}.",
        extra={**details, "verdict": "not significant", "seq_len_at_tolerance": reach},
        **common,
    )


def _fmt(conds: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in conds.items()) or "all conditions"
