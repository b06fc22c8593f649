"""A variant of a computation that adds error its reference path does not have (N003 variant-divergence).

## What it does
Reads correctness reports (the `numerics` table) and pairs every check of a variant (e.g.
`partitioned`) with the check of `reference_variant` (e.g. `unpartitioned`) at equal conditions
(metric, precision, dtype, size and the rest); without a variant column, partitions > 1 are paired
with partitions = 1. A pair diverges when the variant's error is at least `variant_ratio` times its
reference's and above `tolerance`. The finding names the pair with the largest ratio (relative
metrics first) and every failing row.

## Why it matters
A variant that splits the work (context-parallel partitions, a different chunking, a fused path)
should give the same error as the path it replaces. When it does not, the extra error comes from
the variant's own steps, typically a merge of partition states or a product of affine transitions
computed at lower precision, and it grows with the number of parts: tests that only run the
reference path never see it.

## Example
On the project's Triton chunked recurrence (`sample_traces/numerics_tf32.csv`) the partitioned
runs (4 context-parallel parts) agree with the unpartitioned ones within 0.86-1.11x under every
precision and length: no divergence at the default 4x. With `variant_ratio` at 1.1 and no
`tolerance` the rule shows the largest pair it compares, `max_abs_err` under `ieee` at 256 tokens.
A report whose partitioned error grows as seq_len / 4 times the unpartitioned one is reported at
1024x (tests/test_rule_variant_divergence.py).

## Checked on
Real H200 reports of the project's Triton recurrence (tests/data/numerics_matrix, made by
scripts/make_numerics_matrix.py) with 1 and 4 partitions (`cp` / `partitions`, no variant column),
tf32 / tf32x3 / ieee, three input distributions, 1k-64k tokens, output and state metrics: the
partitioned runs are within 0.80-1.00x of the unpartitioned ones and nothing is reported
(tests/test_numerics_matrix.py).

## Options
- `metrics` (""): comma-separated error metrics to read; empty reads all but `skip_metrics`.
- `skip_metrics` ("max_rel_err"): comma-separated error metrics to ignore.
- `reference_variant` ("unpartitioned"): the variant other variants are compared with.
- `variant_ratio` (4.0): error of a variant over its reference that counts as divergence.
- `tolerance` (1e-4): a variant's error must also exceed this to count (below it, any ratio is
  noise at the precision used).
"""

from __future__ import annotations

from tracekit.engine.registry import Example, Param, rule
from tracekit.engine.toolkit import locality, rows
from tracekit.findings.model import Finding, Quantity
from tracekit.rules import _numerics

# Variant rows (v) next to their reference path (r) at equal conditions and size.
PAIRS = """
FROM numerics v JOIN numerics r
  ON r.run_id = v.run_id AND r.metric = v.metric AND r.other_conditions = v.other_conditions
 AND r.precision IS NOT DISTINCT FROM v.precision AND r.dtype IS NOT DISTINCT FROM v.dtype
 AND r.seq_len IS NOT DISTINCT FROM v.seq_len
 AND ((r.variant = $reference_variant AND v.variant IS NOT NULL AND v.variant <> $reference_variant)
      OR (r.variant IS NULL AND v.variant IS NULL AND r.partitions = 1 AND v.partitions > 1))
"""
PAIR_COLUMNS = (
    "v.value / nullif(r.value, 0) AS ratio, v.value AS err_variant, r.value AS err_reference, "
    "r.row_index AS reference_row"
)

VARIANT_SQL = (
    "SELECT v.run_id, v.metric, v.precision, v.dtype, v.other_conditions, v.seq_len, v.variant, v.partitions, "
    f"v.row_index, {PAIR_COLUMNS}{PAIRS}"
)

# The evidence query: one variant row's pair (ratio, the first column, = observed).
EVIDENCE_SQL = (
    f"SELECT {PAIR_COLUMNS}{PAIRS}WHERE v.run_id = $run_id AND v.metric = $metric AND v.row_index = $row_index"
)


@rule(
    code="N003",
    name="variant-divergence",
    title="A variant's numerical error diverges from its reference path at equal conditions",
    category="numerics",
    requires=("numerics",),
    params={
        **_numerics.METRIC_PARAMS,
        "reference_variant": Param("unpartitioned", "the variant other variants are compared with", ""),
        "variant_ratio": Param(4.0, "error of a variant over its reference that counts as divergence", "ratio"),
        "tolerance": Param(1e-4, "a variant's error must exceed this to count", "error"),
    },
    example=Example(
        ("numerics_tf32.csv",),
        params={"variant_ratio": 1.1, "tolerance": 0.0},
        note="the bundled report's partitioned runs agree with the unpartitioned ones within 0.86-1.11x",
    ),
)
def check(con, params, ctx):
    ok = _numerics.metric_filter(params)
    pairs = [p for p in rows(con, VARIANT_SQL, {"reference_variant": params["reference_variant"]}) if ok(p.metric)]
    for run_id in _numerics.runs_with_numerics(con):
        mine = [p for p in pairs if p.run_id == run_id]
        bad = [p for p in mine if _diverges(p, params)]
        if bad:
            yield _finding(ctx.run(run_id), params, mine, bad)


def _diverges(p, params) -> bool:
    return p.ratio is not None and p.ratio >= params["variant_ratio"] and p.err_variant > params["tolerance"]


def _finding(run, params, pairs, bad) -> Finding:
    rep = min(bad, key=lambda p: (_numerics.preference(p.metric), -p.ratio, p.metric, p.row_index))
    conds = _numerics.conditions(rep, ("precision", "dtype", "variant", "partitions", "seq_len"))
    return Finding(
        rule="N003",
        severity="warning",
        confidence=0.8,
        title=(
            f"numerics: variant {rep.variant or 'partitions=' + str(rep.partitions)} diverges from its reference "
            f"({rep.metric} {rep.err_variant:.3g} vs {rep.err_reference:.3g}, {rep.ratio:.1f}x at seq_len {rep.seq_len})"
        ),
        locality=locality(run, launch={"metric": rep.metric, "conditions": conds}),
        observed=Quantity(rep.ratio, "ratio", f"{rep.metric} of the variant over its reference path"),
        expected=Quantity(1.0, "ratio", "the same error as the reference path at equal conditions"),
        impact_ns=0,
        window_ns=0,
        sql=EVIDENCE_SQL,
        sql_params={
            "run_id": rep.run_id,
            "metric": rep.metric,
            "row_index": rep.row_index,
            "reference_variant": params["reference_variant"],
        },
        hypothesis=(
            f"{len(bad)} of {len(pairs)} variant/reference pairs diverge by >= {params['variant_ratio']:g}x: "
            "the variant adds error of its own (e.g. a merge of partition states at low precision)."
        ),
        next_experiment=(
            "Run the variant's extra steps (the state merge / affine-chain products) at higher precision: "
            + _numerics.NEXT_PRECISION
            + "."
        ),
        acceptance=f"Re-run the evidence SQL on the new report: ratio below {params['variant_ratio']:g}.",
        extra={"failing_rows": sorted({p.row_index for p in bad}), "reference_row": rep.reference_row},
    )
