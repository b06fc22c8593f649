"""What the numerics rules (N001 numerics-drift, N002 tf32-signature, N003 variant-divergence) share:
the error metrics they read, how a representative metric is chosen, a check's conditions, which
precisions round to TF32 and which do not, and the precision switch that tells rounding from a
real bug."""

from __future__ import annotations

import json
import re

from tracekit.engine.registry import Param
from tracekit.engine.toolkit import rows

TF32_NAMES = ("tf32", "default", "high")
FP32_NAMES = ("fp32", "float32", "torch.float32", "f32", "float")


def is_tf32_sql(column: str) -> str:
    """SQL: the precision rounds fp32 operands to TF32: `tf32` as a word of its own (`tf32`,
    `triton_tf32`, not `tf32x3`), or Triton's `default` / torch's `high`."""
    return f"({column} IN {TF32_NAMES} OR regexp_matches({column}, '(^|[^a-z0-9])tf32($|[^a-z0-9x])'))"


def is_tf32(precision) -> bool:
    """Python twin of `is_tf32_sql`."""
    p = str(precision or "").lower()
    return p in TF32_NAMES or re.search(r"(^|[^a-z0-9])tf32($|[^a-z0-9x])", p) is not None


def is_exact_sql(column: str) -> str:
    """SQL: the precision keeps fp32 accuracy: `tf32x3`, `ieee`, torch's `highest`, or a name that says
    fp32/fp64 without TF32 (`fp32`, `torch_fp32`: an fp32 reference with TF32 off)."""
    return (
        f"(NOT {is_tf32_sql(column)} AND "
        f"regexp_matches({column}, '(ieee|tf32x3|3xtf32|highest|fp32|float32|fp64|float64)'))"
    )


def size_column(con, run_id: int) -> str:
    """The report's own name of the size condition (numerics.seq_len), for titles."""
    row = con.execute(
        "SELECT json_extract_string(metadata, '$.typed_conditions.seq_len') FROM runs WHERE run_id = ?", [run_id]
    ).fetchone()
    return (row and row[0]) or "seq_len"


METRIC_PARAMS = {
    "metrics": Param("", "comma-separated error metrics to read (empty: all but skip_metrics)", ""),
    "skip_metrics": Param("max_rel_err", "comma-separated error metrics to ignore", ""),
}

NEXT_PRECISION = (
    'set `input_precision="tf32x3"` (or `"ieee"`) in the `tl.dot` calls on fp32 operands, or run with '
    "`TRITON_F32_DEFAULT=ieee` (no code change; it recompiles), or for PyTorch matmuls "
    "`torch.backends.cuda.matmul.allow_tf32 = False`; keep an fp64 reference run as the ground truth"
)


def _split(text: str) -> set[str]:
    return {t.strip() for t in str(text).split(",") if t.strip()}


def metric_filter(params):
    """Whether a metric is read: the ones `metrics` names, else all but `skip_metrics`."""
    wanted, skipped = _split(params["metrics"]), _split(params["skip_metrics"])

    def ok(metric: str) -> bool:
        return (metric in wanted) if wanted else metric not in skipped

    return ok


def relative(metric: str) -> bool:
    m = metric.lower()
    return "rel" in m or "ratio" in m


# SQL twin of `relative`, for queries that scale absolute errors by the reference's magnitude.
RELATIVE_SQL = "regexp_matches(lower(metric), 'rel|ratio')"


def preference(metric: str) -> tuple:
    """Relative metrics first (scale-free), then mean/rms before max (robust to single elements).
    Callers break the remaining ties by name: SQL rows come in no fixed order, and the representative
    (and with it the finding id) must not change between two runs."""
    m = metric.lower()
    return (0 if relative(m) else 1, 0 if ("mean" in m or "rms" in m or "ratio" in m) else 1)


def conditions(row, keys=("precision", "dtype", "variant", "partitions")) -> dict:
    """A check's conditions: the typed ones that are set, then the report's other columns."""
    out = {k: getattr(row, k) for k in keys if getattr(row, k, None) is not None}
    out.update(json.loads(row.other_conditions or "{}"))
    return out


def runs_with_numerics(con) -> list[int]:
    return [r.run_id for r in rows(con, "SELECT DISTINCT run_id FROM numerics ORDER BY run_id")]
