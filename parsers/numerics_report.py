"""Numerics (correctness) reports -> numerics rows: one row per (check row, error metric).

A report is a table with one row per check: condition columns (precision, variant, sequence
length, partitions, anything else) and error columns. Error columns are those whose name contains
`err` (case-insensitive), or the names given in `metrics`. Formats: CSV (`.csv`), JSON (`.json`,
an array of objects), JSON Lines (`.jsonl`, `.ndjson`) and Parquet (`.parquet`); DuckDB reads
them all, so every format of the same rows gives the same table. `tracekit.numerics.compare` and
`write_report` make such reports.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import InputError

FORMAT = "numerics_report"
SUFFIXES = (".csv", ".json", ".jsonl", ".ndjson", ".parquet")

# Typed copies of well-known conditions: first column present (case-insensitive) wins.
WELL_KNOWN = {
    "precision": ("precision", "input_precision", "dot_precision", "fp32_precision"),
    "dtype": ("dtype", "input_dtype", "data_type"),
    "variant": ("variant", "impl", "implementation", "path", "method"),
    "seq_len": ("seq_len", "seqlen", "seq_length", "length", "len", "n", "t", "num_tokens"),
    "partitions": ("partitions", "num_partitions", "n_partitions", "parts", "cp", "cp_size"),
}

ROW_FIELDS = (
    "row_index",
    "metric",
    "value",
    "conditions",
    "precision",
    "dtype",
    "variant",
    "seq_len",
    "partitions",
    "other_conditions",
)


@dataclass
class NumericsTable:
    rows: list[dict] = field(default_factory=list)
    checks: int = 0
    metrics: list[str] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)
    typed: dict[str, str] = field(default_factory=dict)  # typed column -> source column
    skipped: dict[str, int] = field(default_factory=dict)
    file_format: str = ""


def _is_metric(name: str, metrics: tuple[str, ...]) -> bool:
    return name in metrics if metrics else "err" in name.lower()


def _file_format(path: Path) -> str | None:
    name = path.name.lower()
    for suffix, fmt in (
        (".csv", "csv"),
        (".jsonl", "jsonl"),
        (".ndjson", "jsonl"),
        (".json", "json"),
        (".parquet", "parquet"),
    ):
        if name.endswith(suffix):
            return fmt
    return _sniff_format(path)


def _sniff_format(path: Path) -> str | None:
    """The layout of a report whose name says nothing (`report.dat`, a pipe's temp file), from its
    first bytes; gzip and anything else are not a numerics report."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.decode("utf-8", "ignore").lstrip("\ufeff \t\r\n")
    if text.startswith("["):
        return "json"
    if text.startswith("{"):
        return "jsonl"
    first = text.split("\n", 1)[0]
    return "csv" if "," in first and "\x00" not in text else None


def is_numerics_path(path: Path, metrics: tuple[str, ...] = ()) -> bool:
    """A report judged by suffix and header: some column is an error metric (its name contains
    `err`, or is one of `metrics`); never raises. Nsight Compute CSVs, Kineto traces
    (`ph`/`traceEvents`) and runtime logs (`ts_ns`) are not."""
    path = Path(path)
    is_metric = lambda name: _is_metric(name, metrics) if metrics else "err" in name.lower()  # noqa: E731
    fmt = _file_format(path)
    if fmt is None:
        return False
    try:
        if fmt == "parquet":
            return any(is_metric(c) for c in _columns(path, fmt))
        with open(path, "rb") as f:
            head = f.read(1 << 16).decode("utf-8", "ignore")
        if fmt == "csv":
            first = next((line for line in head.splitlines() if line.strip()), "")
            if '"Kernel Name"' in head or first.startswith("=="):
                return False
            return any(is_metric(c.strip().strip('"')) for c in first.split(","))
        if fmt == "jsonl":
            first = next((line for line in head.splitlines() if line.strip()), "")
            obj = json.loads(first)
            return isinstance(obj, dict) and "ts_ns" not in obj and any(is_metric(k) for k in obj)
        # .json: an array of flat objects; traces are objects, or arrays of events with "ph".
        # Only the first object is decoded, from the head: a large trace is never read whole.
        text = head.lstrip()
        if not text.startswith("["):
            return False
        first, _ = json.JSONDecoder().raw_decode(text[1:].lstrip())
        return isinstance(first, dict) and "ph" not in first and any(is_metric(k) for k in first)
    except Exception:
        return False


def _reader(fmt: str) -> str:
    return {
        "csv": "read_csv_auto(?, header = true)",
        "json": "read_json_auto(?, format = 'array')",
        "jsonl": "read_json_auto(?, format = 'newline_delimited')",
        "parquet": "read_parquet(?)",
    }[fmt]


def _columns(path: Path, fmt: str) -> list[str]:
    import duckdb

    con = duckdb.connect()
    try:
        return [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {_reader(fmt)}", [str(path)]).fetchall()]
    finally:
        con.close()


def read(path: Path, metrics: tuple[str, ...] = ()) -> NumericsTable:
    import duckdb

    path = Path(path)
    fmt = _file_format(path)
    if fmt is None:
        raise InputError(path, "file name", f"a numerics report ending in {', '.join(SUFFIXES)}")
    con = duckdb.connect()
    try:
        cur = con.execute(f"SELECT * FROM {_reader(fmt)}", [str(path)])
        cols = [d[0] for d in cur.description]
        data = cur.fetchall()
    except duckdb.Error as e:
        raise InputError(
            path, "file", f"a {fmt} table with one row per check ({' '.join(str(e).split())[:200]})"
        ) from None
    finally:
        con.close()
    table = NumericsTable(file_format=fmt)
    table.metrics = [c for c in cols if _is_metric(c, metrics)]
    if not table.metrics:
        want = f"the columns {list(metrics)}" if metrics else "a column whose name contains 'err'"
        raise InputError(path, "header", f"{want} (an error metric); columns are {cols}")
    table.conditions = [c for c in cols if c not in table.metrics]
    lower = {c.lower(): c for c in table.conditions}
    for typed, names in WELL_KNOWN.items():
        source = next((lower[n] for n in names if n in lower), None)
        if source is not None:
            table.typed[typed] = source
    typed_sources = set(table.typed.values())
    for index, values in enumerate(data):
        table.checks += 1
        row = dict(zip(cols, values))
        conditions = {c: _plain(row[c]) for c in table.conditions}
        base = {
            "row_index": index,
            "conditions": json.dumps(conditions),
            "other_conditions": json.dumps(
                {c: v for c, v in conditions.items() if c not in typed_sources}, sort_keys=True
            ),
        }
        for typed in ("precision", "dtype", "variant"):
            v = conditions.get(table.typed.get(typed, ""))
            base[typed] = None if v is None else str(v).strip().lower()
        for typed in ("seq_len", "partitions"):
            v = conditions.get(table.typed.get(typed, ""))
            base[typed] = _int(v)
        for metric in table.metrics:
            value = _float(row[metric])
            if value is None:
                table.skipped["error value not a number"] = table.skipped.get("error value not a number", 0) + 1
                continue
            table.rows.append({**base, "metric": metric, "value": value})
    return table


def _plain(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    return str(v)


def _int(v) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and f.is_integer() else None


def _float(v) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if not math.isnan(f) else None


def load(con, table: NumericsTable, run_id: int) -> None:
    from tracekit.db.connection import insert_rows

    insert_rows(con, "numerics", run_id, ROW_FIELDS, [[r[k] for k in ROW_FIELDS] for r in table.rows])
