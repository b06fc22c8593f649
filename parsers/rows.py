"""What a reader hands ingest (an `Export`), and the bulk insert of the event rows readers build in Python.

`rows` are event_rows tuples without run_id, parent_id and depth (those come from the run and from
nesting), in the order of ROW_FIELDS. A reader that builds no Python rows (too many, or rows of
another table) sets `loader` instead, which inserts them itself. `read` counts what each source
table or record type held and `skipped` what was left out, by reason, so events read = ingested +
skipped holds for every file.
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
    format: str = ""  # runs.format; a loader may settle it (Kineto or another producer's Chrome JSON)
    rows: list = field(default_factory=list)  # event_rows tuples in ROW_FIELDS order
    read: Counter = field(default_factory=Counter)  # table or record type -> items read
    skipped: Counter = field(default_factory=Counter)  # reason -> items
    notes: dict = field(default_factory=dict)
    device_properties: list | None = None
    metadata: dict | None = field(default_factory=dict)  # None: the run has no metadata (runs.metadata NULL)
    # a run-level quantity the source states (e.g. a benchmark's request throughput) goes to run_metrics
    metrics: list = field(default_factory=list)  # (name, value, unit, args JSON text or None)
    # inserts what `rows` does not hold when loaded: loader(con, run_id, offset_ns) adds offset_ns to
    # every ts_ns it writes and fills `read`, `skipped` and `notes` as it goes
    loader: Callable[..., None] | None = None
    bytes_read: int | None = None  # content bytes (after decompression); None: the file's size
    base_time_ns: int | None = None  # the epoch the source's times count from, when it states one
    rank: int | None = None  # as the source states it, with where it says so
    rank_source: str | None = None
    world_size: int | None = None
    cleanup: Callable[[], None] | None = None  # removes temporary files once loaded

    def window(self) -> tuple[int, int] | None:
        """(first start, last end) of the Python-built rows, metadata aside; None without timestamps."""
        spans = [(r[4], r[4] + (r[5] or 0)) for r in self.rows if r[4] is not None and r[0] != "metadata"]
        return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None


class Reload(Exception):
    """Raised by a loader that must read again inside a fresh transaction (a failed statement aborts
    the one it ran in); the loader keeps what it learnt, and ingest rolls back and calls it again."""


def load(con, export: Export, run_id: int, offset: int = 0) -> None:
    """Insert the export as run `run_id`: the loader's rows first, then `rows` through one Arrow table
    (one statement, whatever the count), every timestamp shifted by `offset` ns."""
    if export.loader is not None:
        export.loader(con, run_id, offset)
    if not export.rows:
        return
    import pyarrow as pa

    rows = export.rows
    if offset:
        rows = [r[:4] + (None if r[4] is None else r[4] + offset,) + r[5:] for r in rows]
    types = {"ts_ns": pa.int64(), "dur_ns": pa.int64(), "pid": pa.int64(), "tid": pa.int64(),
             "device": pa.int32(), "stream": pa.int64(), "correlation": pa.int64(), "external_id": pa.int64()}  # fmt: skip
    try:  # the tuples straight into one struct array: twice as fast as transposing them in Python
        struct = pa.struct([(name, types.get(name, pa.string())) for name in ROW_FIELDS])
        _tracekit_rows = pa.Table.from_struct_array(pa.array(rows, type=struct))
    except (TypeError, ValueError, pa.ArrowException):  # rows that are not plain tuples: column by column
        columns = list(zip(*rows))
        _tracekit_rows = pa.table(  # noqa: F841  (read by DuckDB's replacement scan of this frame's locals)
            {name: pa.array(col, type=types.get(name, pa.string())) for name, col in zip(ROW_FIELDS, columns)}
        )
    # a replacement scan, not con.register: register refuses while the caller's last result is open
    con.execute(
        "INSERT INTO event_rows SELECT ?::INTEGER, kind, ph, cat, name, ts_ns, dur_ns, pid, tid, track, device, "
        "stream, correlation, external_id, flow_id, args::JSON, extra::JSON, NULL, NULL FROM _tracekit_rows",
        [run_id],
    )
