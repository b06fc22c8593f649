"""Numerics (correctness) reports -> numerics rows: one row per (check row, error metric).

A report is a table with one row per check: condition columns (precision, input distribution, size,
partitions, ...), per-row measurements (the reference's magnitude, a time, a non-finite count, a
difference against another run) and error metrics. How the columns are told apart, from the data:

- Error metrics: the names given in `metrics`, else every column whose name says it is an error:
  a name token starting with `err` (`max_abs_err`, `relative_error`), `rms`, `fro` (`o_rel_fro`), or
  `abs` (`o_max_abs`, `abs_diff`). A column measuring the reference itself (first token `ref` or
  `reference`, e.g. `ref_o_absmax`) is not an error. Each metric keeps its tensor when its name
  says it: `o`/`out`/`output` -> output, `h`/`ht`/`state` -> state.
- Measurements: fractional numbers (a magnitude, a time, a difference) and any other column the
  rows do not need to be told apart (removed greedily, fractional and unnamed columns first; a
  non-finite count, a wall time in whole ms). Well-known conditions (below) are always conditions.
- Conditions: what is left. Columns with one value in every row (device, dtype) are kept in the
  `conditions` JSON but separate nothing.

The size the errors are tested against (`seq_len`) is the integer condition with several levels:
one named like a size (`seq_len`, `seqlen`, `T`, `num_tokens`, `context_len`, ...) if there is one,
else the one with the most levels; the partitions column is never the size. Formats: CSV (`.csv`),
JSON (`.json`, an array of objects), JSON Lines (`.jsonl`, `.ndjson`) and Parquet (`.parquet`), by
suffix, else by content; DuckDB reads them all, so every format of the same rows gives the same
table. `tracekit.numerics.compare` and `write_report` make such reports.
"""

from __future__ import annotations

import json
import math
import re
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
    "precision": ("precision", "input_precision", "dot_precision", "fp32_precision", "matmul_precision"),
    "dtype": ("dtype", "input_dtype", "data_type"),
    "variant": ("variant", "impl", "implementation", "path", "method"),
    "partitions": ("partitions", "num_partitions", "n_partitions", "parts", "cp", "cp_size", "cp_world_size"),
}
# Names that say a column is the size; any other integer condition may still be chosen by its levels.
SIZE_NAMES = (
    "seq_len", "seqlen", "seq_length", "sequence_length", "length", "len", "n", "t", "num_tokens",
    "n_tokens", "tokens", "context_len", "context_length", "ctx_len", "max_seqlen",
)  # fmt: skip
TENSORS = {"o": "output", "out": "output", "output": "output", "y": "output",
           "h": "state", "ht": "state", "state": "state", "s": "state", "final_state": "state"}  # fmt: skip

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
    "tensor",
    "reference_scale",
    "measurements",
)


@dataclass
class NumericsTable:
    rows: list[dict] = field(default_factory=list)
    checks: int = 0
    metrics: list[str] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)  # the ones that vary between rows
    constants: list[str] = field(default_factory=list)
    measurements: list[str] = field(default_factory=list)
    typed: dict[str, str] = field(default_factory=dict)  # typed column -> source column
    skipped: dict[str, int] = field(default_factory=dict)
    file_format: str = ""


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def _names_an_error(name: str) -> bool:
    tokens = _tokens(name)
    if not tokens or tokens[0] in ("ref", "reference"):
        return False
    return any(t.startswith("err") or t in ("rms", "fro", "abs") or t.endswith("err") for t in tokens)


def _is_metric(name: str, metrics: tuple[str, ...]) -> bool:
    return name in metrics if metrics else _names_an_error(name)


