"""Numerical error that drifts with size, precision or variant (N001 numerics-drift).

## What it does
Reads correctness reports (the `numerics` table: one row per check and error metric, with its
conditions) and reports three signatures, each on the error metrics of the report (columns whose
name contains `err`; `max_rel_err` is skipped by default, since elements where the reference is
near zero dominate it):

- **growth with size**: per metric and per combination of the other conditions (precision,
  dtype, variant, partitions, the rest), a least-squares fit of log(error) against log(seq_len).
  It flags the combinations whose error at the largest size exceeds `tolerance` and grew at least
  `min_growth`-fold from the smallest size, reports the fitted exponent, the conditions that
  separate the failing combinations from the passing ones (the drivers) and the failing rows.
  When errors grow but stay below the tolerance it reports an info finding, "not significant",
  with the numbers.
- **a variant that diverges from its reference path**: at equal conditions and size, the error of
  a variant (e.g. `partitioned`) over that of `reference_variant` (e.g. `unpartitioned`); without a
  variant column, partitions > 1 against partitions = 1.
- **the TF32 signature**: fp32 inputs whose relative error under the default / `tf32` precision
  lies between `tf32_low` and `tf32_high` (TF32 keeps 10 mantissa bits: unit roundoff ~4.9e-4,
  errors near 1e-3) and that is at least `tf32_gain` times smaller under `tf32x3` or `ieee` at
  the same conditions.

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
driven by `precision=tf32`. At 256 tokens the `tf32` mean relative error (5.1e-3) is 2700x the
`tf32x3` one: the TF32 signature. Partitioned (4 parts) and unpartitioned runs agree within
0.86-1.11x: no variant divergence. On the `tf32x3` rows alone the rule only says "not
significant", and that the fitted power law would reach the tolerance near 32k tokens.

## Options
- `tolerance` (1e-4): largest acceptable error at the largest size (the metric's own unit;
  relative for `*_rel_err` and `*_ratio`).
- `min_growth` (4.0): error at the largest size over the error at the smallest size.
- `min_sizes` (3): distinct sizes needed to fit a growth.
- `metrics` (""): comma-separated error metrics to read; empty reads all but `skip_metrics`.
- `skip_metrics` ("max_rel_err"): comma-separated error metrics to ignore.
- `reference_variant` ("unpartitioned"): the variant other variants are compared with.
- `variant_ratio` (4.0): error of a variant over its reference that counts as divergence.
- `tf32_low` (1e-4): lower bound of the TF32 band of relative errors.
- `tf32_high` (1e-2): upper bound of the TF32 band of relative errors.
- `tf32_gain` (10.0): how much smaller the error must be under tf32x3 or ieee.
"""

from __future__ import annotations

import json

from tracekit.engine.registry import Param, rule
from tracekit.findings.model import Finding, Quantity

TF32_NAMES = ("tf32", "default", "high")
EXACT_NAMES = ("tf32x3", "ieee", "highest")
FP32_NAMES = ("fp32", "float32", "torch.float32", "f32", "float")

GROUP_COLS = ("precision", "dtype", "variant", "partitions", "other_conditions")

# Per (run, metric, conditions other than the size): the error's trend over seq_len.
GROWTH_SQL = """
SELECT run_id, metric, precision, dtype, variant, partitions, other_conditions,
       count(DISTINCT seq_len) AS sizes, min(seq_len) AS min_size, max(seq_len) AS max_size,
       arg_min(value, seq_len) AS err_min_size, arg_max(value, seq_len) AS err_max_size,
       arg_max(value, seq_len) / arg_min(value, seq_len) AS growth,
       regr_slope(ln(value), ln(seq_len)) AS exponent, regr_r2(ln(value), ln(seq_len)) AS r2,
       list(row_index ORDER BY seq_len, row_index) AS row_indexes,
       list(seq_len ORDER BY seq_len, row_index) AS seq_lens,
       list(value ORDER BY seq_len, row_index) AS errors
FROM numerics
WHERE seq_len > 0 AND value > 0
GROUP BY run_id, metric, precision, dtype, variant, partitions, other_conditions
"""

