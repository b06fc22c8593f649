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


def ingest(
    con,
    paths: list[str | Path],
    rank: int | None = None,
    labels: list[str] | None = None,
    tmpdir: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[IngestResult]:
    from tracekit.parsers import kineto
    from tracekit.parsers.json_slice import stage

    paths = [Path(p) for p in paths]
    dbmod.bound_memory(con, dbmod.current_memory_hint(con) + sum(raw_size(p) for p in paths))
    results = []
    # zlib and copy_file_range release the GIL: the next file is staged on the other core.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(stage, paths[0], tmpdir) if paths else None
        for i, path in enumerate(paths):
            started = time.perf_counter()
            staged = pending.result()
            pending = pool.submit(stage, paths[i + 1], tmpdir) if i + 1 < len(paths) else None
            label = labels[i] if labels and i < len(labels) else None
            if progress:
                progress(f"loading {path.name}")
            options: dict = {}
            try:
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
                    results.append(_derive(con, staged, run_id, run, counts, started))
                    break
            except BaseException:
                _discard(pending)
                raise
            finally:
                staged.cleanup()
    return results


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


def _derive(con, staged, run_id: int, run: dict, counts: dict, started: float) -> IngestResult:
    """Entities, nesting, the runs row and the ingest log of a loaded run, in one transaction."""
    from tracekit.parsers import kineto

    con.execute("BEGIN TRANSACTION")
    try:
        kineto.fill_entities(con, run_id)
        compute_nesting(con, run_id)
        _insert_run(con, run_id, run)
        result = _log(con, staged, run_id, run, counts, started)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
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
    con.execute(
        "INSERT INTO ingest_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            run_id,
            result.source,
            result.format,
            result.bytes_read,
            result.events_read,
            result.events_ingested,
            result.events_skipped,
            orjson.dumps(result.skipped_reasons).decode(),
            orjson.dumps(counts["notes"]).decode(),
            result.seconds,
        ],
    )
    return result


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
        "WHERE run_id = ? AND kind NOT IN ('metadata', 'profiler_span')",
        [run_id],
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
