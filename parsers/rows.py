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
    # what the reader's load_batch takes to load this file in one statement with other files of its
    # reader (many small rank traces: a statement's fixed cost dwarfs their rows); None: it loads alone
    batch: object | None = None
    batch_key: str = ""  # files load together only with files of the same reader and key

    def window(self) -> tuple[int, int] | None:
        """(first start, last end) of the Python-built rows, metadata aside; None without timestamps."""
        spans = [(r[4], r[4] + (r[5] or 0)) for r in self.rows if r[4] is not None and r[0] != "metadata"]
        return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None


class Reload(Exception):
    """Raised by a loader that must read again inside a fresh transaction (a failed statement aborts
    the one it ran in); the loader keeps what it learnt, and ingest rolls back and calls it again."""


class Unbatched(Exception):
    """Raised by a reader's batchable or load_batch when the files cannot load together (one of them
    needs a read of its own); ingest rolls the batch back and loads each file alone, as it would have
    anyway, and notes the reason on each (ingest_log.notes.loaded_alone_after_batch)."""


# |ts|, |dur| and |ts + dur| beyond this many ns (127 years) are no times of a trace, and a BIGINT holds
# little more: such rows are skipped with a reason (as the Kineto reader skips its), not a failed file
ABSURD_NS = 4 * 10**18
_TYPES = {"ts_ns": 64, "dur_ns": 64, "pid": 64, "tid": 64, "device": 32, "stream": 64, "correlation": 64,
          "external_id": 64}  # fmt: skip
_INTS = [(i, 2 ** (_TYPES[name] - 1)) for i, name in enumerate(ROW_FIELDS) if name in _TYPES]  # (index, bound)
_TEXTS = [i for i, name in enumerate(ROW_FIELDS) if name not in _TYPES]
TIME_REASON = "time not in range (NaN, infinite, or beyond 127 years of ns)"
ID_REASON = "id not an integer of its column's size"


def load(con, export: Export, run_id: int, offset: int = 0) -> None:
    """Insert the export as run `run_id`: the loader's rows first, then `rows` through one Arrow table
    (one statement, whatever the count), every timestamp shifted by `offset` ns. Rows whose times or
    ids their columns cannot hold are skipped with a reason."""
    if export.loader is not None:
        export.loader(con, run_id, offset)
    if not export.rows:
        return
    rows = export.rows
    if offset:
        rows = [r[:4] + (None if r[4] is None else r[4] + offset,) + r[5:] for r in rows]
    _tracekit_rows = _arrow(rows)  # noqa: F841  (read by DuckDB's replacement scan of this frame's locals)
    if _tracekit_rows is None or _absurd_times(_tracekit_rows):
        _tracekit_rows = _arrow(_representable(rows, export.skipped))
    # a replacement scan, not con.register: register refuses while the caller's last result is open
    con.execute(
        "INSERT INTO event_rows SELECT ?::INTEGER, kind, ph, cat, name, ts_ns, dur_ns, pid, tid, track, device, "
        "stream, correlation, external_id, flow_id, args::JSON, extra::JSON, NULL, NULL FROM _tracekit_rows",
        [run_id],
    )


def _arrow(rows: list):
    """The rows as one Arrow table; None when a value does not fit its column (an integer beyond its
    bits, a float where an id goes, text that is not UTF-8)."""
    import pyarrow as pa

    types = {name: pa.int64() if bits == 64 else pa.int32() for name, bits in _TYPES.items()}
    try:  # the tuples straight into one struct array: twice as fast as transposing them in Python
        struct = pa.struct([(name, types.get(name, pa.string())) for name in ROW_FIELDS])
        return pa.Table.from_struct_array(pa.array(rows, type=struct))
    except (TypeError, ValueError, OverflowError, pa.ArrowException):  # not plain tuples, or a value that does not fit
        pass
    try:
        columns = list(zip(*rows)) if rows else [()] * len(ROW_FIELDS)
        return pa.table(
            {name: pa.array(col, type=types.get(name, pa.string())) for name, col in zip(ROW_FIELDS, columns)}
        )
    except (TypeError, ValueError, OverflowError, pa.ArrowException):
        return None


def _absurd_times(table) -> bool:
    import pyarrow.compute as pc

    ts, dur = (pc.cast(table[c], "float64", safe=False) for c in ("ts_ns", "dur_ns"))
    extremes = [pc.max(pc.abs(x)).as_py() for x in (ts, dur, pc.add(ts, pc.fill_null(dur, 0.0)))]
    return any(x is not None and x > ABSURD_NS for x in extremes)


def _representable(rows: list, skipped: Counter) -> list:
    """The rows whose times and ids their columns hold, text made valid UTF-8; the others counted in
    `skipped` by reason."""
    kept = []
    for row in rows:
        row = list(row)
        for i, bound in _INTS:
            row[i] = _integer(row[i], bound)
        ts, dur = row[4], row[5]
        if any(row[i] is _UNFIT for i, _ in _INTS):
            skipped[ID_REASON if ts is not _UNFIT and dur is not _UNFIT else TIME_REASON] += 1
        elif abs(ts or 0) > ABSURD_NS or abs(dur or 0) > ABSURD_NS or abs((ts or 0) + (dur or 0)) > ABSURD_NS:
            skipped[TIME_REASON] += 1
        else:
            kept.append(tuple(_text(v) if i in _TEXTS else v for i, v in enumerate(row)))
    return kept


_UNFIT = object()


def _integer(value, bound: int):
    """`value` as an integer its column holds (an integral float becomes one), else _UNFIT."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is None or (type(value) is int and -bound <= value < bound):
        return value
    return _UNFIT


def _text(value):
    if value is None:
        return None
    if not isinstance(value, str):  # a reader passed through a value of the wrong JSON type
        value = str(value)
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate a JSON decoder let through
        return value.encode("utf-8", "replace").decode()
    return value
