"""Numerics (correctness) reports -> numerics rows: one row per (check row, error metric).

A report is a table with one row per check: condition columns (precision, variant, sequence
length, partitions, anything else) and error columns. Error columns are those whose name contains
`err` (case-insensitive), or the names given in `metrics`. Formats: CSV (`.csv`), JSON (`.json`,
an array of objects), JSON Lines (`.jsonl`, `.ndjson`) and Parquet (`.parquet`), by suffix, else by
content; DuckDB reads them all, so every format of the same rows gives the same table. `tracekit.numerics.compare` and
`write_report` make such reports.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tracekit import compression
from tracekit.errors import InputError
from tracekit.parsers.rows import Export

FORMAT = "numerics_report"
DESCRIPTION = "numerics report"
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


def _file_format(head: bytes, name: str) -> str | None:
    name = compression.strip_suffix(name).lower()
    for suffix, fmt in (
        (".csv", "csv"),
        (".jsonl", "jsonl"),
        (".ndjson", "jsonl"),
        (".json", "json"),
        (".parquet", "parquet"),
    ):
        if name.endswith(suffix):
            return fmt
    return _sniff_format(head)


def _sniff_format(head: bytes) -> str | None:
    """The layout of a report whose name says nothing (`report.dat`, a pipe's temp file), from its
    first bytes."""
    head = head[:4096]
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.decode("utf-8", "ignore").lstrip("\ufeff \t\r\n")
    if text.startswith("["):
        return "json"
    if text.startswith("{"):
        return "jsonl"
    first = text.split("\n", 1)[0]
    return "csv" if "," in first and "\x00" not in text else None


def sniff(head: bytes, name: str, metrics: tuple[str, ...] = (), **_) -> bool:
    """A report judged by suffix and header: some column is an error metric (its name contains
    `err`, or is one of `metrics`). Nsight Compute CSVs, Kineto traces (`ph`/`traceEvents`) and
    runtime logs (`ts_ns`) are not. A Parquet file's columns are in its footer, not its head: any
    Parquet file is taken for a report, and reading it says when it has no error column."""
    metrics = tuple(metrics)
    fmt = _file_format(head, name)
    if fmt is None:
        return False
    if fmt == "parquet":
        return head.startswith(b"PAR1")
    try:
        text = head[: 1 << 16].decode("utf-8", "ignore")
        first = next((line for line in text.splitlines() if line.strip()), "")
        if fmt == "csv":
            if '"Kernel Name"' in text or first.startswith("=="):
                return False
            return any(_is_metric(c.strip().strip('"'), metrics) for c in first.split(","))
        if fmt == "jsonl":
            obj = json.loads(first)
            return isinstance(obj, dict) and "ts_ns" not in obj and any(_is_metric(k, metrics) for k in obj)
        # .json: an array of flat objects; traces are objects, or arrays of events with "ph".
        # Only the first object is decoded, from the head: a large trace is never read whole.
        text = text.lstrip()
        if not text.startswith("["):
            return False
        first_obj, _ = json.JSONDecoder().raw_decode(text[1:].lstrip())
        return isinstance(first_obj, dict) and "ph" not in first_obj and any(_is_metric(k, metrics) for k in first_obj)
    except (ValueError, RecursionError):
        return False


def _reader(fmt: str) -> str:
    return {
        "csv": "read_csv_auto(?, header = true)",
        "json": "read_json_auto(?, format = 'array')",
        "jsonl": "read_json_auto(?, format = 'newline_delimited')",
        "parquet": "read_parquet(?)",
    }[fmt]


def read(path: Path, metrics: tuple[str, ...] = (), tmpdir: str | None = None, **_) -> Export:
    """The report's rows, inserted into `numerics` when loaded: each error value is an item read."""
    table = parse(path, metrics, tmpdir)
    notes = {
        "unit": "one error metric of one check row",
        "file_format": table.file_format,
        "checks": table.checks,
        "metrics": table.metrics,
        "conditions": table.conditions,
        "typed_conditions": table.typed,
    }
    out = Export(source=Path(path), format=FORMAT, notes=notes, metadata=dict(notes), skipped=Counter(table.skipped))
    out.read["error value"] = len(table.rows) + sum(table.skipped.values())
    out.loader = lambda con, run_id, offset=0: load(con, table, run_id)
    return out


def parse(path: Path, metrics: tuple[str, ...] = (), tmpdir: str | None = None) -> NumericsTable:
    import duckdb

    path = Path(path)
    try:
        fmt = _file_format(compression.head(path, 4096), path.name)
        compressed = compression.kind(path) is not None
    except OSError as e:
        raise InputError(path, "file", f"expected a readable file ({e.strerror})") from None
    if fmt is None:
        raise InputError(path, "file name", f"a numerics report ending in {', '.join(SUFFIXES)}")
    local = compression.decompressed_copy(path, tmpdir) if compressed else path  # DuckDB reads files in place
    con = duckdb.connect()
    try:
        cur = con.execute(f"SELECT * FROM {_reader(fmt)}", [str(local)])
        cols = [d[0] for d in cur.description]
        data = cur.fetchall()
    except duckdb.Error as e:
        raise InputError(
            path, "file", f"a {fmt} table with one row per check ({' '.join(str(e).split())[:200]})"
        ) from None
    finally:
        con.close()
        if compressed:
            local.unlink()
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