GROWTH_EVIDENCE_SQL = (
    "SELECT err_max_size, err_min_size, growth, exponent, r2, min_size, max_size, row_indexes, seq_lens, errors\n"
    "FROM (" + GROWTH_SQL + ") g\n"
    "WHERE run_id = $run_id AND metric = $metric AND precision IS NOT DISTINCT FROM $precision\n"
    "  AND dtype IS NOT DISTINCT FROM $dtype AND variant IS NOT DISTINCT FROM $variant\n"
    "  AND partitions IS NOT DISTINCT FROM $partitions AND other_conditions = $other_conditions"
)

# Variant rows next to their reference path at equal conditions and size.
VARIANT_SQL = """
SELECT v.run_id, v.metric, v.precision, v.dtype, v.other_conditions, v.seq_len,
       v.variant, v.partitions, v.row_index, r.row_index AS reference_row,
       v.value / nullif(r.value, 0) AS ratio, v.value AS err_variant, r.value AS err_reference
FROM numerics v JOIN numerics r
  ON r.run_id = v.run_id AND r.metric = v.metric AND r.other_conditions = v.other_conditions
 AND r.precision IS NOT DISTINCT FROM v.precision AND r.dtype IS NOT DISTINCT FROM v.dtype
 AND r.seq_len IS NOT DISTINCT FROM v.seq_len
 AND ((r.variant = $reference_variant AND v.variant IS NOT NULL AND v.variant <> $reference_variant)
      OR (r.variant IS NULL AND v.variant IS NULL AND r.partitions = 1 AND v.partitions > 1))
"""

VARIANT_EVIDENCE_SQL = (
    "SELECT ratio, err_variant, err_reference, reference_row\nFROM (" + VARIANT_SQL + ") p\n"
    "WHERE run_id = $run_id AND metric = $metric AND row_index = $row_index"
)

# fp32 rows under TF32 next to the same check under tf32x3 / ieee.
TF32_SQL = (
    """
SELECT t.run_id, t.metric, t.row_index, t.seq_len, t.precision, t.dtype, t.variant, t.partitions,
       t.other_conditions, t.value AS err_tf32, min(a.value) AS err_exact,
       arg_min(a.precision, a.value) AS exact_precision, t.value / nullif(min(a.value), 0) AS gain
FROM numerics t JOIN numerics a
  ON a.run_id = t.run_id AND a.metric = t.metric AND a.other_conditions = t.other_conditions
 AND a.dtype IS NOT DISTINCT FROM t.dtype AND a.variant IS NOT DISTINCT FROM t.variant
 AND a.partitions IS NOT DISTINCT FROM t.partitions AND a.seq_len IS NOT DISTINCT FROM t.seq_len
 AND a.precision IN """
    + str(EXACT_NAMES)
    + """
WHERE t.precision IN """
    + str(TF32_NAMES)
    + " AND (t.dtype IS NULL OR t.dtype IN "
    + str(FP32_NAMES)
    + """)
GROUP BY t.run_id, t.metric, t.row_index, t.seq_len, t.precision, t.dtype, t.variant, t.partitions,
         t.other_conditions, t.value
"""
)

TF32_EVIDENCE_SQL = (
    "SELECT err_tf32, err_exact, exact_precision, gain, seq_len\nFROM (" + TF32_SQL + ") s\n"
    "WHERE run_id = $run_id AND metric = $metric AND row_index = $row_index"
)

NEXT_PRECISION = (
    'set `input_precision="tf32x3"` (or `"ieee"`) in the `tl.dot` calls on fp32 operands, or run with '
    "`TRITON_F32_DEFAULT=ieee` (no code change; it recompiles), or for PyTorch matmuls "
    "`torch.backends.cuda.matmul.allow_tf32 = False`; keep an fp64 reference run as the ground truth"
)


def _split(text: str) -> set[str]:
    return {t.strip() for t in str(text).split(",") if t.strip()}


def _metric_filter(params):
    wanted, skipped = _split(params["metrics"]), _split(params["skip_metrics"])

    def ok(metric: str) -> bool:
        return (metric in wanted) if wanted else metric not in skipped

    return ok


def _relative(metric: str) -> bool:
    m = metric.lower()
    return "rel" in m or "ratio" in m


def _preference(metric: str) -> tuple:
    """Relative metrics first (scale-free), then mean/rms before max (robust to single elements).
    Callers break the remaining ties by name: SQL rows come in no fixed order, and the representative
    (and with it the finding id) must not change between two runs."""
    m = metric.lower()
    return (0 if _relative(m) else 1, 0 if ("mean" in m or "rms" in m or "ratio" in m) else 1)


