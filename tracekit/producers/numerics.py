"""Numerics reports: compare an output with a reference and write one row per check.

`compare(reference, output, **conditions)` works on torch tensors, numpy arrays or (nested)
Python lists; torch and numpy are imported lazily and are not dependencies of tracekit.
`write_report(rows, path)` writes the rows as CSV (`.csv`) or JSON Lines (anything else).
`tracekit analyze report.csv` ingests such a report into the `numerics` table (docs/schema.md)
and rule N001 (numerics-drift) reads it.

Error metrics (the reader takes columns whose name says error: `err`, `rms`, `fro`, `abs`):

- `max_abs_err`: max |out - ref|
- `max_rel_err`: max |out - ref| / max(|ref|, eps)
- `mean_rel_err`: mean |out - ref| / max(|ref|, eps)
- `rms_err_ratio`: rms(out - ref) / rms(ref) (FLA's `get_err_ratio`)
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEFAULT_EPS = 1e-6


def _flatten(x: Any) -> list[float]:
    if isinstance(x, (int, float)):
        return [float(x)]
    out: list[float] = []
    for item in x:
        out.extend(_flatten(item))
    return out


def _metrics_torch(ref: Any, out: Any, eps: float) -> dict[str, float]:
    r = ref.detach().to(dtype=_torch().float64)
    o = out.detach().to(device=r.device, dtype=_torch().float64)
    diff = (o - r).abs()
    rel = diff / r.abs().clamp_min(eps)
    rms_ref = float(r.pow(2).mean().sqrt())
    return {
        "max_abs_err": float(diff.max()),
        "max_rel_err": float(rel.max()),
        "mean_rel_err": float(rel.mean()),
        "rms_err_ratio": float(diff.pow(2).mean().sqrt()) / rms_ref if rms_ref > 0 else math.inf,
    }


def _torch():
    import torch  # noqa: PLC0415 - optional, lazy

    return torch


def _metrics_numpy(ref: Any, out: Any, eps: float) -> dict[str, float]:
    import numpy as np  # noqa: PLC0415 - optional, lazy

    r = np.asarray(ref, dtype=np.float64)
    o = np.asarray(out, dtype=np.float64)
    diff = np.abs(o - r)
    rel = diff / np.maximum(np.abs(r), eps)
    rms_ref = float(np.sqrt(np.mean(r * r)))
    return {
        "max_abs_err": float(diff.max()),
        "max_rel_err": float(rel.max()),
        "mean_rel_err": float(rel.mean()),
        "rms_err_ratio": float(np.sqrt(np.mean(diff * diff))) / rms_ref if rms_ref > 0 else math.inf,
    }


def _metrics_python(ref: Any, out: Any, eps: float) -> dict[str, float]:
    r = _flatten(ref)
    o = _flatten(out)
    if len(r) != len(o):
        raise ValueError(f"shape mismatch: reference has {len(r)} elements, output {len(o)}")
    if not r:
        raise ValueError("empty reference")
    diff = [abs(a - b) for a, b in zip(o, r)]
    rel = [d / max(abs(b), eps) for d, b in zip(diff, r)]
    rms_ref = math.sqrt(sum(b * b for b in r) / len(r))
    rms_diff = math.sqrt(sum(d * d for d in diff) / len(diff))
    return {
        "max_abs_err": max(diff),
        "max_rel_err": max(rel),
        "mean_rel_err": sum(rel) / len(rel),
        "rms_err_ratio": rms_diff / rms_ref if rms_ref > 0 else math.inf,
    }


def compare(
    reference: Any,
    output: Any,
    *,
    eps: float = DEFAULT_EPS,
    rows: list[dict[str, Any]] | None = None,
    **conditions: Any,
) -> dict[str, Any]:
    """One report row: the conditions, then max_abs_err, max_rel_err, mean_rel_err, rms_err_ratio.

    Relative errors divide by max(|reference|, eps). When `rows` is given the row is appended.
    """
    mod = type(reference).__module__
    if mod.startswith("torch"):
        metrics = _metrics_torch(reference, output, eps)
    elif mod.startswith("numpy"):
        metrics = _metrics_numpy(reference, output, eps)
    else:
        metrics = _metrics_python(reference, output, eps)
    row: dict[str, Any] = dict(conditions)
    row.update(metrics)
    if rows is not None:
        rows.append(row)
    return row


def write_report(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as CSV (`.csv`) or JSON Lines (other suffixes); returns the path."""
    rows = list(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".csv":
        fields: list[str] = []
        for row in rows:
            for key in row:
                if key not in fields:
                    fields.append(key)
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            for row in rows:
                writer.writerow(row)
    else:
        with path.open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return path
