"""Event rows built in Python by the row-based readers (Nsight Systems, nsys stats, Perfetto, OTLP,
serving logs), and their bulk insert into event_rows.

A reader returns an `Export`: its rows are event_rows tuples without run_id, parent_id and depth (those
come from the run and from nesting), in the order of ROW_FIELDS. `read` counts what each source
table or record type held and `skipped` counts what was left out, by reason, so events read =
ingested + skipped holds for every file.
"""

from __future__ import annotations

from collections import Counter
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


def load(con, export: Export, run_id: int) -> None:
    """Insert the rows as run `run_id` through one Arrow table (one statement, whatever the count)."""
    if not export.rows:
        return
    import pyarrow as pa

    types = {"ts_ns": pa.int64(), "dur_ns": pa.int64(), "pid": pa.int64(), "tid": pa.int64(),
             "device": pa.int32(), "stream": pa.int64(), "correlation": pa.int64(), "external_id": pa.int64()}  # fmt: skip
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