def _conditions(g: dict) -> dict:
    out = {k: g[k] for k in ("precision", "dtype", "variant", "partitions") if g.get(k) is not None}
    out.update(json.loads(g["other_conditions"] or "{}"))
    return out


def _fmt(conds: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in conds.items()) or "all conditions"


def _drivers(failing: list[dict], passing: list[dict]) -> dict:
    """Conditions whose values among failing combinations never occur among passing ones."""
    if not passing:
        return {}
    out = {}
    keys = {k for g in failing for k in _conditions(g)}
    for key in sorted(keys):
        bad = {json.dumps(_conditions(g).get(key)) for g in failing}
        good = {json.dumps(_conditions(g).get(key)) for g in passing}
        if not bad & good:
            out[key] = sorted(json.loads(v) for v in bad) if len(bad) > 1 else json.loads(next(iter(bad)))
    return out


def _fetch(con, sql, params=None):
    cur = con.execute(sql, params or {})
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


@rule(
    code="N001",
    name="numerics-drift",
    title="Numerical error that grows with size, diverges between variants, or carries the TF32 signature",
    category="numerics",
    requires=("numerics",),
    params={
        "tolerance": Param(1e-4, "largest acceptable error at the largest size", "error"),
        "min_growth": Param(4.0, "error at the largest size over that at the smallest", "ratio"),
        "min_sizes": Param(3, "distinct sizes needed to fit a growth", "sizes"),
        "metrics": Param("", "comma-separated error metrics to read (empty: all but skip_metrics)", ""),
        "skip_metrics": Param("max_rel_err", "comma-separated error metrics to ignore", ""),
        "reference_variant": Param("unpartitioned", "the variant other variants are compared with", ""),
        "variant_ratio": Param(4.0, "error of a variant over its reference that counts as divergence", "ratio"),
        "tf32_low": Param(1e-4, "lower bound of the TF32 band of relative errors", "relative error"),
        "tf32_high": Param(1e-2, "upper bound of the TF32 band of relative errors", "relative error"),
        "tf32_gain": Param(10.0, "how much smaller the error must be under tf32x3 or ieee", "ratio"),
    },
)
def check(con, params, ctx):
    ok = _metric_filter(params)
    runs = [r[0] for r in con.execute("SELECT DISTINCT run_id FROM numerics ORDER BY 1").fetchall()]
    growth = [g for g in _fetch(con, GROWTH_SQL + " ORDER BY run_id, metric") if ok(g["metric"])]
    variants = [
        p for p in _fetch(con, VARIANT_SQL, {"reference_variant": params["reference_variant"]}) if ok(p["metric"])
    ]
    tf32 = [s for s in _fetch(con, TF32_SQL) if ok(s["metric"]) and _relative(s["metric"])]
    for run_id in runs:
        run = ctx.run(run_id)
        yield from _growth(run, params, [g for g in growth if g["run_id"] == run_id])
        yield from _variants(run, params, [p for p in variants if p["run_id"] == run_id])
        yield from _tf32(run, params, [s for s in tf32 if s["run_id"] == run_id])


def _group_params(g: dict) -> dict:
    return {"run_id": g["run_id"], "metric": g["metric"], **{k: g[k] for k in GROUP_COLS}}