def tensor_of(metric: str) -> str | None:
    """output / state when the metric's name says which tensor it measures."""
    return next((TENSORS[t] for t in _tokens(metric) if t in TENSORS), None)


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
    """A report judged by suffix and header: some column is an error metric (its name says error,
    see the module docstring, or is one of `metrics`). Nsight Compute CSVs, Kineto traces (`ph`/`traceEvents`) and
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
        "constants": table.constants,
        "measurements": table.measurements,
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
        want = f"the columns {list(metrics)}" if metrics else "an error column (a name with err, rms, fro or abs)"
        raise InputError(path, "header", f"{want}; columns are {cols}")
    records = [dict(zip(cols, values)) for values in data]
    _classify(table, [c for c in cols if c not in table.metrics], records)
    scales = _reference_scales(table.measurements)
    typed_sources = set(table.typed.values())
    for index, row in enumerate(records):
        table.checks += 1
        conditions = {c: _plain(row[c]) for c in cols if c in table.conditions or c in table.constants}
        base = {
            "row_index": index,
            "conditions": json.dumps(conditions),
            "other_conditions": json.dumps(
                {c: v for c, v in conditions.items() if c not in typed_sources}, sort_keys=True
            ),
            "measurements": json.dumps({c: _plain(row[c]) for c in table.measurements}),
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
            tensor = tensor_of(metric)
            scale_column = scales.get(tensor, scales.get(None))
            scale = _float(row[scale_column]) if scale_column else None
            table.rows.append({**base, "metric": metric, "value": value, "tensor": tensor, "reference_scale": scale})
    return table


def _classify(table: NumericsTable, columns: list[str], records: list[dict]) -> None:
    """Split the non-metric columns into conditions, constants and measurements (module docstring)."""
    lower = {c.lower(): c for c in columns}
    for typed, names in WELL_KNOWN.items():
        source = next((lower[n] for n in names if n in lower), None)
        if source is not None:
            table.typed[typed] = source
    values = {c: [_plain(r[c]) for r in records] for c in columns}
    levels = {c: len({json.dumps(v) for v in values[c]}) for c in columns}
    table.constants = [c for c in columns if levels[c] <= 1]
    varying = [c for c in columns if levels[c] > 1]
    size = _size_column(varying, values, levels, table.typed.get("partitions")) or _size_column(
        [c for c in table.constants if c.lower() in SIZE_NAMES], values, levels, None
    )  # a report of one length still says which
    if size is not None:
        table.typed["seq_len"] = size
    protected = set(table.typed.values())

    def distinct(keep: list[str]) -> bool:
        return len({json.dumps([r[c] for c in keep], default=str) for r in records}) == len(records)

    kept = list(varying)
    if distinct(kept):
        # fractional columns first, then the most levels (a time, an id): the least condition-like
        order = sorted(
            (c for c in varying if c not in protected),
            key=lambda c: (not any(_fractional(v) for v in values[c]), -levels[c], c),
        )
        for column in order:
            rest = [c for c in kept if c != column]
            if distinct(rest):
                kept = rest
    else:  # repeated checks: only fractional columns are measurements
        kept = [c for c in varying if c in protected or not any(_fractional(v) for v in values[c])]
    table.conditions = kept
    table.measurements = [c for c in varying if c not in kept]


def _size_column(varying: list[str], values: dict, levels: dict, partitions: str | None) -> str | None:
    """The integer condition the errors are tested against: a size name first, else the most levels."""
    candidates = [
        c
        for c in varying
        if c != partitions and all(_int(v) is not None and _int(v) > 0 for v in values[c] if v is not None)
    ]
    named = [c for c in candidates if c.lower() in SIZE_NAMES]
    pool = named or candidates
    return max(pool, key=lambda c: (levels[c], -pool.index(c))) if pool else None


def _reference_scales(measurements: list[str]) -> dict:
    """Tensor -> the measurement column holding the reference's magnitude (`ref_*`, `*_scale`)."""
    out: dict = {}
    for column in measurements:
        tokens = _tokens(column)
        if tokens and (tokens[0] in ("ref", "reference") or "scale" in tokens):
            out.setdefault(tensor_of(column), column)
    return out


def _fractional(v) -> bool:
    return isinstance(v, float) and not v.is_integer()


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
    # a count beyond 64 bits (1e30 tokens) is no length or partition count: not read as one
    return int(f) if math.isfinite(f) and f.is_integer() and abs(f) < 2**63 else None


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
