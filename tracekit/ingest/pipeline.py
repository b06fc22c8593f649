"""Ingest trace files into a database: stage (decompress/slice) the next file while loading this one."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import orjson

from tracekit import db as dbmod
from tracekit.ingest.nesting import compute_nesting


@dataclass
class IngestResult:
    run_id: int
    source: str
    format: str
    bytes_read: int
    events_read: int
    events_ingested: int
    events_skipped: int
    skipped_reasons: dict
    seconds: float
    rank: int | None
    alignment: dict | None = None  # how a log joined its trace's clock (method, applied_offset_ns)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def plan(paths: list[Path], metrics: tuple[str, ...] = (), readers: dict | None = None) -> list[tuple[int | None, list[int]]]:
    """Group the inputs of one call into runs: (index of the trace, indexes of the logs that join it).

    Logs are runtime-event logs and the row-based sources marked ATTACHABLE (server logs, OTLP spans).
    A log joins the run of the nearest trace before it in the call; a log that comes before every
    trace joins the only trace of the call when there is exactly one; otherwise it is a run of its own
    (a runtime-event log: format `runtime_events`; an attachable source: its own format). So
    `analyze trace.json.gz events.jsonl server.log`, `analyze events.jsonl trace.json.gz` and
    `ingest r0.json.gz r0.jsonl r1.json.gz r1.jsonl` all do what they say.
    """
    from tracekit.parsers import ncu_csv, numerics_report, runtime_events

    readers = readers if readers is not None else detect_readers(paths)
    attachable = {i for i, r in readers.items() if getattr(r, "ATTACHABLE", False)}
    rows = set(readers) - attachable
    numerics = {i for i, p in enumerate(paths) if i not in readers and numerics_report.is_numerics_path(p, metrics)}
    is_log = [i in attachable or (i not in numerics | rows and runtime_events.is_runtime_log(p)) for i, p in enumerate(paths)]
    standalone = rows | numerics | {i for i, p in enumerate(paths) if not is_log[i] and ncu_csv.is_ncu_path(p)}
    traces = [i for i, log in enumerate(is_log) if not log and i not in standalone]
    units: list[tuple[int | None, list[int]]] = []
    by_trace: dict[int, list[int]] = {}
    leading: list[int] = []
    for i, log in enumerate(is_log):
        if not log:
            by_trace[i] = []
            units.append((i, by_trace[i]))
        elif units and units[-1][0] is not None and units[-1][0] in by_trace and units[-1][0] not in standalone:
            units[-1][1].append(i)
        elif len(traces) == 1:
            leading.append(i)
        elif i in attachable:
            units.append((i, []))  # no trace to join: a run of its own, read like any row-based source
        else:
            units.append((None, [i]))
    if leading:
        by_trace[traces[0]][:0] = leading
    return units


# Readers that build event rows in Python (parsers/rows.py), tried in this order on a file's content.
# Each module has FORMAT, detect(path) -> bool (never raises) and read(path) -> rows.Export; one with
# ATTACHABLE = True (a log of the same process or service) joins the run of a trace given with it.
ROW_READERS = ("nsys_sqlite", "nsys_stats_csv", "perfetto_proto", "otlp_json", "bench_serving", "serving_log")


def row_reader(path: Path):
    """The row-based reader module that recognises this file's content, or None."""
    import importlib

    for name in ROW_READERS:
        try:
            module = importlib.import_module(f"tracekit.parsers.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"tracekit.parsers.{name}":
                raise
            continue  # a reader not written yet
        if module.detect(Path(path)):
            return module
    return None


def detect_readers(paths: list[Path]) -> dict:
    """index -> row-based reader module, for the inputs one recognises (each file sniffed once)."""
    found = {}
    for i, p in enumerate(paths):
        reader = row_reader(Path(p))
        if reader is not None:
            found[i] = reader
    return found


def ingest(
    con,
    paths: list[str | Path],
    rank: int | None = None,
    labels: list[str] | None = None,
    tmpdir: str | None = None,
    progress: Callable[[str], None] | None = None,
    align: bool = True,
    metrics: tuple[str, ...] = (),
    offsets: dict | None = None,
) -> list[IngestResult]:
    """Ingest trace files (and the logs that join them, see plan) in order; one IngestResult per file.

    `align`: shift a log attached to a trace onto the trace's clock by the offset measured on the
    events both share (runtime-event logs) or on their windows (server logs); `offsets` (path -> ns)
    overrides that for the files it names and shifts any other input as a whole.
    """
    from tracekit.ingest.formats import export_native, is_native

    paths = [Path(p) for p in paths]
    offsets = {Path(k): v for k, v in (offsets or {}).items()}
    exported: dict[Path, Path] = {}  # export -> the native report it came from
    for i, p in enumerate(paths):
        if is_native(p):
            paths[i] = export_native(p, tmpdir)  # the vendor tool reads its own format; tracekit the export
            exported[paths[i]] = p
            offsets.setdefault(paths[i], offsets.get(p, 0))
    try:
        results = _ingest_all(con, paths, rank, labels, tmpdir, progress, align, metrics, offsets)
    finally:
        for export in exported:
            shutil.rmtree(export.parent, ignore_errors=True)
    for export, native in exported.items():
        # the run is the report the user gave; the export was a means
        for table in ("runs", "ingest_log"):
            con.execute(f"UPDATE {table} SET source = ? WHERE source = ?", [str(native), str(export)])
        for r in results:
            if r.source == str(export):
                r.source = str(native)
    return results


def _ingest_all(con, paths, rank, labels, tmpdir, progress, align, metrics, offsets) -> list[IngestResult]:
    from tracekit.ingest.formats import check_known
    from tracekit.parsers.json_slice import stage

    readers = detect_readers(paths)
    dbmod.bound_memory(con, dbmod.current_memory_hint(con) + sum(raw_size(p) for p in paths))
    from tracekit.parsers import ncu_csv, numerics_report

    metrics = tuple(metrics)
    units = plan(paths, metrics, readers)
    rowbased = {t for t, _ in units if t is not None and t in readers}
    numerics = {
        t for t, _ in units if t is not None and t not in rowbased and numerics_report.is_numerics_path(paths[t], metrics)
    }
    ncu = {t for t, _ in units if t is not None and t not in numerics | rowbased and ncu_csv.is_ncu_path(paths[t])}
    traces = [t for t, _ in units if t is not None and t not in ncu | numerics | rowbased]
    for t in traces:
        check_known(paths[t])  # what no reader took and is not JSON gets one line naming what was tried
    results = []
    # zlib and copy_file_range release the GIL: the next trace is staged on the other core.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(stage, paths[traces[0]], tmpdir) if traces else None
        next_trace = 1
        for unit, (trace_index, log_indexes) in enumerate(units):
            started = time.perf_counter()
            label = labels[unit] if labels and unit < len(labels) else None  # one label per run
            try:
                # logs are read and checked first, so that one that cannot be read stops the run
                # before anything of it is committed
                logs = [_parse_log(paths[i], readers.get(i), progress) for i in log_indexes]
                if trace_index is None:
                    results.append(_ingest_log_run(con, logs[0], rank, label, tmpdir, started))
                    continue
                offset = offsets.get(paths[trace_index], 0)
                if trace_index in rowbased:
                    results.append(
                        _ingest_rows(con, paths[trace_index], readers[trace_index], rank, label, started, progress, offset)
                    )
                    continue
                if trace_index in numerics:
                    results.append(_ingest_numerics(con, paths[trace_index], rank, label, started, progress, metrics))
                    continue
                if trace_index in ncu:
                    results.append(_ingest_ncu(con, paths[trace_index], rank, label, started, progress))
                    continue
                started = time.perf_counter()  # the logs' own time is theirs (log.parse_seconds)
                staged = pending.result()
                pending = pool.submit(stage, paths[traces[next_trace]], tmpdir) if next_trace < len(traces) else None
                next_trace += 1
                try:
                    results += _ingest_trace(con, staged, logs, rank, label, tmpdir, progress, started, align, offset, offsets)
                finally:
                    staged.cleanup()
            except BaseException:
                _discard(pending)
                raise
    return results


@dataclass
class RowLog:
    """An attachable row-based source (a server log, OTLP spans) read ahead of its run."""

    source: Path
    reader: object
    export: object
    parse_seconds: float


def _parse_log(path: Path, reader, progress):
    from tracekit.parsers import runtime_events

    if progress:
        progress(f"loading {path.name}")
    if reader is not None:
        started = time.perf_counter()
        export = reader.read(path)
        return RowLog(path, reader, export, time.perf_counter() - started)
    return runtime_events.parse(path)


def _ingest_trace(con, staged, logs, rank, label, tmpdir, progress, started, align, offset=0, offsets=None):
    from tracekit.ingest.offsets import measure
    from tracekit.parsers import kineto, runtime_events

    offsets = offsets or {}
    if progress:
        progress(f"loading {staged.source.name}")
    options: dict = {}
    while True:
        # the events of a file land in one transaction, so a file that fails leaves nothing
        # behind; what is derived from them waits for the commit, because uncommitted rows
        # carry temporary rowids and parent_id refers to rowids
        con.execute("BEGIN TRANSACTION")
        try:
            run_id, run, counts = _load_events(con, staged, rank, label, options)
            if offset:
                con.execute("UPDATE event_rows SET ts_ns = ts_ns + ? WHERE run_id = ?", [offset, run_id])
                counts["notes"]["applied_offset_ns"] = offset
        except kineto.Reload as again:
            con.execute("ROLLBACK")
            options = again.options
            continue
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        break
    attached = []
    if logs:
        # the run's window is the profiler's: attached logs may reach far beyond it
        run["window"] = _window(con, run_id, run["format"])
    for log in logs:
        log_started = time.perf_counter() - log.parse_seconds
        explicit = offsets.get(log.source)
        if isinstance(log, RowLog):
            note = dict(log.export.notes)
            note["run"] = f"attached to the run of {staged.source}"
            if explicit is not None:
                shift = {"method": "--offset", "applied_offset_ns": explicit}
            elif align:
                shift = measure(run["window"], _export_window(log.export))
            else:
                shift = {"method": "none (alignment off)", "applied_offset_ns": 0}
            note["alignment"] = shift
            con.execute("BEGIN TRANSACTION")
            try:
                _load_export(con, log.export, run_id, shift["applied_offset_ns"])
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
            attached.append((log, note, time.perf_counter() - log_started))
            continue
        note = runtime_events.notes(log)
        note["run"] = f"attached to the run of {staged.source}"
        if "baseTimeNanoseconds" not in staged.metadata:
            note["clock"] = (
                "epoch ns as written; the trace has no baseTimeNanoseconds, so only an applied offset aligns them"
            )
        note["alignment"] = runtime_events.align(con, run_id, log, apply=align and explicit is None)
        if explicit is not None:
            for e in log.events:
                e["ts_ns"] += explicit
            note["alignment"].update({"method": "--offset", "applied_offset_ns": explicit})
        con.execute("BEGIN TRANSACTION")
        try:
            runtime_events.insert(con, log, run_id, tmpdir)
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        attached.append((log, note, time.perf_counter() - log_started))
    return _derive(con, staged, run_id, run, counts, started, attached)


def _export_window(export) -> tuple[int, int] | None:
    spans = [(r[4], r[4] + (r[5] or 0)) for r in export.rows if r[4] is not None and r[0] != "metadata"]
    return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None


def _load_export(con, export, run_id: int, offset: int = 0) -> None:
    """A row-based source's rows and stated metrics, shifted by `offset` ns onto the run's clock."""
    from tracekit.parsers import rows

    if offset:
        export.rows = [r[:4] + (None if r[4] is None else r[4] + offset,) + r[5:] for r in export.rows]
    rows.load(con, export, run_id, offset)  # an export's loader shifts its own events in SQL
    if export.metrics:
        dbmod.insert_rows(con, "run_metrics", run_id, ("name", "value", "unit", "args"), export.metrics)


def _ingest_log_run(con, log, rank, label, tmpdir, started) -> IngestResult:
    """A runtime-event log with no trace to join: a run of its own."""
    from tracekit.parsers import kineto, runtime_events

    con.execute("BEGIN TRANSACTION")
    try:
        run_id = dbmod.next_run_id(con)
        runtime_events.insert(con, log, run_id, tmpdir)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    rank_source = None
    m = kineto.RANK_IN_NAME.search(log.source.name)
    if m:
        run_rank, rank_source = int(m.group(1)), "file name"
    elif rank is not None:
        run_rank, rank_source = rank, "--rank"
    else:
        run_rank = None
    run = {
        "source": str(log.source),
        "format": runtime_events.FORMAT,
        "label": label or runtime_events.stem(log.source),
        "rank": run_rank,
        "world_size": None,
        "rank_source": rank_source,
        "device_properties": None,
        "metadata": None,
        "base_time_ns": None,
    }
    note = runtime_events.notes(log)
    note["run"] = "a run of its own (no trace in the call to join)"
    con.execute("BEGIN TRANSACTION")
    try:
        kineto.fill_entities(con, run_id)
        runtime_events.add_threads(con, run_id)
        compute_nesting(con, run_id)
        _insert_run(con, run_id, run)
        result = _log_runtime(con, log, run_id, run_rank, note, time.perf_counter() - started)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return result


def _ingest_ncu(con, path: Path, rank, label, started, progress) -> IngestResult:
    """An Nsight Compute CSV: a run of its own, with its metrics in ncu_metrics."""
    from tracekit.parsers import ncu_csv

    if progress:
        progress(f"loading {path.name}")
    table = ncu_csv.read(path)
    return _standalone_run(
        con, path, ncu_csv.FORMAT, rank, label or path.name.removesuffix(".gz").removesuffix(".csv"), started,
        rows=len(table.rows), skipped=dict(table.skipped), load=lambda run_id: ncu_csv.load(con, table, run_id),
        notes={"layout": table.layout, "unit": "one metric value of one launch"}, metadata={"layout": table.layout},
    )  # fmt: skip


def _ingest_rows(con, path: Path, reader, rank, label, started, progress, offset: int = 0) -> IngestResult:
    """A file read by a row-based reader (Nsight Systems, Perfetto, OTLP, serving logs...): a run of its
    own, mapped onto the Kineto kinds, then derived alike."""
    from tracekit.parsers import kineto

    if progress:
        progress(f"loading {path.name}")
    export = reader.read(path)
    if offset:
        export.notes["applied_offset_ns"] = offset
    m = kineto.RANK_IN_NAME.search(path.name)
    run_rank, rank_source = (int(m.group(1)), "file name") if m else (rank, "--rank" if rank is not None else None)
    run = {
        "source": str(path),
        "format": reader.FORMAT,
        "label": label or path.stem,
        "rank": run_rank,
        "world_size": None,
        "rank_source": rank_source,
        "device_properties": orjson.dumps(export.device_properties).decode() if export.device_properties else None,
        "metadata": orjson.dumps(export.metadata, default=str).decode(),
        "base_time_ns": None,
    }
    con.execute("BEGIN TRANSACTION")
    try:
        run_id = dbmod.next_run_id(con)
        _load_export(con, export, run_id, offset)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")  # derived steps wait for the commit: parent_id refers to rowids
    read, skipped = sum(export.read.values()), sum(export.skipped.values())
    con.execute("BEGIN TRANSACTION")
    try:
        kineto.fill_entities(con, run_id)
        compute_nesting(con, run_id)
        _insert_run(con, run_id, run)
        result = IngestResult(
            run_id=run_id, source=str(path), format=reader.FORMAT, bytes_read=path.stat().st_size,
            events_read=read, events_ingested=read - skipped, events_skipped=skipped,
            skipped_reasons=dict(export.skipped), seconds=time.perf_counter() - started, rank=run_rank,
        )  # fmt: skip
        _insert_log_row(con, result, export.notes)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return result


def _ingest_numerics(con, path: Path, rank, label, started, progress, metrics=()) -> IngestResult:
    """A numerics report (CSV/JSON/JSONL/Parquet): a run of its own, with its errors in numerics."""
    from tracekit.parsers import numerics_report

    if progress:
        progress(f"loading {path.name}")
    table = numerics_report.read(path, metrics)
    notes = {
        "unit": "one error metric of one check row",
        "file_format": table.file_format,
        "checks": table.checks,
        "metrics": table.metrics,
        "conditions": table.conditions,
        "typed_conditions": table.typed,
    }
    return _standalone_run(
        con, path, numerics_report.FORMAT, rank, label or path.stem, started,
        rows=len(table.rows), skipped=dict(table.skipped), load=lambda run_id: numerics_report.load(con, table, run_id),
        notes=notes, metadata=notes,
    )  # fmt: skip


def _standalone_run(con, path: Path, fmt: str, rank, label: str, started: float, *, rows: int, skipped: dict,
                    load: Callable[[int], None], notes: dict, metadata: dict) -> IngestResult:  # fmt: skip
    """A report that is a run of its own (no events): its rows, runs row and ingest log in one transaction."""
    from tracekit.parsers import kineto

    m = kineto.RANK_IN_NAME.search(path.name)
    run_rank, rank_source = (int(m.group(1)), "file name") if m else (rank, "--rank" if rank is not None else None)
    run = {
        "source": str(path),
        "format": fmt,
        "label": label,
        "rank": run_rank,
        "world_size": None,
        "rank_source": rank_source,
        "device_properties": None,
        "metadata": orjson.dumps(metadata).decode(),
        "base_time_ns": None,
    }
    n_skipped = sum(skipped.values())
    con.execute("BEGIN TRANSACTION")
    try:
        run_id = dbmod.next_run_id(con)
        load(run_id)
        _insert_run(con, run_id, run)
        result = IngestResult(
            run_id=run_id,
            source=str(path),
            format=fmt,
            bytes_read=path.stat().st_size,
            events_read=rows + n_skipped,
            events_ingested=rows,
            events_skipped=n_skipped,
            skipped_reasons=skipped,
            seconds=time.perf_counter() - started,
            rank=run_rank,
        )
        _insert_log_row(con, result, notes)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return result


def _discard(pending) -> None:
    """Remove the temp files of a file staged ahead whose turn will not come."""
    if pending is None or pending.cancel():
        return
    try:
        pending.result().cleanup()
    except Exception:  # its own error does not matter once another file failed
        pass


def _load_events(con, staged, rank: int | None, label: str | None, options: dict) -> tuple[int, dict, dict]:
    from tracekit.parsers import kineto

    run_id = dbmod.next_run_id(con)
    run = kineto.describe_run(staged, rank, label)
    counts = kineto.load(con, staged, run_id, **options)
    run["format"] = counts["format"]  # kineto, or chrome_json for another producer's trace
    return run_id, run, counts


def _derive(con, staged, run_id: int, run: dict, counts: dict, started: float, attached=()) -> list[IngestResult]:
    """Entities, nesting, the runs row and the ingest log of a loaded run, in one transaction."""
    from tracekit.parsers import kineto, runtime_events

    con.execute("BEGIN TRANSACTION")
    try:
        kineto.fill_entities(con, run_id)
        if attached:
            runtime_events.add_threads(con, run_id)
        compute_nesting(con, run_id)
        _insert_run(con, run_id, run)
        results = [_log(con, staged, run_id, run, counts, started)]
        for log, note, seconds in attached:
            if isinstance(log, RowLog):
                results.append(_log_attached_rows(con, log, run_id, run["rank"], note, seconds))
            else:
                results.append(_log_runtime(con, log, run_id, run["rank"], note, seconds))
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return results


def _log_attached_rows(con, log: RowLog, run_id: int, rank, note: dict, seconds: float) -> IngestResult:
    read, skipped = sum(log.export.read.values()), sum(log.export.skipped.values())
    result = IngestResult(
        run_id=run_id, source=str(log.source), format=log.reader.FORMAT, bytes_read=log.source.stat().st_size,
        events_read=read, events_ingested=read - skipped, events_skipped=skipped,
        skipped_reasons=dict(log.export.skipped), seconds=seconds, rank=rank, alignment=note.get("alignment"),
    )  # fmt: skip
    _insert_log_row(con, result, note)
    return result


def _log_runtime(con, log, run_id: int, rank, note: dict, seconds: float) -> IngestResult:
    from tracekit.parsers import runtime_events

    result = IngestResult(
        run_id=run_id,
        source=str(log.source),
        format=runtime_events.FORMAT,
        bytes_read=log.bytes_read,
        events_read=log.lines_read,
        events_ingested=len(log.events),
        events_skipped=log.events_skipped,
        skipped_reasons=dict(log.skipped),
        seconds=seconds,
        rank=rank,
        alignment=note.get("alignment"),
    )
    _insert_log_row(con, result, note)
    return result


def _log(con, staged, run_id: int, run: dict, counts: dict, started: float) -> IngestResult:

    result = IngestResult(
        run_id=run_id,
        source=str(staged.source),
        format=run["format"],
        bytes_read=staged.bytes_read,
        events_read=counts["events_read"],
        events_ingested=counts["events_read"] - counts["events_skipped"],
        events_skipped=counts["events_skipped"],
        skipped_reasons=counts["skipped_reasons"],
        seconds=time.perf_counter() - started,
        rank=run["rank"],
    )
    _insert_log_row(con, result, counts["notes"])
    return result


def _insert_log_row(con, result: IngestResult, notes: dict) -> None:
    con.execute(
        "INSERT INTO ingest_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            result.run_id,
            result.source,
            result.format,
            result.bytes_read,
            result.events_read,
            result.events_ingested,
            result.events_skipped,
            orjson.dumps(result.skipped_reasons).decode(),
            orjson.dumps(notes).decode(),
            result.seconds,
        ],
    )


def raw_size(path: Path) -> int:
    """Uncompressed size of a trace: a gzip member's trailer holds it (mod 4 GiB)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                return size
            f.seek(-4, 2)
            isize = int.from_bytes(f.read(4), "little")
        return isize if isize >= size else isize + (1 << 32)
    except OSError:
        return 0  # a missing file is reported by staging, with its name


def _window(con, run_id: int, fmt: str) -> tuple[int, int]:
    return con.execute(
        "SELECT min(ts_ns), max(ts_ns + coalesce(dur_ns, 0)) FROM event_rows "
        "WHERE run_id = ? AND kind NOT IN ('metadata', 'profiler_span') "
        # a trace's window is the profiler's: runtime events it is given may reach far beyond it
        "AND (kind <> 'runtime_event' OR ? = 'runtime_events')",
        [run_id, fmt],
    ).fetchone()


def _insert_run(con, run_id: int, run: dict) -> None:
    start, end = run.get("window") or _window(con, run_id, run["format"])
    con.execute(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            run_id,
            run["source"],
            run["format"],
            run["label"],
            run["rank"],
            run["world_size"],
            run["rank_source"],
            run["device_properties"],
            run["metadata"],
            run["base_time_ns"],
            start,
            end,
        ],
    )
