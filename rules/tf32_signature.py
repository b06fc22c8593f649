"""fp32 checks whose error carries the rounding of TF32 tensor cores (N002 tf32-signature).

## What it does
Reads correctness reports (the `numerics` table) and compares each fp32 check run under the
default / `tf32` precision with the same check (same metric, dtype, variant, partitions, size and
other conditions) under `tf32x3` or `ieee`. It reports the TF32 signature: relative errors (metrics
whose name contains `rel` or `ratio`) under TF32 between `tf32_low` and `tf32_high` (TF32 keeps 10
mantissa bits: unit roundoff ~4.9e-4, errors near 1e-3) that are at least `tf32_gain` times
smaller under `tf32x3` or `ieee`. The finding names the smallest size that shows it, the pairs that
do, and the precision switch.

## Why it matters
`tl.dot` on fp32 operands uses TF32 tensor cores by default on NVIDIA sm80+ (Triton's
`input_precision="tf32"`, and PyTorch matmuls when `allow_tf32` is on): an fp32 kernel then
computes at 10 mantissa bits without anyone asking for it. An error that lands in the TF32 band
and vanishes under `tf32x3` is rounding, not a bug in the algorithm, and the switch that removes
it is known; without that contrast the same number reads as "fp32 is not accurate enough".

## Example
The project's Triton chunked recurrence on an H200 (`sample_traces/numerics_tf32.csv`): at 256
tokens the `tf32` mean relative error of the outputs (5.1e-3) is 2700x the `tf32x3` one, and 6 of
the 16 (fp32 check, relative metric) pairs under TF32 sit in the band with a 10x or larger gain.

## Options
- `metrics` (""): comma-separated error metrics to read; empty reads all but `skip_metrics`.
- `skip_metrics` ("max_rel_err"): comma-separated error metrics to ignore.
- `tf32_low` (1e-4): lower bound of the TF32 band of relative errors.
- `tf32_high` (1e-2): upper bound of the TF32 band of relative errors.
- `tf32_gain` (10.0): how much smaller the error must be under tf32x3 or ieee.
"""

from __future__ import annotations

from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _numerics

# fp32 rows under TF32 (t) next to the same check under tf32x3 / ieee (a).
PAIRS = f"""
FROM numerics t JOIN numerics a
  ON a.run_id = t.run_id AND a.metric = t.metric AND a.other_conditions = t.other_conditions
 AND a.dtype IS NOT DISTINCT FROM t.dtype AND a.variant IS NOT DISTINCT FROM t.variant
 AND a.partitions IS NOT DISTINCT FROM t.partitions AND a.seq_len IS NOT DISTINCT FROM t.seq_len
 AND a.precision IN {_numerics.EXACT_NAMES}
WHERE t.precision IN {_numerics.TF32_NAMES} AND (t.dtype IS NULL OR t.dtype IN {_numerics.FP32_NAMES})
"""
PAIR_COLUMNS = (
    "t.value AS err_tf32, min(a.value) AS err_exact, arg_min(a.precision, a.value) AS exact_precision, "
    "t.value / nullif(min(a.value), 0) AS gain"
)
PAIR_KEY = (
    "t.run_id, t.metric, t.row_index, t.seq_len, t.precision, t.dtype, t.variant, t.partitions, t.other_conditions"
)

TF32_SQL = f"SELECT {PAIR_KEY}, {PAIR_COLUMNS}\n{PAIRS}GROUP BY {PAIR_KEY}, t.value"

# The evidence query: one check's pair (err_tf32, the first column, = observed).
EVIDENCE_SQL = (
    f"SELECT {PAIR_COLUMNS}, t.seq_len\n{PAIRS}"
    "  AND t.run_id = $run_id AND t.metric = $metric AND t.row_index = $row_index\nGROUP BY t.value, t.seq_len"
)


@rule(
    code="N002",
    name="tf32-signature",
    title="fp32 check whose error is TF32 rounding: in the TF32 band, far smaller under tf32x3/ieee",
    category="numerics",
    requires=("numerics",),
    params={
        **_numerics.METRIC_PARAMS,
        "tf32_low": Param(1e-4, "lower bound of the TF32 band of relative errors", "relative error"),
        "tf32_high": Param(1e-2, "upper bound of the TF32 band of relative errors", "relative error"),
        "tf32_gain": Param(10.0, "how much smaller the error must be under tf32x3 or ieee", "ratio"),
    },
    example=Example(("numerics_tf32.csv",)),
)
def check(con, params, ctx):
    ok = _numerics.metric_filter(params)
    pairs = [p for p in rows(con, TF32_SQL) if ok(p.metric) and _numerics.relative(p.metric)]
    for run_id in _numerics.runs_with_numerics(con):
        mine = [p for p in pairs if p.run_id == run_id]
        hits = [p for p in mine if _signature(p, params)]
        if hits:
            yield _finding(ctx.run(run_id), params, mine, hits)


def _signature(p, params) -> bool:
    in_band = params["tf32_low"] <= p.err_tf32 <= params["tf32_high"]
    return in_band and p.gain is not None and p.gain >= params["tf32_gain"]


def _finding(run, params, pairs, hits) -> Finding:
    rep = min(hits, key=lambda p: (_numerics.preference(p.metric), p.seq_len or 0, p.row_index, p.metric))
    same_metric = [p for p in pairs if p.metric == rep.metric]
    hits_of_metric = [p for p in hits if p.metric == rep.metric]
    return Finding(
        rule="N002",
        severity="warning",
        confidence=min(0.95, 0.6 + 0.35 * len(hits_of_metric) / len(same_metric)),
        title=(
            f"numerics: TF32 signature on fp32 inputs ({rep.metric} {rep.err_tf32:.2g} under {rep.precision}, "
            f"{rep.gain:.0f}x smaller under {rep.exact_precision} at seq_len {rep.seq_len})"
        ),
        locality=locality(run, launch={"metric": rep.metric, "conditions": _numerics.conditions(rep)}),
        observed=Quantity(rep.err_tf32, "relative error", f"{rep.metric} under {rep.precision}"),
        expected=Quantity(
            rep.err_exact, "relative error", f"{rep.metric} under {rep.exact_precision} at equal conditions"
        ),
        impact_ns=0,
        window_ns=0,
        sql=EVIDENCE_SQL,
        sql_params={"run_id": rep.run_id, "metric": rep.metric, "row_index": rep.row_index},
        hypothesis=(
            f"relative error in the TF32 band [{params['tf32_low']:g}, {params['tf32_high']:g}] (TF32 keeps 10 "
            f"mantissa bits, unit roundoff 4.9e-4) in {len(hits)} of {len(pairs)} (fp32 check, relative metric) "
            f"pairs, and >= {params['tf32_gain']:g}x smaller with tf32x3/ieee: the dots round fp32 operands to TF32."
        ),
        next_experiment=_numerics.NEXT_PRECISION[0].upper() + _numerics.NEXT_PRECISION[1:] + "; re-run the report.",
        acceptance=(
            "Re-run the report with the precision changed: N002 reports no TF32 signature, and N001 "
            "numerics-drift's evidence SQL gives an error at the largest size below its tolerance."
        ),
        extra={
            "signature_rows": sorted({p.row_index for p in hits}),
            "gains": sorted({round(p.gain, 1) for p in hits_of_metric}),
        },
    )
