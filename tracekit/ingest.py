"""Ingest trace files into a database: stage (decompress/slice) the next file while loading this one."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import orjson

from . import db as dbmod
from .nesting import compute_nesting


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

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def plan(paths: list[Path], metrics: tuple[str, ...] = ()) -> list[tuple[int | None, list[int]]]:
    """Group the inputs of one call into runs: (index of the trace, indexes of its runtime-event logs).

    A runtime-event log joins the run of the nearest trace before it in the call; a log that comes
    before every trace joins the only trace of the call when there is exactly one; otherwise it is a
    run of its own (format `runtime_events`). So `analyze trace.json.gz events.jsonl`,
    `analyze events.jsonl trace.json.gz` and `ingest r0.json.gz r0.jsonl r1.json.gz r1.jsonl` all
    do what they say.
    """
    from tracekit.parsers import ncu_csv, numerics_report, runtime_events

    nsys = {i for i, p in enumerate(paths) if row_reader(p) is not None}
    numerics = {i for i, p in enumerate(paths) if i not in nsys and numerics_report.is_numerics_path(p, metrics)}
    is_log = [i not in numerics | nsys and runtime_events.is_runtime_log(p) for i, p in enumerate(paths)]
    standalone = nsys | numerics | {i for i, p in enumerate(paths) if not is_log[i] and ncu_csv.is_ncu_path(p)}
    traces = [i for i, log in enumerate(is_log) if not log and i not in standalone]
    units: list[tuple[int | None, list[int]]] = []
    by_trace: dict[int, list[int]] = {}
    leading: list[int] = []
    for i, log in enumerate(is_log):
        if not log:
            by_trace[i] = []
            units.append((i, by_trace[i]))
        elif units and units[-1][0] is not None and units[-1][0] not in standalone:
            units[-1][1].append(i)
        elif len(traces) == 1:
            leading.append(i)
        else:
            units.append((None, [i]))
    if leading:
        by_trace[traces[0]][:0] = leading
    return units


def ingest(
    con,
    paths: list[str | Path],
    rank: int | None = None,
    labels: list[str] | None = None,
    tmpdir: str | None = None,
    progress: Callable[[str], None] | None = None,
    align: bool = True,
    metrics: tuple[str, ...] = (),
) -> list[IngestResult]:
    """Ingest trace files (and runtime-event logs, see plan) in order; one IngestResult per file.

    `align`: shift a log attached to a trace by the median offset measured on the events both share.
    """
    from tracekit.parsers.json_slice import stage

    paths = [Path(p) for p in paths]
    dbmod.bound_memory(con, dbmod.current_memory_hint(con) + sum(raw_size(p) for p in paths))
    from tracekit.parsers import ncu_csv, numerics_report

    metrics = tuple(metrics)
    units = plan(paths, metrics)
    nsys = {t for t, _ in units if t is not None and row_reader(paths[t]) is not None}
    numerics = {
        t for t, _ in units if t is not None and t not in nsys and numerics_report.is_numerics_path(paths[t], metrics)
    }
    ncu = {t for t, _ in units if t is not None and t not in numerics | nsys and ncu_csv.is_ncu_path(paths[t])}
    traces = [t for t, _ in units if t is not None and t not in ncu | numerics | nsys]
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
                logs = [_parse_log(paths[i], progress) for i in log_indexes]
                if trace_index is None:
                    results.append(_ingest_log_run(con, logs[0], rank, label, tmpdir, started))
                    continue
                if trace_index in nsys:
                    reader = row_reader(paths[trace_index])
                    results.append(_ingest_rows(con, paths[trace_index], reader, rank, label, started, progress))
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
                    results += _ingest_trace(con, staged, logs, rank, label, tmpdir, progress, started, align)
                finally:
                    staged.cleanup()
            except BaseException:
                _discard(pending)
                raise
    return results


def _parse_log(path: Path, progress):
    from tracekit.parsers import runtime_events

    if progress:
        progress(f"loading {path.name}")
    return runtime_events.parse(path)


def _ingest_trace(con, staged, logs, rank, label, tmpdir, progress, started, align) -> list[IngestResult]:
    from tracekit.parsers import kineto, runtime_events

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
    for log in logs:
        log_started = time.perf_counter() - log.parse_seconds
        note = runtime_events.notes(log)
        note["run"] = f"attached to the run of {staged.source}"
        if "baseTimeNanoseconds" not in staged.metadata:
            note["clock"] = (
                "epoch ns as written; the trace has no baseTimeNanoseconds, so only an applied offset aligns them"
            )
        note["alignment"] = runtime_events.align(con, run_id, log, apply=align)
        con.execute("BEGIN TRANSACTION")
        try:
            runtime_events.insert(con, log, run_id, tmpdir)
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        attached.append((log, note, time.perf_counter() - log_started))
    return _derive(con, staged, run_id, run, counts, started, attached)


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


# Readers that build event rows in Python (parsers/rows.py), tried in this order on a file's content.
# Each module has FORMAT, detect(path) -> bool (never raises) and read(path) -> rows.Export.
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


def _ingest_rows(con, path: Path, reader, rank, label, started, progress) -> IngestResult:
    """A file read by a row-based reader (Nsight Systems, Perfetto, OTLP, serving logs...): a run of its
    own, mapped onto the Kineto kinds, then derived alike."""
    from tracekit.parsers import kineto, rows

    if progress:
        progress(f"loading {path.name}")
    export = reader.read(path)
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
        rows.load(con, export, run_id)
        if export.metrics:
            dbmod.insert_rows(con, "run_metrics", run_id, ("name", "value", "unit", "args"), export.metrics)
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
    return run_id, run, kineto.load(con, staged, run_id, **options)


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
            results.append(_log_runtime(con, log, run_id, run["rank"], note, seconds))
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return results


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
    )
    _insert_log_row(con, result, note)
    return result


def _log(con, staged, run_id: int, run: dict, counts: dict, started: float) -> IngestResult:
    from tracekit.parsers import kineto

    result = IngestResult(
        run_id=run_id,
        source=str(staged.source),
        format=kineto.FORMAT,
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


def _insert_run(con, run_id: int, run: dict) -> None:
    start, end = con.execute(
        "SELECT min(ts_ns), max(ts_ns + coalesce(dur_ns, 0)) FROM event_rows "
        "WHERE run_id = ? AND kind NOT IN ('metadata', 'profiler_span') "
        # a trace's window is the profiler's: runtime events it is given may reach far beyond it
        "AND (kind <> 'runtime_event' OR ? = 'runtime_events')",
        [run_id, run["format"]],
    ).fetchone()
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