def _growth(run, params, groups):
    groups = [g for g in groups if g["sizes"] >= params["min_sizes"] and g["growth"] is not None]
    if not groups:
        return
    tol, min_growth = params["tolerance"], params["min_growth"]

    def fails(g):
        return g["err_max_size"] > tol and g["growth"] >= min_growth

    failing = [g for g in groups if fails(g)]
    ident = lambda g: tuple(g[k] for k in GROUP_COLS)  # noqa: E731
    bad_ids = {ident(g) for g in failing}
    failing_combos = list({ident(g): g for g in failing}.values())
    passing_combos = list({ident(g): g for g in groups if ident(g) not in bad_ids}.values())
    if failing:
        rep = min(failing, key=lambda g: (_preference(g["metric"]), -g["err_max_size"], g["metric"]))
    else:
        rep = min(groups, key=lambda g: (_preference(g["metric"]), -g["err_max_size"] / tol, g["metric"]))
    conds = _conditions(rep)
    summary = (
        f"{rep['metric']} {rep['err_min_size']:.3g} at seq_len {rep['min_size']} -> {rep['err_max_size']:.3g} at "
        f"{rep['max_size']} ({rep['growth']:.1f}x, fitted exponent {rep['exponent']:.2f}, R^2 {rep['r2'] or 0:.2f})"
    )
    details = {
        "conditions": conds,
        "seq_lens": rep["seq_lens"],
        "errors": rep["errors"],
        "report_rows": rep["row_indexes"],
        "exponent": rep["exponent"],
        "growth": rep["growth"],
    }
    common = {
        "locality": {**run.locality(), "launch": {"metric": rep["metric"], "conditions": conds}},
        "observed": Quantity(
            rep["err_max_size"], "error", f"{rep['metric']} at the largest seq_len ({rep['max_size']})"
        ),
        "expected": Quantity(tol, "error", "tolerance at the largest size"),
        "impact_ns": 0,
        "window_ns": 0,
        "sql": GROWTH_EVIDENCE_SQL,
        "sql_params": _group_params(rep),
    }
    if not failing:
        reach = None
        if rep["exponent"] and rep["exponent"] > 0 and rep["err_max_size"] > 0:
            # where the fitted power law crosses the tolerance: the margin, in sequence length
            reach = rep["max_size"] * (tol / rep["err_max_size"]) ** (1 / rep["exponent"])
        yield Finding(
            rule="N001",
            severity="info",
            confidence=0.8,
            title=f"numerics: error growth with seq_len not significant ({summary}; below the {tol:g} tolerance)",
            hypothesis=(
                f"the error stays below {tol:g} at every size in all {len(groups)} metric/condition combinations; "
                "any growth is rounding at the precision used"
                + (f"; the fitted power law reaches it near seq_len {reach:.3g}" if reach else "")
            ),
            next_experiment="None needed; to see the margin, extend the report to longer sequences.",
            acceptance=f"Re-run the evidence SQL on a new report: err_max_size stays below {tol:g}.",
            extra={**details, "verdict": "not significant", "seq_len_at_tolerance": reach},
            **common,
        )
        return
    drivers = _drivers(failing_combos, passing_combos)
    tf32_driven = str(drivers.get("precision", conds.get("precision", ""))).lower() in TF32_NAMES
    rows = sorted({i for g in failing for i in g["row_indexes"]})
    yield Finding(
        rule="N001",
        severity="warning",
        confidence=min(0.95, 0.5 + 0.45 * (rep["r2"] or 0)),
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
            (NEXT_PRECISION + "; re-run the same report.")
            if tf32_driven or conds.get("precision") is None
            else f"Re-run the failing conditions ({_fmt(conds)}) against an fp64 reference run, with "
            '`input_precision="ieee"`, to separate rounding from an algorithmic error; then ' + NEXT_PRECISION + "."
        ),
        acceptance=(
            f"Re-run the evidence SQL on the new report: err_max_size below {tol:g}, or growth below {min_growth:g}x."
        ),
        caveats=[] if (rep["r2"] or 0) >= 0.8 else ["log-log fit is loose (R^2 < 0.8): the exponent is indicative"],
        extra={
            **details,
            "drivers": drivers,
            "failing_rows": rows,
            "failing_combinations": [
                {
                    "metric": g["metric"],
                    "conditions": _conditions(g),
                    "err_max_size": g["err_max_size"],
                    "growth": g["growth"],
                }
                for g in failing
            ],
        },
        **common,
    )


