"""fp32 checks whose error carries the rounding of TF32 tensor cores (N002 tf32-signature).

## What it does
Reads correctness reports (the `numerics` table) and compares each fp32 check run under a TF32
precision (`tf32`, Triton's `default`, torch's `high`) with the same check (same metric, dtype,
variant, partitions, size and other conditions) under a precision that keeps fp32 accuracy
(`tf32x3`, `ieee`, `highest`, or an fp32 reference with TF32 off such as `torch_fp32`). It reports
the TF32 signature: errors at least `tf32_gain` times smaller without TF32, on any error metric
(the gain is a ratio, so absolute and relative metrics count alike), whether or not the error
grows with the size (that is N001 numerics-drift's question). A relative error under TF32 must also
reach `tf32_low`: TF32 keeps 10 mantissa bits (unit roundoff ~4.9e-4), so below 1e-4 a large gain
is between two fp32-level errors. The finding names the smallest size that shows it, the metrics
and pairs that do, and the precision switch.

## Why it matters
`tl.dot` on fp32 operands uses TF32 tensor cores by default on NVIDIA sm80+ (Triton's
`input_precision="tf32"`, and PyTorch matmuls when `allow_tf32` is on): an fp32 kernel then
computes at 10 mantissa bits without anyone asking for it. An error that vanishes under `tf32x3`
is rounding, not a bug in the algorithm, and the switch that removes it is known; without that
contrast the same number reads as "fp32 is not accurate enough".

## Example
The project's Triton chunked recurrence on an H200 (`sample_traces/numerics_tf32.csv`): at 256
tokens the `tf32` mean relative error of the outputs (5.1e-3) is 2700x the `tf32x3` one.

## Checked on
Real H200 reports of the project's Triton recurrence (tests/data/numerics_matrix, made by
scripts/make_numerics_matrix.py): lengths 1k-64k named `T`, `seqlen`, `num_tokens` or `context_len`;
normal, uniform and heavy-tailed inputs; tf32 / tf32x3 / ieee and a torch fp32 reference with TF32
off; 1 and 4 partitions; relative Frobenius, max abs and mean abs errors of the outputs and the
state. Every report with tf32 rows shows the signature (gains of 1e3-1e4 over tf32x3/ieee at every
length); the report without tf32 rows gives nothing (tests/test_numerics_matrix.py).

## Options
- `metrics` (""): comma-separated error metrics to read; empty reads all but `skip_metrics`.
- `skip_metrics` ("max_rel_err"): comma-separated error metrics to ignore.
- `tf32_low` (1e-4): smallest relative error under TF32 that can be TF32 rounding.
- `tf32_gain` (100.0): how much smaller the error must be without TF32. Over the matrix the gains
  are 1.3e3 (max abs, heavy-tailed inputs) to 1.1e4; two fp32-accurate precisions differ by at
  most 25x (tf32x3 over torch fp32), so 100 separates them with room on both sides.
"""

from __future__ import annotations

from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _numerics

# fp32 rows under TF32 (t) next to the same check at fp32 accuracy (a).
PAIRS = f"""
FROM numerics t JOIN numerics a
  ON a.run_id = t.run_id AND a.metric = t.metric AND a.other_conditions = t.other_conditions
 AND a.dtype IS NOT DISTINCT FROM t.dtype AND a.variant IS NOT DISTINCT FROM t.variant
 AND a.partitions IS NOT DISTINCT FROM t.partitions AND a.seq_len IS NOT DISTINCT FROM t.seq_len
 AND {_numerics.is_exact_sql("a.precision")}
WHERE {_numerics.is_tf32_sql("t.precision")} AND (t.dtype IS NULL OR t.dtype IN {_numerics.FP32_NAMES})
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
    title="fp32 check whose error is TF32 rounding: 100x or more smaller without TF32 at equal conditions",
    category="numerics",
    requires=("numerics",),
    params={
        **_numerics.METRIC_PARAMS,
        "tf32_low": Param(1e-4, "smallest relative error under TF32 that can be TF32 rounding", "relative error"),
        "tf32_gain": Param(100.0, "how much smaller the error must be without TF32", "ratio"),
    },
    example=Example(("numerics_tf32.csv",)),
)
def check(con, params, ctx):
    ok = _numerics.metric_filter(params)
    pairs = [p for p in rows(con, TF32_SQL) if ok(p.metric)]
    for run_id in _numerics.runs_with_numerics(con):
        mine = [p for p in pairs if p.run_id == run_id]
        hits = [p for p in mine if _signature(p, params)]
        if hits:
            yield _finding(ctx.run(run_id), params, mine, hits, _numerics.size_column(con, run_id))


def _signature(p, params) -> bool:
    above_fp32 = p.err_tf32 >= params["tf32_low"] or not _numerics.relative(p.metric)
    return above_fp32 and p.gain is not None and p.gain >= params["tf32_gain"]


def _finding(run, params, pairs, hits, size) -> Finding:
    rep = min(hits, key=lambda p: (_numerics.preference(p.metric), p.seq_len or 0, p.row_index, p.metric))
    same_metric = [p for p in pairs if p.metric == rep.metric]
    hits_of_metric = [p for p in hits if p.metric == rep.metric]
    metrics = sorted({p.metric for p in hits})
    every_size = {p.seq_len for p in hits_of_metric} == {p.seq_len for p in same_metric}
    return Finding(
        rule="N002",
        severity="warning",
        confidence=min(0.95, 0.6 + 0.35 * len(hits_of_metric) / len(same_metric)),
        title=(
            f"numerics: TF32 signature on fp32 inputs ({rep.metric} {rep.err_tf32:.2g} under {rep.precision}, "
            f"{rep.gain:.0f}x smaller under {rep.exact_precision} at {size} {rep.seq_len})"
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
            f"{len(hits)} of {len(pairs)} (fp32 check under TF32, metric) pairs are >= {params['tf32_gain']:g}x worse "
            f"than the same check without TF32 (gains {min(p.gain for p in hits):.3g}-{max(p.gain for p in hits):.3g}, "
            f"on {', '.join(metrics)}; at every {size} tested: {'yes' if every_size else 'no'}): the dots round "
            "fp32 operands to TF32 (10 mantissa bits, unit roundoff 4.9e-4)."
        ),
        next_experiment=_numerics.NEXT_PRECISION[0].upper() + _numerics.NEXT_PRECISION[1:] + "; re-run the report.",
        acceptance=(
            "Re-run the report with the precision changed: N002 reports no TF32 signature, and N001 "
            "numerics-drift's evidence SQL gives an error at the largest size below its tolerance."
        ),
        extra={
            "signature_rows": sorted({p.row_index for p in hits}),
            "gains": sorted({round(p.gain, 1) for p in hits_of_metric}),
            "metrics": metrics,
            "size_column": size,
        },
    )
