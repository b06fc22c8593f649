"""Event rows built in Python by the row-based readers (Nsight Systems, nsys stats, Perfetto, OTLP,
serving logs), and their bulk insert into event_rows.

A reader returns an `Export`: its rows are event_rows tuples without run_id, parent_id and depth (those
come from the run and from nesting), in the order of ROW_FIELDS. `read` counts what each source
table or record type held and `skipped` counts what was left out, by reason, so events read =
ingested + skipped holds for every file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROW_FIELDS = ("kind", "ph", "cat", "name", "ts_ns", "dur_ns", "pid", "tid", "track", "device", "stream",
              "correlation", "external_id", "flow_id", "args", "extra")  # fmt: skip


@dataclass
class Export:
    source: Path
    rows: list = field(default_factory=list)  # event_rows tuples in ROW_FIELDS order
    read: Counter = field(default_factory=Counter)  # table or record type -> items read
    skipped: Counter = field(default_factory=Counter)  # reason -> items
    notes: dict = field(default_factory=dict)
    device_properties: list | None = None
    metadata: dict = field(default_factory=dict)
    # a run-level quantity the source states (e.g. a benchmark's request throughput) goes to run_metrics
    metrics: list = field(default_factory=list)  # (name, value, unit, args JSON text or None)
    # a reader too large for `rows` inserts its events itself when loaded: loader(con, run_id, offset_ns)
    # adds offset_ns to every ts_ns and fills `read`, `skipped` and `notes` as it goes
    loader: Callable[..., None] | None = None


def load(con, export: Export, run_id: int, offset: int = 0) -> None:
    """Insert the rows as run `run_id` through one Arrow table (one statement, whatever the count), after
    the loader's events if the export has one; `offset` (ns) is the loader's to add: `rows` come shifted."""
    if export.loader is not None:
        export.loader(con, run_id, offset)
    if not export.rows:
        return
    import pyarrow as pa

    types = {"ts_ns": pa.int64(), "dur_ns": pa.int64(), "pid": pa.int64(), "tid": pa.int64(),
             "device": pa.int32(), "stream": pa.int64(), "correlation": pa.int64(), "external_id": pa.int64()}  # fmt: skip
    try:  # the tuples straight into one struct array: twice as fast as transposing them in Python
        struct = pa.struct([(name, types.get(name, pa.string())) for name in ROW_FIELDS])
        _tracekit_rows = pa.Table.from_struct_array(pa.array(export.rows, type=struct))
    except (TypeError, ValueError, pa.ArrowException):  # rows that are not plain tuples: column by column
        columns = list(zip(*export.rows))
        _tracekit_rows = pa.table(  # noqa: F841  (read by DuckDB's replacement scan of this frame's locals)
            {name: pa.array(col, type=types.get(name, pa.string())) for name, col in zip(ROW_FIELDS, columns)}
        )
    # a replacement scan, not con.register: register refuses while the caller's last result is open
    con.execute(
        "INSERT INTO event_rows SELECT ?::INTEGER, kind, ph, cat, name, ts_ns, dur_ns, pid, tid, track, device, "
        "stream, correlation, external_id, flow_id, args::JSON, extra::JSON, NULL, NULL FROM _tracekit_rows",
        [run_id],
    )