def _variants(run, params, pairs):
    bad = [
        p
        for p in pairs
        if p["ratio"] is not None and p["ratio"] >= params["variant_ratio"] and p["err_variant"] > params["tolerance"]
    ]
    if not bad:
        return
    rep = min(bad, key=lambda p: (_preference(p["metric"]), -p["ratio"], p["metric"], p["row_index"]))
    conds = {k: rep[k] for k in ("precision", "dtype", "variant", "partitions", "seq_len") if rep.get(k) is not None}
    conds.update(json.loads(rep["other_conditions"] or "{}"))
    yield Finding(
        rule="N001",
        severity="warning",
        confidence=0.8,
        title=(
            f"numerics: variant {rep['variant'] or 'partitions=' + str(rep['partitions'])} diverges from its reference "
            f"({rep['metric']} {rep['err_variant']:.3g} vs {rep['err_reference']:.3g}, {rep['ratio']:.1f}x at "
            f"seq_len {rep['seq_len']})"
        ),
        locality={**run.locality(), "launch": {"metric": rep["metric"], "conditions": conds}},
        observed=Quantity(rep["ratio"], "ratio", f"{rep['metric']} of the variant over its reference path"),
        expected=Quantity(1.0, "ratio", "the same error as the reference path at equal conditions"),
        impact_ns=0,
        window_ns=0,
        sql=VARIANT_EVIDENCE_SQL,
        sql_params={
            "run_id": rep["run_id"],
            "metric": rep["metric"],
            "row_index": rep["row_index"],
            "reference_variant": params["reference_variant"],
        },
        hypothesis=(
            f"{len(bad)} of {len(pairs)} variant/reference pairs diverge by >= {params['variant_ratio']:g}x: "
            "the variant adds error of its own (e.g. a merge of partition states at low precision)."
        ),
        next_experiment=(
            "Run the variant's extra steps (the state merge / affine-chain products) at higher precision: "
            + NEXT_PRECISION
            + "."
        ),
        acceptance=f"Re-run the evidence SQL on the new report: ratio below {params['variant_ratio']:g}.",
        extra={"failing_rows": sorted({p["row_index"] for p in bad}), "reference_row": rep["reference_row"]},
    )


def _tf32(run, params, pairs):
    hits = [
        p
        for p in pairs
        if params["tf32_low"] <= p["err_tf32"] <= params["tf32_high"]
        and p["gain"] is not None
        and p["gain"] >= params["tf32_gain"]
    ]
    if not hits:
        return
    rep = min(hits, key=lambda p: (_preference(p["metric"]), p["seq_len"] or 0, p["row_index"], p["metric"]))
    conds = {k: rep[k] for k in ("precision", "dtype", "variant", "partitions") if rep.get(k) is not None}
    conds.update(json.loads(rep["other_conditions"] or "{}"))
    same_metric = [p for p in pairs if p["metric"] == rep["metric"]]
    yield Finding(
        rule="N001",
        severity="warning",
        confidence=min(0.95, 0.6 + 0.35 * len([p for p in hits if p["metric"] == rep["metric"]]) / len(same_metric)),
        title=(
            f"numerics: TF32 signature on fp32 inputs ({rep['metric']} {rep['err_tf32']:.2g} under "
            f"{rep['precision']}, {rep['gain']:.0f}x smaller under {rep['exact_precision']} at seq_len {rep['seq_len']})"
        ),
        locality={**run.locality(), "launch": {"metric": rep["metric"], "conditions": conds, "signature": "tf32"}},
        observed=Quantity(rep["err_tf32"], "relative error", f"{rep['metric']} under {rep['precision']}"),
        expected=Quantity(
            rep["err_exact"], "relative error", f"{rep['metric']} under {rep['exact_precision']} at equal conditions"
        ),
        impact_ns=0,
        window_ns=0,
        sql=TF32_EVIDENCE_SQL,
        sql_params={"run_id": rep["run_id"], "metric": rep["metric"], "row_index": rep["row_index"]},
        hypothesis=(
            f"relative error in the TF32 band [{params['tf32_low']:g}, {params['tf32_high']:g}] (TF32 keeps 10 "
            f"mantissa bits, unit roundoff 4.9e-4) in {len(hits)} of {len(pairs)} (fp32 check, relative metric) pairs, and >= "
            f"{params['tf32_gain']:g}x smaller with tf32x3/ieee: the dots round fp32 operands to TF32."
        ),
        next_experiment=NEXT_PRECISION[0].upper() + NEXT_PRECISION[1:] + "; re-run the report.",
        acceptance=(
            "Re-run the report with the precision changed and the growth evidence SQL of this rule on it: "
            f"error at the largest size below {params['tolerance']:g}; N001 reports no TF32 signature."
        ),
        extra={
            "signature_rows": sorted({p["row_index"] for p in hits}),
            "gains": sorted({round(p["gain"], 1) for p in hits if p["metric"] == rep["metric"]}),
        },
    )
